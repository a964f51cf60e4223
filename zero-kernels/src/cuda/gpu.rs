//! Host launchers for the CUDA kernels, over `cudarc`'s driver API.
//!
//! [`Gpu::get`] opens device 0 once per process: it checks the driver is there (an error,
//! not a panic, where it is not), compiles every source in [`SOURCES`](super::SOURCES)
//! with NVRTC for the device's exact architecture and loads them. The methods mirror the
//! CPU kernels and take host slices — copy in, launch, copy out — so the GPU tests run
//! the CPU tests' vectors and compare; the engine's device-resident path comes later.

use super::SOURCES;
use crate::{AdamConfig, Element, FlatLayout, GradStats, KernelError};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use zero_sys::cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
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
    /// A kernel did not compile.
    #[error(transparent)]
    Compile(#[from] NvrtcError),
    /// Bad arguments (the same checks as the CPU kernels).
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

fn driver<E: std::fmt::Debug>(context: &'static str) -> impl FnOnce(E) -> GpuError {
    move |e| GpuError::Driver {
        context,
        message: format!("{e:?}"),
    }
}

/// Element types the kernels take, with their kernel-name suffix.
pub trait GpuElement: Element + DeviceRepr + ValidAsZeroBits + Unpin {
    /// `f32`, `f16` or `bf16`.
    const SUFFIX: &'static str;
}
impl GpuElement for f32 {
    const SUFFIX: &'static str = "f32";
}
impl GpuElement for half::f16 {
    const SUFFIX: &'static str = "f16";
}
impl GpuElement for half::bf16 {
    const SUFFIX: &'static str = "bf16";
}

/// Threads per block of the element-wise kernels.
const THREADS: u32 = 256;
/// Blocks of the stats kernel (fixed, so the summation order is fixed).
const STATS_BLOCKS: usize = 1024;
/// Elements per flatten block (`CHUNK` in flatten.cu).
const FLATTEN_CHUNK: u64 = 256 * 8 * 4;

/// Device 0 with every kernel loaded.
pub struct Gpu {
    stream: Arc<CudaStream>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    /// The virtual architecture the kernels were compiled for (for example `compute_90`).
    pub arch: String,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("arch", &self.arch).finish()
    }
}

static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();

