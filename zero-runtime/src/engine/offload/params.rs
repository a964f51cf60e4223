//! `offload_param` (stage 3): the 16-bit owned partition of every sharded bucket lives off
//! the device, in host memory (`cpu`) or in a swap file (`nvme`), and crosses to the
//! device only to be all-gathered. Persistent buckets (at or under
//! `stage3_param_persistence_threshold`) stay on the device, as in DeepSpeed.
//!
//! On NVMe each partition is one aligned block of `nvme_path/zero/rank{r}/params.swp`; one
//! bucket's block at a time is open in host memory (read on first use, written back when
//! another bucket opens or at [`ParamTier::flush`]), so the step, which updates the
//! buckets in order, reads and writes each block once. Blocks the forward and backward
//! will gather next are read ahead ([`ParamTier::read_ahead`], called by stage 3's
//! prefetch with the trace's next buckets) into `offload_param.buffer_count - 1` spare
//! buffers, so opening them waits for nothing (DeepSpeed's parameter swapper prefetches
//! with the same buffers). A block is never read ahead while it is open, so no read ahead
//! can miss a write: a block is written only when it closes, and its reads ahead were all
//! taken when it opened.

use super::HostArena;
use crate::config::{AioConfig, OffloadDevice, OffloadParamConfig};
use crate::device::{Device, HostDevice};
use crate::io::{check_direct, AlignedBuf, SwapFile, Ticket, ALIGN};
use crate::EngineError;
use std::collections::VecDeque;
use zero_comm::HostBuffer;
use zero_kernels::DType;

fn io(e: crate::io::IoError) -> EngineError {
    EngineError::Device(e.to_string())
}

/// Where the partitions are (one per engine: the size difference of the variants does not
/// matter).
#[allow(clippy::large_enum_variant)]
enum Store {
    /// Per bucket: its owned partition, for the buckets the tier holds.
    Host(Vec<Option<HostBuffer>>),
    /// The swap file, each held bucket's block (offset, bytes), the open block, the blocks
    /// read ahead and the idle buffers to read ahead into.
    Nvme {
        file: SwapFile,
        blocks: Vec<Option<(u64, usize)>>,
        open: Option<Open>,
        io: AlignedBuf,
        host: HostBuffer,
        ahead: VecDeque<(usize, Ticket)>,
        spare: Vec<AlignedBuf>,
    },
}

/// How the NVMe blocks were opened: read ahead (the read was in flight or done) or read
/// when asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockReads {
    /// Blocks opened from a read ahead.
    pub ahead: u64,
    /// Blocks read when opened.
    pub waited: u64,
}

/// The NVMe block in host memory.
struct Open {
    bucket: usize,
    dirty: bool,
}

/// The swap file's name in `nvme_path/zero/rank{r}/`.
const SWAP_FILE: &str = "params.swp";

/// This rank's offloaded parameter partitions.
pub(crate) struct ParamTier {
    store: Store,
    dtype: DType,
    parts: Vec<Option<usize>>,
    arena: HostArena,
    reads: BlockReads,
}

