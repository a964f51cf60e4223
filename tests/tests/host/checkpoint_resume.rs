//! Resume exactness: a run saved at step k and loaded into fresh engines (of the same world
//! size and stage, initialized differently) continues bit for bit as the run that never
//! stopped — parameters, fp32 master weights and moments, loss scale and its hysteresis,
//! skipped-step counts and LR — for stages 0–3 × fp32/fp16/bf16 × accumulation 1 and 3.
//! The fp16 runs overflow once before the save, so a skipped step and a lowered
//! hysteresis are in the saved state.

use serde_json::json;
use zero_comm::Communicator;
use zero_runtime::{Device, Engine, LoadOptions};
use zero_tests::{
    consolidate, dataset, full_params, mlp_config, run_ranks, seed, train_step, Consolidated,
    GradHook, MICRO_BATCH,
};

const STEPS: usize = 6;
const SAVE_AT: usize = 3;

#[derive(Debug, PartialEq)]
struct Snapshot {
    params: Vec<u32>,
    state: Vec<zero_runtime::StatePiece>,
    counts: (u64, u64, u64),
    scaler: zero_runtime::scaler::ScalerState,
    lr: u64,
}

fn snapshot<C: Communicator, D: Device<Buffer = C::Buffer>>(e: &mut Engine<C, D>) -> Snapshot {
    let params = full_params(e).expect("params");
    Snapshot {
        params: params
            .iter()
            .flatten()
            .flatten()
            .map(|x| x.to_bits())
            .collect(),
        state: e.optimizer_state().expect("state"),
        counts: e.step_counts(),
        scaler: e.loss_scaler().state(),
        lr: e.lr().to_bits(),
    }
}

/// An overflow on rank 0 in the second step, before the save, and in the fifth, after it
/// (fp16 only): the second halves the scale only if the lowered hysteresis was restored.
#[allow(clippy::ptr_arg)] // the GradHook signature
fn overflow(step: usize, micro: usize, rank: usize, g: &mut Vec<Vec<Vec<f32>>>) {
    if (step == 1 || step == 4) && micro == 0 && rank == 0 {
        g[0][0][0] = f32::INFINITY;
    }
}

#[test]
fn a_resumed_run_is_bit_identical_to_the_run_that_never_stopped() {
    let seed = seed("checkpoint resume");
    let tmp = tempfile::tempdir().expect("temp dir");
    for stage in 0..=3u8 {
        for precision in ["fp32", "fp16", "bf16"] {
            for accum in [1usize, 3] {
                let world = if stage == 3 { 3 } else { 2 };
                let cfg = mlp_config(stage, precision, accum, 0.5, stage % 2 == 1);
                let data = dataset(seed, STEPS * world * MICRO_BATCH * accum);
                let hook: Option<GradHook> = (precision == "fp16").then_some(&overflow);
                let label = format!("stage {stage} {precision} accum {accum} world {world}");
                let straight = run_ranks(world, &cfg, seed, |e| {
                    for s in 0..STEPS {
                        train_step(e, &data, s, hook).expect("step");
                    }
                    snapshot(e)
                });
                let dir = tmp.path().join(format!("s{stage}-{precision}-{accum}"));
                let tags = run_ranks(world, &cfg, seed, |e| {
                    for s in 0..SAVE_AT {
                        train_step(e, &data, s, hook).expect("step");
                    }
                    e.save_checkpoint(&dir, None, json!({"data_step": SAVE_AT}))
                        .expect("save")
                });
                assert!(
                    tags.iter().all(|t| *t == format!("global_step{SAVE_AT}")),
                    "{tags:?}"
                );
                // Fresh engines with other initial values: the load must replace it all.
                let resumed = run_ranks(world, &cfg, seed ^ 0x5eed, |e| {
                    let client = e
                        .load_checkpoint(&dir, None, LoadOptions::default())
                        .expect("load");
                    assert_eq!(client, json!({"data_step": SAVE_AT}));
                    for s in SAVE_AT..STEPS {
                        train_step(e, &data, s, hook).expect("step");
                    }
                    snapshot(e)
                });
                if precision == "fp16" {
                    assert_eq!(
                        straight[0].counts.1, 2,
                        "{label}: the overflows were not skipped"
                    );
                    assert_eq!(
                        f64::from_bits(straight[0].scaler.scale.to_bits()),
                        128.0,
                        "{label}"
                    );
                }
                for (r, (a, b)) in straight.iter().zip(&resumed).enumerate() {
                    assert!(
                        a == b,
                        "{label}: rank {r} differs after resuming (seed {seed})"
                    );
                }
                let all: Vec<Vec<_>> = resumed.into_iter().map(|s| s.state).collect();
                let c: Consolidated = consolidate(&all);
                assert_eq!(c.len(), 6, "{label}");
            }
        }
    }
}
