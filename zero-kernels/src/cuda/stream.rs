//! Device-resident operations on one CUDA stream: the GPU half of every CPU kernel, over
//! [`GpuBuffer`]s that stay on the device.
//!
//! Work is queued on the stream and the calls return without waiting, except those that
//! move data between the device and pageable host memory: uploads and downloads (and
//! [`GpuStream::stats`]) wait for the stream, because CUDA may read or write pageable
//! memory after an asynchronous copy returns ("might be synchronous" is all it promises),
//! and the host slice is gone or read right after. Kernels get small tables as launch
//! parameters and large ones through pinned staging (`staging`). Buffers used from
//! several streams are ordered by `cudarc`'s per-allocation events: a kernel that reads a
//! buffer waits for its last write on any stream, and one that writes it waits for its
//! last read too, so no buffer is reused or freed while another stream still uses it.

use super::buffer::GpuBuffer;
use super::copies::{copy_dtoh, copy_htod};
use super::data::GpuElement;
use super::error::{driver, GpuError};
use super::gpu::Gpu;
use super::staging::{TableStaging, TransferStaging, ZeroBytes};
use crate::{with_gpu_type, DType, GradStats, KernelError};
use std::ops::Range;
use std::sync::Arc;
use zero_sys::cudarc::driver::{
    CudaFunction, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg, SyncOnDrop,
};

/// Threads per block of the element-wise kernels.
pub(crate) const THREADS: u32 = 256;
/// Blocks of the stats kernel (fixed, so the summation order is fixed).
const STATS_BLOCKS: usize = 1024;
/// The most buffers one reduction reads or writes (`MAX_REDUCE_BUFFERS` in reduce.cu): the
/// addresses travel as launch parameters.
pub const MAX_REDUCE_BUFFERS: usize = 64;

/// How [`GpuStream::reduce`] combines sources; the host collectives' `ReduceOp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// Sum in source order, in `f32`.
    Sum,
    /// The sum divided by the number of sources.
    Avg,
    /// Maximum; NaN wins.
    Max,
}

/// A stream of the process's GPU, with the kernels launched on it.
#[derive(Clone)]
pub struct GpuStream {
    gpu: &'static Gpu,
    stream: Arc<CudaStream>,
    tables: Arc<TableStaging>,
    pub(crate) padding: Arc<ZeroBytes>,
    transfers: Arc<TransferStaging>,
    /// The two events a crossing with a foreign stream records (created on the first one,
    /// then re-recorded: an event per tensor per step would be created otherwise).
    pub(crate) crossing_events:
        Arc<std::sync::Mutex<Option<[zero_sys::cudarc::driver::CudaEvent; 2]>>>,
}

impl std::fmt::Debug for GpuStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuStream")
            .field("arch", &self.gpu.arch)
            .finish()
    }
}

