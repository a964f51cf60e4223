//! What each rank keeps of each parameter between uses (`Engine::held_param`, DeepSpeed's
//! `ds_tensor`): at stage 3 the ranks' pieces, in rank order, are the parameter's 16-bit
//! values (a persistent parameter is held whole by every rank), with the partitions on the
//! device, in the `offload_param` host tier and in its NVMe swap file; below stage 3 every
//! rank holds every parameter whole. Checked after two steps of training, against the
//! gathered parameters, to the bit.

use zero_runtime::{Device, Engine, HeldParam, HostDevice};
use zero_tests::{dataset, full_params, mlp_config, run_ranks, seed, train_step, with_offload};

const WORLD: usize = 3;

type Comm = zero_comm::HostComm;

/// Every parameter's held values on this rank, as f32 bit patterns, `[module][param]`,
/// and whether the engine keeps it whole.
fn held(e: &mut Engine<Comm, HostDevice>) -> Vec<Vec<(Vec<u32>, bool)>> {
    (0..3)
        .map(|m| {
            (0..2)
                .map(|k| {
                    let whole = e.param_persistent(m, k).expect("persistent");
                    let vals = match e.held_param(m, k).expect("held") {
                        HeldParam::Buffer(b, r) | HeldParam::Host(b, r) => {
                            HostDevice.download_f32(b, r).expect("download")
                        }
                        HeldParam::Swapped { bucket, range } => {
                            e.read_swapped_f32(bucket, range).expect("swap read")
                        }
                    };
                    (vals.iter().map(|v| v.to_bits()).collect(), whole)
                })
                .collect()
        })
        .collect()
}

fn check(ctx: &str, cfg: &str, stage: u8) {
    let seed = seed("engine_held");
    let data = dataset(seed, 2 * WORLD * 2);
    let ranks = run_ranks(WORLD, cfg, seed, |e| {
        for s in 0..2 {
            train_step(e, &data, s, None).expect("step");
        }
        let pieces = held(e);
        (pieces, full_params(e).expect("params"))
    });
    let whole = &ranks[0].1;
    let mut split = 0;
    for m in 0..3 {
        for k in 0..2 {
            let want: Vec<u32> = whole[m][k].iter().map(|v| v.to_bits()).collect();
            let kept_whole = ranks[0].0[m][k].1;
            if kept_whole || stage < 3 {
                for (r, (pieces, _)) in ranks.iter().enumerate() {
                    assert_eq!(
                        pieces[m][k].0, want,
                        "{ctx}: rank {r} holds module {m} param {k} whole"
                    );
                }
            } else {
                let joined: Vec<u32> = ranks.iter().flat_map(|(p, _)| p[m][k].0.clone()).collect();
                assert_eq!(joined, want, "{ctx}: module {m} param {k}'s pieces");
                split += usize::from(ranks.iter().any(|(p, _)| p[m][k].0.len() < want.len()));
            }
        }
    }
    if stage == 3 {
        assert!(
            split > 0,
            "{ctx}: every rank holds every parameter whole: the test shows nothing"
        );
    }
}

#[test]
fn each_rank_holds_its_piece_of_every_parameter() {
    let nvme = tempfile::Builder::new()
        .prefix("zero-held-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary folder");
    for stage in [2u8, 3] {
        let base = mlp_config(stage, "bf16", 1, 0.0, false);
        check(&format!("stage {stage}"), &base, stage);
    }
    let base = mlp_config(3, "bf16", 1, 0.0, false);
    let cpu = serde_json::json!({"device": "cpu"});
    check(
        "offload_param cpu",
        &with_offload(&base, "offload_param", &cpu, None),
        3,
    );
    let disk = serde_json::json!({"device": "nvme", "nvme_path": nvme.path()});
    check(
        "offload_param nvme",
        &with_offload(&base, "offload_param", &disk, None),
        3,
    );
}
