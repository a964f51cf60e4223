//! The process's GPU, over `cudarc`'s driver API.
//!
//! [`Gpu::open`] opens the process's device once, chosen by
//! [`choose_device`](super::choose_device) from the launcher's local rank (the one
//! visible GPU, else the local rank's): it checks the driver is there (an error, not a
//! panic, where it is not), takes every source in [`SOURCES`](super::SOURCES) compiled to
//! a cubin for the device's exact architecture (from the kernel cache, or NVRTC) and loads
//! them. [`Gpu::get`] returns the opened device, or opens one with no local rank. Work
//! runs on [`GpuStream`]s over device buffers; the methods here mirror the CPU kernels
//! over host slices (copy in, run on the default stream, copy out), so the GPU tests run
//! the CPU tests' vectors through the same device code and compare.

use super::buffer::GpuElement;
use super::ops::{AdamViews, GradScale};
use super::stream::GpuStream;
use super::SOURCES;
use crate::{AdamConfig, FlatLayout, GradStats, KernelError};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use zero_sys::cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use zero_sys::nvrtc::NvrtcError;
use zero_sys::LoadError;

/// The GPU path failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver on this machine.
    #[error("no GPU: {0}")]
    NoDriver(#[from] LoadError),
    /// A driver call failed.
    #[error("CUDA driver error in {context}: {message}")]
    Driver {
        /// What was being done.
        context: &'static str,
        /// The driver's message.
        message: String,
    },
    /// A driver error from an earlier call that could not report it: `cudarc` keeps the
    /// errors of frees and event records made in `Drop` in the context, shared by every
    /// thread of the process, and returns them from the next call on any thread.
    #[error(
        "CUDA driver error {message} on GPU {device}, noticed before {noticed_in}: it was \
         deferred from an earlier free or event record in a Drop on some thread of this \
         process (with ranks as threads, possibly another rank's), not caused by this call \
         ({origin}); the GPU context may be unusable (docs/LAUNCHING.md, \"Troubleshooting\")"
    )]
    Deferred {
        /// The device ordinal.
        device: usize,
        /// The call that found the error waiting.
        noticed_in: &'static str,
        /// The driver's message.
        message: String,
        /// Where it was most likely queued: the last buffer free queued before it was
        /// noticed (cudarc keeps the error without its origin).
        origin: String,
    },
    /// A kernel did not compile.
    #[error(transparent)]
    Compile(#[from] NvrtcError),
    /// Bad arguments (the same checks as the CPU kernels).
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

pub(crate) fn driver<E: std::fmt::Debug>(context: &'static str) -> impl FnOnce(E) -> GpuError {
    move |e| GpuError::Driver {
        context,
        message: format!("{e:?}"),
    }
}

/// The process's GPU with every kernel loaded.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    /// The device ordinal (among the visible devices).
    pub ordinal: usize,
    /// The real architecture the kernels were compiled for (for example `sm_90`).
    pub arch: String,
    /// The driver's CUDA version.
    pub driver: (i32, i32),
    /// The NVRTC version that compiled the kernels.
    pub nvrtc: (i32, i32),
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("arch", &self.arch)
            .field("driver", &self.driver)
            .field("nvrtc", &self.nvrtc)
            .finish()
    }
}

static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();

fn opening_error(message: String) -> GpuError {
    GpuError::Driver {
        context: "opening the GPU",
        message,
    }
}