impl ParamTier {
    /// Holds the partitions of the buckets with `parts[b] = Some(len)` (the sharded
    /// ones), all zeros until written.
    pub fn new(
        cfg: &OffloadParamConfig,
        aio: AioConfig,
        parts: Vec<Option<usize>>,
        dtype: DType,
        rank: usize,
    ) -> Result<Self, EngineError> {
        let arena = HostArena::new(HostArena::default_budget());
        let size = dtype.size_of();
        let store = match cfg.device {
            OffloadDevice::Cpu | OffloadDevice::None => {
                let mut per = Vec::with_capacity(parts.len());
                for p in &parts {
                    per.push(match p {
                        Some(n) => Some(arena.buffer(dtype, *n, "the offloaded parameters")?),
                        None => None,
                    });
                }
                Store::Host(per)
            }
            OffloadDevice::Nvme => {
                let largest = parts.iter().flatten().copied().max().unwrap_or(0);
                if (cfg.buffer_size as usize) < largest {
                    return Err(EngineError::Device(format!(
                        "offload_param.buffer_size is {} elements, and the largest parameter partition has {largest}: raise buffer_size or lower reduce_bucket_size",
                        cfg.buffer_size
                    )));
                }
                let root = cfg.nvme_path.clone().ok_or_else(|| {
                    EngineError::Device("offload_param.nvme_path is not set".into())
                })?;
                let dir = root.join("zero").join(format!("rank{rank}"));
                std::fs::create_dir_all(&dir)
                    .map_err(|e| EngineError::Device(format!("creating {}: {e}", dir.display())))?;
                check_direct(&dir).map_err(io)?;
                let mut blocks = Vec::with_capacity(parts.len());
                let mut offset = 0u64;
                for p in &parts {
                    blocks.push(p.map(|n| {
                        let bytes = (n * size).div_ceil(ALIGN) * ALIGN;
                        let at = offset;
                        offset += bytes as u64;
                        (at, bytes)
                    }));
                }
                let free = zero_sys::fs::free_bytes(&dir)
                    .map_err(|e| EngineError::Device(format!("{}: {e}", dir.display())))?;
                if free < offset {
                    return Err(EngineError::Device(format!(
                        "{}: the offloaded parameters need {offset} bytes of NVMe, and the file system has {free} free",
                        dir.display()
                    )));
                }
                let largest_block = blocks.iter().flatten().map(|b| b.1).max().unwrap_or(0);
                let workers = (aio.intra_op_parallelism * aio.queue_depth).clamp(1, 64) as usize;
                let mut file = SwapFile::create(
                    &dir.join(SWAP_FILE),
                    offset,
                    workers,
                    aio.block_size as usize,
                )
                .map_err(io)?;
                let mut io_buf = arena.aligned(largest_block, "the parameter swap buffer")?;
                // A fresh file reads as zeros on most file systems, not all: write them.
                io_buf.as_mut_slice().fill(0);
                for &(at, bytes) in blocks.iter().flatten() {
                    let t = file.write(io_buf, at, bytes).map_err(io)?;
                    io_buf = file.wait(t).map_err(io)?;
                }
                let mut spare = Vec::new();
                for _ in 1..cfg.buffer_count {
                    spare.push(arena.aligned(largest_block, "the parameter read-ahead buffers")?);
                }
                Store::Nvme {
                    file,
                    blocks,
                    open: None,
                    io: io_buf,
                    host: arena.buffer(dtype, largest, "the open parameter block")?,
                    ahead: VecDeque::new(),
                    spare,
                }
            }
        };
        Ok(Self {
            store,
            dtype,
            parts,
            arena,
            reads: BlockReads::default(),
        })
    }

    /// Whether bucket `b`'s partition lives here.
    pub fn holds(&self, b: usize) -> bool {
        self.parts.get(b).is_some_and(Option::is_some)
    }

    /// Bucket `b`'s partition (its first `len` elements are the partition).
    pub fn get(&mut self, b: usize) -> Result<&HostBuffer, EngineError> {
        self.open(b, false)?;
        Ok(match &mut self.store {
            Store::Host(per) => per[b].as_ref().ok_or_else(|| not_held(b))?,
            Store::Nvme { host, .. } => host,
        })
    }

    /// Bucket `b`'s partition where it lives in host memory (`cpu`); `None` on NVMe (one
    /// block at a time is open there) or for a bucket the tier does not hold.
    pub fn host_partition(&self, b: usize) -> Option<&HostBuffer> {
        match &self.store {
            Store::Host(per) => per.get(b).and_then(Option::as_ref),
            Store::Nvme { .. } => None,
        }
    }

    /// Bucket `b`'s partition, to write.
    pub fn get_mut(&mut self, b: usize) -> Result<&mut HostBuffer, EngineError> {
        self.open(b, true)?;
        Ok(match &mut self.store {
            Store::Host(per) => per[b].as_mut().ok_or_else(|| not_held(b))?,
            Store::Nvme { host, .. } => host,
        })
    }

    /// Writes `vals` (f32, rounded to the dtype) at `at` of bucket `b`'s partition.
    pub fn put_f32(&mut self, b: usize, at: usize, vals: &[f32]) -> Result<(), EngineError> {
        let dst = self.get_mut(b)?;
        HostDevice.upload_f32(dst, at, vals)
    }

    /// Elements `range` of bucket `b`'s partition as f32.
    pub fn read_f32(
        &mut self,
        b: usize,
        range: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        let src = self.get(b)?;
        HostDevice.download_f32_into(src, range, out)
    }

    /// On NVMe, starts reading the blocks of `buckets` (in the order they will be
    /// opened) into the idle read-ahead buffers, skipping the open block, blocks already
    /// read ahead and buckets the tier does not hold; stops when no buffer is idle. Does
    /// nothing in host memory.
    pub fn read_ahead(
        &mut self,
        buckets: impl IntoIterator<Item = usize>,
    ) -> Result<(), EngineError> {
        let Store::Nvme {
            file,
            blocks,
            open,
            ahead,
            spare,
            ..
        } = &mut self.store
        else {
            return Ok(());
        };
        for b in buckets {
            let Some((at, bytes)) = blocks.get(b).copied().flatten() else {
                continue;
            };
            if open.as_ref().is_some_and(|o| o.bucket == b) || ahead.iter().any(|(x, _)| *x == b) {
                continue;
            }
            let Some(buf) = spare.pop() else {
                break; // every buffer is reading ahead already
            };
            ahead.push_back((b, file.read(buf, at, bytes).map_err(io)?));
        }
        Ok(())
    }

