//! A bucket's gradient buffers: one enum whose variant the stage policy chooses once, so a
//! gradient shard at stages 0–1, a whole-bucket buffer kept at stages 2–3, or a
//! "fresh" flag without a shard cannot be written (FSDP2's parameter group keeps its
//! unsharded and sharded gradients the same way, per group). A buffer a reduction takes is
//! a [`Loan`]: held, or lent to the collective until the engine finishes it.
//!
//! | variant | stages | holds | lent while |
//! |---|---|---|---|
//! | `Frozen` | any (frozen buckets) | nothing: never reduced | — |
//! | `Whole` | 0–1 | the whole bucket's gradients, kept across micro-steps; an fp32 accumulator when 16-bit gradients are summed in fp32 | the gradients: the window's all-reduce (stage 0) or reduce-scatter (stage 1) |
//! | `Sharded` | 2–3 | the reduced owned partition and its fp32 accumulator; whether the partition holds nothing of the window yet | the partition: a reduce-scatter that writes it; the partition or accumulator: the replicas' all-reduce at the step (shard groups) |
//! | `OnHost` | 2–3 with `offload_optimizer` | whether the partition (in host memory, `offload::HostGrads`) holds nothing of the window yet | — |
//!
//! Stages 2–3's whole-bucket buffer the backward writes is not the bucket's: the staging
//! pool (`pool.rs`) lends one from the bucket's first gradient of a pass until its
//! reduce-scatter is done.

use super::loan::{Loan, What};
use crate::EngineError;

/// Which of a bucket's gradient buffers [`Grads::reduced`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReducedIn {
    /// `Whole`'s gradients.
    Whole,
    /// `Sharded`'s fp32 accumulator.
    Accum,
    /// `Sharded`'s partition.
    Shard,
}

/// A bucket's gradient buffers (see the module docs).
pub(super) enum Grads<B> {
    /// A frozen bucket: no gradient.
    Frozen,
    /// Stages 0–1.
    Whole {
        /// The whole bucket's gradients: the backward writes them, the window's reduction
        /// takes them.
        grads: Loan<B>,
        /// The fp32 sum of a window's 16-bit gradients (never lent).
        accum: Option<B>,
    },
    /// Stages 2–3, the partition on the device.
    Sharded {
        /// The reduced owned partition (the window's sum when summed in the gradients'
        /// dtype).
        shard: Loan<B>,
        /// The fp32 sum of the window's reduced partitions.
        accum: Option<Loan<B>>,
        /// Whether `shard` holds nothing of the current window yet: the next reduction
        /// writes it, later ones are added.
        fresh: bool,
    },
    /// Stages 2–3 with the partition in host memory (`offload_optimizer`).
    OnHost {
        /// Whether the host partition holds nothing of the current window yet.
        fresh: bool,
    },
}

/// Bucket `b` has no gradients of the kind asked for (a frozen bucket, or a stage that
/// keeps another kind): a caller's bug.
fn none_kept(b: usize, what: &str) -> EngineError {
    EngineError::Internal(format!("bucket {b} keeps no {what}"))
}

impl<B> Grads<B> {
    /// Stages 0–1's gradients of bucket `b`, and their fp32 accumulator when there is
    /// one.
    pub(super) fn whole(b: usize, grads: B, accum: Option<B>) -> Self {
        Self::Whole {
            grads: Loan::held_by(grads, What::Grads(b)),
            accum,
        }
    }

    /// Stages 2–3's partition of bucket `b`, and its fp32 accumulator when there is one.
    pub(super) fn sharded(b: usize, shard: B, accum: Option<B>) -> Self {
        Self::Sharded {
            shard: Loan::held_by(shard, What::Grads(b)),
            accum: accum.map(|a| Loan::held_by(a, What::Grads(b))),
            fresh: true,
        }
    }

    /// Whether a collective has one of its buffers.
    pub(super) fn any_lent(&self) -> bool {
        match self {
            Self::Whole { grads, .. } => grads.is_lent(),
            Self::Sharded { shard, accum, .. } => {
                shard.is_lent() || accum.as_ref().is_some_and(Loan::is_lent)
            }
            Self::Frozen | Self::OnHost { .. } => false,
        }
    }

    /// Stages 0–1's gradients, which the backward writes.
    pub(super) fn whole_mut(&mut self, b: usize) -> Result<&mut B, EngineError> {
        match self {
            Self::Whole { grads, .. } => grads.get_mut(),
            _ => Err(none_kept(b, "whole-bucket gradients")),
        }
    }

    /// Stages 0–1's gradients and their fp32 accumulator (`None`: the window sums in
    /// place).
    pub(super) fn whole_and_accum(
        &mut self,
        b: usize,
    ) -> Result<(&mut B, Option<&mut B>), EngineError> {
        match self {
            Self::Whole { grads, accum } => Ok((grads.get_mut()?, accum.as_mut())),
            _ => Err(none_kept(b, "whole-bucket gradients")),
        }
    }

    /// Stages 0–1's gradients, lent to the window's reduction.
    pub(super) fn lend_whole(&mut self, b: usize) -> Result<B, EngineError> {
        match self {
            Self::Whole { grads, .. } => grads.lend(),
            _ => Err(none_kept(b, "whole-bucket gradients")),
        }
    }

    /// The window's reduction gave stages 0–1's gradients back.
    pub(super) fn put_back_whole(&mut self, buf: B) {
        if let Self::Whole { grads, .. } = self {
            grads.put_back(buf);
        }
    }

