//! The engine calls a framework front end makes beyond training steps (zero-torch uses
//! them): `set_params` (DeepSpeed's `GatheredParameters(modifier_rank=r)`),
//! `abandon_pass` (a forward without backward), `param_persistent`, and tied-weight
//! aliases in the 16-bit model and in exports.

use std::time::Duration;
use zero_comm::HostGroup;
use zero_runtime::checkpoint::export::{export_safetensors, DEFAULT_MAX_SHARD};
use zero_runtime::checkpoint::CheckpointDir;
use zero_runtime::io::DEFAULT_BUFFER;
use zero_runtime::{Engine, HostDevice, ModuleSpec, ParamSpec, ZeroConfig};
use zero_tests::{dataset, full_params, init_values, run_ranks, seed, train_step};

fn config(stage: u8) -> String {
    format!(
        r#"{{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
        "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01, "weight_decay": 0.01}}}},
        "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": 40,
        "stage3_prefetch_bucket_size": 40, "stage3_param_persistence_threshold": 13,
        "stage3_gather_16bit_weights_on_model_save": true}}}}"#
    )
}

/// New values for `layer1.weight` (parameter id 2, 5 × 13), different on every rank: only
/// the root's may be used.
fn new_values(rank: usize) -> Vec<f32> {
    (0..65)
        .map(|i| (i as f32 * 0.01 - 0.3) + rank as f32 * 100.0)
        .collect()
}

#[test]
fn set_params_takes_the_root_values_into_master_weights_on_every_rank() {
    let s = seed("set_params");
    let data = dataset(s, 64);
    for stage in [1u8, 3] {
        let cfg = config(stage);
        // One step, layer1.weight set from rank 1's values, one more step.
        let a = run_ranks(3, &cfg, s, |e| {
            train_step(e, &data, 0, None).unwrap();
            let id = e.param_id(1, 0).unwrap();
            e.set_params(vec![(id, new_values(e.rank()))], 1).unwrap();
            let after_set = full_params(e).unwrap();
            train_step(e, &data, 1, None).unwrap();
            (after_set, full_params(e).unwrap())
        });
        let want = new_values(1);
        for (rank, (after_set, _)) in a.iter().enumerate() {
            assert_eq!(
                after_set[1][0], want,
                "stage {stage} rank {rank}: not the root's values"
            );
        }
        for r in &a {
            assert_eq!(r.1, a[0].1, "stage {stage}: ranks differ after the step");
        }
    }
}

