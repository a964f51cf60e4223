mod common;

use common::*;
use half::{bf16, f16};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use zero_kernels::{adam_step, AdamConfig, Element, KernelError, WeightDecay};

/// The update of `adam.rs`'s docs, in f64, straight from the formula.
#[allow(clippy::too_many_arguments)]
fn reference(
    cfg: &AdamConfig,
    step: u64,
    scale: f32,
    w: &mut f64,
    m: &mut f64,
    v: &mut f64,
    grad: f64,
) {
    let (lr, b1, b2, eps, wd) = (
        cfg.lr as f64,
        cfg.beta1 as f64,
        cfg.beta2 as f64,
        cfg.eps as f64,
        cfg.weight_decay as f64,
    );
    let mut g = grad * scale as f64;
    if wd != 0.0 {
        match cfg.decay {
            WeightDecay::L2 => g += wd * *w,
            WeightDecay::Decoupled => *w -= lr * wd * *w,
        }
    }
    *m = b1 * *m + (1.0 - b1) * g;
    *v = b2 * *v + (1.0 - b2) * g * g;
    let (bc1, bc2) = if cfg.bias_correction {
        (1.0 - b1.powi(step as i32), 1.0 - b2.powi(step as i32))
    } else {
        (1.0, 1.0)
    };
    *w -= (lr / bc1) * *m / ((*v).sqrt() / bc2.sqrt() + eps);
}

struct Case {
    cfg: AdamConfig,
    step: u64,
    scale: f32,
}

fn random_case(rng: &mut ChaCha8Rng) -> Case {
    let mut cfg = if rng.gen_bool(0.5) {
        AdamConfig::adam(rng.gen_range(1e-4..1e-2))
    } else {
        AdamConfig::adamw(rng.gen_range(1e-4..1e-2))
    };
    cfg.beta1 = rng.gen_range(0.8..0.95);
    cfg.beta2 = rng.gen_range(0.95..0.9999);
    cfg.eps = 10f32.powi(rng.gen_range(-8..-5));
    cfg.weight_decay = if rng.gen_bool(0.3) {
        0.0
    } else {
        rng.gen_range(0.0..0.1)
    };
    cfg.bias_correction = rng.gen_bool(0.8);
    Case {
        cfg,
        step: rng.gen_range(1..2000),
        scale: rng.gen_range(0.5..2.0) / 1024.0,
    }
}

/// Runs one step of `adam_step::<G, P>` on fresh inputs and checks it against the f64
/// reference: master and moments within tolerance, the 16-bit copy exactly the rounding
/// of the new master, non-finite gradients propagating exactly where planted.
fn check<G: Element, P: RefRound>(rng: &mut ChaCha8Rng, with_copy: bool) {
    for n in LENGTHS {
        let c = random_case(rng);
        let w0: Vec<f32> = random_vec(rng, n, -1.0, 1.0);
        let m0: Vec<f32> = random_vec(rng, n, -0.1, 0.1);
        let v0: Vec<f32> = random_vec(rng, n, 0.0, 0.01);
        let mut g: Vec<G> = random_vec(rng, n, -2000.0, 2000.0);
        let planted = if rng.gen_bool(0.5) {
            plant_non_finite(rng, &mut g)
        } else {
            vec![]
        };
        let (mut w, mut m, mut v) = (w0.clone(), m0.clone(), v0.clone());
        let mut p = vec![poison::<P>(); n];
        adam_step(
            &c.cfg,
            c.step,
            c.scale,
            &mut w,
            &mut m,
            &mut v,
            &g,
            with_copy.then_some(&mut p[..]),
        )
        .expect("valid arguments");
        let step_size = (c.cfg.lr as f64)
            / if c.cfg.bias_correction {
                1.0 - (c.cfg.beta1 as f64).powi(c.step as i32)
            } else {
                1.0
            };
        for i in 0..n {
            let (mut rw, mut rm, mut rv) = (w0[i] as f64, m0[i] as f64, v0[i] as f64);
            reference(
                &c.cfg,
                c.step,
                c.scale,
                &mut rw,
                &mut rm,
                &mut rv,
                g[i].to_f32() as f64,
            );
            let ctx = || {
                format!(
                    "G={} P={} n={n} i={i} case={:?} step={}",
                    G::DTYPE,
                    P::DTYPE,
                    c.cfg,
                    c.step
                )
            };
            if planted.contains(&i) {
                assert!(
                    w[i].is_nan() && rw.is_nan(),
                    "{}: non-finite grad must give NaN",
                    ctx()
                );
            } else {
                // f32 arithmetic costs a few ulps of each *term*: bound by term magnitudes,
                // since m's two terms can cancel.
                let g_mag = (g[i].to_f32() as f64 * c.scale as f64).abs()
                    + (c.cfg.weight_decay as f64 * w0[i].abs() as f64);
                let b1 = c.cfg.beta1 as f64;
                let m_mag = b1 * (m0[i] as f64).abs() + (1.0 - b1) * g_mag;
                let bc2 = if c.cfg.bias_correction {
                    1.0 - (c.cfg.beta2 as f64).powi(c.step as i32)
                } else {
                    1.0
                };
                let denom = rv.sqrt() / bc2.sqrt() + c.cfg.eps as f64;
                let tol_m = 2e-6 * m_mag + 1e-30;
                let tol_w = 4e-7 * rw.abs() + step_size * (1e-5 * m_mag + tol_m) / denom;
                assert!(
                    (w[i] as f64 - rw).abs() <= tol_w,
                    "{}: w {} vs {rw}",
                    ctx(),
                    w[i]
                );
                assert!(
                    (m[i] as f64 - rm).abs() <= tol_m,
                    "{}: m {} vs {rm}",
                    ctx(),
                    m[i]
                );
                // v's two terms are both positive, but its gradient g' = g·scale + wd·w
                // (L2) can itself cancel: g' carries a few ulps of g_mag, and g'² twice that
                // times |g'|.
                let g_prime = g[i].to_f32() as f64 * c.scale as f64
                    + match c.cfg.decay {
                        WeightDecay::L2 => c.cfg.weight_decay as f64 * w0[i] as f64,
                        WeightDecay::Decoupled => 0.0,
                    };
                let g_err = 2.4e-7 * g_mag;
                let tol_v = 2e-6 * rv.abs()
                    + (1.0 - c.cfg.beta2 as f64) * (2.0 * g_prime.abs() + g_err) * g_err
                    + 1e-30;
                assert!(
                    (v[i] as f64 - rv).abs() <= tol_v,
                    "{}: v {} vs {rv}",
                    ctx(),
                    v[i]
                );
            }
            if with_copy {
                let want = P::from_f64_ref(w[i] as f64);
                assert!(same(p[i], want), "{}: copy {:?} vs {want:?}", ctx(), p[i]);
            }
        }
        if !with_copy {
            assert!(
                p.iter().all(|x| same(*x, poison::<P>())),
                "no copy was asked for"
            );
        }
    }
}

