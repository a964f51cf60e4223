//! Reshard on load, with no converter: a checkpoint written at world size N and stage S
//! loads into world size M and stage T, for every N, M in 1..=4 and every stage pair, and
//! the fp32 master weights, exp_avg, exp_avg_sq and step counts of every parameter equal
//! the saved ones bit for bit; the 16-bit parameters are the master weights rounded. A
//! change of 16-bit dtype (bf16 → fp16) loads too. Each rank reads only the byte ranges of
//! its new partitions: counted on a model large enough to span many checksummed chunks.

use serde_json::json;
use std::time::Duration;
use zero_comm::HostGroup;
use zero_runtime::{Engine, HostDevice, LoadOptions, ModuleSpec, ParamSpec, ZeroConfig};
use zero_tests::{
    consolidate, dataset, full_params, init_values, mlp_config, run_ranks, seed, train_step,
    Consolidated, MICRO_BATCH,
};

const STEPS: usize = 2;

/// Saves after `STEPS` steps at (`world`, `stage`, `precision`); returns the saved state.
fn save(
    dir: &std::path::Path,
    world: usize,
    stage: u8,
    precision: &str,
    seed: u64,
) -> (Consolidated, (u64, u64, u64)) {
    let cfg = mlp_config(stage, precision, 1, 0.5, false);
    let data = dataset(seed, STEPS * world * MICRO_BATCH);
    let out = run_ranks(world, &cfg, seed, |e| {
        for s in 0..STEPS {
            train_step(e, &data, s, None).expect("step");
        }
        e.save_checkpoint(dir, Some("ckpt"), json!(null))
            .expect("save");
        (e.optimizer_state().expect("state"), e.step_counts())
    });
    let counts = out[0].1;
    let states: Vec<_> = out.into_iter().map(|o| o.0).collect();
    (consolidate(&states), counts)
}

