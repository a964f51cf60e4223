//! Device buffers: typed `cudarc` allocations of one of the three element types, with a
//! logical length that may be shorter than the allocation (so an empty buffer still owns
//! one element, since CUDA refuses zero-byte allocations, and shrinking keeps memory).

use super::data::{GpuData, GpuElement};
use super::error::GpuError;
use super::lease::{GpuLease, Lent};
use super::readers::{Reader, StreamId, StreamReaders};
use crate::DType;
use std::ops::Range;
use std::sync::{Arc, OnceLock};
use zero_sys::cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, SyncOnDrop,
};

/// Runs `$body` with the type alias `$t` set to the element type of `$dtype`.
#[macro_export]
macro_rules! with_gpu_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::DType::F16 => {
                type $t = $crate::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $t = $crate::bf16;
                $body
            }
        }
    };
}

/// An owned device buffer: an allocation and how many of its elements are in use.
#[derive(Debug)]
pub struct GpuBuffer {
    /// The allocation; `None` only inside `drop`, once a lease took it over.
    data: Option<GpuData>,
    len: usize,
    /// Which streams read it since its last write: a write or the free on another
    /// stream waits for them ([`StreamReaders`]).
    readers: StreamReaders,
    /// Shared with the leases handed out ([`GpuBuffer::lease`]), once there is one: the
    /// allocation goes to it when the buffer is dropped, and is freed with the last lease.
    lent: OnceLock<Arc<Lent>>,
}

/// Makes `waiter` wait for everything queued on `reader` so far.
fn order_after(
    waiter: &CudaStream,
    reader: &CudaStream,
) -> Result<(), zero_sys::cudarc::driver::DriverError> {
    let done = reader.record_event(Some(
        zero_sys::cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
    ))?;
    waiter.wait(&done)
}

/// A free a `GpuBuffer` queued: its dtype, elements, stream handle and thread name.
type FreeSite = (DType, usize, usize, Option<String>);

/// The last free a `GpuBuffer` queued: where a deferred driver error most likely came
/// from, for its message.
static LAST_FREE: std::sync::Mutex<Option<FreeSite>> = std::sync::Mutex::new(None);

/// What [`GpuError::Deferred`] says of its origin: the last free queued before it.
pub(crate) fn last_free() -> String {
    match &*LAST_FREE.lock().unwrap_or_else(|p| p.into_inner()) {
        Some((dtype, len, stream, thread)) => format!(
            "the last free queued before it: a {dtype} buffer of {len} elements on stream \
             {stream:#x}, thread {}",
            thread.as_deref().unwrap_or("(unnamed)")
        ),
        None => "no buffer of zero's had been freed: an event record in a Drop".into(),
    }
}

impl Drop for GpuBuffer {
    /// The allocation is freed on the stream it was made on, after the last read
    /// `cudarc`'s event holds: first make that stream wait for the reads it forgot. A
    /// leased allocation goes to its leases instead, freed with the last of them.
    fn drop(&mut self) {
        let owner = self.owner_stream();
        *LAST_FREE.lock().unwrap_or_else(|p| p.into_inner()) = Some((
            self.dtype(),
            self.len,
            owner.cu_stream() as usize,
            std::thread::current().name().map(str::to_string),
        ));
        for r in self.readers.forgotten_except(stream_id(&owner)) {
            if let Some(reader) = r.stream {
                owner.context().record_err(order_after(&owner, &reader));
            }
        }
        if let Some(lent) = self.lent.take() {
            // Leases are clones of this `Arc`, made only through the buffer being dropped:
            // with none left the allocation is freed here, on its stream, as any other.
            if Arc::strong_count(&lent) > 1 {
                lent.keep(self.data.take());
            }
        }
    }
}

/// The identity [`StreamReaders`] knows a stream by.
fn stream_id(stream: &CudaStream) -> StreamId {
    stream.cu_stream() as usize as u64 + 1
}

fn out_of_range(what: &str, range: &Range<usize>, len: usize) -> GpuError {
    GpuError::Kernel(crate::KernelError::LengthMismatch {
        what: format!("{what}: range {range:?} of a buffer"),
        expected: len,
        actual: range.end,
    })
}

fn wrong_type(what: &str, want: &str, have: DType) -> GpuError {
    GpuError::Driver {
        context: "buffer type",
        message: format!("{what}: wanted {want} elements, the buffer holds {have}"),
    }
}

impl GpuBuffer {
    /// `len` zeros of `dtype`, allocated on `stream`.
    pub fn zeros(
        stream: &std::sync::Arc<CudaStream>,
        dtype: DType,
        len: usize,
    ) -> Result<Self, GpuError> {
        let cap = len.max(1);
        // Out of memory: the framework's cache is released and the allocation tried again.
        let data = with_gpu_type!(dtype, T => T::wrap(
            super::out_of_memory::allocating("alloc", || stream.alloc_zeros::<T>(cap))?
        ));
        Ok(GpuBuffer {
            data: Some(data),
            len,
            readers: StreamReaders::default(),
            lent: OnceLock::new(),
        })
    }

