//! `load_hf_checkpoint`: a Hugging Face checkpoint (sharded, tied weights stored once, saved
//! with or without the base prefix, mixed dtypes) loads into engines of every stage and
//! world size with the file's values, each rank reading only the byte ranges of what it
//! holds; a checkpoint that does not fit the model, or a damaged file on one rank, fails
//! every rank naming the tensor and the file, and changes nothing. On a GPU (the stand-in
//! in CI: `.ci/gpusim`), the GPU engine loads the same bits reading the same byte ranges
//! (how `zero.Init(checkpoint=...)` and `from_pretrained` fill a CUDA engine).

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;
use zero_comm::{Communicator, DeviceGroup, HostComm, HostGroup};
use zero_kernels::testing::gpu_or_skip;
use zero_runtime::{CudaDevice, Device, Engine, HfLoadOptions, HostDevice, ModuleSpec, ParamSpec};
use zero_tests::{init_values, seed};

const VOCAB: usize = 300;
const WIDTH: usize = 64;

/// The model as the engine knows it (a causal LM's names: `model.*` and a tied head).
fn modules() -> Vec<ModuleSpec> {
    vec![
        ModuleSpec::new(
            "model.embed",
            vec![ParamSpec::new("weight", &[VOCAB, WIDTH])
                .with_aliases(vec!["lm_head.weight".into()])],
        ),
        ModuleSpec::new(
            "model.layer",
            vec![
                ParamSpec::new("weight", &[WIDTH, WIDTH]),
                ParamSpec::new("bias", &[WIDTH]),
                ParamSpec::frozen("pos", &[16, WIDTH]),
            ],
        ),
    ]
}

fn config(stage: u8, precision: &str) -> String {
    let p = match precision {
        "bf16" => r#""bf16": {"enabled": true},"#,
        _ => "",
    };
    format!(
        r#"{{"train_micro_batch_size_per_gpu": 1, {p}
            "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01}}}},
            "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": 5000,
                "stage3_param_persistence_threshold": 100}}}}"#
    )
}

/// The checkpoint's tensors: name → (values, file dtype).
type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>, Dtype)>;

fn checkpoint_values(seed: u64, prefix: &str) -> Tensors {
    let mut t = Tensors::new();
    let mut put = |name: &str, shape: &[usize], id: usize, dtype| {
        let mut v = vec![0f32; shape.iter().product()];
        init_values(seed ^ 0xc0ffee, id, &mut v);
        t.insert(format!("{prefix}{name}"), (shape.to_vec(), v, dtype));
    };
    put("embed.weight", &[VOCAB, WIDTH], 0, Dtype::BF16);
    put("layer.weight", &[WIDTH, WIDTH], 1, Dtype::F32);
    put("layer.bias", &[WIDTH], 2, Dtype::F32);
    put("layer.pos", &[16, WIDTH], 3, Dtype::BF16);
    t
}

