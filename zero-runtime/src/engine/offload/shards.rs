//! The owned 16-bit parameter partition of a bucket, wherever it lives: in the bucket's
//! device buffer, or (stage 3 with `offload_param`) in the [`ParamTier`](super::ParamTier).
//! Every reader and writer of owned parameters goes through these, so the rest of the
//! engine does not know which.

use super::super::Engine;
use crate::device::{Device, HostDevice};
use crate::EngineError;
use std::ops::Range;
use zero_comm::{Communicator, HostBuffer};

fn in_flight() -> EngineError {
    EngineError::Internal("parameters in flight".into())
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Whether bucket `b`'s owned parameters live in the parameter tier.
    pub(in crate::engine) fn params_offloaded(&self, b: usize) -> bool {
        self.param_tier.as_ref().is_some_and(|t| t.holds(b))
    }

    /// Takes bucket `b`'s parameter buffer to update it in place; an offloaded partition
    /// comes to the device for the duration. Give it back with
    /// [`put_params`](Self::put_params).
    pub(in crate::engine) fn take_params(&mut self, b: usize) -> Result<C::Buffer, EngineError> {
        match self.param_tier.as_mut().filter(|t| t.holds(b)) {
            Some(tier) => {
                let n = self.plan.buckets[b].layout.partition_len();
                let mut buf = self.dev.zeros(self.dtype, n)?;
                self.dev.copy_from_host(tier.get(b)?, 0..n, &mut buf, 0)?;
                Ok(buf)
            }
            None => self.buckets[b].params.take().ok_or_else(in_flight),
        }
    }

    /// Gives back what [`take_params`](Self::take_params) took (an offloaded partition
    /// goes back to its tier and leaves the device).
    pub(in crate::engine) fn put_params(
        &mut self,
        b: usize,
        params: C::Buffer,
    ) -> Result<(), EngineError> {
        match self.param_tier.as_mut().filter(|t| t.holds(b)) {
            Some(tier) => {
                let n = self.plan.buckets[b].layout.partition_len();
                self.dev.copy_to_host(&params, 0..n, tier.get_mut(b)?, 0)
            }
            None => {
                self.buckets[b].params = Some(params);
                Ok(())
            }
        }
    }

    /// A device copy of bucket `b`'s owned partition (stage 3): the input of its gather.
    pub(in crate::engine) fn shard_input(&mut self, b: usize) -> Result<C::Buffer, EngineError> {
        if self.params_offloaded(b) {
            return self.take_params(b);
        }
        let n = self.plan.buckets[b].layout.partition_len();
        let shard = self.buckets[b].params.as_ref().ok_or_else(in_flight)?;
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
        let params = self.buckets[b].params.as_ref().ok_or_else(in_flight)?;
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
        let params = self.buckets[b].params.as_mut().ok_or_else(in_flight)?;
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
        let params = self.buckets[b].params.as_mut().ok_or_else(in_flight)?;
        self.dev.copy_from_host(src, range, params, start + at)
    }

    /// Where bucket `b`'s owned element 0 is in its parameter buffer.
    pub(in crate::engine) fn owned_param_offset(&self, b: usize) -> Result<usize, EngineError> {
        Ok(if self.params_sharded(b) {
            0
        } else {
            self.plan.buckets[b]
                .layout
                .partition_range(self.rank)?
                .start
        })
    }
}