#[test]
fn matches_f64_reference_for_every_grad_and_param_dtype() {
    let mut rng = seeded("adam");
    check::<bf16, bf16>(&mut rng, true);
    check::<f16, f16>(&mut rng, true);
    check::<f32, bf16>(&mut rng, true);
    check::<f32, f16>(&mut rng, true);
    check::<bf16, f32>(&mut rng, true);
    check::<f32, f32>(&mut rng, false);
    check::<bf16, bf16>(&mut rng, false);
}

#[test]
fn result_is_bitwise_the_same_on_one_thread_and_many() {
    let mut rng = seeded("adam threads");
    let n = (1 << 20) + 3;
    let c = random_case(&mut rng);
    let w0: Vec<f32> = random_vec(&mut rng, n, -1.0, 1.0);
    let g: Vec<bf16> = random_vec(&mut rng, n, -4.0, 4.0);
    let run = |threads| {
        in_pool(threads, || {
            let (mut w, mut m, mut v) = (w0.clone(), vec![0.01f32; n], vec![0.001f32; n]);
            let mut p = vec![poison::<bf16>(); n];
            adam_step(
                &c.cfg,
                c.step,
                c.scale,
                &mut w,
                &mut m,
                &mut v,
                &g,
                Some(&mut p),
            )
            .unwrap();
            (bits(&w), bits(&m), bits(&v), bits(&p))
        })
    };
    assert!(run(1) == run(4), "1-thread and 4-thread results differ");
}

#[test]
fn bad_arguments_are_errors_that_name_them() {
    let cfg = AdamConfig::adam(1e-3);
    let (mut w, mut m, mut v) = (vec![0.5f32; 4], vec![0f32; 4], vec![0f32; 3]);
    let g = vec![bf16::ONE; 4];
    let err = adam_step::<bf16, bf16>(&cfg, 1, 1.0, &mut w, &mut m, &mut v, &g, None).unwrap_err();
    assert!(err.to_string().contains("exp_avg_sq"), "{err}");
    let mut v = vec![0f32; 4];
    let err = adam_step::<bf16, bf16>(&cfg, 0, 1.0, &mut w, &mut m, &mut v, &g, None).unwrap_err();
    assert!(err.to_string().contains("step"), "{err}");
    let bad = AdamConfig { beta2: 1.0, ..cfg };
    let err = adam_step::<bf16, bf16>(&bad, 1, 1.0, &mut w, &mut m, &mut v, &g, None).unwrap_err();
    assert!(
        matches!(err, KernelError::InvalidHyperParameter(ref s) if s.contains("beta2")),
        "{err}"
    );
    assert_eq!(
        w,
        vec![0.5; 4],
        "a rejected call must not touch the parameters"
    );
}
