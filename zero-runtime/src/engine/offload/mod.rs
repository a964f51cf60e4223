//! The optimizer state off the device: in host memory (`offload_optimizer.device: cpu`,
//! ZeRO-Offload) or in NVMe swap files (`nvme`, ZeRO-Infinity), for stages 1–3.
//!
//! The owned partition of each bucket is cut into **sub-groups** of at most
//! `sub_group_size` elements; a sub-group is the unit every offloaded step moves:
//! its gradients cross to the host once (in the gradient buffer's dtype, or the
//! accumulator's `grad_accum_dtype` with accumulation), the CPU runs the fused Adam on it (unscale, clip,
//! Adam, cast to 16-bit in one pass: the same kernel, so the same bits as on the device),
//! and its 16-bit parameters cross back once. On NVMe each sub-group's fp32 state is one
//! aligned block `[master | exp_avg | exp_avg_sq]` of the rank's swap file, and the step
//! pipelines it: the next block is read while this one is stepped and the previous one
//! written. The engine's step code is the same for every tier (`step.rs`).
//!
//! Host memory comes from a [`HostArena`] with a budget in bytes (`ZERO_HOST_MEMORY_BUDGET`,
//! else the memory the system reports available), so running out is an error naming the
//! numbers at start-up, never an allocation failure mid-run.

mod grads;
mod params;
mod shards;
mod state;
mod step;

pub(crate) use grads::HostGrads;
pub(crate) use params::ParamTier;
pub(crate) use state::Staging;
pub(crate) use step::stage_elements;

use crate::config::{AioConfig, OffloadDevice, OffloadOptimizerConfig};
use crate::io::{check_direct, AlignedBuf, SwapFile, ALIGN};
use crate::EngineError;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use zero_comm::HostBuffer;
use zero_kernels::DType;

/// Host memory handed out against a budget.
#[derive(Debug)]
pub struct HostArena {
    budget: usize,
    used: AtomicUsize,
}

impl HostArena {
    /// An arena of `budget` bytes.
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            used: AtomicUsize::new(0),
        }
    }

    /// The budget: `ZERO_HOST_MEMORY_BUDGET` (bytes) if set, else what the system reports
    /// available (`MemAvailable`), else unlimited.
    pub fn default_budget() -> usize {
        if let Some(b) = std::env::var("ZERO_HOST_MEMORY_BUDGET")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
        {
            return b;
        }
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemAvailable:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
            })
            .map_or(usize::MAX, |kb| kb * 1024)
    }

    /// Bytes handed out.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Accounts `bytes` for `what`, or the error naming the budget.
    pub fn reserve(&self, bytes: usize, what: &str) -> Result<(), EngineError> {
        let now = self.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if now > self.budget {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return Err(EngineError::Device(format!(
                "host memory: {what} needs {bytes} bytes, and {} of the budget of {} are taken (set ZERO_HOST_MEMORY_BUDGET, or offload to nvme)",
                now - bytes,
                self.budget
            )));
        }
        Ok(())
    }

    /// Returns `bytes` to the budget.
    pub fn release(&self, bytes: usize) {
        self.used
            .fetch_sub(bytes.min(self.used()), Ordering::Relaxed);
    }

    /// `n` zeroed `f32`s, accounted.
    pub fn f32s(&self, n: usize, what: &str) -> Result<Vec<f32>, EngineError> {
        self.reserve(4 * n, what)?;
        Ok(vec![0.0; n])
    }

    /// An aligned buffer of `bytes`, accounted.
    pub fn aligned(&self, bytes: usize, what: &str) -> Result<AlignedBuf, EngineError> {
        let b = AlignedBuf::new(bytes);
        self.reserve(b.len(), what)?;
        Ok(b)
    }

    /// A host buffer of `n` elements of `dtype`, accounted.
    pub fn buffer(&self, dtype: DType, n: usize, what: &str) -> Result<HostBuffer, EngineError> {
        self.reserve(n * dtype.size_of(), what)?;
        Ok(HostBuffer::zeros(dtype, n))
    }
}

