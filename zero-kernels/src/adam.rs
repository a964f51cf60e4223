//! Fused mixed-precision Adam / AdamW over one contiguous range.
//!
//! # The update (identical to `torch.optim.Adam` / `AdamW`, as their fused kernels write it)
//! For every element, with `t` the step count (from 1), `s = grad_scale`:
//!
//! ```text
//! g  = grad · s                                   (unscale and clip, fused)
//! Adam  (L2):        g = g + wd · w               (only if wd ≠ 0)
//! AdamW (decoupled): w = w − lr · wd · w          (only if wd ≠ 0)
//! m  = β1 · m + (1 − β1) · g
//! v  = β2 · v + (1 − β2) · g · g
//! bc1 = 1 − β1^t,  bc2 = 1 − β2^t                 (both 1 when bias correction is off)
//! w  = w − (lr / bc1) · m / (√v / √bc2 + ε)       (ε added after the bias-corrected root)
//! p16 = round_to_nearest_even(w)                  (the 16-bit parameter copy, same pass)
//! ```
//!
//! Arithmetic is `f32` with no fused multiply-add, so every CPU path and the CUDA kernel
//! (compiled with `--fmad=false`) give the same bits; `bc1` and `√bc2` are computed once in
//! `f64` and rounded to `f32`. Each element is read once and written once: grad (2 or 4
//! bytes), w, m, v (4 each) in; w, m, v and the 16-bit copy out — 28 bytes per parameter
//! for 16-bit gradients and parameters.

use crate::error::check_len;
use crate::{Element, KernelError, PAR_CHUNK};
use rayon::prelude::*;

/// How weight decay enters the update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDecay {
    /// Adam: `wd · w` is added to the gradient (L2 regularisation).
    L2,
    /// AdamW: the weight is shrunk by `lr · wd · w`, apart from the gradient.
    Decoupled,
}

/// Hyper-parameters of one Adam/AdamW parameter group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay β1.
    pub beta1: f32,
    /// Second-moment decay β2.
    pub beta2: f32,
    /// Added to the bias-corrected root of `v`.
    pub eps: f32,
    /// Weight-decay coefficient.
    pub weight_decay: f32,
    /// L2 (Adam) or decoupled (AdamW) weight decay.
    pub decay: WeightDecay,
    /// Divide the moments by `1 − β^t` (torch always does; DeepSpeed lets you turn it off).
    pub bias_correction: bool,
}

impl AdamConfig {
    /// torch's `Adam` defaults: betas (0.9, 0.999), eps 1e-8, no weight decay.
    pub fn adam(lr: f32) -> Self {
        Self {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decay: WeightDecay::L2,
            bias_correction: true,
        }
    }

    /// torch's `AdamW` defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    pub fn adamw(lr: f32) -> Self {
        Self {
            weight_decay: 0.01,
            decay: WeightDecay::Decoupled,
            ..Self::adam(lr)
        }
    }

    /// Checks every hyper-parameter is in the range torch accepts.
    pub fn validate(&self) -> Result<(), KernelError> {
        let bad = |m: String| Err(KernelError::InvalidHyperParameter(m));
        if !(self.lr >= 0.0 && self.lr.is_finite()) {
            return bad(format!("lr must be finite and >= 0, got {}", self.lr));
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(format!("{name} must be in [0, 1), got {b}"));
            }
        }
        if !(self.eps >= 0.0 && self.eps.is_finite()) {
            return bad(format!("eps must be finite and >= 0, got {}", self.eps));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return bad(format!(
                "weight_decay must be finite and >= 0, got {}",
                self.weight_decay
            ));
        }
        Ok(())
    }
}

/// Per-step scalars, computed once on the host.
#[derive(Clone, Copy)]
pub(crate) struct Scalars {
    pub(crate) scale: f32,
    pub(crate) beta1: f32,
    pub(crate) one_minus_beta1: f32,
    pub(crate) beta2: f32,
    pub(crate) one_minus_beta2: f32,
    pub(crate) wd: f32,
    pub(crate) lr_wd: f32,
    pub(crate) step_size: f32,
    pub(crate) bc2_sqrt: f32,
    pub(crate) eps: f32,
}

// Weight-decay modes; adam.cu's `mode` argument uses the same numbers.
const NO_DECAY: u8 = 0;
const L2: u8 = 1;
const DECOUPLED: u8 = 2;

/// Which weight-decay branch a config takes (torch skips decay when it is 0).
pub(crate) fn decay_mode(cfg: &AdamConfig) -> u8 {
    match (cfg.weight_decay == 0.0, cfg.decay) {
        (true, _) => NO_DECAY,
        (false, WeightDecay::L2) => L2,
        (false, WeightDecay::Decoupled) => DECOUPLED,
    }
}

