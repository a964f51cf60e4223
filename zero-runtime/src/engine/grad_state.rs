//! A bucket's gradient buffers: one enum whose variant the stage policy chooses once, so a
//! gradient shard at stages 0–1, a whole-bucket buffer kept at stages 2–3, or a
//! "fresh" flag without a shard cannot be written (FSDP2's parameter group keeps its
//! unsharded and sharded gradients the same way, per group).
//!
//! | variant | stages | holds | a buffer is `None` while |
//! |---|---|---|---|
//! | `Frozen` | any (frozen buckets) | nothing: never reduced | — |
//! | `Whole` | 0–1 | the whole bucket's gradients, kept across micro-steps; an fp32 accumulator when 16-bit gradients are summed in fp32 | its all-reduce (stage 0) or reduce-scatter (stage 1) has it |
//! | `Sharded` | 2–3 | a pooled staging buffer the backward writes; the reduced owned partition and its accumulator; whether the partition holds nothing of the window yet | staging: before the bucket's first gradient of a pass, and while its reduce-scatter has it; shard: while a reduce-scatter writes it, and always when the partition lives in host memory (`offload_optimizer`) |

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
        /// The whole bucket's gradients.
        grads: Option<B>,
        /// The fp32 sum of a window's 16-bit gradients.
        accum: Option<B>,
    },
    /// Stages 2–3.
    Sharded {
        /// The pooled buffer the backward writes until the bucket's reduce-scatter.
        staging: Option<B>,
        /// The reduced owned partition (the window's sum when summed in the gradients'
        /// dtype).
        shard: Option<B>,
        /// The fp32 sum of the window's reduced partitions.
        accum: Option<B>,
        /// Whether `shard` holds nothing of the current window yet: the next reduction
        /// writes it, later ones are added.
        fresh: bool,
    },
}

impl<B> Grads<B> {
    /// The buffer the backward writes: the whole gradients, or the staging buffer.
    pub(super) fn written_mut(&mut self) -> Option<&mut B> {
        match self {
            Self::Whole { grads, .. } => grads.as_mut(),
            Self::Sharded { staging, .. } => staging.as_mut(),
            Self::Frozen => None,
        }
    }

    /// The buffer the backward writes into bucket `b`'s gradients; an error naming the
    /// bucket where it has none (a frozen bucket, or one whose reduction holds it).
    pub(super) fn written(&mut self, b: usize) -> Result<&mut B, crate::EngineError> {
        self.written_mut().ok_or_else(|| {
            crate::EngineError::Internal(format!("bucket {b} has no gradient buffer"))
        })
    }

    /// Whether the backward has a buffer to write.
    pub(super) fn has_written(&self) -> bool {
        match self {
            Self::Whole { grads, .. } => grads.is_some(),
            Self::Sharded { staging, .. } => staging.is_some(),
            Self::Frozen => false,
        }
    }

    /// The written buffer, handed to a reduction.
    pub(super) fn take_written(&mut self) -> Option<B> {
        match self {
            Self::Whole { grads, .. } => grads.take(),
            Self::Sharded { staging, .. } => staging.take(),
            Self::Frozen => None,
        }
    }

    /// The written buffer, handed to bucket `b`'s reduction; an error where a reduction
    /// holds it already.
    pub(super) fn take_for_reduction(&mut self, b: usize) -> Result<B, crate::EngineError> {
        self.take_written().ok_or_else(|| {
            crate::EngineError::Internal(format!("bucket {b}'s gradients are in flight already"))
        })
    }

    /// Gives the written buffer back (a reduction's input, or a staging buffer from the
    /// pool).
    pub(super) fn put_written(&mut self, buf: B) {
        match self {
            Self::Whole { grads, .. } => *grads = Some(buf),
            Self::Sharded { staging, .. } => *staging = Some(buf),
            Self::Frozen => {}
        }
    }

    /// What the optimizer reads of this micro-step's reductions: stages 0–1's whole
    /// gradients, stages 2–3's fp32 accumulator where there is one, else the partition.
    pub(super) fn reduced(&self) -> Option<&B> {
        match self {
            Self::Whole { grads, .. } => grads.as_ref(),
            Self::Sharded {
                accum: Some(accum), ..
            } => Some(accum),
            Self::Sharded { shard, .. } => shard.as_ref(),
            Self::Frozen => None,
        }
    }

