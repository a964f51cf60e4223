//! The engine's memory report against what the GPU's allocator holds: after training at
//! stages 0–3 (bf16 and fp32, with and without accumulation), the bytes in use in the
//! device's default memory pool (every zero buffer draws from it) equal the report's
//! device categories, within the per-stream kernel tables; after the engine is dropped
//! they return to where they were, and the run's peak (the pool's high-water mark, reset
//! before each engine) stays within the report's `device_bound` plus the trainer's f32
//! copies. A buffer the report forgets, or one never freed, fails it. Alone in its test binary: the pool is the process's, and the tests of one binary
//! run in parallel threads. Without a GPU it prints a visible skip.

use std::time::Duration;
use zero_comm::DeviceGroup;
use zero_kernels::testing::gpu_or_skip;
use zero_runtime::{CudaDevice, MemoryReport};
use zero_tests::{dataset, mlp_config, run_ranks_on, seed, train_step, MICRO_BATCH};

const STEPS: usize = 3;
/// On a real GPU: the per-stream kernel tables and padding zeros zero keeps, and the
/// pool's rounding of each allocation, beyond the report.
const SLACK: u64 = 1 << 20;
/// On the stand-in, which counts allocations to the byte: the engine's scalars (a found-
/// overflow flag, a norm) are all the pool may hold beyond the report.
const SCALARS: u64 = 64;
/// Beyond `MemoryReport::device_bound` at a run's peak on the stand-in: the engine's
/// scalars and the step's exchange of norm partials (tens of bytes at world 1).
const BOUND_SLACK: u64 = 1 << 10;

#[test]
fn the_memory_report_matches_the_gpus_allocator() {
    let Some(gpu) = gpu_or_skip("memory report against the allocator") else {
        return;
    };
    let exact = gpu.name().contains("zero-gpusim");
    let seed = seed("engine_gpu_memory");
    let before = gpu.pool_used_bytes().expect("pool");
    for stage in 0..=3u8 {
        for (precision, accum) in [("bf16", 1), ("bf16", 3), ("fp32", 1)] {
            let cfg = mlp_config(stage, precision, accum, 0.0, false);
            let data = dataset(seed, STEPS * MICRO_BATCH * accum);
            let comms = DeviceGroup::with_timeout(1, Duration::from_secs(60)).expect("group");
            gpu.reset_pool_peak().expect("pool");
            let reports: Vec<(MemoryReport, usize)> = run_ranks_on(
                comms,
                || CudaDevice::new().expect("device"),
                &cfg,
                seed,
                |e| {
                    for s in 0..STEPS {
                        train_step(e, &data, s, None).expect("step");
                    }
                    let largest = e
                        .modules()
                        .iter()
                        .flat_map(|m| &m.params)
                        .map(|p| p.numel())
                        .max()
                        .unwrap_or(0);
                    (e.memory_report(), largest)
                },
            );
            let (r, largest) = (&reports[0].0, reports[0].1);
            let used = r.allocator_used.expect("the CUDA device reads its pool") as u64;
            let peak = r
                .allocator_peak
                .expect("the CUDA device reads its pool's peak") as u64;
            assert!(
                peak >= used,
                "the pool's peak {peak} is below its use {used}"
            );
            let held = used.saturating_sub(before);
            let reported = r.device_total() as u64;
            let what = format!("stage {stage} {precision} accumulation {accum}");
            println!("{what}: the pool holds {held} B for the engine, the report says {reported} B ({r:?})");
            let margin = if exact {
                SCALARS
            } else {
                reported / 20 + SLACK
            };
            assert!(
                held >= reported && held <= reported + margin,
                "{what}: the device's pool holds {held} bytes for the engine, its report \
                 {reported} (at most {margin} more allowed)"
            );
            // The run's peak within the engine's bound, plus the trainer's f32 copies of
            // one parameter (`params_f32`, `add_grads_f32`: a read and a write, the first
            // one's free still queued) and the engine's scalars.
            let bound = r.device_bound as u64 + 2 * 4 * largest as u64 + BOUND_SLACK;
            let run_peak = peak.saturating_sub(before);
            println!("{what}: the pool peaked at {run_peak} B for the engine, its bound {bound} B");
            if exact {
                assert!(
                    run_peak <= bound,
                    "{what}: the device's pool peaked at {run_peak} B for the engine, over its bound {bound} B ({} B from the report)",
                    r.device_bound
                );
            }
            let after = gpu.pool_used_bytes().expect("pool");
            assert!(
                after <= before + margin,
                "{what}: {} bytes still held after the engine was dropped",
                after - before
            );
        }
    }
}
