//! ZeRO-Offload on a GPU: the optimizer step with the fp32 state on the GPU against the
//! same step with `offload_optimizer.device: cpu`, stepped alternately in one run (world
//! 1, stage 1, bf16; `ZERO_BENCH_GPU_OFFLOAD_SIZES`, millions of parameters, default
//! 16,256). Per step the offload moves 2 bytes per parameter of bf16 gradients over PCIe
//! to the host and 2 bytes of bf16 parameters back; the bench measures the two crossings
//! alone (`CudaDevice::copy_to_host` / `copy_from_host` of the same sizes) as that
//! traffic's roofline, and prints the step times, the crossings' GB/s and the share of the
//! offloaded step they take.
//!
//! Without a GPU it prints a visible skip and measures nothing.
//!
//! ```sh
//! cargo bench --bench gpu_offload
//! ```

use std::time::Instant;
use zero_benches::offload::{config, grads, modules, paired};
use zero_comm::{DeviceGroup, HostBuffer};
use zero_kernels::DType;
use zero_runtime::{CudaDevice, Device, Engine};

fn sizes() -> Vec<usize> {
    std::env::var("ZERO_BENCH_GPU_OFFLOAD_SIZES")
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

/// Median seconds of `f` over 9 runs after one warm-up.
fn median_secs(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..9)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--exact") {
        return;
    }
    let dev = match CudaDevice::new() {
        Ok(d) => d,
        Err(e) => {
            zero_kernels::testing::skip_gpu_test("gpu_offload bench", &e.to_string());
            return;
        }
    };
    println!("| Ψ | step, state on GPU | step, cpu offload | ratio | D2H bf16 grads | H2D bf16 params | crossings' share of the offloaded step |");
    println!("|---|---|---|---|---|---|---|");
    for n in sizes() {
        // The crossings alone.
        let src = dev.zeros(DType::BF16, n).expect("alloc");
        let mut host = HostBuffer::zeros(DType::BF16, n);
        let d2h = median_secs(|| dev.copy_to_host(&src, 0..n, &mut host, 0).expect("d2h"));
        let mut back = dev.zeros(DType::BF16, n).expect("alloc");
        let h2d = median_secs(|| dev.copy_from_host(&host, 0..n, &mut back, 0).expect("h2d"));
        drop((src, back, host));
        let engine = |offload: &str| {
            let comm = DeviceGroup::new(1).expect("group").remove(0);
            let dev = CudaDevice::new().expect("device");
            Engine::new(config(offload), modules(n), comm, dev, |id, _, v| {
                zero_benches::fill(v, id as u64 + 1)
            })
            .expect("engine")
        };
        let grads = grads(n);
        let mut engines = [engine("none"), engine("cpu")];
        let [a, b] = paired(&mut engines, &grads, 10);
        let bytes = 2.0 * n as f64;
        println!(
            "| {}M | {a:.2} ms | {b:.2} ms | {:.2} | {:.1} GB/s | {:.1} GB/s | {:.0}% |",
            n >> 20,
            b / a,
            bytes / d2h / 1e9,
            bytes / h2d / 1e9,
            100.0 * (d2h + h2d) * 1e3 / b
        );
    }
}