impl Gpu {
    /// The process's GPU: the one already opened, or else the device
    /// [`open`](Self::open) picks with no local rank (the one visible GPU, or device 0).
    pub fn get() -> Result<&'static Gpu, GpuError> {
        zero_sys::driver::library()?;
        match GPU.get() {
            Some(opened) => opened.as_ref().map_err(|m| opening_error(m.clone())),
            None => Self::open(None),
        }
    }

    /// Opens the process's GPU for a process at `local_rank` on its node (from the
    /// launcher; `None` when there is none), with kernels compiled on first use. The
    /// device is the one visible GPU, else the local rank's (see
    /// [`choose_device`](super::choose_device)). A process has one GPU: asking for another
    /// device than the one already opened is an error naming both.
    pub fn open(local_rank: Option<usize>) -> Result<&'static Gpu, GpuError> {
        zero_sys::driver::library()?;
        let count = CudaContext::device_count().map_err(driver("device_count"))?;
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let ordinal = super::choose_device(local_rank, count.max(0) as usize, visible.as_deref())
            .map_err(opening_error)?;
        Self::open_at(ordinal, &format!("local rank {local_rank:?}"))
    }

    /// Opens device `ordinal` (among the visible devices) as the process's GPU: the device
    /// a framework already chose (zero-torch passes the one torch's model is on, so both
    /// sides use one device). An error names both when another device is already open,
    /// and the count when `ordinal` is not a visible device.
    pub fn open_ordinal(ordinal: usize) -> Result<&'static Gpu, GpuError> {
        zero_sys::driver::library()?;
        let count = CudaContext::device_count().map_err(driver("device_count"))?;
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let ordinal =
            super::device_choice::check_ordinal(ordinal, count.max(0) as usize, visible.as_deref())
                .map_err(opening_error)?;
        Self::open_at(ordinal, "the caller")
    }

    /// The process's GPU if one was opened (by [`open`](Self::open),
    /// [`open_ordinal`](Self::open_ordinal) or [`get`](Self::get)), else `None`.
    pub fn opened() -> Option<&'static Gpu> {
        GPU.get().and_then(|g| g.as_ref().ok())
    }

    fn open_at(ordinal: usize, who: &str) -> Result<&'static Gpu, GpuError> {
        let gpu = GPU
            .get_or_init(|| Self::open_device(ordinal).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|m| opening_error(m.clone()))?;
        if gpu.ordinal != ordinal {
            return Err(opening_error(format!(
                "this process already uses GPU {}, and {who} asks for GPU {ordinal}; open the \
                 GPU (NcclComm::init, Gpu::open) before anything else uses it",
                gpu.ordinal
            )));
        }
        Ok(gpu)
    }

    fn open_device(ordinal: usize) -> Result<Gpu, GpuError> {
        let driver_version = zero_sys::driver::version().map_err(opening_error)?;
        let ctx = CudaContext::new(ordinal).map_err(driver("CudaContext::new"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("compute_capability"))?;
        let nvrtc = zero_sys::nvrtc::Nvrtc::for_device((major, minor))?.version();
        super::check_toolchain(driver_version, nvrtc, (major, minor)).map_err(opening_error)?;
        let arch = format!("sm_{major}{minor}");
        let key = super::kernel_cache::CacheKey {
            sm: &arch,
            nvrtc,
            driver: Some(driver_version),
        };
        let mut modules = HashMap::new();
        let cache = super::kernel_cache::cache_dir();
        for src in SOURCES {
            let (image, _) = super::kernel_cache::compiled_cubin(&src, &key, cache.as_deref())?;
            let module = ctx
                .load_module(zero_sys::cudarc::nvrtc::Ptx::from_binary(image.to_vec()))
                .map_err(|e| GpuError::Driver {
                    context: "loading the kernels",
                    message: format!(
                        "{}: {e:?} (a cubin for {arch} from NVRTC {}.{} on a CUDA {}.{} driver)",
                        src.name, nvrtc.0, nvrtc.1, driver_version.0, driver_version.1
                    ),
                })?;
            modules.insert(src.name, module);
        }
        Ok(Gpu {
            stream: ctx.default_stream(),
            ctx,
            modules,
            ordinal,
            arch,
            driver: driver_version,
            nvrtc,
        })
    }

    pub(crate) fn function(
        &self,
        file: &'static str,
        name: &str,
    ) -> Result<CudaFunction, GpuError> {
        let module = self.modules.get(file).ok_or_else(|| GpuError::Driver {
            context: "module lookup",
            message: file.into(),
        })?;
        module.load_function(name).map_err(|e| GpuError::Driver {
            context: "load_function",
            message: format!("{name}: {e:?}"),
        })
    }

    /// The device's default stream.
    pub fn default_stream(&'static self) -> GpuStream {
        GpuStream::new(self, self.stream.clone())
    }

    /// A new stream (one per rank of the one-device group, or for communication).
    pub fn new_stream(&'static self) -> Result<GpuStream, GpuError> {
        let s = self.ctx.new_stream().map_err(driver("new_stream"))?;
        Ok(GpuStream::new(self, s))
    }

    /// Bytes in use in this device's default memory pool, which every buffer zero
    /// allocates draws from (`zero_sys::driver::default_pool_used`: the process's users
    /// of the pool together), read after the device ran the work queued so far, so frees
    /// queued on any stream have landed. What the engine's memory report is checked
    /// against.
    pub fn pool_used_bytes(&self) -> Result<u64, GpuError> {
        self.ctx.synchronize().map_err(driver("synchronize"))?;
        zero_sys::driver::default_pool_used(self.ctx.cu_device()).map_err(|message| {
            GpuError::Driver {
                context: "memory pool",
                message,
            }
        })
    }

    /// The device's name, for reports.
    pub fn name(&self) -> String {
        self.ctx
            .name()
            .unwrap_or_else(|e| format!("unknown ({e:?})"))
    }

    /// [`crate::cast`] on the GPU.
    pub fn cast<S: GpuElement, D: GpuElement>(
        &'static self,
        src: &[S],
        dst: &mut [D],
    ) -> Result<(), GpuError> {
        crate::error::check_len("cast: dst", src.len(), dst.len())?;
        let st = self.default_stream();
        let s = st.upload(src)?;
        let mut d = st.zeros(D::DTYPE, dst.len())?;
        st.copy(&s, 0..src.len(), &mut d, 0)?;
        dst.copy_from_slice(&st.download(&d, 0..dst.len())?);
        Ok(())
    }

    /// [`crate::adam_step`] on the GPU: the same update, the same bits.
    #[allow(clippy::too_many_arguments)]
    pub fn adam_step<G: GpuElement, P: GpuElement>(
        &'static self,
        cfg: &AdamConfig,
        step: u64,
        grad_scale: f32,
        master: &mut [f32],
        exp_avg: &mut [f32],
        exp_avg_sq: &mut [f32],
        grads: &[G],
        params_out: Option<&mut [P]>,
    ) -> Result<(), GpuError> {
        let n = master.len();
        crate::adam::check_args(
            cfg,
            step,
            n,
            exp_avg.len(),
            exp_avg_sq.len(),
            grads.len(),
            params_out.as_ref().map(|p| p.len()),
        )?;
        let st = self.default_stream();
        let mut w = st.upload(master)?;
        let mut m = st.upload(exp_avg)?;
        let mut v = st.upload(exp_avg_sq)?;
        let g = st.upload(grads)?;
        let mut p = st.zeros(P::DTYPE, n)?;
        {
            let (mut wv, mut mv, mut vv) = (
                w.view_mut::<f32>(0..n)?,
                m.view_mut::<f32>(0..n)?,
                v.view_mut::<f32>(0..n)?,
            );
            let mut pv = p.view_mut::<P>(0..n)?;
            st.adam(
                cfg,
                step,
                GradScale::Host(grad_scale),
                None,
                AdamViews {
                    master: &mut wv,
                    exp_avg: &mut mv,
                    exp_avg_sq: &mut vv,
                },
                &g.view::<G>(0..n)?,
                params_out.is_some().then_some(&mut pv),
            )?;
        }
        master.copy_from_slice(&st.download(&w, 0..n)?);
        exp_avg.copy_from_slice(&st.download(&m, 0..n)?);
        exp_avg_sq.copy_from_slice(&st.download(&v, 0..n)?);
        if let Some(out) = params_out {
            out.copy_from_slice(&st.download(&p, 0..n)?);
        }
        Ok(())
    }

    /// [`crate::grad_stats`] on the GPU (the sum in a different fixed order than the CPU).
    pub fn grad_stats<T: GpuElement>(&'static self, x: &[T]) -> Result<GradStats, GpuError> {
        let st = self.default_stream();
        let b = st.upload(x)?;
        st.stats(&b, 0..x.len())
    }

    /// [`crate::flatten`] on the GPU: one launch for every tensor and gap.
    pub fn flatten<S: GpuElement, D: GpuElement>(
        &'static self,
        layout: &FlatLayout,
        srcs: &[&[S]],
        flat: &mut [D],
    ) -> Result<(), GpuError> {
        let st = self.default_stream();
        let bufs: Vec<_> = srcs
            .iter()
            .map(|s| st.upload(s))
            .collect::<Result<_, _>>()?;
        let views: Vec<_> = bufs
            .iter()
            .zip(srcs)
            .map(|(b, s)| b.view::<S>(0..s.len()))
            .collect::<Result<_, _>>()?;
        // Poison the output first, so an element the kernel misses shows.
        let mut out = st.upload(&vec![D::from_f32(f32::NAN); flat.len()])?;
        st.flatten_views(layout, &views, &mut out.view_mut::<D>(0..flat.len())?)?;
        flat.copy_from_slice(&st.download(&out, 0..flat.len())?);
        Ok(())
    }

    /// [`crate::unflatten`] on the GPU: one launch for every tensor.
    pub fn unflatten<S: GpuElement, D: GpuElement>(
        &'static self,
        layout: &FlatLayout,
        flat: &[S],
        dsts: &mut [&mut [D]],
    ) -> Result<(), GpuError> {
        let st = self.default_stream();
        let src = st.upload(flat)?;
        let mut outs: Vec<_> = dsts
            .iter()
            .map(|d| st.zeros(D::DTYPE, d.len()))
            .collect::<Result<_, _>>()?;
        {
            let mut views: Vec<_> = outs
                .iter_mut()
                .zip(dsts.iter())
                .map(|(b, d)| b.view_mut::<D>(0..d.len()))
                .collect::<Result<_, _>>()?;
            st.unflatten_views(layout, &src.view::<S>(0..flat.len())?, &mut views)?;
        }
        for (d, b) in dsts.iter_mut().zip(&outs) {
            d.copy_from_slice(&st.download(b, 0..d.len())?);
        }
        Ok(())
    }
}
