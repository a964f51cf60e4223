//! Checkpoints with the optimizer state offloaded: a save reads the state from the host
//! tier or the NVMe swap files; a load fills a new copy of the tier and takes it only when
//! every rank read its part. Checkpoints move freely between the device, cpu and nvme
//! tiers, world sizes and stages.

use serde_json::{json, Value};
use std::path::Path;
use zero_comm::Communicator;
use zero_runtime::{Device, Engine, LoadOptions};
use zero_tests::{
    consolidate, dataset, full_params, mlp_config, run_ranks, seed, train_step, with_offload,
    Consolidated, MICRO_BATCH,
};

const STEPS: usize = 5;
const SAVE_AT: usize = 2;

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("zero-offload-ckpt-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary folder")
}

fn tier(device: &str, nvme: &Path) -> Option<Value> {
    match device {
        "cpu" => Some(json!({"device": "cpu"})),
        "nvme" => Some(json!({"device": "nvme", "nvme_path": nvme})),
        _ => None,
    }
}

/// `device`: none, cpu or nvme (the optimizer state), or params-cpu / params-nvme (stage 3:
/// the parameters, and the optimizer state in the same tier).
fn config(stage: u8, device: &str, nvme: &Path) -> String {
    let base = mlp_config(stage, "bf16", 1, 0.5, false);
    let (params, device) = match device.strip_prefix("params-") {
        Some(d) => (tier(d, nvme), d),
        None => (None, device),
    };
    let base = match params {
        Some(t) => with_offload(&base, "offload_param", &t, None),
        None => base,
    };
    match tier(device, nvme) {
        Some(t) => with_offload(&base, "offload_optimizer", &t, Some(7)),
        None => base,
    }
}

fn bits<C: Communicator, D: Device<Buffer = C::Buffer>>(e: &mut Engine<C, D>) -> Vec<u32> {
    let p = full_params(e).expect("params");
    p.iter().flatten().flatten().map(|x| x.to_bits()).collect()
}

/// Saves at SAVE_AT from `from`, loads into `to` (same world and stage), trains to STEPS:
/// the run continues as the one that never stopped, and the state after the load is the
/// state saved.
#[test]
fn checkpoints_move_between_device_cpu_and_nvme_bit_for_bit() {
    let seed = seed("offload checkpoint resume");
    let tmp = scratch();
    let nvme = tmp.path().join("nvme");
    let world = 3;
    let data = dataset(seed, STEPS * world * MICRO_BATCH);
    for stage in [1u8, 3] {
        let straight = run_ranks(world, &config(stage, "none", &nvme), seed, |e| {
            for s in 0..STEPS {
                train_step(e, &data, s, None).expect("step");
            }
            bits(e)
        });
        for (from, to) in [
            ("nvme", "none"),
            ("none", "nvme"),
            ("cpu", "nvme"),
            ("nvme", "cpu"),
        ] {
            let ctx = format!("stage {stage} {from} -> {to}");
            let dir = tmp.path().join(format!("{stage}-{from}-{to}"));
            let saved = run_ranks(world, &config(stage, from, &nvme), seed, |e| {
                for s in 0..SAVE_AT {
                    train_step(e, &data, s, None).expect("step");
                }
                e.save_checkpoint(&dir, None, json!(null)).expect("save");
                e.optimizer_state().expect("state")
            });
            let resumed = run_ranks(world, &config(stage, to, &nvme), seed ^ 1, |e| {
                e.load_checkpoint(&dir, None, LoadOptions::default())
                    .expect("load");
                let state = e.optimizer_state().expect("state");
                for s in SAVE_AT..STEPS {
                    train_step(e, &data, s, None).expect("step");
                }
                (state, bits(e))
            });
            let loaded: Vec<_> = resumed.iter().map(|(s, _)| s.clone()).collect();
            assert!(
                consolidate(&loaded) == consolidate(&saved),
                "{ctx}: loaded state differs"
            );
            for (r, (_, b)) in resumed.iter().enumerate() {
                assert!(
                    *b == straight[r],
                    "{ctx}: rank {r} diverged after the resume"
                );
            }
        }
    }
}