/// One fused Adam/AdamW step over a contiguous range, on all threads.
///
/// - `master`, `exp_avg`, `exp_avg_sq`: fp32 master weights and moments, updated in place.
/// - `grads`: the gradients in f16, bf16 or f32, multiplied by `grad_scale`
///   (`1 / (loss_scale · clip_coef)`) as they are read.
/// - `params_out`: if given, receives the updated weights rounded to `P` in the same pass.
/// - `step`: the step count after this update, from 1 (torch's `state['step']`).
///
/// Non-finite gradients propagate into the state: skipping an overflowed step is the
/// caller's decision, made before calling (see `grad_stats`).
#[allow(clippy::too_many_arguments)]
pub fn adam_step<G: Element, P: Element>(
    cfg: &AdamConfig,
    step: u64,
    grad_scale: f32,
    master: &mut [f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    grads: &[G],
    params_out: Option<&mut [P]>,
) -> Result<(), KernelError> {
    let n = master.len();
    check_args(
        cfg,
        step,
        n,
        exp_avg.len(),
        exp_avg_sq.len(),
        grads.len(),
        params_out.as_ref().map(|p| p.len()),
    )?;
    let s = scalars(cfg, step, grad_scale);
    match decay_mode(cfg) {
        NO_DECAY => run::<NO_DECAY, G, P>(&s, master, exp_avg, exp_avg_sq, grads, params_out),
        L2 => run::<L2, G, P>(&s, master, exp_avg, exp_avg_sq, grads, params_out),
        _ => run::<DECOUPLED, G, P>(&s, master, exp_avg, exp_avg_sq, grads, params_out),
    }
    Ok(())
}

/// Every check `adam_step` makes before touching anything (shared with the GPU path).
pub(crate) fn check_args(
    cfg: &AdamConfig,
    step: u64,
    n: usize,
    exp_avg: usize,
    exp_avg_sq: usize,
    grads: usize,
    params_out: Option<usize>,
) -> Result<(), KernelError> {
    cfg.validate()?;
    check_len("adam_step: exp_avg", n, exp_avg)?;
    check_len("adam_step: exp_avg_sq", n, exp_avg_sq)?;
    check_len("adam_step: grads", n, grads)?;
    if let Some(p) = params_out {
        check_len("adam_step: params_out", n, p)?;
    }
    if step == 0 {
        return Err(KernelError::InvalidHyperParameter(
            "step counts from 1 (the first update is step 1)".into(),
        ));
    }
    Ok(())
}

pub(crate) fn scalars(cfg: &AdamConfig, step: u64, grad_scale: f32) -> Scalars {
    let t = step.min(i32::MAX as u64) as i32;
    let (bc1, bc2) = if cfg.bias_correction {
        (
            1.0 - (cfg.beta1 as f64).powi(t),
            1.0 - (cfg.beta2 as f64).powi(t),
        )
    } else {
        (1.0, 1.0)
    };
    Scalars {
        scale: grad_scale,
        beta1: cfg.beta1,
        one_minus_beta1: 1.0 - cfg.beta1,
        beta2: cfg.beta2,
        one_minus_beta2: 1.0 - cfg.beta2,
        wd: cfg.weight_decay,
        lr_wd: cfg.lr * cfg.weight_decay,
        step_size: (cfg.lr as f64 / bc1) as f32,
        bc2_sqrt: bc2.sqrt() as f32,
        eps: cfg.eps,
    }
}

fn run<const MODE: u8, G: Element, P: Element>(
    s: &Scalars,
    master: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[G],
    p: Option<&mut [P]>,
) {
    let c = PAR_CHUNK;
    match p {
        Some(p) => (
            master.par_chunks_mut(c),
            m.par_chunks_mut(c),
            v.par_chunks_mut(c),
            g.par_chunks(c),
            p.par_chunks_mut(c),
        )
            .into_par_iter()
            .for_each(|(w, m, v, g, p)| chunk_with_copy::<MODE, G, P>(s, w, m, v, g, p)),
        None => (
            master.par_chunks_mut(c),
            m.par_chunks_mut(c),
            v.par_chunks_mut(c),
            g.par_chunks(c),
        )
            .into_par_iter()
            .for_each(|(w, m, v, g)| chunk::<MODE, G>(s, w, m, v, g)),
    }
}

// The inner loops are compiled for these target sets and the best one the CPU has is
// picked at run time. Rust never contracts a·b + c into an FMA, so every version (and the
// baseline) gives the same bits.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
fn chunk_with_copy<const MODE: u8, G: Element, P: Element>(
    s: &Scalars,
    w: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[G],
    p: &mut [P],
) {
    let n = w.len();
    let (m, v, g, p) = (&mut m[..n], &mut v[..n], &g[..n], &mut p[..n]);
    for i in 0..n {
        w[i] = update::<MODE>(s, w[i], &mut m[i], &mut v[i], g[i].to_f32());
        p[i] = P::from_f32(w[i]);
    }
}

#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
fn chunk<const MODE: u8, G: Element>(
    s: &Scalars,
    w: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[G],
) {
    let n = w.len();
    let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
    for i in 0..n {
        w[i] = update::<MODE>(s, w[i], &mut m[i], &mut v[i], g[i].to_f32());
    }
}

#[inline(always)]
fn update<const MODE: u8>(s: &Scalars, mut w: f32, m: &mut f32, v: &mut f32, grad: f32) -> f32 {
    let mut g = grad * s.scale;
    if MODE == L2 {
        g += s.wd * w;
    }
    if MODE == DECOUPLED {
        w -= s.lr_wd * w;
    }
    let m1 = s.beta1 * *m + s.one_minus_beta1 * g;
    let v1 = s.beta2 * *v + s.one_minus_beta2 * g * g;
    *m = m1;
    *v = v1;
    let denom = v1.sqrt() / s.bc2_sqrt + s.eps;
    w - s.step_size * m1 / denom
}