fn encode(v: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// Writes `tensors` as two shards and an index, as `save_pretrained` does.
fn write_checkpoint(dir: &Path, tensors: &Tensors) {
    std::fs::create_dir_all(dir).unwrap();
    let names: Vec<&String> = tensors.keys().collect();
    let (first, second) = names.split_at(names.len() / 2);
    let mut map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", second),
    ] {
        let bytes: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = part
            .iter()
            .map(|n| {
                let (shape, v, d) = &tensors[*n];
                (n.to_string(), shape.clone(), *d, encode(v, *d))
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(file)).unwrap();
        for n in part {
            map.insert(n.to_string(), file.into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

fn run<R: Send>(
    world: usize,
    cfg: &str,
    seed: u64,
    f: impl Fn(&mut Engine<HostComm, HostDevice>) -> R + Sync,
) -> Vec<R> {
    let comms = HostGroup::with_timeout(world, std::time::Duration::from_secs(30)).unwrap();
    zero_tests::run_ranks_model(comms, || HostDevice, cfg, seed, modules, f)
}

/// Every parameter, whole, as f32 (a collective in stage 3).
fn all_params<C: Communicator, D: Device<Buffer = C::Buffer>>(
    e: &mut Engine<C, D>,
) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for m in 0..2 {
        e.fetch(m).unwrap();
        out.extend(e.params_f32(m).unwrap());
        e.release(m).unwrap();
    }
    out
}

fn round(x: f32, precision: &str) -> f32 {
    if precision == "bf16" {
        half::bf16::from_f32(x).to_f32()
    } else {
        x
    }
}

#[test]
fn every_stage_and_world_size_loads_the_files_values_reading_only_what_it_holds() {
    let seed = seed("hf load");
    let tmp = tempfile::tempdir().unwrap();
    // Saved with the head (`model.` prefix, the tied head stored once as the embedding),
    // and saved from the base model (no prefix).
    for (label, prefix) in [("with the head", "model."), ("base model", "")] {
        let dir = tmp.path().join(label.replace(' ', "-"));
        let tensors = checkpoint_values(seed, prefix);
        write_checkpoint(&dir, &tensors);
        // What the files hold: bf16 tensors hold their values rounded to bf16.
        let file_values: Vec<Vec<f32>> =
            ["embed.weight", "layer.weight", "layer.bias", "layer.pos"]
                .iter()
                .map(|n| {
                    let (_, v, d) = &tensors[&format!("{prefix}{n}")];
                    v.iter()
                        .map(|x| {
                            if *d == Dtype::BF16 {
                                round(*x, "bf16")
                            } else {
                                *x
                            }
                        })
                        .collect()
                })
                .collect();
        let total_bytes: u64 = tensors
            .values()
            .map(|(_, v, d)| (v.len() * d.bitsize() / 8) as u64)
            .sum();
        let frozen_bytes = (16 * WIDTH * 2) as u64;
        for precision in ["fp32", "bf16"] {
            for stage in 0..=3u8 {
                for world in 1..=3usize {
                    let ctx = format!("{label}, {precision}, stage {stage}, world {world}");
                    let opts = HfLoadOptions {
                        strict: true,
                        prefix: Some("model".into()),
                        ignore: vec![],
                        round_to: None,
                    };
                    let out = run(world, &config(stage, precision), seed, |e| {
                        let (stats, left) = e.load_hf_checkpoint(&dir, &opts).unwrap();
                        (stats, left, all_params(e))
                    });
                    let mut requested = 0;
                    for (rank, (stats, left, params)) in out.iter().enumerate() {
                        assert!(left.is_empty(), "{ctx}: left {left:?}");
                        for (i, (got, want)) in params.iter().zip(&file_values).enumerate() {
                            assert_eq!(got.len(), want.len(), "{ctx}: rank {rank} parameter {i}");
                            // The engine's dtype rounds the file's value once.
                            let bad = got
                                .iter()
                                .zip(want)
                                .position(|(g, w)| g.to_bits() != round(*w, precision).to_bits());
                            assert_eq!(
                                bad, None,
                                "{ctx}: rank {rank} parameter {i} differs at element {bad:?}"
                            );
                        }
                        // Owned byte ranges, rounded to whole 4 KiB blocks, and the headers.
                        let slack = (tensors.len() as u64 + 2) * 2 * 4096;
                        assert!(
                            stats.read <= stats.requested + slack,
                            "{ctx}: rank {rank} {stats:?}"
                        );
                        requested += stats.requested;
                    }
                    // Over the ranks each byte is read once, except in stage 0, where every
                    // rank holds all, and the frozen ones at stages 1–2, read by every rank
                    // (it keeps them whole; stage 3 partitions them).
                    let want = match stage {
                        0 => world as u64 * total_bytes,
                        3 => total_bytes,
                        _ => total_bytes + (world as u64 - 1) * frozen_bytes,
                    };
                    assert_eq!(requested, want, "{ctx}: bytes asked for over all ranks");
                }
            }
        }
    }
}

/// The master weights take the file's fp32 values, or (`round_to`) those values rounded to
/// the loading model's 16-bit dtype first: DeepSpeed's master weights of a bf16 model that
/// transformers filled from the file.
#[test]
fn master_weights_are_the_files_values_or_rounded_through_the_models_dtype() {
    let seed = seed("hf load rounding");
    let tmp = tempfile::Builder::new()
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let dir = tmp.path().join("ckpt");
    let tensors = checkpoint_values(seed, "model.");
    write_checkpoint(&dir, &tensors);
    let file = &tensors["model.layer.weight"].1; // stored in fp32
    assert!(
        file.iter().any(|x| round(*x, "bf16") != *x),
        "the test needs values bf16 cannot hold"
    );
    for stage in [1u8, 3] {
        for round_to in [None, Some(zero_kernels::DType::BF16)] {
            let opts = HfLoadOptions {
                strict: true,
                prefix: Some("model".into()),
                ignore: vec![],
                round_to,
            };
            let states = run(2, &config(stage, "bf16"), seed, |e| {
                e.load_hf_checkpoint(&dir, &opts).unwrap();
                e.optimizer_state().unwrap()
            });
            let master = &zero_tests::consolidate(&states)["model.layer.weight"][0];
            let want: Vec<u32> = file
                .iter()
                .map(|x| match round_to {
                    Some(_) => round(*x, "bf16").to_bits(),
                    None => x.to_bits(),
                })
                .collect();
            assert!(
                master == &want,
                "stage {stage}, round_to {round_to:?}: master weights differ"
            );
        }
    }
}

#[test]
fn a_checkpoint_that_does_not_fit_fails_every_rank_naming_the_tensor() {
    let seed = seed("hf load errors");
    let tmp = tempfile::tempdir().unwrap();
    let strict = HfLoadOptions {
        strict: true,
        prefix: Some("model".into()),
        ignore: vec![],
        round_to: None,
    };
    let case = |label: &str, edit: &dyn Fn(&mut Tensors), opts: &HfLoadOptions| -> Vec<String> {
        let dir = tmp.path().join(label);
        let mut t = checkpoint_values(seed, "model.");
        edit(&mut t);
        write_checkpoint(&dir, &t);
        let before = run(2, &config(3, "bf16"), seed, all_params);
        run(2, &config(3, "bf16"), seed, |e| {
            let err = e.load_hf_checkpoint(&dir, opts).unwrap_err().to_string();
            assert_eq!(
                all_params(e),
                before[0],
                "{label}: a failed load changed nothing"
            );
            err
        })
    };
    for err in case("missing", &|t| drop(t.remove("model.layer.bias")), &strict) {
        assert!(
            err.contains("`model.layer.bias`") && err.contains("not in the checkpoint"),
            "{err}"
        );
    }
    for err in case(
        "extra",
        &|t| drop(t.insert("model.extra".into(), (vec![2], vec![1.0, 2.0], Dtype::F32))),
        &strict,
    ) {
        assert!(
            err.contains("`model.extra`") && err.contains("safetensors"),
            "{err}"
        );
    }
    for err in case(
        "shape",
        &|t| {
            let (s, v, _) = t.get_mut("model.layer.weight").unwrap();
            *s = vec![WIDTH * WIDTH];
            let _ = v;
        },
        &strict,
    ) {
        assert!(
            err.contains("`model.layer.weight`")
                && err.contains("safetensors")
                && err.contains("shape"),
            "{err}"
        );
    }
    // Not strict: the extra tensor is left for the caller, named.
    let dir = tmp.path().join("extra");
    let lenient = HfLoadOptions {
        strict: false,
        ..strict.clone()
    };
    let out = run(2, &config(2, "bf16"), seed, |e| {
        e.load_hf_checkpoint(&dir, &lenient).unwrap().1
    });
    assert_eq!(out[0], vec!["model.extra".to_string()]);
    let named = HfLoadOptions {
        ignore: vec!["extra".into()],
        ..strict.clone()
    };
    run(2, &config(2, "bf16"), seed, |e| {
        e.load_hf_checkpoint(&dir, &named).unwrap()
    });
}

#[test]
fn a_damaged_file_on_one_rank_fails_every_rank() {
    let seed = seed("hf load damaged");
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good");
    let bad = tmp.path().join("bad");
    write_checkpoint(&good, &checkpoint_values(seed, "model."));
    write_checkpoint(&bad, &checkpoint_values(seed, "model."));
    let shard = bad.join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let opts = HfLoadOptions {
        strict: true,
        prefix: Some("model".into()),
        ignore: vec![],
        round_to: None,
    };
    let errs = run(2, &config(3, "bf16"), seed, |e| {
        let dir = if e.rank() == 1 { &bad } else { &good };
        e.load_hf_checkpoint(dir, &opts).unwrap_err().to_string()
    });
    assert!(
        errs[1].contains("model-00002-of-00002.safetensors"),
        "{}",
        errs[1]
    );
    assert!(
        errs[0].contains("rank 1"),
        "rank 0 hears of rank 1: {}",
        errs[0]
    );
}

#[test]
fn the_gpu_engine_loads_the_host_engines_bits_reading_the_same_ranges() {
    if gpu_or_skip("load_hf_checkpoint into the GPU engine").is_none() {
        return;
    }
    let seed = seed("hf load gpu");
    let tmp = tempfile::tempdir().unwrap();
    write_checkpoint(tmp.path(), &checkpoint_values(seed, "model."));
    let opts = HfLoadOptions {
        strict: true,
        prefix: Some("model".into()),
        ignore: vec![],
        round_to: Some(zero_kernels::DType::BF16),
    };
    let world = 2;
    for stage in [1u8, 3] {
        let cfg = config(stage, "bf16");
        let host = run(world, &cfg, seed, |e| {
            let (stats, left) = e.load_hf_checkpoint(tmp.path(), &opts).unwrap();
            assert!(left.is_empty(), "stage {stage}: left {left:?}");
            (stats.requested, all_params(e))
        });
        let comms = DeviceGroup::with_timeout(world, std::time::Duration::from_secs(60)).unwrap();
        let gpu = zero_tests::run_ranks_model(
            comms,
            || CudaDevice::new().expect("device"),
            &cfg,
            seed,
            modules,
            |e| {
                let (stats, left) = e.load_hf_checkpoint(tmp.path(), &opts).unwrap();
                assert!(left.is_empty(), "stage {stage}: left {left:?}");
                (stats.requested, all_params(e))
            },
        );
        for r in 0..world {
            assert_eq!(
                gpu[r].0, host[r].0,
                "stage {stage}, rank {r}: bytes asked for"
            );
            for (i, (g, h)) in gpu[r].1.iter().zip(&host[r].1).enumerate() {
                let (g, h): (Vec<u32>, Vec<u32>) = (
                    g.iter().map(|x| x.to_bits()).collect(),
                    h.iter().map(|x| x.to_bits()).collect(),
                );
                assert_eq!(g, h, "stage {stage}, rank {r}, parameter {i} (seed {seed})");
            }
        }
    }
}