    /// Takes out the buffer [`reduced`](Self::reduced) reads, for a collective that hands
    /// it back, and where it was, for [`put_reduced`](Self::put_reduced).
    pub(super) fn take_reduced(&mut self) -> Option<(B, ReducedIn)> {
        match self {
            Self::Whole { grads, .. } => grads.take().map(|g| (g, ReducedIn::Whole)),
            Self::Sharded {
                accum: accum @ Some(_),
                ..
            } => accum.take().map(|a| (a, ReducedIn::Accum)),
            Self::Sharded { shard, .. } => shard.take().map(|s| (s, ReducedIn::Shard)),
            Self::Frozen => None,
        }
    }

    /// Puts back what [`take_reduced`](Self::take_reduced) took.
    pub(super) fn put_reduced(&mut self, buf: B, at: ReducedIn) {
        match (self, at) {
            (Self::Whole { grads, .. }, ReducedIn::Whole) => *grads = Some(buf),
            (Self::Sharded { accum, .. }, ReducedIn::Accum) => *accum = Some(buf),
            (Self::Sharded { shard, .. }, ReducedIn::Shard) => *shard = Some(buf),
            _ => {}
        }
    }

    /// The fp32 accumulator, where there is one.
    pub(super) fn accum(&self) -> Option<&B> {
        match self {
            Self::Whole { accum, .. } | Self::Sharded { accum, .. } => accum.as_ref(),
            Self::Frozen => None,
        }
    }

    /// The fp32 accumulator, mutably.
    pub(super) fn accum_mut(&mut self) -> Option<&mut B> {
        match self {
            Self::Whole { accum, .. } | Self::Sharded { accum, .. } => accum.as_mut(),
            Self::Frozen => None,
        }
    }

    /// Stages 0–1's whole gradients and their accumulator, together.
    pub(super) fn whole_and_accum_mut(&mut self) -> Option<(&mut B, &mut B)> {
        match self {
            Self::Whole {
                grads: Some(g),
                accum: Some(a),
            } => Some((g, a)),
            _ => None,
        }
    }

    /// Stages 2–3's reduced partition on the device (`None` otherwise).
    pub(super) fn shard(&self) -> Option<&B> {
        match self {
            Self::Sharded { shard, .. } => shard.as_ref(),
            _ => None,
        }
    }

    /// The reduced partition, mutably.
    pub(super) fn shard_mut(&mut self) -> Option<&mut B> {
        match self {
            Self::Sharded { shard, .. } => shard.as_mut(),
            _ => None,
        }
    }

    /// The reduced partition, handed to a reduce-scatter as its output.
    pub(super) fn take_shard(&mut self) -> Option<B> {
        match self {
            Self::Sharded { shard, .. } => shard.take(),
            _ => None,
        }
    }

    /// A reduce-scatter's output back as the reduced partition.
    pub(super) fn put_shard(&mut self, buf: B) {
        if let Self::Sharded { shard, .. } = self {
            *shard = Some(buf);
        }
    }

    /// Whether the partition holds nothing of the window yet (always at stages 0–1).
    pub(super) fn fresh(&self) -> bool {
        match self {
            Self::Sharded { fresh, .. } => *fresh,
            _ => true,
        }
    }

    /// The next reduction of the window is not its first (or is, after a step).
    pub(super) fn set_fresh(&mut self, value: bool) {
        if let Self::Sharded { fresh, .. } = self {
            *fresh = value;
        }
    }

    /// The gradients this bucket keeps at rest, as the memory report counts them: the
    /// whole gradients at stages 0–1, the partition at 2–3.
    pub(super) fn kept(&self) -> Option<&B> {
        match self {
            Self::Whole { grads, .. } => grads.as_ref(),
            Self::Sharded { shard, .. } => shard.as_ref(),
            Self::Frozen => None,
        }
    }

    /// Every buffer it holds now (to zero them).
    pub(super) fn buffers_mut(&mut self) -> Vec<&mut B> {
        match self {
            Self::Whole { grads, accum } => grads.iter_mut().chain(accum.iter_mut()).collect(),
            Self::Sharded {
                staging,
                shard,
                accum,
                ..
            } => staging
                .iter_mut()
                .chain(shard.iter_mut())
                .chain(accum.iter_mut())
                .collect(),
            Self::Frozen => Vec::new(),
        }
    }
}
