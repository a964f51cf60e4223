//! Host-slice conveniences over the GPU: the CPU kernels' signatures (copy in, run on the
//! default stream, copy out), so the GPU tests run the CPU tests' vectors through the
//! same device code and compare. The top of `cuda/`: it stands on the streams and ops.

use super::data::GpuElement;
use super::error::GpuError;
use super::gpu::Gpu;
use super::ops::{AdamViews, GradScale};
use crate::{AdamConfig, FlatLayout, GradStats};

impl Gpu {
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
