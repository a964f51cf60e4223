//! Device checkpoints: a run on the GPU saved at step k loads on the CPU and continues
//! there, and a CPU save loads on the GPU; both continue bit for bit as the run that never
//! stopped (without clipping the GPU engine gives the host engine's bits), parameters,
//! fp32 master weights and moments, step counts and LR, for stages 0–3 × fp32/bf16 at
//! world size 2 (the one-device group). Without a GPU each test prints a visible skip.

use serde_json::json;
use std::time::Duration;
use zero_comm::{Communicator, DeviceGroup, HostGroup};
use zero_kernels::testing::gpu_or_skip;
use zero_runtime::{CudaDevice, Device, Engine, HostDevice, LoadOptions};
use zero_tests::{dataset, full_params, mlp_config, run_ranks_on, seed, train_step, MICRO_BATCH};

const WORLD: usize = 2;
const STEPS: usize = 4;
const SAVE_AT: usize = 2;

#[derive(Debug, PartialEq)]
struct Snapshot {
    params: Vec<u32>,
    state: Vec<zero_runtime::StatePiece>,
    counts: (u64, u64, u64),
    lr: u64,
}

fn snapshot<C: Communicator, D: Device<Buffer = C::Buffer>>(e: &mut Engine<C, D>) -> Snapshot {
    let params = full_params(e).expect("params");
    Snapshot {
        params: zero_kernels::testing::canonical_bits(
            &params
                .iter()
                .flatten()
                .flatten()
                .copied()
                .collect::<Vec<f32>>(),
        ),
        state: e.optimizer_state().expect("state"),
        counts: e.step_counts(),
        lr: e.lr().to_bits(),
    }
}

/// Runs `f` on `WORLD` engines, on the GPU or the CPU.
fn ranks<R: Send>(
    gpu: bool,
    cfg: &str,
    seed: u64,
    f: impl Fn(&mut dyn Trainer) -> R + Sync,
) -> Vec<R> {
    let timeout = Duration::from_secs(60);
    if gpu {
        let comms = DeviceGroup::with_timeout(WORLD, timeout).expect("device group");
        run_ranks_on(
            comms,
            || CudaDevice::new().expect("device"),
            cfg,
            seed,
            |e| f(e),
        )
    } else {
        let comms = HostGroup::with_timeout(WORLD, timeout).expect("host group");
        run_ranks_on(comms, || HostDevice, cfg, seed, |e| f(e))
    }
}

/// What the test does with an engine, whatever its device.
trait Trainer {
    fn steps(&mut self, data: &[(Vec<f32>, Vec<f32>)], range: std::ops::Range<usize>);
    fn save(&mut self, dir: &std::path::Path) -> String;
    fn load(&mut self, dir: &std::path::Path);
    fn snap(&mut self) -> Snapshot;
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Trainer for Engine<C, D> {
    fn steps(&mut self, data: &[(Vec<f32>, Vec<f32>)], range: std::ops::Range<usize>) {
        for s in range {
            train_step(self, data, s, None).expect("step");
        }
    }
    fn save(&mut self, dir: &std::path::Path) -> String {
        self.save_checkpoint(dir, None, json!({"at": SAVE_AT}))
            .expect("save")
    }
    fn load(&mut self, dir: &std::path::Path) {
        let client = self
            .load_checkpoint(dir, None, LoadOptions::default())
            .expect("load");
        assert_eq!(client, json!({"at": SAVE_AT}));
    }
    fn snap(&mut self) -> Snapshot {
        snapshot(self)
    }
}

#[test]
fn gpu_checkpoints_load_on_the_cpu_and_back_and_continue_bit_for_bit() {
    if gpu_or_skip("device checkpoints").is_none() {
        return;
    }
    let seed = seed("checkpoint gpu");
    let tmp = tempfile::tempdir().expect("temp dir");
    for stage in 0..=3u8 {
        for precision in ["fp32", "bf16"] {
            let cfg = mlp_config(stage, precision, 1, 0.0, false);
            let data = dataset(seed, STEPS * WORLD * MICRO_BATCH);
            let label = format!("stage {stage} {precision}");
            let straight = ranks(true, &cfg, seed, |e| {
                e.steps(&data, 0..STEPS);
                e.snap()
            });
            for (from_gpu, to_gpu) in [(true, false), (false, true)] {
                let dir = tmp.path().join(format!("s{stage}-{precision}-{from_gpu}"));
                let tags = ranks(from_gpu, &cfg, seed, |e| {
                    e.steps(&data, 0..SAVE_AT);
                    e.save(&dir)
                });
                assert!(
                    tags.iter().all(|t| *t == format!("global_step{SAVE_AT}")),
                    "{tags:?}"
                );
                // Fresh engines with other initial values: the load replaces it all.
                let resumed = ranks(to_gpu, &cfg, seed ^ 0x5eed, |e| {
                    e.load(&dir);
                    e.steps(&data, SAVE_AT..STEPS);
                    e.snap()
                });
                let way = if from_gpu {
                    "GPU → CPU"
                } else {
                    "CPU → GPU"
                };
                for (r, (a, b)) in straight.iter().zip(&resumed).enumerate() {
                    assert!(a == b, "{label}, {way}: rank {r} differs from the run that never stopped (seed {seed})");
                }
            }
        }
    }
}
