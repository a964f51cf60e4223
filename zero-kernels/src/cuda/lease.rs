//! Leases on device memory: a framework's tensors view an allocation of the engine's
//! (zero-torch's parameters on a GPU are DLPack views of the engine's 16-bit buffers), so
//! the allocation must outlive both the engine's [`GpuBuffer`](super::GpuBuffer) and every
//! tensor over it, whichever goes last.
//!
//! The buffer and its leases share a [`Lent`]. While the buffer lives it owns the
//! allocation and the `Lent` is empty; dropping the buffer moves the allocation into the
//! `Lent`, and the last lease to go frees it. A lease gives an address and a size only:
//! code outside Rust reads and writes the memory, ordered with the engine's stream by the
//! caller's events, as with any foreign tensor.

use super::data::GpuData;
use std::sync::{Arc, Mutex};

/// The allocation a dropped, leased buffer left behind, kept for its leases.
#[derive(Debug, Default)]
pub(crate) struct Lent {
    keep: Mutex<Option<GpuData>>,
}

impl Lent {
    /// Takes over the allocation of the buffer being dropped.
    pub(crate) fn keep(&self, data: Option<GpuData>) {
        *self.keep.lock().unwrap_or_else(|p| p.into_inner()) = data;
    }
}

impl Drop for Lent {
    /// The last lease is gone after the buffer: the framework's kernels that used the
    /// memory may still be queued on its own streams, which zero does not know, so the
    /// whole device is waited for before the free (once per leased buffer, when a tensor
    /// outlived its engine). A driver error is kept in the context for its next call.
    fn drop(&mut self) {
        let data = self
            .keep
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(data) = data else { return };
        let ctx = data.stream().context().clone();
        ctx.record_err(ctx.synchronize());
        drop(data);
    }
}

/// A share of a device allocation: where it is, how large, on which GPU. The allocation
/// stays until its buffer and every lease are dropped.
#[derive(Debug, Clone)]
pub struct GpuLease {
    addr: u64,
    bytes: usize,
    ordinal: usize,
    _lent: Arc<Lent>,
}

impl GpuLease {
    pub(crate) fn new(addr: u64, bytes: usize, ordinal: usize, lent: Arc<Lent>) -> Self {
        GpuLease {
            addr,
            bytes,
            ordinal,
            _lent: lent,
        }
    }

    /// The allocation's device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The allocation's size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The GPU (CUDA ordinal) it is on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}
