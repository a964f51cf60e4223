//! The owned 16-bit parameter partition of a bucket, wherever it lives: in the bucket's
//! device buffer, or (stage 3 with `offload_param`) in the [`ParamTier`](super::ParamTier).
//! Every reader and writer of owned parameters goes through these, so the rest of the
//! engine does not know which.

use super::super::Engine;
use crate::device::{Device, HostDevice};
use crate::EngineError;
use std::ops::Range;
use zero_comm::{Communicator, HostBuffer};

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// A device copy of bucket `b`'s owned partition when it lives in the parameter tier,
    /// to update it there; `None` when the bucket's own buffer holds it (update that in
    /// place). Write the copy back with [`tier_params_back`](Self::tier_params_back).
    pub(in crate::engine) fn tier_params_on_device(
        &mut self,
        b: usize,
    ) -> Result<Option<C::Buffer>, EngineError> {
        match self.param_tier.as_mut().filter(|t| t.holds(b)) {
            Some(tier) => {
                let n = self.plan.buckets[b].layout.partition_len();
                let mut buf = self.dev.zeros(self.dtype, n)?;
                self.dev.copy_from_host(tier.get(b)?, 0..n, &mut buf, 0)?;
                Ok(Some(buf))
            }
            None => Ok(None),
        }
    }

    /// Writes a copy from [`tier_params_on_device`](Self::tier_params_on_device) back to
    /// the parameter tier (it then leaves the device).
    pub(in crate::engine) fn tier_params_back(
        &mut self,
        b: usize,
        params: &C::Buffer,
    ) -> Result<(), EngineError> {
        let n = self.plan.buckets[b].layout.partition_len();
        match self.param_tier.as_mut() {
            Some(tier) => self.dev.copy_to_host(params, 0..n, tier.get_mut(b)?, 0),
            None => Ok(()),
        }
    }

    /// A device copy of bucket `b`'s owned partition (stage 3): the input of its gather.
    pub(in crate::engine) fn shard_input(&mut self, b: usize) -> Result<C::Buffer, EngineError> {
        if let Some(copy) = self.tier_params_on_device(b)? {
            return Ok(copy);
        }
        let n = self.plan.buckets[b].layout.partition_len();
        let shard = self.buckets[b].params.get()?;
        let mut input = self.dev.zeros(self.dtype, n)?;
        self.dev.copy(shard, 0..n, &mut input, 0)?;
        Ok(input)
    }

    /// Owned elements `range` (of bucket `b`'s partition) of the parameters, as f32.
    pub(in crate::engine) fn owned_params_f32(
        &mut self,
        b: usize,
        range: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        if let Some(tier) = self.param_tier.as_mut().filter(|t| t.holds(b)) {
            return tier.read_f32(b, range, out);
        }
        let at = self.owned_param_offset(b)?;
        let params = self.buckets[b].params.get()?;
        self.dev
            .download_f32_into(params, at + range.start..at + range.end, out)
    }

    /// Writes `vals` at owned element `at` of bucket `b`'s parameters (rounded).
    pub(in crate::engine) fn upload_owned_f32(
        &mut self,
        b: usize,
        at: usize,
        vals: &[f32],
    ) -> Result<(), EngineError> {
        if let Some(tier) = self.param_tier.as_mut().filter(|t| t.holds(b)) {
            return tier.put_f32(b, at, vals);
        }
        let start = self.owned_param_offset(b)?;
        let params = self.buckets[b].params.get_mut()?;
        self.dev.upload_f32(params, start + at, vals)
    }

    /// Writes host `src[range]` (the parameters' dtype) at owned element `at` of bucket
    /// `b`'s parameters: the offloaded optimizer's output crossing back.
    pub(in crate::engine) fn write_owned_params(
        &mut self,
        b: usize,
        at: usize,
        src: &HostBuffer,
        range: Range<usize>,
    ) -> Result<(), EngineError> {
        if let Some(tier) = self.param_tier.as_mut().filter(|t| t.holds(b)) {
            return HostDevice.copy(src, range, tier.get_mut(b)?, at);
        }
        let start = self.owned_param_offset(b)?;
        let params = self.buckets[b].params.get_mut()?;
        self.dev.copy_from_host(src, range, params, start + at)
    }

    /// Where bucket `b`'s owned element 0 is in its parameter buffer.
    pub(in crate::engine) fn owned_param_offset(&self, b: usize) -> Result<usize, EngineError> {
        Ok(if self.params_sharded(b) {
            0
        } else {
            self.plan.buckets[b]
                .layout
                .partition_range(self.shard.rank)?
                .start
        })
    }
}
