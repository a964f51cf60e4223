//! What this rank keeps of each parameter between uses: DeepSpeed's `param.ds_tensor`.
//!
//! DeepSpeed partitions each parameter on its own (`ceil(numel / world)` elements per rank,
//! the last padded); zero partitions each bucket, so a rank's piece of one parameter is
//! the part of it that falls in the rank's partition of its bucket: possibly shorter than
//! DeepSpeed's, possibly empty, and the ranks' pieces in rank order make up the flattened
//! parameter. A parameter the engine keeps whole on every rank (below stage 3, stage 3's
//! persistent ones, trained or frozen) is held whole.

use super::Engine;
use crate::device::Device;
use crate::plan::ParamLoc;
use crate::EngineError;
use std::ops::Range;
use zero_comm::{Communicator, HostBuffer};

/// Where this rank keeps one parameter's 16-bit values between uses.
pub enum HeldParam<'a, B> {
    /// Elements `.1` of an engine buffer: the rank's partition of a sharded bucket, or the
    /// buffer holding the whole parameter.
    Buffer(&'a B, Range<usize>),
    /// Elements `.1` of its bucket's partition in the `offload_param` host tier.
    Host(&'a HostBuffer, Range<usize>),
    /// A piece of a partition in the `offload_param` NVMe swap file (read it with
    /// [`Engine::read_swapped_f32`]).
    Swapped {
        /// The bucket whose partition holds it.
        bucket: usize,
        /// Its elements in that partition.
        range: Range<usize>,
    },
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Where this rank keeps parameter `k` of module `m` between uses (see the module
    /// docs); the range is empty where the rank holds none of it.
    pub fn held_param(&self, m: usize, k: usize) -> Result<HeldParam<'_, C::Buffer>, EngineError> {
        let module = self.module(m)?;
        let spec = module.params.get(k).ok_or_else(|| EngineError::GradShape {
            module: module.name.clone(),
            detail: format!("no parameter {k}: the module has {}", module.params.len()),
        })?;
        let (bucket, index) = match self.plan.locs[self.plan.param_id(m, k)] {
            ParamLoc::Frozen { offset } => {
                return Ok(HeldParam::Buffer(
                    &self.frozen,
                    offset..offset + spec.numel(),
                ))
            }
            ParamLoc::Bucket { bucket, index } => (bucket, index),
        };
        let layout = &self.plan.buckets[bucket].layout;
        if !self.params_sharded(bucket) {
            let buf = self.buckets[bucket].params.get()?;
            return Ok(HeldParam::Buffer(buf, layout.tensor_range(index)));
        }
        let part = layout.partition_range(self.shard.rank)?.start;
        let range = layout
            .tensor_shards(index)?
            .into_iter()
            .find(|s| s.rank == self.shard.rank)
            .map_or(0..0, |s| s.flat_range.start - part..s.flat_range.end - part);
        match &self.param_tier {
            Some(tier) if tier.holds(bucket) => Ok(match tier.host_partition(bucket) {
                Some(host) => HeldParam::Host(host, range),
                None => HeldParam::Swapped { bucket, range },
            }),
            _ => {
                let buf = self.buckets[bucket].params.get()?;
                Ok(HeldParam::Buffer(buf, range))
            }
        }
    }

    /// Elements `range` of bucket `bucket`'s partition in the NVMe swap file, as f32 (a
    /// [`HeldParam::Swapped`] parameter's values).
    pub fn read_swapped_f32(
        &mut self,
        bucket: usize,
        range: Range<usize>,
    ) -> Result<Vec<f32>, EngineError> {
        let tier = self.param_tier.as_mut().ok_or_else(|| {
            EngineError::Order(
                "read_swapped_f32: no parameter is swapped (zero_optimization.offload_param is not set)"
                    .into(),
            )
        })?;
        let mut out = vec![0.0; range.len()];
        tier.read_f32(bucket, range, &mut out)?;
        Ok(out)
    }
}
