//! Where a bucket's fp32 master weights are: their own buffer, or, when the parameters
//! are fp32 and the state is not offloaded, the parameters' own held range. fp32 weights
//! need no second copy: the optimizer updates the parameters in place, as DeepSpeed's
//! optimizer steps fp32 parameters, and stage 0 keeps 16 bytes per parameter
//! (parameters, gradients and two moments), not 20.

use super::Engine;
use crate::device::Device;
use crate::EngineError;
use std::ops::Range;
use zero_comm::Communicator;

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Whether the master weights are kept apart from the parameters: 16-bit parameters,
    /// or an optimizer state (or stage 3's parameter partitions) living off the device.
    pub(super) fn keeps_master_apart(
        dtype: zero_kernels::DType,
        state_offloaded: bool,
        params_offloaded: bool,
    ) -> bool {
        dtype != zero_kernels::DType::F32 || state_offloaded || params_offloaded
    }

    /// Elements of bucket `b`'s optimizer state this rank holds (on the device).
    pub(super) fn held_len(&self, b: usize) -> usize {
        self.dev.len(&self.buckets[b].opt.exp_avg)
    }

    /// Where bucket `b`'s held element 0 is in its parameter buffer: 0 where the buffer
    /// is what the rank holds (stage 0's whole bucket, stage 3's partition), else the
    /// start of the rank's partition.
    pub(super) fn held_param_offset(&self, b: usize) -> Result<usize, EngineError> {
        Ok(
            if !self.policy.shards_optimizer() || self.params_sharded(b) {
                0
            } else {
                self.plan.buckets[b]
                    .layout
                    .partition_range(self.shard.rank)?
                    .start
            },
        )
    }

    /// Held array `kind` of bucket `b` (0 master, 1 exp_avg, 2 exp_avg_sq): its buffer and
    /// where held element 0 is in it.
    pub(super) fn held_array(
        &self,
        b: usize,
        kind: usize,
    ) -> Result<(&C::Buffer, usize), EngineError> {
        match self.buckets[b].opt.array(kind) {
            Some(buf) => Ok((buf, 0)),
            None => {
                let at = self.held_param_offset(b)?;
                let params = self.buckets[b].params.get()?;
                Ok((params, at))
            }
        }
    }

    /// The device, bucket `b`'s master weights to write, and where held element 0 is in
    /// the buffer.
    pub(super) fn master_mut(
        &mut self,
        b: usize,
    ) -> Result<(&D, &mut C::Buffer, usize), EngineError> {
        let at = if self.buckets[b].opt.master.is_some() {
            0
        } else {
            self.held_param_offset(b)?
        };
        let state = &mut self.buckets[b];
        let buf = match state.opt.master.as_mut() {
            Some(m) => m,
            None => state.params.get_mut()?,
        };
        Ok((&self.dev, buf, at))
    }

    /// Elements `r` of bucket `b`'s held master weights, as a range of the buffer
    /// [`held_array`](Self::held_array) gives.
    pub(super) fn held_range(at: usize, r: Range<usize>) -> Range<usize> {
        at + r.start..at + r.end
    }
}