/// A checkpoint saved by 3 ranks with nvme offload in stage 3 loads into 2 ranks with cpu
/// offload in stage 1 (and back): the consolidated state is the same bits.
#[test]
fn offloaded_checkpoints_reshard() {
    let seed = seed("offload checkpoint reshard");
    let tmp = scratch();
    let nvme = tmp.path().join("nvme");
    let data = dataset(seed, SAVE_AT * 3 * MICRO_BATCH);
    let a = tmp.path().join("a");
    let saved: Consolidated = consolidate(&run_ranks(3, &config(3, "nvme", &nvme), seed, |e| {
        for s in 0..SAVE_AT {
            train_step(e, &data, s, None).expect("step");
        }
        e.save_checkpoint(&a, None, json!(null)).expect("save");
        e.optimizer_state().expect("state")
    }));
    let b = tmp.path().join("b");
    let loaded = consolidate(&run_ranks(2, &config(1, "cpu", &nvme), seed ^ 7, |e| {
        e.load_checkpoint(&a, None, LoadOptions::default())
            .expect("load");
        e.save_checkpoint(&b, None, json!(null)).expect("save");
        e.optimizer_state().expect("state")
    }));
    assert!(
        loaded == saved,
        "3 ranks nvme stage 3 -> 2 ranks cpu stage 1"
    );
    let back = consolidate(&run_ranks(4, &config(2, "nvme", &nvme), seed ^ 9, |e| {
        e.load_checkpoint(&b, None, LoadOptions::default())
            .expect("load");
        e.optimizer_state().expect("state")
    }));
    assert!(back == saved, "2 ranks cpu stage 1 -> 4 ranks nvme stage 2");
}

/// A load that fails on one rank (a damaged file) leaves every rank's offloaded state,
/// parameters and counts as they were, and no half-filled copy behind; and a load without
/// the optimizer state zeroes the moments in the tier.
#[test]
fn a_failed_load_leaves_the_offloaded_state_untouched() {
    let seed = seed("offload checkpoint failure");
    let tmp = scratch();
    let nvme = tmp.path().join("nvme");
    let world = 2;
    let data = dataset(seed, 3 * world * MICRO_BATCH);
    let dir = tmp.path().join("ckpt");
    run_ranks(world, &config(2, "none", &nvme), seed, |e| {
        train_step(e, &data, 0, None).expect("step");
        e.save_checkpoint(&dir, Some("t"), json!(null))
            .expect("save");
    });
    let moments = std::fs::read_dir(dir.join("t"))
        .expect("tag folder")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("rank00001-moments"))
        .expect("rank 1's moments");
    let mut b = std::fs::read(&moments).expect("read");
    let at = b.len() - 5;
    b[at] ^= 0x10;
    std::fs::write(&moments, &b).expect("write");
    for device in ["cpu", "nvme"] {
        run_ranks(world, &config(2, device, &nvme), seed ^ 3, |e| {
            for s in 1..3 {
                train_step(e, &data, s, None).expect("step");
            }
            let before = (
                bits(e),
                e.optimizer_state().expect("state"),
                e.step_counts(),
            );
            let err = e
                .load_checkpoint(&dir, Some("t"), LoadOptions::default())
                .expect_err("a damaged file must fail the load");
            assert!(err.to_string().contains("checksum"), "{device}: {err}");
            let after = (
                bits(e),
                e.optimizer_state().expect("state"),
                e.step_counts(),
            );
            assert!(
                after == before,
                "{device}: the failed load changed the engine"
            );
            // Loading the weights alone reads only the (intact) master files.
            let opts = LoadOptions {
                load_optimizer_states: false,
                ..LoadOptions::default()
            };
            e.load_checkpoint(&dir, Some("t"), opts)
                .expect("weights-only load");
            for p in e.optimizer_state().expect("state") {
                assert!(
                    p.exp_avg.iter().chain(&p.exp_avg_sq).all(|&x| x == 0.0),
                    "{device}: moments survived a load without optimizer state"
                );
            }
        });
    }
    let leftovers: Vec<_> = walk(&nvme)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".loading"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "half-filled copies left: {leftovers:?}"
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