fn round(x: f32, precision: &str) -> f32 {
    match precision {
        "bf16" => half::bf16::from_f32(x).to_f32(),
        "fp16" => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// Loads into (`world`, `stage`, `precision`); checks state, counts and parameters.
fn load_and_check(
    dir: &std::path::Path,
    world: usize,
    stage: u8,
    precision: &str,
    saved: &(Consolidated, (u64, u64, u64)),
    label: &str,
) {
    let cfg = mlp_config(stage, precision, 1, 0.5, false);
    let out = run_ranks(world, &cfg, 0xbad, |e| {
        e.load_checkpoint(dir, Some("ckpt"), LoadOptions::default())
            .expect("load");
        let params = full_params(e).expect("params");
        (e.optimizer_state().expect("state"), e.step_counts(), params)
    });
    let states: Vec<_> = out.iter().map(|o| o.0.clone()).collect();
    let loaded = consolidate(&states);
    assert!(
        loaded == saved.0,
        "{label}: the fp32 state differs from the saved one"
    );
    assert_eq!(out[0].1, saved.1, "{label}: step counts");
    // The 16-bit parameters are the loaded master weights, rounded.
    let names = ["layer0", "layer1", "layer2"];
    for (r, o) in out.iter().enumerate() {
        for (l, layer) in o.2.iter().enumerate() {
            for (k, p) in layer.iter().enumerate() {
                let name = format!("{}.{}", names[l], ["weight", "bias"][k]);
                let master = &loaded[&name][0];
                for (i, v) in p.iter().enumerate() {
                    let want = round(f32::from_bits(master[i]), precision);
                    assert_eq!(v.to_bits(), want.to_bits(), "{label}: rank {r} {name}[{i}]");
                }
            }
        }
    }
}

#[test]
fn every_world_size_and_stage_loads_every_other_bit_for_bit() {
    let seed = seed("checkpoint reshard");
    let tmp = tempfile::tempdir().expect("temp dir");
    for n in 1..=4 {
        for s in 0..=3u8 {
            let dir = tmp.path().join(format!("n{n}s{s}"));
            let saved = save(&dir, n, s, "bf16", seed);
            for m in 1..=4 {
                for t in 0..=3u8 {
                    let label = format!(
                        "saved at world {n} stage {s}, loaded at world {m} stage {t} (seed {seed})"
                    );
                    load_and_check(&dir, m, t, "bf16", &saved, &label);
                }
            }
        }
    }
}

#[test]
fn a_change_of_16_bit_dtype_loads_the_same_fp32_state() {
    let seed = seed("checkpoint dtype change");
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("bf16");
    let saved = save(&dir, 2, 2, "bf16", seed);
    load_and_check(
        &dir,
        3,
        1,
        "fp16",
        &saved,
        "bf16 world 2 stage 2 → fp16 world 3 stage 1",
    );
    load_and_check(
        &dir,
        1,
        3,
        "fp32",
        &saved,
        "bf16 world 2 stage 2 → fp32 world 1 stage 3",
    );
}

/// Elements per parameter of the large model.
const BIG: u64 = 2_000_000;

/// A model of four 2M-element parameters (32 MB of master weights), so a rank's share of
/// each is many 256 KiB chunks long.
fn big_model() -> Vec<ModuleSpec> {
    (0..4)
        .map(|m| {
            ModuleSpec::new(
                format!("block{m}"),
                vec![ParamSpec::new("w", &[2000, 1000])],
            )
        })
        .collect()
}

fn big_engines(world: usize, stage: u8) -> Vec<Engine<zero_comm::HostComm, HostDevice>> {
    let cfg = format!(
        r#"{{"train_micro_batch_size_per_gpu": 1, "bf16": {{"enabled": true}},
            "optimizer": {{"type": "AdamW", "params": {{"lr": 0.001}}}},
            "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": 3000000}}}}"#
    );
    let cfg = ZeroConfig::from_json_str(&cfg, world).expect("config");
    let comms = HostGroup::with_timeout(world, Duration::from_secs(60)).expect("group");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let cfg = cfg.clone();
                s.spawn(move || {
                    Engine::new(cfg, big_model(), c, HostDevice, |id, _, v| {
                        init_values(7, id, v)
                    })
                    .expect("engine")
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

#[test]
fn each_rank_reads_only_the_byte_ranges_of_its_new_partition() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    std::thread::scope(|s| {
        for mut e in big_engines(1, 1) {
            s.spawn(move || {
                e.save_checkpoint(dir, Some("big"), json!(null))
                    .expect("save")
            });
        }
    });
    let total: u64 = std::fs::read_dir(dir.join("big"))
        .expect("folder")
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".safetensors"))
        .map(|f| f.metadata().expect("size").len())
        .sum();
    let world = 4;
    let stats: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = big_engines(world, 2)
            .into_iter()
            .map(|mut e| {
                s.spawn(move || {
                    e.load_checkpoint(dir, Some("big"), LoadOptions::default())
                        .expect("load");
                    e.last_load_read_stats()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    // Each rank's share: a quarter of the 8M elements, 12 bytes each (master, exp_avg,
    // exp_avg_sq). Reads are whole 256 KiB chunks: allow two extra per range read (one
    // range per parameter and state, 4 × 3) and the two files' headers.
    let share = 4 * BIG / world as u64 * 12;
    let slack = (4 * 3 * 2 + 2) * 256 * 1024;
    for (r, st) in stats.iter().enumerate() {
        println!(
            "rank {r}: asked for {} bytes, read {} of {total}",
            st.requested, st.read
        );
        // (Give or take the alignment padding at the ends of the buckets, which holds no
        // parameter and is not read.)
        assert!(
            st.requested.abs_diff(share) <= 64 * 1024,
            "rank {r}: {st:?}"
        );
        assert!(
            st.read <= share + slack,
            "rank {r} read {} bytes for a share of {share}",
            st.read
        );
        assert!(
            st.read < total / 2,
            "rank {r} read {} of {total} bytes",
            st.read
        );
    }
}
