//! A bucket's 16-bit parameters as an explicit state: held in the bucket, or lent to an
//! all-gather. Where the stage keeps a bucket whole (stages 1–2, stage 3's persistent
//! buckets) the step gathers the updated partitions into the bucket's own buffer (and so
//! does a load, which rounds the parameters from the master weights the same way), and
//! the communicator takes that buffer by value until the gather is waited for. The step
//! (`step.rs`: `gather_whole`, `finish_gathers`) keeps the gathers in flight in a list of
//! its own and gives every buffer back before it returns, so outside it a bucket's
//! parameters are always held; only a failed all-gather leaves them lent for good (the
//! collective took them with it).
//!
//! Everything else reads or writes the parameters in place (the device Adam, the copies
//! to and from the master weights): nothing takes them out of the bucket.
//!
//! ```text
//!          lend()   (the step issues all_gather(input, buffer))
//!   Held ───────────────────────────────────────────────────► Lent
//!    ▲                                                          │
//!    └──────────── put_back(gathered)   (the step's wait) ──────┘
//!                                 a failed wait: stays Lent
//! ```

use crate::EngineError;

/// Where a bucket's parameters are (see the module docs).
pub(super) enum Params<B> {
    /// In the bucket: the whole bucket, or (stage 3, non-persistent) the owned partition
    /// (zero-length when it lives in the parameter tier).
    Held(B),
    /// Handed to an all-gather of the step's that has not given it back.
    Lent,
}

fn lent() -> EngineError {
    EngineError::Internal("parameters lent to an all-gather that did not give them back".into())
}

impl<B> Params<B> {
    /// The held buffer, or `None` while lent (the memory report counts what is held).
    pub(super) fn held(&self) -> Option<&B> {
        match self {
            Params::Held(b) => Some(b),
            Params::Lent => None,
        }
    }

    /// The held buffer; lent, only after a failed all-gather.
    pub(super) fn get(&self) -> Result<&B, EngineError> {
        self.held().ok_or_else(lent)
    }

    /// The held buffer, to write in place.
    pub(super) fn get_mut(&mut self) -> Result<&mut B, EngineError> {
        match self {
            Params::Held(b) => Ok(b),
            Params::Lent => Err(lent()),
        }
    }

    /// Held → Lent: the buffer, for an all-gather's output.
    pub(super) fn lend(&mut self) -> Result<B, EngineError> {
        match std::mem::replace(self, Params::Lent) {
            Params::Held(b) => Ok(b),
            Params::Lent => Err(lent()),
        }
    }

    /// Lent → Held: the gathered bucket comes back.
    pub(super) fn put_back(&mut self, gathered: B) {
        *self = Params::Held(gathered);
    }
}
