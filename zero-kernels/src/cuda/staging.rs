//! Host tables for kernels and large transfers, staged through pinned memory.
//!
//! A copy from pageable host memory "might be synchronous" (CUDA's words): the driver may
//! still read the host buffer after the call returns, so a table in a `Vec` could be freed
//! before it was read. Pinned memory is copied by DMA, truly asynchronously, so the host
//! side must stay alive and unchanged until the copy has run. Here it does: every copy
//! goes through a [`PinnedBuffer`], which records its own event after each copy and is
//! written, read or freed again only after that event (see `copies`). Each copy moves
//! exactly the elements asked for, never a whole buffer.

use super::copies::{Direction, PinnedBuffer};
use super::data::GpuElement;
use super::error::{driver, GpuError};
use crate::DType;
use std::any::Any;
use std::sync::{Arc, Mutex};
use zero_sys::cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};

/// Pinned slots per stream.
const SLOTS: usize = 4;
/// The smallest slot, in `u64`s (a 2,000-tensor copy table is 8,000).
const MIN_SLOT: usize = 4096;

/// A ring of pinned host buffers for one stream's table uploads.
#[derive(Debug, Default)]
pub(crate) struct TableStaging {
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    slots: Vec<PinnedBuffer<u64>>,
    /// Each slot's device table, kept from call to call (grown when a longer table comes,
    /// replaced while a caller still holds it): a stream-ordered allocation per launch
    /// costs a mapping of fresh memory after every synchronize, since the pool's release
    /// threshold is 0 (measured on an H200: docs/BENCHMARKS.md, flatten's per-call cost).
    device: Vec<Arc<CudaSlice<u64>>>,
    next: usize,
}

impl TableStaging {
    /// A device copy of `table` in its first `table.len()` elements (the slice may be
    /// longer), queued on `stream`: the slot's device table is written again only after
    /// this stream ran every launch queued before (same stream), so the kernel that reads
    /// it has finished.
    pub(crate) fn upload(
        &self,
        stream: &Arc<CudaStream>,
        table: &[u64],
    ) -> Result<Arc<CudaSlice<u64>>, GpuError> {
        let mut guard = self.ring.lock().map_err(|_| GpuError::Driver {
            context: "table staging",
            message: "a thread panicked while staging a table".into(),
        })?;
        let ring = &mut *guard;
        let i = ring.next % SLOTS;
        ring.next = ring.next.wrapping_add(1);
        let need = table.len().max(MIN_SLOT).next_power_of_two();
        if ring.slots.get(i).is_none_or(|s| s.len() < need) {
            // The old slot's drop waits for its last copy.
            put_slot(
                &mut ring.slots,
                i,
                PinnedBuffer::new(stream, need, Direction::ToDevice)?,
            );
        }
        let reusable = ring
            .device
            .get_mut(i)
            .and_then(Arc::get_mut)
            .is_some_and(|d| d.len() >= need);
        if !reusable {
            // A table still held by a caller, or too short: a new one (the old one is
            // freed in stream order once its holder drops it).
            let fresh = Arc::new(stream.alloc_zeros::<u64>(need).map_err(driver("alloc"))?);
            put_slot(&mut ring.device, i, fresh);
        }
        let dev = ring
            .device
            .get_mut(i)
            .and_then(Arc::get_mut)
            .ok_or(GpuError::Driver {
                context: "table staging",
                message: "a new device table is already shared".into(),
            })?;
        let mut exact = dev.slice_mut(0..table.len());
        // Waits for this slot's previous copy before overwriting it; returns before this
        // copy runs.
        ring.slots[i].send(stream, table, &mut exact)?;
        Ok(Arc::clone(&ring.device[i]))
    }
}

/// Puts `x` in ring slot `i`, replacing what was there (slots are filled in order, so `i`
/// is at most one past the last).
fn put_slot<T>(slots: &mut Vec<T>, i: usize, x: T) {
    if i < slots.len() {
        slots[i] = x;
    } else {
        slots.push(x);
    }
}

/// A buffer of zero bytes per stream, the source of flatten's padding: kept and grown as
/// the longest gap asks (never written after its first fill, so every launch on the
/// stream may read it), instead of a zeroed allocation per call.
#[derive(Debug, Default)]
pub(crate) struct ZeroBytes {
    buf: Mutex<Option<CudaSlice<u8>>>,
}

impl ZeroBytes {
    /// Runs `f` with at least `bytes` zero bytes on `stream`'s device (the lock held).
    pub(crate) fn with<R>(
        &self,
        stream: &Arc<CudaStream>,
        bytes: usize,
        f: impl FnOnce(&CudaSlice<u8>) -> Result<R, GpuError>,
    ) -> Result<R, GpuError> {
        let mut guard = self.buf.lock().map_err(|_| GpuError::Driver {
            context: "padding zeros",
            message: "a thread panicked while using the padding zeros".into(),
        })?;
        let need = bytes.max(512).next_power_of_two();
        let zeros = match guard.take() {
            Some(z) if z.len() >= need => z,
            // The old buffer is freed in stream order, after the launches that read it.
            _ => stream.alloc_zeros::<u8>(need).map_err(driver("alloc"))?,
        };
        let zeros = guard.insert(zeros);
        f(zeros)
    }
}