    /// What the optimizer reads of this micro-step's reductions of bucket `b`: stages
    /// 0–1's whole gradients, stages 2–3's fp32 accumulator where there is one, else the
    /// partition.
    pub(super) fn reduced(&self, b: usize) -> Result<&B, EngineError> {
        match self {
            Self::Whole { grads, .. } => grads.get(),
            Self::Sharded {
                accum: Some(accum), ..
            } => accum.get(),
            Self::Sharded { shard, .. } => shard.get(),
            Self::Frozen | Self::OnHost { .. } => Err(none_kept(b, "gradients on the device")),
        }
    }

    /// Lends the buffer [`reduced`](Self::reduced) reads to a collective that hands it
    /// back, with where it was, for [`put_reduced`](Self::put_reduced).
    pub(super) fn lend_reduced(&mut self, b: usize) -> Result<(B, ReducedIn), EngineError> {
        match self {
            Self::Whole { grads, .. } => Ok((grads.lend()?, ReducedIn::Whole)),
            Self::Sharded {
                accum: Some(accum), ..
            } => Ok((accum.lend()?, ReducedIn::Accum)),
            Self::Sharded { shard, .. } => Ok((shard.lend()?, ReducedIn::Shard)),
            Self::Frozen | Self::OnHost { .. } => Err(none_kept(b, "gradients on the device")),
        }
    }

    /// Puts back what [`lend_reduced`](Self::lend_reduced) lent.
    pub(super) fn put_reduced(&mut self, buf: B, at: ReducedIn) {
        match (self, at) {
            (Self::Whole { grads, .. }, ReducedIn::Whole) => {
                grads.put_back(buf);
            }
            (
                Self::Sharded {
                    accum: Some(accum), ..
                },
                ReducedIn::Accum,
            ) => {
                accum.put_back(buf);
            }
            (Self::Sharded { shard, .. }, ReducedIn::Shard) => {
                shard.put_back(buf);
            }
            _ => {}
        }
    }

    /// The fp32 accumulator where there is one and it is held (the memory report).
    pub(super) fn accum(&self) -> Option<&B> {
        match self {
            Self::Whole { accum, .. } => accum.as_ref(),
            Self::Sharded { accum, .. } => accum.as_ref().and_then(Loan::held),
            Self::Frozen | Self::OnHost { .. } => None,
        }
    }

    /// Stages 2–3's partition, lent to the reduce-scatter that writes it; the window's
    /// next reduction is not its first.
    pub(super) fn lend_shard(&mut self, b: usize) -> Result<B, EngineError> {
        match self {
            Self::Sharded { shard, fresh, .. } => {
                *fresh = false;
                shard.lend()
            }
            _ => Err(none_kept(b, "gradient partition on the device")),
        }
    }

    /// The reduce-scatter that wrote the partition is done: its output is the partition,
    /// added into the fp32 accumulator where there is one (`add` does the sum).
    pub(super) fn put_back_shard(
        &mut self,
        output: B,
        add: impl FnOnce(&mut B, &B) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        if let Self::Sharded { shard, accum, .. } = self {
            let output = shard.put_back(output);
            if let Some(accum) = accum {
                add(accum.get_mut()?, output)?;
            }
        }
        Ok(())
    }

    /// Stages 2–3's partition, to add a later reduction of the window into.
    pub(super) fn shard_mut(&mut self, b: usize) -> Result<&mut B, EngineError> {
        match self {
            Self::Sharded { shard, .. } => shard.get_mut(),
            _ => Err(none_kept(b, "gradient partition on the device")),
        }
    }

    /// Stages 2–3's partition where it is on the device and held (to clear it).
    pub(super) fn held_shard_mut(&mut self) -> Option<&mut B> {
        match self {
            Self::Sharded { shard, .. } => shard.get_mut().ok(),
            _ => None,
        }
    }

    /// Whether the partition holds nothing of the window yet (always at stages 0–1).
    pub(super) fn fresh(&self) -> bool {
        match self {
            Self::Sharded { fresh, .. } | Self::OnHost { fresh } => *fresh,
            Self::Frozen | Self::Whole { .. } => true,
        }
    }

    /// The next reduction of the window is not its first (or is, after a step).
    pub(super) fn set_fresh(&mut self, value: bool) {
        if let Self::Sharded { fresh, .. } | Self::OnHost { fresh } = self {
            *fresh = value;
        }
    }

    /// The gradients this bucket keeps at rest, as the memory report counts them: the
    /// whole gradients at stages 0–1, the partition at 2–3 (on the device).
    pub(super) fn kept(&self) -> Option<&B> {
        match self {
            Self::Whole { grads, .. } => grads.held(),
            Self::Sharded { shard, .. } => shard.held(),
            Self::Frozen | Self::OnHost { .. } => None,
        }
    }

    /// Stages 0–1's gradients where they are held (to clear them).
    pub(super) fn held_whole_mut(&mut self) -> Option<&mut B> {
        match self {
            Self::Whole { grads, .. } => grads.get_mut().ok(),
            _ => None,
        }
    }

    /// The fp32 accumulator where there is one and it is held (to clear it).
    pub(super) fn held_accum_mut(&mut self) -> Option<&mut B> {
        match self {
            Self::Whole { accum, .. } => accum.as_mut(),
            Self::Sharded { accum, .. } => accum.as_mut().and_then(|a| a.get_mut().ok()),
            Self::Frozen | Self::OnHost { .. } => None,
        }
    }

    /// Every buffer it holds now (to zero them).
    pub(super) fn buffers_mut(&mut self) -> Vec<&mut B> {
        match self {
            Self::Whole { grads, accum } => grads.get_mut().ok().into_iter().chain(accum).collect(),
            Self::Sharded { shard, accum, .. } => shard
                .get_mut()
                .ok()
                .into_iter()
                .chain(accum.as_mut().and_then(|a| a.get_mut().ok()))
                .collect(),
            Self::Frozen | Self::OnHost { .. } => Vec::new(),
        }
    }
}
