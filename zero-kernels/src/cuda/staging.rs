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
