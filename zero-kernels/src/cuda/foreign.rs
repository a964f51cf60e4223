//! Device memory and streams another library owns (PyTorch's CUDA tensors and its current
//! stream), and the copies between them and [`GpuBuffer`]s.
//!
//! The other library orders its work on its own stream; ours runs on a [`GpuStream`].
//! Every crossing is ordered by events in both directions: before touching the foreign
//! memory our stream waits for everything queued so far on the owner's stream (the tensor
//! was written there, or its memory was just allocated there), and after queuing the copy
//! the owner's stream waits for ours (so the owner neither reads the tensor, nor frees and
//! reuses its memory, before the copy ran). Nothing waits on the host.

use super::buffer::GpuBuffer;
use super::error::{driver, GpuError};
use super::stream::{Combine, GpuStream};
use crate::{with_gpu_type, DType, KernelError};
use std::ops::Range;
use std::sync::Arc;
use zero_sys::cudarc::driver::sys::CUevent_flags;
use zero_sys::cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

/// A stream another library owns, borrowed by its raw handle (dropping it never destroys
/// the stream).
#[derive(Clone)]
pub struct ForeignStream {
    stream: Arc<CudaStream>,
    handle: u64,
}

impl std::fmt::Debug for ForeignStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ForeignStream({:#x})", self.handle)
    }
}

/// `len` elements of `dtype` at device address `addr` on this process's GPU, owned by
/// another library (a contiguous CUDA tensor's `data_ptr()`). Whoever makes one vouches
/// that the range is that library's live allocation for as long as the work queued on it
/// runs: the owner's stream waits for that work (see the module notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignSlice {
    /// Device address of the first element.
    pub addr: u64,
    /// Element count.
    pub len: usize,
    /// Element type.
    pub dtype: DType,
}

/// Event flags for cross-stream ordering: no timing (cheaper to record).
fn ordering_event() -> Option<CUevent_flags> {
    Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)
}

fn check_foreign(what: &str, s: &ForeignSlice, dtype: DType, n: usize) -> Result<(), GpuError> {
    if s.dtype != dtype {
        return Err(GpuError::Driver {
            context: "foreign tensor type",
            message: format!("{what}: the tensor holds {}, the buffer {dtype}", s.dtype),
        });
    }
    if s.len != n {
        return Err(KernelError::LengthMismatch {
            what: format!("{what}: the tensor's elements"),
            expected: n,
            actual: s.len,
        }
        .into());
    }
    if n > 0 && s.addr == 0 {
        return Err(GpuError::Driver {
            context: "foreign tensor",
            message: format!("{what}: the tensor has no storage (address 0)"),
        });
    }
    Ok(())
}

impl GpuStream {
    /// Borrows stream `handle` of this GPU (`torch.cuda.current_stream().cuda_stream`;
    /// `0` is the legacy default stream): an error naming it unless it belongs to this
    /// GPU's context. Its owner must keep it alive while the borrow is used.
    pub fn borrow_foreign(&self, handle: u64) -> Result<ForeignStream, GpuError> {
        let stream =
            zero_sys::driver::borrow_stream(self.cuda().context(), handle).map_err(|message| {
                GpuError::Driver {
                    context: "borrowing a stream",
                    message,
                }
            })?;
        Ok(ForeignStream { stream, handle })
    }

    /// Runs `queue` (copies between `owner`'s memory and this stream's buffers) ordered
    /// after everything queued so far on `owner`, and makes `owner` wait for it.
    ///
    /// The two events are this stream's, made once and re-recorded by every crossing: a
    /// wait orders against the record it follows, so a later record cannot change what an
    /// earlier wait waited for.
    pub fn crossing<R>(
        &self,
        owner: &ForeignStream,
        queue: impl FnOnce(&Self) -> Result<R, GpuError>,
    ) -> Result<R, GpuError> {
        let mut events = self
            .crossing_events
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let make = || {
            self.cuda()
                .context()
                .new_event(ordering_event())
                .map_err(driver("creating the crossing events"))
        };
        let [theirs, ours] = match events.take() {
            Some(made) => &*events.insert(made),
            None => &*events.insert([make()?, make()?]),
        };
        theirs
            .record(&owner.stream)
            .map_err(driver("recording an event on the tensor's stream"))?;
        self.cuda()
            .wait(theirs)
            .map_err(driver("waiting for the tensor's stream"))?;
        let out = queue(self);
        // Even after a failed queue, earlier copies of the same crossing may be queued:
        // the owner waits for them either way.
        ours.record(self.cuda())
            .map_err(driver("recording an event after the copies"))?;
        owner
            .stream
            .wait(ours)
            .map_err(driver("making the tensor's stream wait"))?;
        out
    }

    /// `dst[offset..offset + src.len] = src` (same dtype; queued, call within
    /// [`crossing`](Self::crossing)).
    pub fn copy_from_foreign(
        &self,
        src: &ForeignSlice,
        dst: &mut GpuBuffer,
        offset: usize,
    ) -> Result<(), GpuError> {
        self.take_foreign("copy from a tensor", src, dst, offset, false)
    }

    /// `dst[offset..] = round(dst[offset..] + src)`, the sum in `f32` (a gradient added
    /// in; same dtype; queued, call within [`crossing`](Self::crossing)).
    pub fn add_from_foreign(
        &self,
        src: &ForeignSlice,
        dst: &mut GpuBuffer,
        offset: usize,
    ) -> Result<(), GpuError> {
        self.take_foreign("add from a tensor", src, dst, offset, true)
    }

    /// `dst = src[range]` (same dtype; queued, call within [`crossing`](Self::crossing)).
    pub fn copy_to_foreign(
        &self,
        src: &GpuBuffer,
        range: Range<usize>,
        dst: &ForeignSlice,
    ) -> Result<(), GpuError> {
        check_foreign("copy into a tensor", dst, src.dtype(), range.len())?;
        if range.is_empty() {
            return Ok(());
        }
        let n = range.len();
        with_gpu_type!(src.dtype(), T => {
            let view = self.read::<T>(src, range)?;
            let (addr, guard) = view.device_ptr(self.cuda());
            self.launch_reduce_addrs::<T>(&[addr], &[dst.addr], n, Combine::Sum)?;
            drop(guard);
            Ok(())
        })
    }

    /// `dst[offset..offset + src.len]` = `src`, or (`add`) the `f32` sum of both, through
    /// the ordered reduction kernel (one rounding, the host's bits).
    fn take_foreign(
        &self,
        what: &str,
        src: &ForeignSlice,
        dst: &mut GpuBuffer,
        offset: usize,
        add: bool,
    ) -> Result<(), GpuError> {
        check_foreign(what, src, dst.dtype(), src.len)?;
        let n = src.len;
        if n == 0 {
            return Ok(());
        }
        with_gpu_type!(dst.dtype(), T => {
            let mut view = self.write::<T>(dst, offset..offset + n)?;
            let (addr, guard) = view.device_ptr_mut(self.cuda());
            let srcs = if add { vec![addr, src.addr] } else { vec![src.addr] };
            self.launch_reduce_addrs::<T>(&srcs, &[addr], n, Combine::Sum)?;
            drop(guard);
            Ok(())
        })
    }
}
