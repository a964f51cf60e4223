//! The process's GPU, over `cudarc`'s driver API.
//!
//! [`Gpu::open`] opens the process's device once, chosen by
//! [`choose_device`](super::device_choice::choose_device) from the launcher's local rank (the one
//! visible GPU, else the local rank's): it checks the driver is there (an error, not a
//! panic, where it is not), takes every source in [`SOURCES`] compiled to
//! a cubin for the device's exact architecture (from the kernel cache, or NVRTC) and loads
//! them. [`Gpu::get`] returns the opened device, or opens one with no local rank. Work
//! runs on `GpuStream`s over device buffers (`stream.rs` makes them);
//! `host_slices.rs` mirrors the CPU kernels over host slices.

use super::error::{driver, opening_error, GpuError};
use super::sources::SOURCES;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use zero_sys::cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};

/// The process's GPU with every kernel loaded.
pub struct Gpu {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
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
    /// [`choose_device`](super::device_choice::choose_device)). A process has one GPU: asking for another
    /// device than the one already opened is an error naming both.
    pub fn open(local_rank: Option<usize>) -> Result<&'static Gpu, GpuError> {
        zero_sys::driver::library()?;
        let count = CudaContext::device_count().map_err(driver("device_count"))?;
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let ordinal = super::device_choice::choose_device(
            local_rank,
            count.max(0) as usize,
            visible.as_deref(),
        )
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
        super::toolchain::check_toolchain(driver_version, nvrtc, (major, minor))
            .map_err(opening_error)?;
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

    /// Bytes in use in this device's default memory pool, which every buffer zero
    /// allocates draws from (`zero_sys::driver::default_pool_used`: the process's users
    /// of the pool together), read after the device ran the work queued so far, so frees
    /// queued on any stream have landed. What the engine's memory report is checked
    /// against.
    pub fn pool_used_bytes(&self) -> Result<u64, GpuError> {
        self.pool_figure(zero_sys::driver::default_pool_used)
    }

    /// The most bytes ever in use at once in this device's default memory pool
    /// (`zero_sys::driver::default_pool_peak`; the same users as [`Gpu::pool_used_bytes`]),
    /// read after the device ran the work queued so far.
    pub fn pool_peak_bytes(&self) -> Result<u64, GpuError> {
        self.pool_figure(zero_sys::driver::default_pool_peak)
    }

    /// Resets [`Gpu::pool_peak_bytes`] to the bytes in use now, after the queued work ran
    /// (a test measures one run's peak from there).
    pub fn reset_pool_peak(&self) -> Result<(), GpuError> {
        self.pool_figure(zero_sys::driver::default_pool_reset_peak)
    }

    /// `call` on the default memory pool (read a figure, or reset one) after the queued
    /// work ran.
    fn pool_figure<T>(
        &self,
        call: fn(zero_sys::cudarc::driver::sys::CUdevice) -> Result<T, String>,
    ) -> Result<T, GpuError> {
        self.ctx.synchronize().map_err(driver("synchronize"))?;
        call(self.ctx.cu_device()).map_err(|message| GpuError::Driver {
            context: "memory pool",
            message,
        })
    }

    /// The device's name, for reports.
    pub fn name(&self) -> String {
        self.ctx
            .name()
            .unwrap_or_else(|e| format!("unknown ({e:?})"))
    }
}