#[test]
fn set_params_then_step_equals_starting_from_those_values() {
    let s = seed("set_params_step");
    let data = dataset(s, 64);
    for stage in [0u8, 2, 3] {
        let cfg = config(stage);
        let set = run_ranks(2, &cfg, s, |e| {
            let id = e.param_id(1, 0).unwrap();
            e.set_params(vec![(id, new_values(e.rank()))], 1).unwrap();
            train_step(e, &data, 0, None).unwrap();
            full_params(e).unwrap()
        });
        // The same start, given at construction.
        let comms = HostGroup::with_timeout(2, Duration::from_secs(30)).unwrap();
        let zc = ZeroConfig::from_json_str(&cfg, 2).unwrap();
        let built: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    let (zc, data) = (zc.clone(), &data);
                    sc.spawn(move || {
                        let mut e = Engine::new(
                            zc,
                            zero_tests::mlp_modules(),
                            comm,
                            HostDevice,
                            |id, _, v| {
                                if id == 2 {
                                    v.copy_from_slice(&new_values(1));
                                } else {
                                    init_values(s, id, v);
                                }
                            },
                        )
                        .unwrap();
                        train_step(&mut e, data, 0, None).unwrap();
                        full_params(&mut e).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            set, built,
            "stage {stage}: set_params did not set the master weights"
        );
    }
}

#[test]
fn set_params_refuses_a_bad_root_or_length() {
    let res = run_ranks(2, &config(3), 1, |e| {
        let id = e.param_id(1, 0).unwrap();
        let bad_root = e
            .set_params(vec![(id, new_values(0))], 5)
            .unwrap_err()
            .to_string();
        let bad_len = e
            .set_params(vec![(id, vec![0.0; 3])], 0)
            .unwrap_err()
            .to_string();
        let bad_k = e.param_id(1, 9).unwrap_err().to_string();
        (bad_root, bad_len, bad_k)
    });
    for (root, len, k) in res {
        assert!(root.contains("modifier rank 5"), "{root}");
        assert!(len.contains("3 values for 65 elements"), "{len}");
        assert!(k.contains("no parameter 9"), "{k}");
    }
}

#[test]
fn an_abandoned_pass_frees_what_it_gathered_and_changes_nothing() {
    let s = seed("abandon_pass");
    let data = dataset(s, 64);
    let cfg = config(3);
    let plain = run_ranks(2, &cfg, s, |e| {
        for step in 0..2 {
            train_step(e, &data, step, None).unwrap();
        }
        full_params(e).unwrap()
    });
    let with_eval = run_ranks(2, &cfg, s, |e| {
        for step in 0..2 {
            // An evaluation forward: gathered, never released, then abandoned.
            for m in 0..3 {
                e.fetch(m).unwrap();
            }
            assert!(e.memory_report().gathered > 0);
            e.abandon_pass().unwrap();
            assert_eq!(
                e.memory_report().gathered,
                0,
                "the abandoned pass kept gathered buckets"
            );
            train_step(e, &data, step, None).unwrap();
        }
        full_params(e).unwrap()
    });
    assert_eq!(plain, with_eval);
}

#[test]
fn persistence_follows_the_stage_and_the_threshold() {
    for stage in 0u8..=3 {
        let res = run_ranks(2, &config(stage), 1, |e| {
            (0..3)
                .flat_map(|m| (0..2).map(move |k| (m, k)))
                .map(|(m, k)| e.param_persistent(m, k).unwrap())
                .collect::<Vec<_>>()
        });
        // Biases have 13, 5 and 3 elements (at or under the threshold); weights 91, 65, 15.
        let want = if stage == 3 {
            vec![false, true, false, true, false, true]
        } else {
            vec![true; 6]
        };
        assert_eq!(res[0], want, "stage {stage}");
    }
}

#[test]
fn tied_weights_are_written_under_every_name() {
    let dir = tempfile::tempdir().unwrap();
    let modules = vec![
        ModuleSpec::new(
            "embed",
            vec![ParamSpec::new("weight", &[4, 3]).with_aliases(vec!["head.weight".into()])],
        ),
        ModuleSpec::new("", vec![ParamSpec::new("scale", &[3])]),
    ];
    let cfg = ZeroConfig::from_json_str(&config(3), 1).unwrap();
    let comm = HostGroup::with_timeout(1, Duration::from_secs(30))
        .unwrap()
        .remove(0);
    let mut e = Engine::new(cfg, modules, comm, HostDevice, |id, _, v| {
        init_values(7, id, v)
    })
    .unwrap();
    let st = dir.path().join("st");
    e.save_16bit_model(&st).unwrap();
    e.save_checkpoint(&dir.path().join("ckpt"), None, serde_json::json!({}))
        .unwrap();
    let mut ckpt = CheckpointDir::open(&dir.path().join("ckpt"), None).unwrap();
    assert_eq!(
        ckpt.manifest.params[0].aliases,
        vec!["head.weight".to_string()]
    );
    let ex = dir.path().join("export");
    export_safetensors(
        &mut ckpt,
        &ex,
        zero_runtime::kernels::DType::F32,
        DEFAULT_MAX_SHARD,
        DEFAULT_BUFFER,
    )
    .unwrap();
    let mut want = vec![0f32; 12];
    init_values(7, 0, &mut want);
    for folder in [&st, &ex] {
        let bytes = std::fs::read(folder.join("model-00001-of-00001.safetensors")).unwrap();
        let t = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names = t.names();
        names.sort();
        assert_eq!(
            names,
            vec!["embed.weight", "head.weight", "scale"],
            "{}",
            folder.display()
        );
        for name in ["embed.weight", "head.weight"] {
            let got: Vec<f32> = t
                .tensor(name)
                .unwrap()
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            assert_eq!(got, want, "{name} in {}", folder.display());
        }
    }
}