    /// Wraps a whole allocation.
    pub fn from_slice<T: GpuElement>(s: CudaSlice<T>) -> Self {
        let len = s.len();
        GpuBuffer {
            data: Some(T::wrap(s)),
            len,
            readers: StreamReaders::default(),
            lent: OnceLock::new(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self.data() {
            GpuData::F32(_) => DType::F32,
            GpuData::F16(_) => DType::F16,
            GpuData::BF16(_) => DType::BF16,
        }
    }

    /// Elements in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no element is in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements allocated.
    pub fn capacity(&self) -> usize {
        match self.data() {
            GpuData::F32(s) => s.len(),
            GpuData::F16(s) => s.len(),
            GpuData::BF16(s) => s.len(),
        }
    }

    /// Size in bytes of the elements in use.
    pub fn bytes(&self) -> usize {
        self.len * self.dtype().size_of()
    }

    /// Sets the length without touching contents; the caller keeps `len <= capacity()`.
    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity());
        self.len = len;
    }

    /// The allocation.
    pub fn data(&self) -> &GpuData {
        self.data
            .as_ref()
            .expect("a GpuBuffer's allocation is taken only by its own drop")
    }

    fn data_mut(&mut self) -> &mut GpuData {
        self.data
            .as_mut()
            .expect("a GpuBuffer's allocation is taken only by its own drop")
    }

    /// A lease on the allocation for a framework's tensors to view (zero-torch's parameters
    /// on a GPU): its device address and size, and a share of the allocation, which is
    /// freed only when this buffer and every lease are gone (after a wait for the whole
    /// device, since the framework's kernels on its own streams may still use it).
    pub fn lease(&self) -> GpuLease {
        let stream = self.owner_stream();
        let (addr, _read) = self.read_addr(&stream);
        let lent = self.lent.get_or_init(|| Arc::new(Lent::default())).clone();
        GpuLease::new(
            addr,
            self.capacity() * self.dtype().size_of(),
            stream.context().ordinal(),
            lent,
        )
    }

    /// Whether a lease was handed out (the allocation must then never move).
    pub fn is_leased(&self) -> bool {
        self.lent.get().is_some()
    }

    /// The stream the allocation was made on (and is freed on).
    fn owner_stream(&self) -> Arc<CudaStream> {
        self.data().stream().clone()
    }

    /// Notes a read on `stream`, so a later write or free on another stream waits for it
    /// even after `cudarc`'s read event moved on to another reader (invariant 19).
    pub(crate) fn note_read(&self, stream: &Arc<CudaStream>) {
        self.readers.read(Reader {
            id: stream_id(stream),
            stream: Some(stream.clone()),
        });
    }

    /// Notes a write on `stream`, which first waits for every earlier read `cudarc`'s
    /// read event no longer holds (invariant 19). A driver error is kept in the context
    /// and reported by the next call, as `cudarc` does for errors it cannot return.
    pub(crate) fn note_write(&self, stream: &Arc<CudaStream>) {
        for r in self.readers.write(stream_id(stream)) {
            if let Some(reader) = r.stream {
                stream.context().record_err(order_after(stream, &reader));
            }
        }
    }

    /// The allocation's device address for a read on `stream` (which first waits for the
    /// buffer's last write); the guard records the read when dropped, after the caller has
    /// queued it.
    ///
    /// Not noted as a read: its one user (NCCL) waits on the host for the collective's
    /// completion before the buffer comes back, so its reads are over before any other
    /// stream can use the buffer.
    pub fn read_addr<'a>(&'a self, stream: &'a Arc<CudaStream>) -> (u64, SyncOnDrop<'a>) {
        match self.data() {
            GpuData::F32(s) => s.device_ptr(stream),
            GpuData::F16(s) => s.device_ptr(stream),
            GpuData::BF16(s) => s.device_ptr(stream),
        }
    }

    /// The allocation's device address for a write on `stream` (which first waits for the
    /// buffer's last read and write); the guard records the write when dropped.
    pub fn write_addr<'a>(&'a mut self, stream: &'a Arc<CudaStream>) -> (u64, SyncOnDrop<'a>) {
        self.note_write(stream);
        match self.data_mut() {
            GpuData::F32(s) => s.device_ptr_mut(stream),
            GpuData::F16(s) => s.device_ptr_mut(stream),
            GpuData::BF16(s) => s.device_ptr_mut(stream),
        }
    }

    /// `self[range]` as `T`: an error if it holds another type or the range is outside.
    /// Not tracked for the last-reader rule: engine paths use `GpuStream::read`, which is.
    pub fn view<T: GpuElement>(&self, range: Range<usize>) -> Result<CudaView<'_, T>, GpuError> {
        if range.start > range.end || range.end > self.len {
            return Err(out_of_range("view", &range, self.len));
        }
        let dtype = self.dtype();
        T::slice(self.data())
            .map(|s| s.slice(range))
            .ok_or_else(|| wrong_type("view", T::SUFFIX, dtype))
    }

    /// `self[range]` as mutable `T` (untracked, as [`view`](Self::view); engine paths use
    /// `GpuStream::write`).
    pub fn view_mut<T: GpuElement>(
        &mut self,
        range: Range<usize>,
    ) -> Result<CudaViewMut<'_, T>, GpuError> {
        if range.start > range.end || range.end > self.len {
            return Err(out_of_range("view_mut", &range, self.len));
        }
        let dtype = self.dtype();
        T::slice_mut(self.data_mut())
            .map(|s| s.slice_mut(range))
            .ok_or_else(|| wrong_type("view_mut", T::SUFFIX, dtype))
    }
}
