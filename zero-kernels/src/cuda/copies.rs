//! The one place host ↔ device copies are made, and the pinned buffers they go through.
//!
//! `cudarc`'s copies take their byte count from the host side (`size_of_val(dst)` for a
//! download, `size_of_val(src)` for an upload) and only assert that the device side is at
//! least as long. A host buffer longer than the device range therefore reads or writes
//! past the end of the device range. [`copy_htod`] and [`copy_dtoh`] are the only callers
//! of those copies in the workspace: each checks that the two sides hold exactly the same
//! number of elements and returns an error naming both lengths otherwise (clippy's
//! `disallowed-methods` rejects the `cudarc` calls everywhere else).
//!
//! [`PinnedBuffer`] is page-locked host memory for chunked transfers. Its copies go
//! through those two helpers over an exact sub-slice, so a short chunk moves only its own
//! elements. A plain sub-slice gets no event from `cudarc` (and `cudarc` records its own
//! event on a whole `PinnedHostSlice` only while it manages several streams), so each
//! buffer records its own event after every copy and waits for it before the host touches
//! the memory again or frees it.

use super::error::{driver, GpuError};
use crate::KernelError;
use std::sync::Arc;
use zero_sys::cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED;
use zero_sys::cudarc::driver::{
    CudaEvent, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};

pub(crate) fn check_exact(what: &str, device: usize, host: usize) -> Result<(), GpuError> {
    if device == host {
        return Ok(());
    }
    Err(KernelError::LengthMismatch {
        what: format!("{what}: the host side (the device side holds {device} elements)"),
        expected: device,
        actual: host,
    }
    .into())
}

/// Queues a copy of `src` into `dst`, which must hold exactly `src.len()` elements.
///
/// Where `src` is pageable memory CUDA may still read it after this returns: the caller
/// synchronizes the stream before `src` changes or goes ([`GpuStream::upload`] does).
/// Where it is pinned, the caller keeps it alive and unchanged until the copy ran
/// ([`PinnedBuffer`] does).
///
/// [`GpuStream::upload`]: super::GpuStream::upload
pub fn copy_htod<T: DeviceRepr, D: DevicePtrMut<T>>(
    stream: &Arc<CudaStream>,
    src: &[T],
    dst: &mut D,
) -> Result<(), GpuError> {
    check_exact("copy to device", dst.len(), src.len())?;
    if src.is_empty() {
        return Ok(());
    }
    #[allow(clippy::disallowed_methods)] // the one sanctioned call, lengths checked above
    stream
        .memcpy_htod(src, dst)
        .map_err(driver("copy to device"))
}

/// Queues a copy of `src` into `dst`, which must hold exactly `src.len()` elements.
///
/// The data is in `dst` only once the stream has run the copy: the caller synchronizes
/// (the stream, or an event recorded after the copy) before reading `dst`.
pub fn copy_dtoh<T: DeviceRepr, S: DevicePtr<T>>(
    stream: &Arc<CudaStream>,
    src: &S,
    dst: &mut [T],
) -> Result<(), GpuError> {
    check_exact("copy to host", src.len(), dst.len())?;
    if dst.is_empty() {
        return Ok(());
    }
    #[allow(clippy::disallowed_methods)] // the one sanctioned call, lengths checked above
    stream.memcpy_dtoh(src, dst).map_err(driver("copy to host"))
}

/// Which way data crosses a pinned buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The host writes it and the GPU reads it (uploads, kernel tables).
    ToDevice,
    /// The GPU writes it and the host reads it (downloads).
    ToHost,
}

/// The `cuMemHostAlloc` flags for a pinned buffer crossed in `direction`.
///
/// Write-combined memory is not cached on the host: the host's writes stream out and the
/// GPU reads it faster over PCIe, but host reads of it are very slow (CUDA C++
/// Programming Guide, "Write-Combining Memory": "reading from write-combining memory from
/// the host is prohibitively slow"). So only buffers the host writes and never reads are
/// write-combined; buffers the host reads are ordinary cached pinned memory.
pub fn pinned_flags(direction: Direction) -> u32 {
    match direction {
        Direction::ToDevice => CU_MEMHOSTALLOC_WRITECOMBINED,
        Direction::ToHost => 0,
    }
}

