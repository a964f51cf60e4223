//! Stages 2–3 with `offload_optimizer`: the reduced gradient partitions live in host
//! memory, beside the optimizer state that reads them, as DeepSpeed keeps them (its
//! stage 1–2 `single_partition_of_fp32_groups[i].grad` and stage 3's
//! `fp32_partitioned_groups_flat[i].grad` are pinned CPU tensors). The device keeps only
//! the reduce-scatter's staging and output; each reduced partition crosses to the host
//! as its reduction finishes.
//!
//! A partition is kept in the dtype the step reads: the gradients' own, or the fp32
//! accumulator's when a window of 16-bit gradients is summed in fp32
//! (`data_types.grad_accum_dtype`). The arithmetic is the device path's, on the host's
//! kernels (`HostDevice`), which compute the device kernels' function: the window's first
//! reduction is copied in and the later ones added (summing in the gradients' dtype), or
//! every one is added into the zeroed fp32 accumulator.

use super::HostArena;
use crate::device::{Device, HostDevice};
use crate::EngineError;
use zero_comm::HostBuffer;
use zero_kernels::{DType, GradStats};

/// Each trainable bucket's reduced gradient partition, in host memory.
pub(crate) struct HostGrads {
    /// Per trainable bucket: the partition the step reads.
    shards: Vec<HostBuffer>,
    /// Per bucket: the fp32 sum of a micro-step reopened after its reductions (see
    /// `Engine::reopen_micro_step`); dropped after the step.
    carry: Vec<Option<HostBuffer>>,
    /// Per bucket: bytes of its partition handed back to the kernel since the last step
    /// (a host mapping's pages, until the next reduction writes them).
    released: Vec<usize>,
    /// A reduced partition that is added in crosses to the host through this buffer
    /// (the gradients' dtype, at most one chunk of the offloaded step's staging).
    staging: Option<HostBuffer>,
}

impl HostGrads {
    /// Partitions of `owned[b]` elements in `kept` (the dtype the step reads); `adds`
    /// when a window can add a reduction into a partition (accumulation), which needs a
    /// staging buffer of at most `chunk` elements in `reduced`, the dtype the
    /// reductions produce.
    pub fn new(
        arena: &HostArena,
        owned: &[usize],
        (kept, reduced): (DType, DType),
        adds: bool,
        chunk: usize,
    ) -> Result<Self, EngineError> {
        let mut shards = Vec::with_capacity(owned.len());
        for &n in owned {
            shards.push(arena.buffer(kept, n, "a gradient partition")?);
        }
        let staging = if adds {
            let largest = owned.iter().copied().max().unwrap_or(0).min(chunk);
            Some(arena.buffer(
                reduced,
                largest,
                "the staging of a gradient partition added in",
            )?)
        } else {
            None
        };
        Ok(Self {
            carry: vec![None; shards.len()],
            released: vec![0; shards.len()],
            shards,
            staging,
        })
    }

    /// Bucket `b`'s reduced partition, `src[..len]` on `dev`, copied in (`add` false: the
    /// window's first, or every one without accumulation) or added.
    pub fn receive<D: Device>(
        &mut self,
        dev: &D,
        b: usize,
        src: &D::Buffer,
        add: bool,
    ) -> Result<(), EngineError> {
        let shard = self.shard_mut(b)?;
        let len = shard.len();
        self.released[b] = 0;
        if !add {
            return dev.copy_to_host(src, 0..len, &mut self.shards[b], 0);
        }
        let staging = self.staging.as_mut().ok_or_else(|| {
            EngineError::Internal("a gradient partition added in without its staging".into())
        })?;
        let chunk = staging.len().max(1);
        for at in (0..len).step_by(chunk) {
            let n = chunk.min(len - at);
            dev.copy_to_host(src, at..at + n, staging, 0)?;
            HostDevice.accumulate(&mut self.shards[b], at, staging, 0..n)?;
        }
        Ok(())
    }

    fn shard_mut(&mut self, b: usize) -> Result<&mut HostBuffer, EngineError> {
        let n = self.shards.len();
        self.shards.get_mut(b).ok_or_else(|| {
            EngineError::Internal(format!(
                "bucket {b} has no host gradient partition ({n} buckets)"
            ))
        })
    }

    /// What the step reads for bucket `b`: the carried sum when a micro-step was
    /// reopened, else the partition.
    pub fn step_grads(&self, b: usize) -> Result<&HostBuffer, EngineError> {
        match self.carry.get(b) {
            Some(Some(c)) => Ok(c),
            Some(None) => Ok(&self.shards[b]),
            None => Err(no_partition(b)),
        }
    }

    /// Whether a window's reductions are added into the partitions (accumulation): then
    /// the replicas all-reduce the window's sum once, at the step.
    pub fn adds(&self) -> bool {
        self.staging.is_some()
    }

    /// [`step_grads`](Self::step_grads), to write: the replicas' all-reduce puts the
    /// window's sum back.
    pub fn step_grads_mut(&mut self, b: usize) -> Result<&mut HostBuffer, EngineError> {
        match self.carry.get_mut(b) {
            Some(Some(c)) => Ok(c),
            Some(None) => Ok(&mut self.shards[b]),
            None => Err(no_partition(b)),
        }
    }

    /// Bucket `b`'s non-finite flag and sum of squares.
    pub fn stats(&self, b: usize) -> Result<GradStats, EngineError> {
        let g = self.step_grads(b)?;
        HostDevice.stats(g, 0..g.len())
    }

    /// Adds each partition into its fp32 carry: into the buckets that have one, or into
    /// every bucket, allocating them (`create`).
    pub fn add_into_carry(&mut self, create: bool) -> Result<(), EngineError> {
        for (shard, carry) in self.shards.iter().zip(self.carry.iter_mut()) {
            if carry.is_none() && !create {
                continue;
            }
            let c = carry.get_or_insert_with(|| HostBuffer::zeros(DType::F32, shard.len()));
            HostDevice.accumulate(c, 0, shard, 0..shard.len())?;
        }
        Ok(())
    }

    /// Zeroes every partition (a micro-step reopened after its reductions starts the
    /// partitions again from zero; its sum is in the carry).
    pub fn zero(&mut self) -> Result<(), EngineError> {
        for s in self.shards.iter_mut() {
            let n = s.len();
            HostDevice.zero(s, 0..n)?;
        }
        Ok(())
    }

    /// The window's gradients are dropped: the carries go, and each partition's pages go
    /// back to the kernel (reading as zero) until the next reduction writes it.
    pub fn clear(&mut self) -> Result<(), EngineError> {
        self.carry.iter_mut().for_each(|c| *c = None);
        for (s, r) in self.shards.iter_mut().zip(self.released.iter_mut()) {
            *r = HostDevice.zero_discarding(s)?;
        }
        Ok(())
    }

    /// Bytes by category, given the gradients' dtype: `(partitions in that dtype,
    /// partitions in another (the fp32 accumulator), carries, released)`.
    pub fn bytes(&self, dtype: DType) -> (usize, usize, usize, usize) {
        let size = |b: &HostBuffer| b.len() * b.dtype().size_of();
        let shards: usize = self.shards.iter().map(size).sum();
        let own = self.shards.first().is_none_or(|s| s.dtype() == dtype);
        let carry = self.carry.iter().flatten().map(size).sum();
        let released = self.released.iter().sum();
        if own {
            (shards, 0, carry, released)
        } else {
            (0, shards, carry, released)
        }
    }
}

fn no_partition(b: usize) -> EngineError {
    EngineError::Internal(format!("bucket {b} has no host gradient partition"))
}
