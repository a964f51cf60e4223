//! Host tables for kernels (the multi-tensor copy's entries), staged through pinned memory.
//!
//! A copy from pageable host memory "might be synchronous" (CUDA's words): the driver may
//! still read the host buffer after the call returns, so a table in a `Vec` could be freed
//! before it was read. Pinned memory is copied by DMA, truly asynchronously, so the host
//! side must stay alive and unchanged until the copy has run. Here it does: tables go
//! through a small ring of pinned slots, and a slot is written again only after `cudarc`'s
//! event on it says its previous copy finished (`PinnedHostSlice::as_mut_slice` waits for
//! it). With [`SLOTS`] slots the host can queue that many table copies ahead of the GPU.

use super::gpu::{driver, GpuError};
use std::sync::{Arc, Mutex};
use zero_sys::cudarc::driver::{CudaSlice, CudaStream, PinnedHostSlice};

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

/// Elements of the pinned buffer large downloads go through (16 MiB of `f32`).
const DOWNLOAD_CHUNK: usize = 4 << 20;

/// One pinned buffer for large device-to-host `f32` copies (a checkpoint save): the DMA
/// lands in pinned memory at full PCIe speed, then one host copy moves it out, chunk after
/// chunk, so the pinned memory held stays at [`DOWNLOAD_CHUNK`] elements.
#[derive(Debug, Default)]
pub(crate) struct DownloadStaging {
    buf: Mutex<Option<PinnedHostSlice<f32>>>,
}

impl DownloadStaging {
    /// Copies `src` into `dst` (equal lengths) through the pinned buffer; returns once
    /// `dst` holds the data.
    pub(crate) fn download(
        &self,
        stream: &Arc<CudaStream>,
        src: &zero_sys::cudarc::driver::CudaView<'_, f32>,
        dst: &mut [f32],
    ) -> Result<(), GpuError> {
        let mut slot = self.buf.lock().map_err(|_| GpuError::Driver {
            context: "download staging",
            message: "a thread panicked while downloading".into(),
        })?;
        if slot.is_none() {
            // SAFETY: f32 has no invalid bit patterns; every element read from the buffer
            // below was first written by the copy into it.
            let pinned = unsafe { stream.context().alloc_pinned::<f32>(DOWNLOAD_CHUNK) }
                .map_err(driver("pinned alloc"))?;
            *slot = Some(pinned);
        }
        let pinned = slot.as_mut().ok_or_else(|| GpuError::Driver {
            context: "download staging",
            message: "no pinned buffer".into(),
        })?;
        let mut at = 0;
        while at < dst.len() {
            let n = DOWNLOAD_CHUNK.min(dst.len() - at);
            let piece = src.slice(at..at + n);
            // A copy into pinned memory: truly asynchronous, then waited for below (the
            // slot's event, recorded after the copy, is what as_slice waits on).
            #[allow(clippy::disallowed_methods)]
            stream
                .memcpy_dtoh(&piece, pinned)
                .map_err(driver("copy to host"))?;
            let host = pinned.as_slice().map_err(driver("pinned staging"))?;
            dst[at..at + n].copy_from_slice(&host[..n]);
            at += n;
        }
        Ok(())
    }
}
