//! Stage 3: where a bucket's whole parameters are, as an explicit state (FSDP2's
//! sharded / unsharded parameter group): only the partition, an all-gather in flight, or
//! the whole bucket gathered. The transitions are the verbs below; "gathered and in
//! flight at once" cannot be written down.
//!
//! ```text
//!            start(work)            wait()
//!   Idle ───────────────► InFlight ───────► Ready
//!    ▲                                        │
//!    └──────────────── release() ─────────────┘
//! ```

use zero_comm::{CommError, Completion};

/// A bucket's gather state. Buckets kept whole (stages 0–2, stage 3's persistent ones)
/// stay [`Idle`](Gather::Idle): they are never gathered.
pub(super) enum Gather<B, W> {
    /// Only this rank's partition is held.
    Idle,
    /// An all-gather of the bucket is in flight.
    InFlight(W),
    /// The whole bucket is gathered on this rank.
    Ready(B),
}

impl<B, W: Completion<Output = (B, B)>> Gather<B, W> {
    /// Whether neither gathered nor being gathered.
    pub fn is_idle(&self) -> bool {
        matches!(self, Gather::Idle)
    }

    /// The whole bucket, once gathered.
    pub fn ready(&self) -> Option<&B> {
        match self {
            Gather::Ready(b) => Some(b),
            _ => None,
        }
    }

    /// Idle → InFlight: the all-gather `work` was issued.
    pub fn start(&mut self, work: W) {
        *self = Gather::InFlight(work);
    }

    /// InFlight → Ready: waits for the all-gather (nothing to do in another state). On an
    /// error the state is Idle: the partition is still held, the gathered copy is gone.
    pub fn wait(&mut self) -> Result<(), CommError> {
        if let Gather::InFlight(_) = self {
            if let Gather::InFlight(work) = std::mem::replace(self, Gather::Idle) {
                let (_, full) = work.wait()?;
                *self = Gather::Ready(full);
            }
        }
        Ok(())
    }

    /// Ready → Idle: the gathered copy is dropped. Returns whether there was one.
    pub fn release(&mut self) -> bool {
        match self {
            Gather::Ready(_) => {
                *self = Gather::Idle;
                true
            }
            _ => false,
        }
    }
}