/// One sub-group: a range of a bucket's owned optimizer state, and its NVMe block.
#[derive(Debug, Clone)]
pub(crate) struct SubGroup {
    /// The bucket.
    pub bucket: usize,
    /// Elements of the bucket's owned state (its partition).
    pub range: Range<usize>,
    /// Where its block starts in the swap file.
    pub offset: u64,
    /// The block's length in bytes (12 per element, padded to [`ALIGN`]).
    pub block: usize,
}

impl SubGroup {
    fn len(&self) -> usize {
        self.range.len()
    }
}

/// Where the state is.
pub(crate) enum Store {
    /// Per bucket: master, exp_avg, exp_avg_sq.
    Host(Vec<[Vec<f32>; 3]>),
    /// The rank's swap file and its pipeline buffers.
    Nvme {
        file: SwapFile,
        buffers: Vec<AlignedBuf>,
        /// The block last read outside the step (a save reads each block once per file
        /// rather than once per parameter): its sub-group and buffer.
        cache: Option<(usize, AlignedBuf)>,
    },
}

/// The NVMe pipeline's buffers: how many, and how large (the largest block).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pipeline {
    pub count: usize,
    pub bytes: usize,
}

impl Pipeline {
    /// Tops `buffers` back up to `count` after a failed transfer kept one (a failed
    /// transfer's buffer does not come back).
    pub fn refill(&self, buffers: &mut Vec<AlignedBuf>) {
        while buffers.len() < self.count {
            buffers.push(AlignedBuf::new(self.bytes));
        }
    }
}

/// This rank's offloaded optimizer.
pub(crate) struct Offload {
    pub groups: Vec<SubGroup>,
    pub store: Store,
    pub arena: HostArena,
    /// Host staging of a chunk of a sub-group's gradients (by dtype: an fp32 accumulator,
    /// or 16-bit), double: one chunk arrives while the one before is stepped; and of a
    /// chunk of parameters.
    pub grads: [HostBuffer; 2],
    pub params: HostBuffer,
    /// Bytes of state in the host tier, and on NVMe (the swap file, with each block's
    /// alignment padding).
    pub host_state: usize,
    pub nvme_state: u64,
    /// Stages 2–3: the reduced gradient partitions, in host memory (stage 1 keeps whole
    /// gradients on the device, as it does without offloading).
    pub host_grads: Option<HostGrads>,
    aio: AioConfig,
    pipeline: Pipeline,
}

/// The swap file's name in `nvme_path/zero/rank{r}/`.
const SWAP_FILE: &str = "optimizer.swp";