pub(crate) fn launch_config(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Blocks for `n` elements at `per_thread` elements per thread (grid-stride loops cover
/// the rest).
pub(crate) fn blocks(n: usize, per_thread: usize) -> u32 {
    (n.div_ceil(per_thread * THREADS as usize)).clamp(1, 65_535) as u32
}

fn check_same_len(what: &str, expected: usize, actual: usize) -> Result<(), GpuError> {
    crate::error::check_len(what, expected, actual).map_err(GpuError::from)
}

impl Gpu {
    /// The device's default stream.
    pub fn default_stream(&'static self) -> GpuStream {
        GpuStream::new(self, self.stream.clone())
    }

    /// A new stream (one per rank of the one-device group, or for communication).
    pub fn new_stream(&'static self) -> Result<GpuStream, GpuError> {
        let s = self.ctx.new_stream().map_err(driver("new_stream"))?;
        Ok(GpuStream::new(self, s))
    }
}

impl GpuStream {
    pub(crate) fn new(gpu: &'static Gpu, stream: Arc<CudaStream>) -> Self {
        GpuStream {
            gpu,
            stream,
            tables: Arc::default(),
            padding: Arc::default(),
            transfers: Arc::default(),
            crossing_events: Arc::default(),
        }
    }

    /// A device copy of a kernel's `u64` table in the first `table.len()` elements of a
    /// slice kept per stream, staged through pinned memory (queued; the host side stays
    /// alive until the copy ran).
    pub(crate) fn upload_table(
        &self,
        table: &[u64],
    ) -> Result<Arc<zero_sys::cudarc::driver::CudaSlice<u64>>, GpuError> {
        self.tables.upload(&self.stream, table)
    }

    /// `b[range]` as `T`, for a read on this stream: the read is noted, so a later write
    /// or free on another stream waits for it (ARCHITECTURE.md, invariant 19).
    pub fn read<'a, T: GpuElement>(
        &self,
        b: &'a GpuBuffer,
        range: Range<usize>,
    ) -> Result<CudaView<'a, T>, GpuError> {
        self.deferred_errors("a read")?;
        b.note_read(&self.stream);
        b.view(range)
    }

    /// `b[range]` as mutable `T`, for a write (or read and write) on this stream, which
    /// first waits for every earlier read on another stream (invariant 19).
    pub fn write<'a, T: GpuElement>(
        &self,
        b: &'a mut GpuBuffer,
        range: Range<usize>,
    ) -> Result<CudaViewMut<'a, T>, GpuError> {
        self.deferred_errors("a write")?;
        b.note_write(&self.stream);
        b.view_mut(range)
    }

    /// Errors `cudarc` kept from earlier `Drop`s in this context, reported as such
    /// ([`GpuError::Deferred`]) rather than as a failure of the call that found them.
    fn deferred_errors(&self, noticed_in: &'static str) -> Result<(), GpuError> {
        self.stream
            .context()
            .check_err()
            .map_err(|e| GpuError::Deferred {
                device: self.gpu.ordinal,
                noticed_in,
                message: format!("{e:?}"),
                origin: super::buffer::last_free(),
            })
    }

    /// The `cudarc` stream, for other crates' launches (NCCL takes its raw handle).
    pub fn cuda(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The GPU.
    pub fn gpu(&self) -> &'static Gpu {
        self.gpu
    }

    /// Blocks the host until everything queued on this stream has run.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(driver("stream synchronize"))
    }

    pub(crate) fn function(
        &self,
        file: &'static str,
        name: &str,
    ) -> Result<CudaFunction, GpuError> {
        self.gpu.function(file, name)
    }

    /// `len` zeros of `dtype`.
    pub fn zeros(&self, dtype: DType, len: usize) -> Result<GpuBuffer, GpuError> {
        // cudarc's allocation returns an error kept from an earlier Drop as its own: report
        // it as what it is first.
        self.deferred_errors("an allocation")?;
        GpuBuffer::zeros(&self.stream, dtype, len)
    }

    /// A buffer holding `src` (waits for the stream: CUDA may read pageable `src` after
    /// an asynchronous copy returns).
    pub fn upload<T: GpuElement>(&self, src: &[T]) -> Result<GpuBuffer, GpuError> {
        let mut buf = self.zeros(T::DTYPE, src.len())?;
        if !src.is_empty() {
            let mut view = self.write::<T>(&mut buf, 0..src.len())?;
            copy_htod(&self.stream, src, &mut view)?;
            // Pageable `src`: synchronized before it can go.
            self.synchronize()?;
        }
        Ok(buf)
    }

    /// `src[range]` copied to the host (waits for the stream).
    pub fn download<T: GpuElement>(
        &self,
        src: &GpuBuffer,
        range: Range<usize>,
    ) -> Result<Vec<T>, GpuError> {
        let mut out = vec![T::default(); range.len()];
        if !out.is_empty() {
            let view = self.read::<T>(src, range)?;
            self.download_view(&view, &mut out)?;
        }
        Ok(out)
    }

    /// Copies `src` into `dst` on the host and waits for the copy: CUDA may write pageable
    /// `dst` after an asynchronous copy returns, so nothing may read it before the wait.
    pub fn download_view<T: GpuElement + zero_sys::cudarc::driver::DeviceRepr>(
        &self,
        src: &CudaView<'_, T>,
        dst: &mut [T],
    ) -> Result<(), GpuError> {
        copy_dtoh(&self.stream, src, dst)?;
        // Pageable `dst`: synchronized before it is read.
        self.synchronize()
    }

    /// Copies a large view to the host through a pinned chunk (full-speed DMA, then one
    /// host copy), so memory held stays at one chunk whatever `src`'s size; returns once
    /// `dst` holds the data.
    pub fn download_pinned<T: GpuElement>(
        &self,
        src: &CudaView<'_, T>,
        dst: &mut [T],
    ) -> Result<(), GpuError> {
        check_same_len("download: dst", src.len(), dst.len())?;
        self.transfers.download(&self.stream, src, dst)
    }

    /// Queues a copy of `src` into `dst[offset..]` (same type) through pinned slots and
    /// returns before the GPU runs it: `src` may be reused at once, and the host computes
    /// on while the DMA runs (a slot is refilled only after its copy finished).
    pub fn upload_pinned<T: GpuElement>(
        &self,
        src: &[T],
        dst: &mut GpuBuffer,
        offset: usize,
    ) -> Result<(), GpuError> {
        let mut view = self.write::<T>(dst, offset..offset + src.len())?;
        self.transfers.upload(&self.stream, src, &mut view)
    }

    /// Writes host `f32` values into `dst[offset..]`, rounding to its type.
    pub fn upload_f32(
        &self,
        dst: &mut GpuBuffer,
        offset: usize,
        src: &[f32],
    ) -> Result<(), GpuError> {
        let tmp = self.upload(src)?;
        self.copy(&tmp, 0..src.len(), dst, offset)
    }

    /// `src[range]` widened to `f32` on the host.
    pub fn download_f32(&self, src: &GpuBuffer, range: Range<usize>) -> Result<Vec<f32>, GpuError> {
        if src.dtype() == DType::F32 {
            return self.download(src, range);
        }
        let mut tmp = self.zeros(DType::F32, range.len())?;
        let n = range.len();
        self.copy(src, range, &mut tmp, 0)?;
        self.download(&tmp, 0..n)
    }

    /// Changes the length, zero-filling new elements; shrinking keeps the allocation. A
    /// leased buffer ([`GpuBuffer::lease`]) cannot grow past its allocation: the tensors
    /// viewing it would keep the old memory.
    pub fn resize(&self, b: &mut GpuBuffer, len: usize) -> Result<(), GpuError> {
        let old = b.len();
        if len <= b.capacity() {
            b.set_len(len);
            if len > old {
                self.zero(b, old..len)?;
            }
            return Ok(());
        }
        if b.is_leased() {
            return Err(GpuError::Driver {
                context: "resize",
                message: format!(
                    "a buffer of {} elements that tensors view (leased) cannot grow to {len}: its \
                     memory would move from under them",
                    b.capacity()
                ),
            });
        }
        let mut bigger = self.zeros(b.dtype(), len)?;
        self.copy(b, 0..old, &mut bigger, 0)?;
        *b = bigger;
        Ok(())
    }

    /// Zeroes `b[range]`.
    pub fn zero(&self, b: &mut GpuBuffer, range: Range<usize>) -> Result<(), GpuError> {
        if range.is_empty() {
            return Ok(());
        }
        with_gpu_type!(b.dtype(), T => {
            let mut view = self.write::<T>(b, range)?;
            self.stream.memset_zeros(&mut view).map_err(driver("memset"))
        })
    }

    /// Copies `src[range]` to `dst[offset..]`, converting type (round to nearest even).
    pub fn copy(
        &self,
        src: &GpuBuffer,
        range: Range<usize>,
        dst: &mut GpuBuffer,
        offset: usize,
    ) -> Result<(), GpuError> {
        let n = range.len();
        let out = offset..offset + n;
        if src.dtype() == dst.dtype() {
            return with_gpu_type!(src.dtype(), T => {
                let s = self.read::<T>(src, range)?;
                let mut d = self.write::<T>(dst, out)?;
                if n == 0 {
                    return Ok(());
                }
                // The stream's own copy binds the context to this thread (a raw
                // cuMemcpyDtoDAsync from a thread with no current context fails) and
                // records the buffers' events.
                self.stream.memcpy_dtod(&s, &mut d).map_err(driver("copy"))
            });
        }
        with_gpu_type!(src.dtype(), S => with_gpu_type!(dst.dtype(), D => {
            let s = self.read::<S>(src, range)?;
            let mut d = self.write::<D>(dst, out)?;
            self.cast_view(&s, &mut d)
        }))
    }

    /// Copy with conversion between views of equal length and different element types.
    fn cast_view<S: GpuElement, D: GpuElement>(
        &self,
        src: &CudaView<'_, S>,
        dst: &mut CudaViewMut<'_, D>,
    ) -> Result<(), GpuError> {
        check_same_len("cast: dst", src.len(), dst.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let f = self.function("cast.cu", &format!("cast_{}_{}", S::SUFFIX, D::SUFFIX))?;
        let n = src.len() as u64;
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(src).arg(dst).arg(&n);
        // SAFETY: cast_S_D(const S*, D*, u64 n) reads n elements of src and writes n of
        // dst; both views hold exactly n elements.
        unsafe { launch.launch(launch_config(blocks(src.len(), 4))) }
            .map(|_| ())
            .map_err(driver("launch cast"))
    }

    /// `acc[offset..] += src[range]`: into an `f32` accumulator from any dtype, or into a
    /// 16-bit accumulator from the same dtype (summed in `f32`, rounded once per element:
    /// torch's `add_` on 16-bit tensors).
    pub fn accumulate(
        &self,
        acc: &mut GpuBuffer,
        offset: usize,
        src: &GpuBuffer,
        range: Range<usize>,
    ) -> Result<(), GpuError> {
        let n = range.len();
        if n == 0 {
            return Ok(());
        }
        if acc.dtype() != DType::F32 {
            // (Reading `src` as the accumulator's type refuses another dtype.)
            return with_gpu_type!(acc.dtype(), T => {
                let s = self.read::<T>(src, range)?;
                let mut a = self.write::<T>(acc, offset..offset + n)?;
                let (sa, sg) = s.device_ptr(self.cuda());
                let (aa, ag) = a.device_ptr_mut(self.cuda());
                self.launch_reduce_addrs::<T>(&[aa, sa], &[aa], n, Combine::Sum)?;
                drop((sg, ag));
                Ok(())
            });
        }
        let mut a = self.write::<f32>(acc, offset..offset + n)?;
        with_gpu_type!(src.dtype(), T => {
            let s = self.read::<T>(src, range)?;
            let f = self.function("reduce.cu", &format!("accumulate_{}", T::SUFFIX))?;
            let n64 = n as u64;
            let mut launch = self.stream.launch_builder(&f);
            launch.arg(&mut a).arg(&s).arg(&n64);
            // SAFETY: accumulate_T(float* acc, const T* src, u64 n): both views hold n
            // elements.
            unsafe { launch.launch(launch_config(blocks(n, 4))) }
                .map(|_| ())
                .map_err(driver("launch accumulate"))
        })
    }

    /// Non-finite check and sum of squares of `b[range]` (waits for the stream).
    pub fn stats(&self, b: &GpuBuffer, range: Range<usize>) -> Result<GradStats, GpuError> {
        if range.is_empty() {
            return Ok(GradStats::EMPTY);
        }
        with_gpu_type!(b.dtype(), T => {
            let x = self.read::<T>(b, range)?;
            self.stats_view(&x)
        })
    }

    /// [`stats`](Self::stats) of a typed view.
    pub fn stats_view<T: GpuElement>(&self, x: &CudaView<'_, T>) -> Result<GradStats, GpuError> {
        if x.is_empty() {
            return Ok(GradStats::EMPTY);
        }
        let st = &self.stream;
        let f = self.function("stats.cu", &format!("stats_{}", T::SUFFIX))?;
        let fin = self.function("stats.cu", "stats_finish")?;
        let nblocks = x.len().div_ceil(THREADS as usize).min(STATS_BLOCKS);
        let mut sums = st.alloc_zeros::<f64>(nblocks).map_err(driver("alloc"))?;
        let mut flags = st.alloc_zeros::<i32>(nblocks).map_err(driver("alloc"))?;
        let mut sum = st.alloc_zeros::<f64>(1).map_err(driver("alloc"))?;
        let mut flag = st.alloc_zeros::<i32>(1).map_err(driver("alloc"))?;
        let n = x.len() as u64;
        let count = nblocks as i32;
        let mut first = st.launch_builder(&f);
        first.arg(x).arg(&n).arg(&mut sums).arg(&mut flags);
        // SAFETY: stats_T(const T* x, u64 n, double* sums, int* flags): x holds n elements;
        // sums and flags hold one entry per block.
        unsafe { first.launch(launch_config(nblocks as u32)) }.map_err(driver("launch stats"))?;
        let mut second = st.launch_builder(&fin);
        second
            .arg(&sums)
            .arg(&flags)
            .arg(&count)
            .arg(&mut sum)
            .arg(&mut flag);
        // SAFETY: stats_finish reads `count` partials and writes one sum and one flag.
        unsafe { second.launch(launch_config(1)) }.map_err(driver("launch stats_finish"))?;
        let (mut s, mut b) = ([0f64], [0i32]);
        // Pageable downloads, synchronized before the values are read.
        copy_dtoh(st, &sum, &mut s)?;
        copy_dtoh(st, &flag, &mut b)?;
        self.synchronize()?;
        Ok(GradStats {
            sum_sq: s[0],
            non_finite: b[0] != 0,
        })
    }

    /// `dsts[d][i] = op(srcs[0][i], …)` for every destination, sources in order, combined
    /// in `f32` and rounded once (the host collectives' order and bits). Each source and
    /// destination is a buffer and an offset; every range holds `n` elements.
    pub fn reduce(
        &self,
        srcs: &[(&GpuBuffer, usize)],
        dsts: &mut [(&mut GpuBuffer, usize)],
        n: usize,
        op: Combine,
    ) -> Result<(), GpuError> {
        let dtype = srcs.first().map(|s| s.0.dtype()).ok_or_else(no_sources)?;
        if n == 0 || dsts.is_empty() {
            return Ok(());
        }
        with_gpu_type!(dtype, T => {
            let views: Vec<CudaView<'_, T>> = srcs
                .iter()
                .map(|(b, off)| self.read::<T>(b, *off..*off + n))
                .collect::<Result<_, _>>()?;
            let mut outs: Vec<CudaViewMut<'_, T>> = dsts
                .iter_mut()
                .map(|(b, off)| self.write::<T>(b, *off..*off + n))
                .collect::<Result<_, _>>()?;
            let (src_ptrs, src_guards): (Vec<u64>, Vec<SyncOnDrop<'_>>) =
                views.iter().map(|v| v.device_ptr(&self.stream)).unzip();
            let (dst_ptrs, dst_guards): (Vec<u64>, Vec<SyncOnDrop<'_>>) =
                outs.iter_mut().map(|v| v.device_ptr_mut(&self.stream)).unzip();
            self.launch_reduce_addrs::<T>(&src_ptrs, &dst_ptrs, n, op)?;
            // Dropping the guards records this stream's reads and writes on each buffer.
            drop((src_guards, dst_guards));
            Ok(())
        })
    }

    /// All-reduce in place: every buffer's first `n` elements become `op` of all of them,
    /// read in order.
    pub fn reduce_in_place(
        &self,
        bufs: &mut [&mut GpuBuffer],
        n: usize,
        op: Combine,
    ) -> Result<(), GpuError> {
        let dtype = bufs.first().map(|b| b.dtype()).ok_or_else(no_sources)?;
        if n == 0 {
            return Ok(());
        }
        with_gpu_type!(dtype, T => {
            let mut views: Vec<CudaViewMut<'_, T>> = bufs
                .iter_mut()
                .map(|b| self.write::<T>(b, 0..n))
                .collect::<Result<_, _>>()?;
            let (ptrs, guards): (Vec<u64>, Vec<SyncOnDrop<'_>>) =
                views.iter_mut().map(|v| v.device_ptr_mut(&self.stream)).unzip();
            self.launch_reduce_addrs::<T>(&ptrs, &ptrs, n, op)?;
            drop(guards);
            Ok(())
        })
    }

    /// The ordered reduction kernel over raw device addresses: every address must be a
    /// live range of `n` elements of `T` that the caller keeps alive and ordered until the
    /// launch is queued.
    pub(crate) fn launch_reduce_addrs<T: GpuElement>(
        &self,
        srcs: &[u64],
        dsts: &[u64],
        n: usize,
        op: Combine,
    ) -> Result<(), GpuError> {
        let table = |what: &str, ptrs: &[u64]| -> Result<[u64; MAX_REDUCE_BUFFERS], GpuError> {
            if ptrs.len() > MAX_REDUCE_BUFFERS {
                return Err(KernelError::LengthMismatch {
                    what: format!("reduce: {what} (at most {MAX_REDUCE_BUFFERS})"),
                    expected: MAX_REDUCE_BUFFERS,
                    actual: ptrs.len(),
                }
                .into());
            }
            let mut t = [0u64; MAX_REDUCE_BUFFERS];
            t[..ptrs.len()].copy_from_slice(ptrs);
            Ok(t)
        };
        let src_table = table("sources", srcs)?;
        let dst_table = table("destinations", dsts)?;
        let f = self.function("reduce.cu", &format!("reduce_{}", T::SUFFIX))?;
        let (nsrc, ndst, n64) = (srcs.len() as i32, dsts.len() as i32, n as u64);
        let code: i32 = match op {
            Combine::Sum => 0,
            Combine::Avg => 1,
            Combine::Max => 2,
        };
        let world = nsrc as f32;
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&src_table)
            .arg(&nsrc)
            .arg(&dst_table)
            .arg(&ndst)
            .arg(&n64)
            .arg(&code)
            .arg(&world);
        // SAFETY: reduce_T(BufferTable srcs, int nsrc, BufferTable dsts, int ndst, u64 n,
        // int op, float world), the tables passed by value (64 addresses each): their
        // first nsrc and ndst entries are addresses of ranges of n elements of T, which
        // the callers keep alive and guarded until the launch is queued.
        unsafe { launch.launch(launch_config(blocks(n, 4))) }
            .map(|_| ())
            .map_err(driver("launch reduce"))
    }
}

fn no_sources() -> GpuError {
    KernelError::LengthMismatch {
        what: "reduce: sources".into(),
        expected: 1,
        actual: 0,
    }
    .into()
}
