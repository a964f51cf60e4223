//! Host tables for kernels (the multi-tensor copy's entries), staged through pinned memory.
//!
//! A copy from pageable host memory "might be synchronous" (CUDA's words): the driver may
//! still read the host buffer after the call returns, so a table in a `Vec` could be freed
//! before it was read. Pinned memory is copied by DMA, truly asynchronously, so the host
//! side must stay alive and unchanged until the copy has run. Here it does: tables go
//! through a small ring of pinned slots, and a slot is written again only after `cudarc`'s
//! event on it says its previous copy finished (`PinnedHostSlice::as_mut_slice` waits for
//! it). With [`SLOTS`] slots the host can queue that many table copies ahead of the GPU.

use super::buffer::GpuElement;
use super::gpu::{driver, GpuError};
use crate::DType;
use std::any::Any;
use std::sync::{Arc, Mutex};
use zero_sys::cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, PinnedHostSlice};

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
    slots: Vec<PinnedHostSlice<u64>>,
    next: usize,
}

impl TableStaging {
    /// A device copy of `table`, queued on `stream`. The returned allocation may be
    /// longer than the table (it is as long as the slot); the kernel is told the length.
    pub(crate) fn upload(
        &self,
        stream: &Arc<CudaStream>,
        table: &[u64],
    ) -> Result<CudaSlice<u64>, GpuError> {
        let mut ring = self.ring.lock().map_err(|_| GpuError::Driver {
            context: "table staging",
            message: "a thread panicked while staging a table".into(),
        })?;
        let i = ring.next % SLOTS;
        ring.next = ring.next.wrapping_add(1);
        let need = table.len().max(MIN_SLOT).next_power_of_two();
        if ring.slots.get(i).is_none_or(|s| s.len() < need) {
            // SAFETY: u64 has no invalid bit patterns, so the uninitialized pinned memory
            // is a valid (if meaningless) table until it is written below.
            let slot = unsafe { stream.context().alloc_pinned::<u64>(need) }
                .map_err(driver("pinned alloc"))?;
            if i < ring.slots.len() {
                // The old slot's drop waits for its last copy.
                ring.slots[i] = slot;
            } else {
                ring.slots.push(slot);
            }
        }
        let slot = &mut ring.slots[i];
        // Waits for this slot's previous copy to finish before overwriting it.
        let host = slot.as_mut_slice().map_err(driver("pinned staging"))?;
        host[..table.len()].copy_from_slice(table);
        let mut dev = stream
            .alloc_zeros::<u64>(slot.len())
            .map_err(driver("alloc"))?;
        // The pinned source makes this a true asynchronous copy; cudarc records the slot's
        // event after it, which the next writer of the slot waits for.
        #[allow(clippy::disallowed_methods)]
        stream
            .memcpy_htod(&*slot, &mut dev)
            .map_err(driver("copy to device"))?;
        Ok(dev)
    }
}

/// Bytes of each pinned buffer large transfers go through (16 MiB).
const TRANSFER_BYTES: usize = 16 << 20;

/// Pinned buffers of one element type for large transfers: one for downloads, and a ring
/// of [`UPLOAD_SLOTS`] for uploads.
struct Pinned<T: GpuElement> {
    down: Option<PinnedHostSlice<T>>,
    up: Vec<PinnedHostSlice<T>>,
    next_up: usize,
}

/// Uploads queued ahead of the GPU: while one slot's copy runs, the host fills the other.
const UPLOAD_SLOTS: usize = 2;

/// Large device ↔ host copies through pinned memory, a chunk of [`TRANSFER_BYTES`] at a
/// time, so the DMA runs at full PCIe speed and the pinned memory held stays small:
/// - a download lands in a pinned buffer, then one host copy moves it out (returns once
///   the host slice holds the data);
/// - an upload copies the host slice into a pinned slot and queues the DMA and returns:
///   the slot is written again only after cudarc's event says its copy finished, so the
///   host computes the next chunk while this one crosses (the offload step's overlap).
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

/// A pinned buffer of `n` elements of `T`.
fn alloc_pinned<T: GpuElement>(
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<PinnedHostSlice<T>, GpuError> {
    // SAFETY: GpuElement types (f32, f16, bf16) have no invalid bit patterns, and every
    // element is written (by the host or the DMA) before it is read.
    unsafe { stream.context().alloc_pinned::<T>(n) }.map_err(driver("pinned alloc"))
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
                    down: None,
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
        let chunk = Self::chunk::<T>();
        self.with::<T, _>(|p| {
            if p.down.is_none() {
                p.down = Some(alloc_pinned::<T>(stream, chunk)?);
            }
            let pinned = p
                .down
                .as_mut()
                .ok_or_else(|| poisoned("download staging"))?;
            let mut at = 0;
            while at < dst.len() {
                let n = chunk.min(dst.len() - at);
                let piece = src.slice(at..at + n);
                // A copy into pinned memory: truly asynchronous, then waited for below
                // (the buffer's event, recorded after the copy, is what as_slice waits on).
                #[allow(clippy::disallowed_methods)]
                stream
                    .memcpy_dtoh(&piece, pinned)
                    .map_err(driver("copy to host"))?;
                let host = pinned.as_slice().map_err(driver("pinned staging"))?;
                dst[at..at + n].copy_from_slice(&host[..n]);
                at += n;
            }
            Ok(())
        })
    }

    /// Queues copies of `src` into `dst` (equal lengths) and returns before they run; the
    /// host may reuse `src` at once. Each chunk goes pinned slot → a device buffer of the
    /// slot's length → `dst` (cudarc's copy takes the whole slot), all on `stream`.
    pub(crate) fn upload<T: GpuElement>(
        &self,
        stream: &Arc<CudaStream>,
        src: &[T],
        dst: &mut CudaViewMut<'_, T>,
    ) -> Result<(), GpuError> {
        let chunk = Self::chunk::<T>();
        self.with::<T, _>(|p| {
            let mut at = 0;
            while at < src.len() {
                let n = chunk.min(src.len() - at);
                let i = p.next_up % UPLOAD_SLOTS;
                p.next_up = p.next_up.wrapping_add(1);
                if p.up.len() <= i {
                    p.up.push(alloc_pinned::<T>(stream, chunk)?);
                }
                let slot = &mut p.up[i];
                // Waits for this slot's previous copy before overwriting it.
                let host = slot.as_mut_slice().map_err(driver("pinned staging"))?;
                host[..n].copy_from_slice(&src[at..at + n]);
                let mut tmp = stream
                    .alloc_zeros::<T>(slot.len())
                    .map_err(driver("alloc"))?;
                // From pinned memory: a true asynchronous copy; cudarc records the slot's
                // event after it, which the slot's next writer waits for.
                #[allow(clippy::disallowed_methods)]
                stream
                    .memcpy_htod(&*slot, &mut tmp)
                    .map_err(driver("copy to device"))?;
                let mut piece = dst.slice_mut(at..at + n);
                stream
                    .memcpy_dtod(&tmp.slice(0..n), &mut piece)
                    .map_err(driver("copy on device"))?;
                at += n;
            }
            Ok(())
        })
    }
}