impl Offload {
    /// Lays out the state of buckets whose owned partitions are `owned[b]` elements,
    /// allocating the host tier or creating the swap file (with its start-up checks).
    /// `dtypes` are the parameters' and the gradients' the optimizer reads (the
    /// accumulator's with accumulation at stages 2–3).
    pub fn new(
        cfg: &OffloadOptimizerConfig,
        aio: AioConfig,
        sub_group_size: u64,
        owned: &[usize],
        (dtype, grad_dtype): (DType, DType),
        rank: usize,
    ) -> Result<Self, EngineError> {
        let sub = (sub_group_size.min(usize::MAX as u64) as usize).max(1);
        let mut groups = Vec::new();
        let mut offset = 0u64;
        for (b, &n) in owned.iter().enumerate() {
            let mut at = 0;
            while at < n {
                let len = sub.min(n - at);
                let block = (12 * len).div_ceil(ALIGN) * ALIGN;
                groups.push(SubGroup {
                    bucket: b,
                    range: at..at + len,
                    offset,
                    block,
                });
                offset += block as u64;
                at += len;
            }
        }
        let largest = groups
            .iter()
            .map(SubGroup::len)
            .max()
            .unwrap_or(0)
            .min(step::stage_elements());
        let arena = HostArena::new(HostArena::default_budget());
        // Two gradient chunks: one arrives while the one before is stepped.
        let grads = [
            arena.buffer(grad_dtype, largest, "the gradient staging of one chunk")?,
            arena.buffer(grad_dtype, largest, "the gradient staging of one chunk")?,
        ];
        let params = arena.buffer(dtype, largest, "the parameter staging of one chunk")?;
        let mut pipeline = Pipeline::default();
        let (store, host_state, nvme_state) = match cfg.device {
            OffloadDevice::Cpu | OffloadDevice::None => {
                let mut per = Vec::with_capacity(owned.len());
                for &n in owned {
                    per.push([
                        arena.f32s(n, "the fp32 master weights")?,
                        arena.f32s(n, "exp_avg")?,
                        arena.f32s(n, "exp_avg_sq")?,
                    ]);
                }
                let bytes = owned.iter().sum::<usize>() * 12;
                (Store::Host(per), bytes, 0)
            }
            OffloadDevice::Nvme => {
                let root = cfg.nvme_path.clone().ok_or_else(|| {
                    EngineError::Device("offload_optimizer.nvme_path is not set".into())
                })?;
                let dir = root.join("zero").join(format!("rank{rank}"));
                std::fs::create_dir_all(&dir)
                    .map_err(|e| EngineError::Device(format!("creating {}: {e}", dir.display())))?;
                check_direct(&dir).map_err(|e| EngineError::Device(e.to_string()))?;
                let free = zero_sys::fs::free_bytes(&dir)
                    .map_err(|e| EngineError::Device(format!("{}: {e}", dir.display())))?;
                if free < offset {
                    return Err(EngineError::Device(format!(
                        "{}: the optimizer state needs {offset} bytes of NVMe, and the file system has {free} free",
                        dir.display()
                    )));
                }
                let largest_block = groups.iter().map(|g| g.block).max().unwrap_or(ALIGN);
                let count = (cfg.buffer_count as usize).max(3);
                // No locked-memory check: these buffers are ordinary heap memory, and the
                // device's pinned staging comes from cuMemHostAlloc, which the driver pins
                // without charging RLIMIT_MEMLOCK (docs/OFFLOAD.md, "Start-up checks").
                pipeline = Pipeline {
                    count,
                    bytes: largest_block,
                };
                let mut buffers = Vec::with_capacity(count);
                for _ in 0..count {
                    buffers.push(arena.aligned(
                        largest_block,
                        &format!("an NVMe pipeline buffer (sub_group_size {sub})"),
                    )?);
                }
                let workers = (aio.intra_op_parallelism * aio.queue_depth).clamp(1, 64) as usize;
                let file = SwapFile::create(
                    &dir.join(SWAP_FILE),
                    offset,
                    workers,
                    aio.block_size as usize,
                )
                .map_err(|e| EngineError::Device(e.to_string()))?;
                (
                    Store::Nvme {
                        file,
                        buffers,
                        cache: None,
                    },
                    0,
                    offset,
                )
            }
        };
        Ok(Self {
            groups,
            store,
            arena,
            grads,
            params,
            host_state,
            nvme_state,
            host_grads: None,
            aio,
            pipeline,
        })
    }

    /// Its bytes, by tier and category, and the bytes of its gradient partitions whose
    /// pages went back to the kernel. `dtype`: the gradients'.
    pub fn report(
        &self,
        host: &mut crate::engine::TierBytes,
        nvme: &mut crate::engine::TierBytes,
        dtype: DType,
    ) -> usize {
        let array = 4 * self.groups.iter().map(SubGroup::len).sum::<usize>();
        let tier = match self.store {
            Store::Host(_) => &mut *host,
            Store::Nvme { .. } => {
                // Each block is padded to the alignment.
                nvme.buffers += (self.nvme_state as usize).saturating_sub(3 * array);
                &mut *nvme
            }
        };
        tier.master += array;
        tier.exp_avg += array;
        tier.exp_avg_sq += array;
        let (grads, accum, carry, released) = self
            .host_grads
            .as_ref()
            .map_or((0, 0, 0, 0), |g| g.bytes(dtype));
        host.grads += grads;
        host.grad_accum += accum;
        // Staging is in the arena (the partitions' included); a reopened micro-step's
        // carries are not.
        host.buffers += carry
            + self
                .arena
                .used()
                .saturating_sub(self.host_state + grads + accum);
        released
    }
}

impl Drop for Offload {
    /// The swap file is scratch (unlinked since it was created; checkpoints hold the
    /// state): it goes with the engine, and so does its folder when empty.
    fn drop(&mut self) {
        self.uncache();
        if let Store::Nvme { file, .. } = &self.store {
            let path = file.path().to_path_buf();
            // Closing first: the I/O thread is joined when the store goes.
            self.store = Store::Host(Vec::new());
            if let Some(dir) = path.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}
