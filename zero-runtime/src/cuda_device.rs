//! The GPU: buffers are [`GpuBuffer`]s on one device, and every operation is a kernel
//! queued on this rank's stream (`zero-kernels`' CUDA half). The engine is the same as on
//! the host; only this trait implementation differs.

use crate::device::{check_runs, AdamRun, AdamState, Device, HostDevice};
use crate::EngineError;
use std::ops::Range;
use zero_comm::HostBuffer;
use zero_kernels::cuda::{AdamViews, Gpu, GpuBuffer, GpuError, GpuStream, GradScale};
use zero_kernels::{with_gpu_type, DType, GradStats};

/// One rank's view of the process's GPU: its own stream, so ranks sharing the device (the
/// one-device group) run side by side and order themselves through buffer events.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    stream: GpuStream,
}

fn device_error(e: GpuError) -> EngineError {
    match e {
        GpuError::Kernel(k) => EngineError::Kernel(k),
        other => EngineError::Device(other.to_string()),
    }
}

impl CudaDevice {
    /// A new stream on the process's GPU (the one `NcclComm::init` or `Gpu::open` opened,
    /// else the one visible GPU or device 0); an error naming the missing driver where
    /// there is none.
    pub fn new() -> Result<Self, EngineError> {
        let gpu = Gpu::get().map_err(device_error)?;
        Ok(CudaDevice {
            stream: gpu.new_stream().map_err(device_error)?,
        })
    }

    /// The stream this device queues on (for a trainer's own kernels).
    pub fn stream(&self) -> &GpuStream {
        &self.stream
    }
}

impl Device for CudaDevice {
    type Buffer = GpuBuffer;

    fn zeros(&self, dtype: DType, len: usize) -> Result<GpuBuffer, EngineError> {
        self.stream.zeros(dtype, len).map_err(device_error)
    }

    fn len(&self, b: &GpuBuffer) -> usize {
        b.len()
    }

    fn allocator_used(&self) -> Option<usize> {
        let used = self.stream.gpu().pool_used_bytes().ok()?;
        usize::try_from(used).ok()
    }

    fn allocator_peak(&self) -> Option<usize> {
        let peak = self.stream.gpu().pool_peak_bytes().ok()?;
        usize::try_from(peak).ok()
    }

    fn dtype(&self, b: &GpuBuffer) -> DType {
        b.dtype()
    }

    fn resize(&self, b: &mut GpuBuffer, len: usize) -> Result<(), EngineError> {
        self.stream.resize(b, len).map_err(device_error)
    }

    fn upload_f32(
        &self,
        dst: &mut GpuBuffer,
        offset: usize,
        src: &[f32],
    ) -> Result<(), EngineError> {
        self.stream
            .upload_f32(dst, offset, src)
            .map_err(device_error)
    }

    fn download_f32(&self, src: &GpuBuffer, range: Range<usize>) -> Result<Vec<f32>, EngineError> {
        self.stream.download_f32(src, range).map_err(device_error)
    }

    fn download_f32_into(
        &self,
        src: &GpuBuffer,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), EngineError> {
        // The f32 state streams into the caller's (I/O) buffer through a pinned chunk;
        // 16-bit buffers go through a device-side widening copy first.
        if src.dtype() == DType::F32 {
            let view = self.stream.read::<f32>(src, range).map_err(device_error)?;
            return self
                .stream
                .download_pinned(&view, dst)
                .map_err(device_error);
        }
        let n = range.len();
        let mut wide = self.stream.zeros(DType::F32, n).map_err(device_error)?;
        self.stream
            .copy(src, range, &mut wide, 0)
            .map_err(device_error)?;
        let view = self.stream.read::<f32>(&wide, 0..n).map_err(device_error)?;
        self.stream
            .download_pinned(&view, dst)
            .map_err(device_error)
    }

    fn add_f32(&self, dst: &mut GpuBuffer, offset: usize, src: &[f32]) -> Result<(), EngineError> {
        // The convenience path: read, add on the host (the same f32 sum and rounding as
        // the host device), write back. GPU trainers write into grad_buffer_mut instead.
        let mut cur = self.download_f32(dst, offset..offset + src.len())?;
        cur.iter_mut().zip(src).for_each(|(c, s)| *c += *s);
        self.upload_f32(dst, offset, &cur)
    }

