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
//!
//! With hpZ a gather reads either the shard group's partitions (`Primary`) or the hpZ
//! group's secondary pieces (`Secondary`): waiting for the latter hands the piece back.

use zero_comm::{CommError, Completion};

/// A bucket's gather state. Buckets kept whole (stages 0–2, stage 3's persistent ones)
/// stay [`Idle`](Gather::Idle): they are never gathered.
pub(super) enum Gather<B, W> {
    /// Only this rank's partition is held.
    Idle,
    /// An all-gather of the bucket is in flight, from the partitions or (hpZ) from the
    /// secondary pieces.
    InFlight(W, Source),
    /// The whole bucket is gathered on this rank.
    Ready(B),
}

/// What an all-gather reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The shard group's partitions.
    Primary,
    /// hpZ's secondary pieces, inside a node.
    Secondary,
}

/// What waiting finished.
pub(super) enum Waited<B> {
    /// Nothing was in flight.
    Nothing,
    /// A gather from the partitions: the bucket is whole now.
    Primary,
    /// A gather from the secondary pieces: this rank's piece, handed back.
    Secondary(B),
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

    /// Idle → InFlight: the all-gather `work` was issued, reading `source`.
    pub fn start(&mut self, work: W, source: Source) {
        *self = Gather::InFlight(work, source);
    }

    /// InFlight → Ready: waits for the all-gather (nothing to do in another state). On an
    /// error the state is Idle: the partition is still held, the gathered copy (and a
    /// secondary piece it read) is gone.
    pub fn wait(&mut self) -> Result<Waited<B>, CommError> {
        if !matches!(self, Gather::InFlight(..)) {
            return Ok(Waited::Nothing);
        }
        let Gather::InFlight(work, source) = std::mem::replace(self, Gather::Idle) else {
            return Ok(Waited::Nothing);
        };
        let (input, full) = work.wait()?;
        *self = Gather::Ready(full);
        Ok(match source {
            Source::Primary => Waited::Primary,
            Source::Secondary => Waited::Secondary(input),
        })
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