impl Gpu {
    /// The process's GPU (device 0), opened and with kernels compiled on first use.
    pub fn get() -> Result<&'static Gpu, GpuError> {
        zero_sys::driver::library()?;
        GPU.get_or_init(|| Self::open().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|message| GpuError::Driver {
                context: "opening device 0",
                message: message.clone(),
            })
    }

    fn open() -> Result<Gpu, GpuError> {
        let ctx = CudaContext::new(0).map_err(driver("CudaContext::new(0)"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("compute_capability"))?;
        let arch = format!("compute_{major}{minor}");
        let leaked: &'static str = Box::leak(arch.clone().into_boxed_str());
        let mut modules = HashMap::new();
        let cache = super::ptx_cache::cache_dir();
        for src in SOURCES {
            let (ptx, _) = super::ptx_cache::compiled_ptx(&src, leaked, cache.as_deref())?;
            let module = ctx
                .load_module(zero_sys::cudarc::nvrtc::Ptx::from_src(ptx.to_string()))
                .map_err(driver("load_module"))?;
            modules.insert(src.name, module);
        }
        Ok(Gpu {
            stream: ctx.default_stream(),
            modules,
            arch,
        })
    }

    fn function(&self, file: &'static str, name: &str) -> Result<CudaFunction, GpuError> {
        let module = self.modules.get(file).ok_or_else(|| GpuError::Driver {
            context: "module lookup",
            message: file.into(),
        })?;
        module.load_function(name).map_err(|e| GpuError::Driver {
            context: "load_function",
            message: format!("{name}: {e:?}"),
        })
    }

    fn blocks(n: usize, per_thread: usize) -> u32 {
        (n.div_ceil(per_thread * THREADS as usize)).clamp(1, 65_535) as u32
    }

    fn config(blocks: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// [`crate::cast`] on the GPU.
    pub fn cast<S: GpuElement, D: GpuElement>(
        &self,
        src: &[S],
        dst: &mut [D],
    ) -> Result<(), GpuError> {
        crate::error::check_len("cast: dst", src.len(), dst.len())?;
        if src.is_empty() || S::SUFFIX == D::SUFFIX {
            dst.iter_mut()
                .zip(src)
                .for_each(|(d, s)| *d = D::from_f32(s.to_f32()));
            return Ok(());
        }
        let f = self.function("cast.cu", &format!("cast_{}_{}", S::SUFFIX, D::SUFFIX))?;
        let s = &self.stream;
        let d_src = s.clone_htod(src).map_err(driver("copy in"))?;
        let mut d_dst = s.alloc_zeros::<D>(dst.len()).map_err(driver("alloc"))?;
        let n = src.len() as u64;
        let mut launch = s.launch_builder(&f);
        launch.arg(&d_src).arg(&mut d_dst).arg(&n);
        // SAFETY: cast_S_D(const S*, D*, u64 n) reads n elements of d_src and writes n of
        // d_dst; both hold exactly n elements.
        unsafe { launch.launch(Self::config(Self::blocks(src.len(), 4))) }
            .map_err(driver("launch cast"))?;
        s.memcpy_dtoh(&d_dst, dst).map_err(driver("copy out"))?;
        Ok(())
    }

    /// [`crate::adam_step`] on the GPU: the same update, the same bits.
    #[allow(clippy::too_many_arguments)]
    pub fn adam_step<G: GpuElement, P: GpuElement>(
        &self,
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
        if n == 0 {
            return Ok(());
        }
        let s = crate::adam::scalars(cfg, step, grad_scale);
        let mode = crate::adam::decay_mode(cfg) as i32;
        let name = format!("adam_{}_{}", G::SUFFIX, P::SUFFIX);
        let f = self.function("adam.cu", &name)?;
        let st = &self.stream;
        let mut w = st.clone_htod(master).map_err(driver("copy in"))?;
        let mut m = st.clone_htod(exp_avg).map_err(driver("copy in"))?;
        let mut v = st.clone_htod(exp_avg_sq).map_err(driver("copy in"))?;
        let g = st.clone_htod(grads).map_err(driver("copy in"))?;
        let mut p = st.alloc_zeros::<P>(n).map_err(driver("alloc"))?;
        let grad_scale_dev = st.clone_htod(&[s.scale]).map_err(driver("copy in"))?;
        let (p_ptr, p_sync) = p.device_ptr_mut(st);
        let p_arg: u64 = if params_out.is_some() { p_ptr } else { 0 };
        let no_flag: u64 = 0;
        let n64 = n as u64;
        let scalars = [
            s.beta1,
            s.one_minus_beta1,
            s.beta2,
            s.one_minus_beta2,
            s.wd,
            s.lr_wd,
            s.step_size,
            s.bc2_sqrt,
            s.eps,
        ];
        let mut launch = st.launch_builder(&f);
        launch
            .arg(&mut w)
            .arg(&mut m)
            .arg(&mut v)
            .arg(&g)
            .arg(&p_arg)
            .arg(&n64);
        for x in &scalars {
            launch.arg(x);
        }
        launch.arg(&mode).arg(&grad_scale_dev).arg(&no_flag);
        // SAFETY: adam_G_P(float* w, float* m, float* v, const G* g, P* p, u64 n, nine
        // floats, int mode, const float* grad_scale, const int* found_inf): w, m, v, g and
        // p hold n elements; p is null when no copy is wanted; grad_scale points to one
        // float; found_inf is null.
        unsafe { launch.launch(Self::config(Self::blocks(n, 4))) }
            .map_err(driver("launch adam"))?;
        drop(p_sync); // the write through p_ptr is scheduled
        st.memcpy_dtoh(&w, master).map_err(driver("copy out"))?;
        st.memcpy_dtoh(&m, exp_avg).map_err(driver("copy out"))?;
        st.memcpy_dtoh(&v, exp_avg_sq).map_err(driver("copy out"))?;
        if let Some(out) = params_out {
            st.memcpy_dtoh(&p, out).map_err(driver("copy out"))?;
        }
        Ok(())
    }

    /// [`crate::grad_stats`] on the GPU (the sum in a different fixed order than the CPU).
    pub fn grad_stats<T: GpuElement>(&self, x: &[T]) -> Result<GradStats, GpuError> {
        if x.is_empty() {
            return Ok(GradStats::EMPTY);
        }
        let st = &self.stream;
        let f = self.function("stats.cu", &format!("stats_{}", T::SUFFIX))?;
        let fin = self.function("stats.cu", "stats_finish")?;
        let blocks = x.len().div_ceil(THREADS as usize).min(STATS_BLOCKS);
        let d_x = st.clone_htod(x).map_err(driver("copy in"))?;
        let mut sums = st.alloc_zeros::<f64>(blocks).map_err(driver("alloc"))?;
        let mut flags = st.alloc_zeros::<i32>(blocks).map_err(driver("alloc"))?;
        let mut sum = st.alloc_zeros::<f64>(1).map_err(driver("alloc"))?;
        let mut flag = st.alloc_zeros::<i32>(1).map_err(driver("alloc"))?;
        let n = x.len() as u64;
        let count = blocks as i32;
        let mut first = st.launch_builder(&f);
        first.arg(&d_x).arg(&n).arg(&mut sums).arg(&mut flags);
        // SAFETY: stats_T(const T* x, u64 n, double* sums, int* flags): x holds n elements;
        // sums and flags hold one entry per block.
        unsafe { first.launch(Self::config(blocks as u32)) }.map_err(driver("launch stats"))?;
        let mut second = st.launch_builder(&fin);
        second
            .arg(&sums)
            .arg(&flags)
            .arg(&count)
            .arg(&mut sum)
            .arg(&mut flag);
        // SAFETY: stats_finish reads `count` partials and writes one sum and one flag.
        unsafe { second.launch(Self::config(1)) }.map_err(driver("launch stats_finish"))?;
        let s = st.clone_dtoh(&sum).map_err(driver("copy out"))?;
        let b = st.clone_dtoh(&flag).map_err(driver("copy out"))?;
        Ok(GradStats {
            sum_sq: s[0],
            non_finite: b[0] != 0,
        })
    }

    /// [`crate::flatten`] on the GPU: one launch for every tensor, from a device table.
    pub fn flatten<S: GpuElement, D: GpuElement>(
        &self,
        layout: &FlatLayout,
        srcs: &[&[S]],
        flat: &mut [D],
    ) -> Result<(), GpuError> {
        crate::flatten::check_shapes(
            "flatten",
            layout,
            srcs.iter().map(|s| s.len()),
            srcs.len(),
            flat.len(),
        )?;
        let st = &self.stream;
        let concat: Vec<S> = srcs.iter().flat_map(|s| s.iter().copied()).collect();
        if concat.is_empty() {
            flat.iter_mut().for_each(|x| *x = D::default());
            return Ok(());
        }
        let d_src = st.clone_htod(&concat).map_err(driver("copy in"))?;
        let mut d_dst = st.alloc_zeros::<D>(flat.len()).map_err(driver("alloc"))?;
        let (src_base, src_sync) = d_src.device_ptr(st);
        let (dst_base, dst_sync) = d_dst.device_ptr_mut(st);
        let mut table: Vec<u64> = Vec::with_capacity(4 * srcs.len());
        let (mut offset, mut blocks) = (0u64, 0u64);
        for (i, s) in srcs.iter().enumerate() {
            let len = s.len() as u64;
            if len == 0 {
                continue;
            }
            let dst = dst_base + (layout.tensor_range(i).start * std::mem::size_of::<D>()) as u64;
            table.extend([
                src_base + offset * std::mem::size_of::<S>() as u64,
                dst,
                len,
                blocks,
            ]);
            offset += len;
            blocks += len.div_ceil(FLATTEN_CHUNK);
        }
        let d_table = st.clone_htod(&table).map_err(driver("copy in"))?;
        let entries = (table.len() / 4) as i32;
        let f = self.function("flatten.cu", &format!("copy_{}_{}", S::SUFFIX, D::SUFFIX))?;
        let mut launch = st.launch_builder(&f);
        launch.arg(&d_table).arg(&entries);
        // SAFETY: copy_S_D(const CopyEntry* table, int entries): every entry's source range
        // lies in d_src and its destination range in d_dst (both alive until the copy
        // out below), and `blocks` covers every entry's chunks.
        unsafe { launch.launch(Self::config(blocks.max(1) as u32)) }
            .map_err(driver("launch flatten"))?;
        drop((src_sync, dst_sync)); // the accesses through the table are scheduled
        st.memcpy_dtoh(&d_dst, flat).map_err(driver("copy out"))?;
        Ok(())
    }
}
