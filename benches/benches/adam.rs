//! Fused Adam on the CPU, two groups:
//! - `adam_bf16`: mixed precision, bf16 gradients in, fp32 master/m/v updated, bf16
//!   parameters out;
//! - `adam_fp32`: fp32 gradients and weights, no 16-bit copy (torch's fused fp32 AdamW's
//!   work; `benches/torch_cpu_adam.py` times torch on the same sizes).
//!
//! Both are counted at 28 bytes per parameter; criterion prints GB/s, and params/s is that
//! divided by 28. `RAYON_NUM_THREADS` sets the thread count.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use half::bf16;
use zero_benches::{config, fill, label, SIZES};
use zero_kernels::{adam_step, cast, AdamConfig};

/// Both groups' inputs, `n` elements each: master weights, exp_avg, exp_avg_sq (made
/// non-negative) and fp32 gradients, from fixed seeds.
fn state(n: usize) -> [Vec<f32>; 4] {
    let mut s: [Vec<f32>; 4] = std::array::from_fn(|i| {
        let mut x = vec![0f32; n];
        fill(&mut x, i as u64 + 1);
        x
    });
    s[2].iter_mut().for_each(|x| *x = x.abs());
    s
}

fn adam(c: &mut Criterion) {
    let mut g = c.benchmark_group("adam_bf16");
    for &n in &SIZES {
        let [mut w, mut m, mut v, tmp] = state(n);
        let mut grads = vec![bf16::ZERO; n];
        cast(&tmp, &mut grads).expect("equal lengths");
        drop(tmp);
        let mut p16 = vec![bf16::ZERO; n];
        let cfg = AdamConfig::adamw(1e-4);
        let mut step = 0u64;
        g.throughput(Throughput::Bytes((28 * n) as u64));
        g.bench_function(label(n), |b| {
            b.iter(|| {
                step += 1;
                adam_step(
                    &cfg,
                    step,
                    1.0 / 1024.0,
                    &mut w,
                    &mut m,
                    &mut v,
                    &grads,
                    Some(&mut p16),
                )
                .expect("valid arguments");
            })
        });
    }
    g.finish();
}

/// fp32 AdamW with no 16-bit copy: the work `torch.optim.AdamW(fused=True)` does on fp32
/// parameters (`benches/torch_cpu_adam.py` times torch on the same sizes). Counted at 28
/// bytes per parameter: grad, w, m, v read (16), w, m, v written (12).
fn adam_fp32(c: &mut Criterion) {
    let mut g = c.benchmark_group("adam_fp32");
    for &n in &SIZES {
        let [mut w, mut m, mut v, grads] = state(n);
        let cfg = AdamConfig::adamw(1e-4);
        let mut step = 0u64;
        g.throughput(Throughput::Bytes((28 * n) as u64));
        g.bench_function(label(n), |b| {
            b.iter(|| {
                step += 1;
                adam_step::<f32, f32>(&cfg, step, 1.0, &mut w, &mut m, &mut v, &grads, None)
                    .expect("valid arguments");
            })
        });
    }
    g.finish();
}

criterion_group! { name = benches; config = config(); targets = adam, adam_fp32 }
criterion_main!(benches);