/// Bytes of each pinned buffer large transfers go through (16 MiB).
const TRANSFER_BYTES: usize = 16 << 20;

/// Pinned buffers of one element type for large transfers: two for downloads (one
/// crossing while the host empties the other) and a ring of [`UPLOAD_SLOTS`] for uploads.
struct Pinned<T: GpuElement> {
    down: Vec<PinnedBuffer<T>>,
    up: Vec<PinnedBuffer<T>>,
    next_up: usize,
}

/// Uploads queued ahead of the GPU: while one slot's copy runs, the host fills the other.
const UPLOAD_SLOTS: usize = 2;
/// Download buffers: chunk k+1 crosses while the host copies chunk k out.
const DOWNLOAD_SLOTS: usize = 2;

/// Large device ↔ host copies through pinned memory, a chunk of [`TRANSFER_BYTES`] at a
/// time, so the DMA runs at full PCIe speed and the pinned memory held stays small:
/// - a download queues chunk k+1 into one pinned buffer while the host copies chunk k out
///   of the other (returns once the host slice holds the data);
/// - an upload copies the host slice into a pinned slot, queues the DMA straight into
///   the destination range and returns: the slot is written again only after its copy
///   finished, so the host computes the next chunk while this one crosses (the offload
///   step's overlap).
#[derive(Default)]
pub(crate) struct TransferStaging {
    by_type: Mutex<Vec<(DType, Box<dyn Any + Send>)>>,
}

impl std::fmt::Debug for TransferStaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferStaging").finish()
    }
}

fn poisoned(context: &'static str) -> GpuError {
    GpuError::Driver {
        context,
        message: "a thread panicked while staging a transfer".into(),
    }
}

impl TransferStaging {
    /// Runs `f` on `T`'s pinned buffers.
    fn with<T: GpuElement, R>(
        &self,
        f: impl FnOnce(&mut Pinned<T>) -> Result<R, GpuError>,
    ) -> Result<R, GpuError> {
        let mut all = self
            .by_type
            .lock()
            .map_err(|_| poisoned("transfer staging"))?;
        let at = match all.iter().position(|(d, _)| *d == T::DTYPE) {
            Some(i) => i,
            None => {
                let fresh: Pinned<T> = Pinned {
                    down: Vec::new(),
                    up: Vec::new(),
                    next_up: 0,
                };
                all.push((T::DTYPE, Box::new(fresh)));
                all.len() - 1
            }
        };
        let pinned = all[at]
            .1
            .downcast_mut::<Pinned<T>>()
            .ok_or_else(|| poisoned("transfer staging"))?;
        f(pinned)
    }

    /// Elements of `T` per chunk.
    fn chunk<T: GpuElement>() -> usize {
        TRANSFER_BYTES / std::mem::size_of::<T>()
    }

    /// Copies `src` into `dst` (equal lengths); returns once `dst` holds the data.
    pub(crate) fn download<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaView<'_, T>,
        dst: &mut [T],
    ) -> Result<(), GpuError> {
        super::copies::check_exact("pinned download", src.len(), dst.len())?;
        let (chunk, len) = (Self::chunk::<T>(), dst.len());
        let chunks = len.div_ceil(chunk);
        self.with::<T, _>(|p| {
            while p.down.len() < DOWNLOAD_SLOTS.min(chunks) {
                p.down
                    .push(PinnedBuffer::new(stream, chunk, Direction::ToHost)?);
            }
            let piece = |k: usize| src.slice(k * chunk..((k + 1) * chunk).min(len));
            if chunks > 0 {
                p.down[0].queue_download(stream, &piece(0))?;
            }
            for k in 0..chunks {
                if k + 1 < chunks {
                    p.down[(k + 1) % DOWNLOAD_SLOTS].queue_download(stream, &piece(k + 1))?;
                }
                let host = p.down[k % DOWNLOAD_SLOTS].downloaded()?;
                dst[k * chunk..k * chunk + host.len()].copy_from_slice(host);
            }
            Ok(())
        })
    }

    /// Queues copies of `src` into `dst` (equal lengths) and returns before they run; the
    /// host may reuse `src` at once. Each chunk goes pinned slot → its range of `dst`, on
    /// `stream`, moving exactly its own elements.
    pub(crate) fn upload<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        src: &[T],
        dst: &mut CudaViewMut<'_, T>,
    ) -> Result<(), GpuError> {
        super::copies::check_exact("pinned upload", dst.len(), src.len())?;
        let chunk = Self::chunk::<T>();
        self.with::<T, _>(|p| {
            let mut at = 0;
            while at < src.len() {
                let n = chunk.min(src.len() - at);
                let i = p.next_up % UPLOAD_SLOTS;
                p.next_up = p.next_up.wrapping_add(1);
                if p.up.len() <= i {
                    p.up.push(PinnedBuffer::new(stream, chunk, Direction::ToDevice)?);
                }
                let mut piece = dst.slice_mut(at..at + n);
                // Waits for this slot's previous copy, then queues this one and returns.
                p.up[i].send(stream, &src[at..at + n], &mut piece)?;
                at += n;
            }
            Ok(())
        })
    }
}