    fn copy_to_host(
        &self,
        src: &GpuBuffer,
        range: Range<usize>,
        dst: &mut HostBuffer,
        offset: usize,
    ) -> Result<(), EngineError> {
        let n = range.len();
        if dst.len() < offset + n {
            return Err(EngineError::OutOfRange {
                what: "copy to host".into(),
                range: offset..offset + n,
                len: dst.len(),
            });
        }
        let dtype = dst.dtype();
        if src.dtype() == dtype {
            // Through pinned chunks: full-speed DMA (the offload step's gradients).
            return with_gpu_type!(src.dtype(), T => {
                let view = self.stream.read::<T>(src, range).map_err(device_error)?;
                let d = dst.as_mut_slice::<T>().ok_or_else(|| host_dtype(src.dtype(), dtype))?;
                self.stream.download_pinned(&view, &mut d[offset..offset + n]).map_err(device_error)
            });
        }
        let wide = self.download_f32(src, range)?;
        let host = HostDevice;
        host.upload_f32(dst, offset, &wide)
    }

    fn copy_from_host(
        &self,
        src: &HostBuffer,
        range: Range<usize>,
        dst: &mut GpuBuffer,
        offset: usize,
    ) -> Result<(), EngineError> {
        let n = range.len();
        if src.dtype() == dst.dtype() {
            // Queued through pinned slots, returning before the DMA runs: the offload step
            // computes the next chunk while this one crosses.
            return with_gpu_type!(src.dtype(), T => {
                let s = src.as_slice::<T>().ok_or_else(|| host_dtype(src.dtype(), src.dtype()))?;
                self.stream.upload_pinned(&s[range], dst, offset).map_err(device_error)
            });
        }
        let tmp = with_gpu_type!(src.dtype(), T => {
            let s = src.as_slice::<T>().ok_or_else(|| host_dtype(src.dtype(), src.dtype()))?;
            self.stream.upload(&s[range]).map_err(device_error)?
        });
        self.stream
            .copy(&tmp, 0..n, dst, offset)
            .map_err(device_error)
    }

    fn copy(
        &self,
        src: &GpuBuffer,
        range: Range<usize>,
        dst: &mut GpuBuffer,
        offset: usize,
    ) -> Result<(), EngineError> {
        self.stream
            .copy(src, range, dst, offset)
            .map_err(device_error)
    }

    fn accumulate(
        &self,
        acc: &mut GpuBuffer,
        offset: usize,
        src: &GpuBuffer,
        range: Range<usize>,
    ) -> Result<(), EngineError> {
        self.stream
            .accumulate(acc, offset, src, range)
            .map_err(device_error)
    }

    fn zero(&self, b: &mut GpuBuffer, range: Range<usize>) -> Result<(), EngineError> {
        self.stream.zero(b, range).map_err(device_error)
    }

    fn stats(&self, b: &GpuBuffer, range: Range<usize>) -> Result<GradStats, EngineError> {
        self.stream.stats(b, range).map_err(device_error)
    }

    fn adam(
        &self,
        runs: &[AdamRun],
        step: u64,
        grad_scale: f32,
        state: &mut AdamState<GpuBuffer>,
        grads: &GpuBuffer,
        range: Range<usize>,
        params: &mut GpuBuffer,
        offset: usize,
    ) -> Result<(), EngineError> {
        let n = state.exp_avg.len();
        check_runs(runs, n)?;
        let mut run = |r: &AdamRun| -> Result<(), GpuError> {
            let st = &self.stream;
            let e = r.range.clone();
            let mut m = st.write::<f32>(&mut state.exp_avg, e.clone())?;
            let mut v = st.write::<f32>(&mut state.exp_avg_sq, e.clone())?;
            let held = offset + e.start..offset + e.end;
            match state.master.as_mut() {
                Some(master) => {
                    let mut w = st.write::<f32>(master, e.clone())?;
                    with_gpu_type!(grads.dtype(), G => with_gpu_type!(params.dtype(), P => {
                        let g = st.read::<G>(grads, range.start + e.start..range.start + e.end)?;
                        let mut p = st.write::<P>(params, held)?;
                        self.stream.adam(
                            &r.cfg,
                            step,
                            GradScale::Host(grad_scale),
                            None,
                            AdamViews { master: &mut w, exp_avg: &mut m, exp_avg_sq: &mut v },
                            &g,
                            Some(&mut p),
                        )
                    }))
                }
                // fp32 parameters are the master weights: updated in place.
                None => {
                    let mut w = st.write::<f32>(params, held)?;
                    with_gpu_type!(grads.dtype(), G => {
                        let g = st.read::<G>(grads, range.start + e.start..range.start + e.end)?;
                        self.stream.adam::<G, f32>(
                            &r.cfg,
                            step,
                            GradScale::Host(grad_scale),
                            None,
                            AdamViews { master: &mut w, exp_avg: &mut m, exp_avg_sq: &mut v },
                            &g,
                            None,
                        )
                    })
                }
            }
        };
        for r in runs {
            run(r).map_err(device_error)?;
        }
        Ok(())
    }
}

/// A host buffer that does not hold the dtype a copy's other side has (the copy is typed
/// by that side).
fn host_dtype(requested: DType, actual: DType) -> EngineError {
    EngineError::WrongDType { requested, actual }
}
