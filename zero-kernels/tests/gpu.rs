//! The CPU kernels' test vectors on the GPU: cast, Adam and flatten must give the CPU's
//! bits (no FMA, IEEE division and square root on both sides), stats the same flag and the
//! same sum to 1e-12. Without a GPU each test prints a visible skip.

mod common;

use common::*;
use half::{bf16, f16};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use zero_kernels::cuda::{Gpu, GpuElement, GpuError};
use zero_kernels::{adam_step, cast, flatten, grad_stats, AdamConfig, Element, FlatLayout};

fn gpu(test: &str) -> Option<&'static Gpu> {
    match Gpu::get() {
        Ok(g) => Some(g),
        Err(GpuError::NoDriver(e)) => {
            println!("SKIPPED {test}: no GPU on this machine ({e})");
            None
        }
        Err(e) => panic!("{test}: a GPU driver is present but the GPU path failed: {e}"),
    }
}

fn cast_case<S: GpuElement, D: GpuElement>(g: &Gpu, rng: &mut ChaCha8Rng) {
    for n in LENGTHS {
        let mut src: Vec<S> = wide_vec(rng, n).into_iter().map(S::from_f32).collect();
        plant_non_finite(rng, &mut src);
        let (mut cpu, mut dev) = (vec![poison::<D>(); n], vec![poison::<D>(); n]);
        cast(&src, &mut cpu).unwrap();
        g.cast(&src, &mut dev).unwrap();
        assert!(
            bits(&cpu) == bits(&dev) || cpu.iter().zip(&dev).all(|(a, b)| same(*a, *b)),
            "{}→{} n={n}",
            S::SUFFIX,
            D::SUFFIX
        );
    }
}

#[test]
fn casts_match_the_cpu() {
    let Some(g) = gpu("casts") else { return };
    let mut rng = seeded("gpu casts");
    cast_case::<f32, bf16>(g, &mut rng);
    cast_case::<f32, f16>(g, &mut rng);
    cast_case::<bf16, f32>(g, &mut rng);
    cast_case::<f16, f32>(g, &mut rng);
    cast_case::<f16, bf16>(g, &mut rng);
    cast_case::<bf16, f16>(g, &mut rng);
}

fn adam_case<G: GpuElement, P: GpuElement>(g: &Gpu, rng: &mut ChaCha8Rng, copy: bool) {
    for n in LENGTHS {
        let mut cfg = if rng.gen_bool(0.5) {
            AdamConfig::adam(1e-3)
        } else {
            AdamConfig::adamw(1e-3)
        };
        cfg.weight_decay = if rng.gen_bool(0.3) { 0.0 } else { 0.05 };
        let step = rng.gen_range(1..100);
        let w: Vec<f32> = random_vec(rng, n, -1.0, 1.0);
        let m: Vec<f32> = random_vec(rng, n, -0.1, 0.1);
        let v: Vec<f32> = random_vec(rng, n, 0.0, 0.01);
        let mut grads: Vec<G> = random_vec(rng, n, -2000.0, 2000.0);
        plant_non_finite(rng, &mut grads);
        let run = |on_gpu: bool| {
            let (mut w, mut m, mut v) = (w.clone(), m.clone(), v.clone());
            let mut p = vec![poison::<P>(); n];
            let out = copy.then_some(&mut p[..]);
            if on_gpu {
                g.adam_step(
                    &cfg,
                    step,
                    1.0 / 1024.0,
                    &mut w,
                    &mut m,
                    &mut v,
                    &grads,
                    out,
                )
                .unwrap();
            } else {
                adam_step(
                    &cfg,
                    step,
                    1.0 / 1024.0,
                    &mut w,
                    &mut m,
                    &mut v,
                    &grads,
                    out,
                )
                .unwrap();
            }
            (bits(&w), bits(&m), bits(&v), bits(&p))
        };
        assert!(
            run(false) == run(true),
            "adam G={} P={} n={n} copy={copy}: GPU bits differ from the CPU's",
            G::SUFFIX,
            P::SUFFIX
        );
    }
}

#[test]
fn adam_matches_the_cpu_bit_for_bit() {
    let Some(g) = gpu("adam") else { return };
    let mut rng = seeded("gpu adam");
    adam_case::<bf16, bf16>(g, &mut rng, true);
    adam_case::<f16, f16>(g, &mut rng, true);
    adam_case::<f32, bf16>(g, &mut rng, true);
    adam_case::<f32, f32>(g, &mut rng, false);
}

#[test]
fn stats_match_the_cpu() {
    let Some(g) = gpu("stats") else { return };
    let mut rng = seeded("gpu stats");
    for n in LENGTHS {
        let mut x: Vec<bf16> = random_vec(&mut rng, n, -3.0, 3.0);
        let (cpu, dev) = (grad_stats(&x), g.grad_stats(&x).unwrap());
        assert_eq!(cpu.non_finite, dev.non_finite, "n={n}");
        assert!(
            (cpu.sum_sq - dev.sum_sq).abs() <= 1e-12 * cpu.sum_sq.max(1e-300),
            "n={n}: {} vs {}",
            cpu.sum_sq,
            dev.sum_sq
        );
        if n > 0 {
            plant_non_finite(&mut rng, &mut x);
            assert!(
                g.grad_stats(&x).unwrap().non_finite,
                "n={n}: planted inf/NaN missed"
            );
        }
    }
}

#[test]
fn flatten_matches_the_cpu() {
    let Some(g) = gpu("flatten") else { return };
    let mut rng = seeded("gpu flatten");
    let mut sizes = LENGTHS.to_vec();
    sizes.extend((0..2000).map(|_| rng.gen_range(0..300)));
    let layout = FlatLayout::with_default_alignment(&sizes, bf16::DTYPE, 4).unwrap();
    let tensors: Vec<Vec<f32>> = sizes
        .iter()
        .map(|&n| random_vec(&mut rng, n, -100.0, 100.0))
        .collect();
    let srcs: Vec<&[f32]> = tensors.iter().map(|t| &t[..]).collect();
    let (mut cpu, mut dev) = (
        vec![poison::<bf16>(); layout.total_len()],
        vec![poison::<bf16>(); layout.total_len()],
    );
    flatten(&layout, &srcs, &mut cpu).unwrap();
    g.flatten(&layout, &srcs, &mut dev).unwrap();
    assert!(
        bits(&cpu) == bits(&dev),
        "flatten f32→bf16 of {} tensors differs from the CPU",
        sizes.len()
    );
}
