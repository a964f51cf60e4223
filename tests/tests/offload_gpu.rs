//! Offload on the GPU: the engine with `CudaDevice` (ranks as threads sharing the GPU)
//! and the optimizer state in host memory or an NVMe swap file, or stage 3's parameters
//! offloaded, gives exactly the parameters of the same GPU run without offload — the CPU
//! runs the same fused Adam on the same inputs, and the crossings copy bits — for stages
//! 1–3, fp32/fp16/bf16, accumulation 1 and 3, clipping on and off.
//!
//! Without a GPU each test prints a visible skip. The swap files go to a temporary folder
//! under `target/`.

use std::time::Duration;
use zero_comm::DeviceGroup;
use zero_kernels::testing::gpu_or_skip;
use zero_runtime::CudaDevice;
use zero_tests::{dataset, full_params, mlp_config, run_ranks_on, seed, train_step, with_offload};

const STEPS: usize = 5;
const WORLD: usize = 2;

/// Every rank's parameters after each step, as bits (any NaN equals any NaN).
fn train(cfg: &str, seed: u64, accum: usize) -> Vec<Vec<u32>> {
    let data = dataset(seed, STEPS * WORLD * 2 * accum);
    let comms = DeviceGroup::with_timeout(WORLD, Duration::from_secs(60)).expect("device group");
    run_ranks_on(
        comms,
        || CudaDevice::new().expect("device"),
        cfg,
        seed,
        |e| {
            let mut out = Vec::new();
            for s in 0..STEPS {
                train_step(e, &data, s, None).expect("step");
                let p: Vec<f32> = full_params(e)
                    .expect("params")
                    .into_iter()
                    .flatten()
                    .flatten()
                    .collect();
                out.extend(zero_kernels::testing::canonical_bits(&p));
            }
            out
        },
    )
}

fn sweep(key: &str, device: &str, stages: std::ops::RangeInclusive<u8>) {
    let seed = seed(&format!("offload_gpu {key} {device}"));
    let nvme = tempfile::Builder::new()
        .prefix("zero-offload-gpu-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary folder");
    let tier = serde_json::json!({"device": device, "nvme_path": nvme.path(), "pin_memory": true});
    for stage in stages {
        for precision in ["fp32", "fp16", "bf16"] {
            for accum in [1, 3] {
                for clip in [0.0, 0.5] {
                    let base = mlp_config(stage, precision, accum, clip, false);
                    let want = train(&base, seed, accum);
                    let got = train(&with_offload(&base, key, &tier, Some(7)), seed, accum);
                    for (r, (w, g)) in want.iter().zip(&got).enumerate() {
                        assert!(
                            w == g,
                            "{key} {device} stage {stage} {precision} accum {accum} clip {clip}: rank {r} differs from the GPU run without offload"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_cpu_optimizer_offload_is_bit_identical() {
    if gpu_or_skip("GPU engine with offload_optimizer cpu").is_none() {
        return;
    }
    sweep("offload_optimizer", "cpu", 1..=3);
}

#[test]
fn gpu_nvme_optimizer_offload_is_bit_identical() {
    if gpu_or_skip("GPU engine with offload_optimizer nvme").is_none() {
        return;
    }
    sweep("offload_optimizer", "nvme", 1..=3);
}

#[test]
fn gpu_param_offload_is_bit_identical() {
    if gpu_or_skip("GPU engine with offload_param cpu and nvme").is_none() {
        return;
    }
    sweep("offload_param", "cpu", 3..=3);
    sweep("offload_param", "nvme", 3..=3);
}
