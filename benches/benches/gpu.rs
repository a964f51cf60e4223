//! The GPU kernels against a device-to-device copy (the roofline), on device-resident
//! buffers; each iteration waits for the stream, so it times the kernel plus one launch.
//! - `gpu_copy`: f32 copy, 8 bytes per element moved.
//! - `gpu_adam_bf16`: fused Adam, bf16 grads → fp32 state → bf16 params, 28 bytes each.
//! - `gpu_flatten_bf16` / `gpu_unflatten_bf16`: 4 large tensors, and about 2,000 small
//!   ones, 4 bytes per element (2 read, 2 written); `gpu_flatten_bf16_*_host` the same
//!   calls without the wait for the stream: the host's part of each call alone.
//!
//! Sizes: `ZERO_BENCH_GPU_SIZES` (element counts in millions, comma-separated; default
//! 16,256). Without a GPU it prints a visible skip and measures nothing.
//! `benches/torch_baseline.py` times PyTorch on the same sizes.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;
use zero_kernels::cuda::{AdamViews, Gpu, GpuBuffer, GpuStream, GradScale};
use zero_kernels::{bf16, AdamConfig, DType, FlatLayout};

fn sizes() -> Vec<usize> {
    std::env::var("ZERO_BENCH_GPU_SIZES")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|x| x.trim().parse::<usize>().ok())
                .collect()
        })
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![16, 256])
        .into_iter()
        .map(|m| m << 20)
        .collect()
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

fn filled(st: &GpuStream, dtype: DType, n: usize, seed: u64) -> GpuBuffer {
    let mut host = vec![0f32; n];
    zero_benches::fill(&mut host, seed);
    let mut b = st.zeros(dtype, n).expect("alloc");
    st.upload_f32(&mut b, 0, &host).expect("upload");
    b
}

fn gpu_benches(c: &mut Criterion) {
    let gpu = match Gpu::get() {
        Ok(g) => g,
        Err(e) => {
            zero_kernels::testing::skip_gpu_test("gpu benches", &e.to_string());
            return;
        }
    };
    println!("GPU: {} ({})", gpu.name(), gpu.arch);
    let st = gpu.new_stream().expect("stream");
    for n in sizes() {
        let label = format!("{}M", n >> 20);
        let src = filled(&st, DType::F32, n, 1);
        let mut dst = st.zeros(DType::F32, n).expect("alloc");
        let mut g = c.benchmark_group("gpu_copy");
        g.throughput(Throughput::Bytes((8 * n) as u64));
        g.bench_function(&label, |b| {
            b.iter(|| {
                st.copy(&src, 0..n, &mut dst, 0).expect("copy");
                st.synchronize().expect("sync");
            })
        });
        g.finish();
        drop((src, dst));

        let mut w = filled(&st, DType::F32, n, 2);
        let mut m = filled(&st, DType::F32, n, 3);
        let mut v = st.zeros(DType::F32, n).expect("alloc");
        let grads = filled(&st, DType::BF16, n, 4);
        let mut p = st.zeros(DType::BF16, n).expect("alloc");
        let cfg = AdamConfig::adamw(1e-4);
        let mut step = 0u64;
        let mut g = c.benchmark_group("gpu_adam_bf16");
        g.throughput(Throughput::Bytes((28 * n) as u64));
        g.bench_function(&label, |b| {
            b.iter(|| {
                step += 1;
                st.adam(
                    &cfg,
                    step,
                    GradScale::Host(1.0 / 1024.0),
                    None,
                    AdamViews {
                        master: &mut w.view_mut::<f32>(0..n).expect("view"),
                        exp_avg: &mut m.view_mut::<f32>(0..n).expect("view"),
                        exp_avg_sq: &mut v.view_mut::<f32>(0..n).expect("view"),
                    },
                    &grads.view::<bf16>(0..n).expect("view"),
                    Some(&mut p.view_mut::<bf16>(0..n).expect("view")),
                )
                .expect("adam");
                st.synchronize().expect("sync");
            })
        });
        g.finish();
        drop((w, m, v, grads, p));

        // Four large tensors, and about 2,000 small ones of the same total.
        let small = (n / 2000).max(1);
        for (kind, sizes) in [
            ("4_tensors", vec![n / 4; 4]),
            ("2000_tensors", vec![small; 2000]),
        ] {
            let layout =
                FlatLayout::with_default_alignment(&sizes, DType::BF16, 1).expect("layout");
            let tensors: Vec<GpuBuffer> = sizes
                .iter()
                .enumerate()
                .map(|(i, &k)| filled(&st, DType::BF16, k, i as u64 + 5))
                .collect();
            let mut flat = st.zeros(DType::BF16, layout.total_len()).expect("alloc");
            // One flatten call, queued (the benches below wait for it, or not).
            let mut flatten = || {
                let views: Vec<_> = tensors
                    .iter()
                    .zip(&sizes)
                    .map(|(t, &k)| t.view::<bf16>(0..k).expect("view"))
                    .collect();
                let total = layout.total_len();
                st.flatten_views(
                    &layout,
                    &views,
                    &mut flat.view_mut::<bf16>(0..total).expect("view"),
                )
                .expect("flatten");
            };
            let bytes = (4 * sizes.iter().sum::<usize>()) as u64;
            let mut g = c.benchmark_group(format!("gpu_flatten_bf16_{kind}"));
            g.throughput(Throughput::Bytes(bytes));
            g.bench_function(&label, |b| {
                b.iter(|| {
                    flatten();
                    st.synchronize().expect("sync");
                })
            });
            g.finish();
            // The host's part alone: the calls queued, the wait for the stream left out
            // of the time (docs/GPU_FIRST_RUN.md, the per-call cost).
            let mut g = c.benchmark_group(format!("gpu_flatten_bf16_{kind}_host"));
            g.bench_function(&label, |b| {
                b.iter_custom(|iters| {
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        flatten();
                    }
                    let host = start.elapsed();
                    st.synchronize().expect("sync");
                    host
                })
            });
            g.finish();
            let mut outs: Vec<GpuBuffer> = sizes
                .iter()
                .map(|&k| st.zeros(DType::BF16, k).expect("alloc"))
                .collect();
            let mut g = c.benchmark_group(format!("gpu_unflatten_bf16_{kind}"));
            g.throughput(Throughput::Bytes(bytes));
            g.bench_function(&label, |b| {
                b.iter(|| {
                    let mut views: Vec<_> = outs
                        .iter_mut()
                        .zip(&sizes)
                        .map(|(t, &k)| t.view_mut::<bf16>(0..k).expect("view"))
                        .collect();
                    let total = layout.total_len();
                    st.unflatten_views(
                        &layout,
                        &flat.view::<bf16>(0..total).expect("view"),
                        &mut views,
                    )
                    .expect("unflatten");
                    st.synchronize().expect("sync");
                })
            });
            g.finish();
        }
    }
}

criterion_group! { name = benches; config = config(); targets = gpu_benches }
criterion_main!(benches);