    /// How the NVMe blocks were opened so far; `None` in host memory.
    pub fn block_reads(&self) -> Option<BlockReads> {
        matches!(self.store, Store::Nvme { .. }).then_some(self.reads)
    }

    /// On NVMe, makes bucket `b`'s block the open one: from its read ahead if there is
    /// one, else read now.
    fn open(&mut self, b: usize, write: bool) -> Result<(), EngineError> {
        if !self.holds(b) {
            return Err(not_held(b));
        }
        let Store::Nvme { open, .. } = &mut self.store else {
            return Ok(());
        };
        if let Some(o) = open.as_mut().filter(|o| o.bucket == b) {
            o.dirty |= write;
            return Ok(());
        }
        self.flush()?;
        let Store::Nvme {
            file,
            blocks,
            open,
            io: buf,
            host,
            ahead,
            spare,
        } = &mut self.store
        else {
            return Ok(());
        };
        let n = self.parts[b].unwrap_or(0) * self.dtype.size_of();
        let read_ahead = ahead
            .iter()
            .position(|(x, _)| *x == b)
            .and_then(|i| ahead.remove(i));
        if let Some((_, t)) = read_ahead {
            let read = file.wait(t).map_err(io)?;
            copy_bytes(&read.as_slice()[..n], host)?;
            spare.push(read);
            self.reads.ahead += 1;
        } else {
            let (at, bytes) = blocks[b].ok_or_else(|| not_held(b))?;
            let t = file
                .read(std::mem::replace(buf, AlignedBuf::empty()), at, bytes)
                .map_err(io)?;
            *buf = file.wait(t).map_err(io)?;
            copy_bytes(&buf.as_slice()[..n], host)?;
            self.reads.waited += 1;
        }
        *open = Some(Open {
            bucket: b,
            dirty: write,
        });
        Ok(())
    }

    /// On NVMe, writes the open block back if it changed.
    pub fn flush(&mut self) -> Result<(), EngineError> {
        let Store::Nvme {
            file,
            blocks,
            open,
            io: buf,
            host,
            ..
        } = &mut self.store
        else {
            return Ok(());
        };
        let Some(o) = open.take() else {
            return Ok(());
        };
        if !o.dirty {
            return Ok(());
        }
        let (at, bytes) = blocks[o.bucket].ok_or_else(|| not_held(o.bucket))?;
        let n = self.parts[o.bucket].unwrap_or(0) * self.dtype.size_of();
        buf.as_mut_slice()[..n].copy_from_slice(&host_bytes(host)[..n]);
        let t = file
            .write(std::mem::replace(buf, AlignedBuf::empty()), at, bytes)
            .map_err(io)?;
        match file.wait(t) {
            Ok(b) => *buf = b,
            Err(e) => {
                *buf = AlignedBuf::new(blocks.iter().flatten().map(|b| b.1).max().unwrap_or(0));
                return Err(io(e));
            }
        }
        Ok(())
    }

    /// Its bytes: (host, nvme) of parameters, and host buffers.
    pub fn report(&self, host: &mut crate::engine::TierBytes, nvme: &mut crate::engine::TierBytes) {
        let params = self.parts.iter().flatten().sum::<usize>() * self.dtype.size_of();
        match &self.store {
            Store::Host(_) => host.params += params,
            Store::Nvme { file, .. } => {
                nvme.params += params;
                nvme.buffers += (file.len() as usize).saturating_sub(params);
                host.buffers += self.arena.used();
            }
        }
    }
}

impl Drop for ParamTier {
    /// The swap file is scratch (unlinked since it was created): it goes with the engine,
    /// and so does its folder when empty.
    fn drop(&mut self) {
        if let Store::Nvme { file, .. } = &self.store {
            let path = file.path().to_path_buf();
            self.store = Store::Host(Vec::new());
            if let Some(dir) = path.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

fn not_held(b: usize) -> EngineError {
    EngineError::Internal(format!("bucket {b}'s parameters are not offloaded"))
}

/// A host buffer's bytes.
fn host_bytes(h: &HostBuffer) -> &[u8] {
    match h {
        HostBuffer::F32(v) => bytemuck::cast_slice(v),
        HostBuffer::F16(v) => bytemuck::cast_slice(v),
        HostBuffer::BF16(v) => bytemuck::cast_slice(v),
    }
}

/// Copies `bytes` into the start of `h`.
fn copy_bytes(bytes: &[u8], h: &mut HostBuffer) -> Result<(), EngineError> {
    let dst: &mut [u8] = match h {
        HostBuffer::F32(v) => bytemuck::cast_slice_mut(v),
        HostBuffer::F16(v) => bytemuck::cast_slice_mut(v),
        HostBuffer::BF16(v) => bytemuck::cast_slice_mut(v),
    };
    dst.get_mut(..bytes.len())
        .ok_or_else(|| EngineError::Internal("parameter block larger than its buffer".into()))?
        .copy_from_slice(bytes);
    Ok(())
}