/// Page-locked host memory for transfers in one direction, with its own completion event.
#[derive(Debug)]
pub(crate) struct PinnedBuffer<T> {
    mem: PinnedHostSlice<T>,
    /// Recorded after every copy through `mem`; the host waits for it before it writes,
    /// reads or frees `mem`.
    done: CudaEvent,
    direction: Direction,
    /// Elements the last download put here.
    filled: usize,
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> PinnedBuffer<T> {
    /// `len` elements of pinned memory in `stream`'s context, for `direction`.
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        len: usize,
        direction: Direction,
    ) -> Result<Self, GpuError> {
        let ctx = stream.context();
        // SAFETY: the element types used here (f32, f16, bf16, u64) have no invalid bit
        // patterns, and every element is written (by the host or a copy) before it is
        // read.
        let mem = unsafe { ctx.alloc_pinned_with_flags::<T>(len, pinned_flags(direction)) }
            .map_err(driver("pinned alloc"))?;
        let done = ctx.new_event(None).map_err(driver("pinned event"))?;
        Ok(PinnedBuffer {
            mem,
            done,
            direction,
            filled: 0,
        })
    }

    /// Elements it holds.
    pub(crate) fn len(&self) -> usize {
        self.mem.len()
    }

    fn check_fits(&self, what: &str, n: usize) -> Result<(), GpuError> {
        if n <= self.len() {
            return Ok(());
        }
        Err(KernelError::LengthMismatch {
            what: format!("{what}: more elements than the pinned buffer holds"),
            expected: self.len(),
            actual: n,
        }
        .into())
    }

    /// Waits for the last copy through this buffer.
    fn settle(&self) -> Result<(), GpuError> {
        self.done.synchronize().map_err(driver("pinned staging"))
    }

    /// Copies `src` in and queues its upload into `dst` (exactly `src.len()` elements) on
    /// `stream`; returns before the copy runs. The buffer is written again only after
    /// that copy finished.
    pub(crate) fn send<D: DevicePtrMut<T>>(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &[T],
        dst: &mut D,
    ) -> Result<(), GpuError> {
        debug_assert_eq!(self.direction, Direction::ToDevice);
        self.check_fits("pinned upload", src.len())?;
        self.settle()?;
        let host = self.mem.as_mut_slice().map_err(driver("pinned staging"))?;
        let host = &mut host[..src.len()];
        host.copy_from_slice(src);
        copy_htod(stream, host, dst)?;
        self.done.record(stream).map_err(driver("pinned event"))
    }

    /// Queues a download of `src` (at most [`len`](Self::len) elements) into this
    /// buffer on `stream`, after the host is done with its previous contents; returns
    /// before the copy runs. [`downloaded`](Self::downloaded) waits for it.
    pub(crate) fn queue_download<S: DevicePtr<T>>(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &S,
    ) -> Result<(), GpuError> {
        debug_assert_eq!(self.direction, Direction::ToHost);
        let n = src.len();
        self.check_fits("pinned download", n)?;
        self.settle()?;
        let host = self.mem.as_mut_slice().map_err(driver("pinned staging"))?;
        copy_dtoh(stream, src, &mut host[..n])?;
        self.done.record(stream).map_err(driver("pinned event"))?;
        self.filled = n;
        Ok(())
    }

    /// Waits for the download queued last and returns its elements.
    pub(crate) fn downloaded(&self) -> Result<&[T], GpuError> {
        self.settle()?;
        let host = self.mem.as_slice().map_err(driver("pinned staging"))?;
        Ok(&host[..self.filled])
    }
}

impl<T> Drop for PinnedBuffer<T> {
    /// The memory is freed only after the last copy through it finished (`cudarc` waits
    /// for its own event, which these copies never record).
    fn drop(&mut self) {
        let ctx = self.done.context().clone();
        ctx.record_err(self.done.synchronize());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_buffers_the_host_never_reads_are_write_combined() {
        assert_eq!(
            pinned_flags(Direction::ToDevice),
            CU_MEMHOSTALLOC_WRITECOMBINED
        );
        assert_eq!(pinned_flags(Direction::ToHost), 0);
        assert_ne!(CU_MEMHOSTALLOC_WRITECOMBINED, 0);
    }

    #[test]
    fn unequal_lengths_are_an_error_naming_both() {
        let e = check_exact("copy to host", 5, 4194304)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("copy to host") && e.contains('5') && e.contains("4194304"),
            "{e}"
        );
        assert!(check_exact("copy to host", 7, 7).is_ok());
    }
}
