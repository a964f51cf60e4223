//! Fused Adam and multi-tensor flatten / unflatten on a [`GpuStream`], over device views.

use super::data::GpuElement;
use super::error::{driver, GpuError};
use super::stream::{blocks, launch_config, GpuStream};
use crate::{AdamConfig, FlatLayout, KernelError};
use zero_sys::cudarc::driver::{
    CudaView, CudaViewMut, DevicePtr, DevicePtrMut, PushKernelArg, SyncOnDrop,
};

/// Elements per flatten block (`CHUNK` in flatten.cu).
const FLATTEN_CHUNK: u64 = 256 * 8 * 4;

/// The fp32 optimizer state of one range, on the device.
#[derive(Debug)]
pub struct AdamViews<'a, 'b> {
    /// Master weights.
    pub master: &'a mut CudaViewMut<'b, f32>,
    /// First moment.
    pub exp_avg: &'a mut CudaViewMut<'b, f32>,
    /// Second moment.
    pub exp_avg_sq: &'a mut CudaViewMut<'b, f32>,
}

/// One row of the flatten kernel's table: source, destination, length, first block.
type CopyEntry = [u64; 4];

/// The scale Adam multiplies every gradient by (unscale and clip folded together).
#[derive(Debug, Clone, Copy)]
pub enum GradScale<'a, 'b> {
    /// A value the host passes with the launch.
    Host(f32),
    /// One `f32` in device memory, computed there (no host round trip).
    Device(&'a CudaView<'b, f32>),
}

impl GpuStream {
    /// [`crate::adam_step`] on device memory. `found_inf` (one `i32`, optional) is read
    /// on the device: when the flag is non-zero the kernel changes nothing, so an overflow
    /// skips the step with no host round trip.
    #[allow(clippy::too_many_arguments)]
    pub fn adam<G: GpuElement, P: GpuElement>(
        &self,
        cfg: &AdamConfig,
        step: u64,
        grad_scale: GradScale<'_, '_>,
        found_inf: Option<&CudaView<'_, i32>>,
        state: AdamViews<'_, '_>,
        grads: &CudaView<'_, G>,
        params_out: Option<&mut CudaViewMut<'_, P>>,
    ) -> Result<(), GpuError> {
        let n = state.master.len();
        crate::adam::check_args(
            cfg,
            step,
            n,
            state.exp_avg.len(),
            state.exp_avg_sq.len(),
            grads.len(),
            params_out.as_ref().map(|p| p.len()),
        )?;
        if let GradScale::Device(v) = grad_scale {
            crate::error::check_len("adam: grad_scale", 1, v.len())?;
        }
        if n == 0 {
            return Ok(());
        }
        // The scale is applied on the device (to the gradient, as the CPU kernel does), so
        // the scalars are computed with a scale of one.
        let s = crate::adam::scalars(cfg, step, 1.0);
        let mode = crate::adam::decay_mode(cfg) as i32;
        let f = self.function("adam.cu", &format!("adam_{}_{}", G::SUFFIX, P::SUFFIX))?;
        let st = self.cuda();
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::new();
        let p_arg: u64 = match params_out {
            Some(p) => {
                let (ptr, g) = p.device_ptr_mut(st);
                guards.push(g);
                ptr
            }
            None => 0,
        };
        let flag_arg: u64 = match found_inf {
            Some(flag) => {
                crate::error::check_len("adam: found_inf", 1, flag.len())?;
                let (ptr, g) = flag.device_ptr(st);
                guards.push(g);
                ptr
            }
            None => 0,
        };
        let (scale_value, scale_arg) = match grad_scale {
            GradScale::Host(v) => (v, 0u64),
            GradScale::Device(v) => {
                let (ptr, g) = v.device_ptr(st);
                guards.push(g);
                (1.0f32, ptr)
            }
        };
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
            .arg(state.master)
            .arg(state.exp_avg)
            .arg(state.exp_avg_sq)
            .arg(grads)
            .arg(&p_arg)
            .arg(&n64);
        for x in &scalars {
            launch.arg(x);
        }
        launch
            .arg(&mode)
            .arg(&scale_value)
            .arg(&scale_arg)
            .arg(&flag_arg);
        // SAFETY: adam_G_P(float* w, float* m, float* v, const G* g, P* p, u64 n, nine
        // floats, int mode, float grad_scale_value, const float* grad_scale, const int*
        // found_inf): w, m, v and g hold n elements (checked above); p is null or n
        // elements; grad_scale is null or one float; found_inf is null or one int. The
        // guards keep p, grad_scale and found_inf ordered.
        unsafe { launch.launch(launch_config(blocks(n, 4))) }.map_err(driver("launch adam"))?;
        drop(guards);
        Ok(())
    }

    fn launch_copy_table<S: GpuElement, D: GpuElement>(
        &self,
        table: &[CopyEntry],
        total_blocks: u64,
    ) -> Result<(), GpuError> {
        if table.is_empty() {
            return Ok(());
        }
        let flat: Vec<u64> = table.iter().flatten().copied().collect();
        let d_table = self.upload_table(&flat)?;
        let entries = table.len() as i32;
        let f = self.function("flatten.cu", &format!("copy_{}_{}", S::SUFFIX, D::SUFFIX))?;
        let mut launch = self.cuda().launch_builder(&f);
        launch.arg(&*d_table).arg(&entries);
        // SAFETY: copy_S_D(const CopyEntry* table, int entries): each entry's source is a
        // live range of `len` S (tensor or zeros), its destination a live range of
        // `len` D, kept alive and guarded by the caller until the launch is queued; the
        // grid covers every entry's chunks.
        unsafe { launch.launch(launch_config(total_blocks.max(1) as u32)) }
            .map(|_| ())
            .map_err(driver("launch flatten"))
    }

    /// [`crate::flatten`] on the device: every tensor and every padding gap in one launch.
    pub fn flatten_views<S: GpuElement, D: GpuElement>(
        &self,
        layout: &FlatLayout,
        srcs: &[CudaView<'_, S>],
        flat: &mut CudaViewMut<'_, D>,
    ) -> Result<(), GpuError> {
        crate::flatten::check_shapes(
            "flatten",
            layout,
            srcs.iter().map(|s| s.len()),
            srcs.len(),
            flat.len(),
        )?;
        let st = self.cuda();
        // Padding is copied from a buffer of zeros as long as the longest gap.
        let mut gaps = Vec::with_capacity(srcs.len() + 1);
        let mut pos = 0;
        for i in 0..srcs.len() {
            let r = layout.tensor_range(i);
            gaps.push(pos..r.start);
            pos = r.end;
        }
        gaps.push(pos..layout.total_len());
        let longest = gaps.iter().map(|g| g.len()).max().unwrap_or(0);
        let size = std::mem::size_of::<D>() as u64;
        let zero_bytes = longest.max(1) * std::mem::size_of::<S>();
        self.padding.with(st, zero_bytes, |zeros| {
            let (zero_ptr, zero_guard) = zeros.device_ptr(st);
            let (base, flat_guard) = flat.device_ptr_mut(st);
            let mut guards = vec![zero_guard, flat_guard];
            let mut table: Vec<CopyEntry> = Vec::new();
            let mut total = 0u64;
            let mut push = |src: u64, start: usize, len: usize, table: &mut Vec<CopyEntry>| {
                if len > 0 {
                    table.push([src, base + start as u64 * size, len as u64, total]);
                    total += (len as u64).div_ceil(FLATTEN_CHUNK);
                }
            };
            for (i, src) in srcs.iter().enumerate() {
                let (gap, r) = (&gaps[i], layout.tensor_range(i));
                push(zero_ptr, gap.start, gap.len(), &mut table);
                if !src.is_empty() {
                    let (ptr, g) = src.device_ptr(st);
                    guards.push(g);
                    push(ptr, r.start, r.len(), &mut table);
                }
            }
            let tail = &gaps[srcs.len()];
            push(zero_ptr, tail.start, tail.len(), &mut table);
            self.launch_copy_table::<S, D>(&table, total)?;
            drop(guards);
            Ok(())
        })
    }

    /// [`crate::unflatten`] on the device: every tensor in one launch; padding is not read.
    pub fn unflatten_views<S: GpuElement, D: GpuElement>(
        &self,
        layout: &FlatLayout,
        flat: &CudaView<'_, S>,
        dsts: &mut [CudaViewMut<'_, D>],
    ) -> Result<(), GpuError> {
        if dsts.len() != layout.num_tensors() {
            return Err(KernelError::TensorCountMismatch {
                what: "unflatten",
                expected: layout.num_tensors(),
                actual: dsts.len(),
            }
            .into());
        }
        crate::error::check_len("unflatten: flat buffer", layout.total_len(), flat.len())?;
        for (i, d) in dsts.iter().enumerate() {
            crate::error::check_len(
                &format!("unflatten: tensor {i}"),
                layout.sizes()[i],
                d.len(),
            )?;
        }
        let st = self.cuda();
        let size = std::mem::size_of::<S>() as u64;
        let (base, flat_guard) = flat.device_ptr(st);
        let mut guards = vec![flat_guard];
        let mut table: Vec<CopyEntry> = Vec::new();
        let mut total = 0u64;
        for (i, dst) in dsts.iter_mut().enumerate() {
            let len = dst.len() as u64;
            if len == 0 {
                continue;
            }
            let (ptr, g) = dst.device_ptr_mut(st);
            guards.push(g);
            let src = base + layout.tensor_range(i).start as u64 * size;
            table.push([src, ptr, len, total]);
            total += len.div_ceil(FLATTEN_CHUNK);
        }
        self.launch_copy_table::<S, D>(&table, total)?;
        drop(guards);
        Ok(())
    }
}
