//! Frozen parameters (a LoRA-style frozen base) at stage 3: those over
//! `stage3_param_persistence_threshold` are partitioned like the trainable ones and
//! gathered with their module, with no gradient and no optimizer state (DeepSpeed's
//! stage 3 partitions them too); stages 0–2 keep them whole. The model is the MLP with
//! the two hidden layers' weights frozen: the biases and the last layer train.
//!
//! - Stage 3 trains to the bits of stage 2 (the trainable buckets are the same), at
//!   world sizes 2 and 4, in bf16 and fp32, with and without `offload_param` (cpu, nvme).
//! - Each rank holds its partitions of the frozen weights, not all of them
//!   (`memory_report().frozen`), and the comm report counts their gathers to the element.
//! - A checkpoint saved at stage 3 loads at other stages and world sizes with the frozen
//!   values intact, with `exclude_frozen_parameters` too, and the 16-bit weights saved in
//!   Hugging Face's format hold them.
//! - On a GPU (the stand-in in CI: `.ci/gpusim`), stage 3 with the frozen base gives the
//!   host engine's bits, with and without `offload_param`.

use serde_json::json;
use std::time::Duration;
use zero_comm::{DeviceGroup, HostGroup};
use zero_kernels::testing::gpu_or_skip;
use zero_runtime::{
    CudaDevice, Device, Engine, EngineError, HostDevice, LoadOptions, ModuleSpec, ParamSpec,
    SaveOptions,
};
use zero_tests::{
    dataset, full_params, init_values, loss_and_grads, micro_batch, mlp_config, run_ranks_model,
    seed, with_offload, Params, DIMS, MICRO_BATCH,
};

/// The MLP with layer 0's and layer 1's weights (91 and 65 elements) frozen.
fn frozen_mlp() -> Vec<ModuleSpec> {
    (0..3)
        .map(|l| {
            let shape = [DIMS[l + 1], DIMS[l]];
            let weight = if l < 2 {
                ParamSpec::frozen("weight", &shape)
            } else {
                ParamSpec::new("weight", &shape)
            };
            ModuleSpec::new(
                format!("layer{l}"),
                vec![weight, ParamSpec::new("bias", &[DIMS[l + 1]])],
            )
        })
        .collect()
}

fn trainable(l: usize, k: usize) -> bool {
    l == 2 || k == 1
}

/// One optimizer step: forward, then backward handing the trainable gradients only.
fn step<C: zero_comm::Communicator, D: Device<Buffer = C::Buffer>>(
    e: &mut Engine<C, D>,
    data: &[(Vec<f32>, Vec<f32>)],
    s: usize,
) -> Result<(), EngineError> {
    let (world, rank) = (e.world_size(), e.rank());
    let batch = &data[micro_batch(s, 0, rank, world, MICRO_BATCH, 1)];
    let params = full_params(e)?;
    let (_, grads) = loss_and_grads(&params, batch, e.loss_scale_factor() as f32);
    for m in (0..3).rev() {
        e.fetch(m)?;
        let g: Vec<&[f32]> = (0..2)
            .filter(|&k| trainable(m, k))
            .map(|k| &grads[m][k][..])
            .collect();
        e.add_grads_f32(m, &g)?;
        e.grads_ready(m)?;
        e.release(m)?;
    }
    e.step()?;
    Ok(())
}

fn run<R: Send>(
    world: usize,
    cfg: &str,
    seed: u64,
    f: impl Fn(&mut Engine<zero_comm::HostComm, HostDevice>) -> R + Sync,
) -> Vec<R> {
    let comms = HostGroup::with_timeout(world, Duration::from_secs(30)).expect("group");
    run_ranks_model(comms, || HostDevice, cfg, seed, frozen_mlp, f)
}

fn bits(p: &Params) -> Vec<u32> {
    p.iter().flatten().flatten().map(|x| x.to_bits()).collect()
}

const STEPS: usize = 4;

/// `STEPS` steps on one rank's engine, then every parameter.
fn steps_then_params<C: zero_comm::Communicator, D: Device<Buffer = C::Buffer>>(
    e: &mut Engine<C, D>,
    data: &[(Vec<f32>, Vec<f32>)],
) -> Params {
    for s in 0..STEPS {
        step(e, data, s).expect("step");
    }
    full_params(e).expect("params")
}

/// Trains `STEPS` steps; returns each rank's parameters and memory report.
fn train(
    world: usize,
    cfg: &str,
    seed: u64,
) -> Vec<(Params, zero_runtime::MemoryReport, zero_runtime::CommReport)> {
    let data = dataset(seed, STEPS * world * MICRO_BATCH);
    run(world, cfg, seed, |e| {
        for s in 0..STEPS {
            step(e, &data, s).expect("step");
        }
        let report = (e.memory_report(), e.comm_report());
        (full_params(e).expect("params"), report.0, report.1)
    })
}

/// [`mlp_config`] with one module per bucket and no persistent parameter: every bucket is
/// then gathered exactly twice per micro-step at stage 3 (reuse distance 0), as the comm
/// formula counts.
fn one_module_per_bucket(stage: u8, precision: &str) -> String {
    let mut v: serde_json::Value =
        serde_json::from_str(&mlp_config(stage, precision, 1, 0.5, false)).expect("JSON");
    v["zero_optimization"]["reduce_bucket_size"] = 1.into();
    v["zero_optimization"]["stage3_param_persistence_threshold"] = 0.into();
    v.to_string()
}

#[test]
fn a_frozen_base_is_partitioned_at_stage_3_and_trains_to_stage_2s_bits() {
    let seed = seed("frozen_stage3");
    for (world, precision) in [(2, "bf16"), (4, "bf16"), (2, "fp32"), (4, "fp32")] {
        let stage2 = train(world, &one_module_per_bucket(2, precision), seed);
        let base = one_module_per_bucket(3, precision);
        let offloaded = with_offload(&base, "offload_param", &json!({"device": "cpu"}), None);
        let nvme_dir = tempfile::Builder::new()
            .prefix("zero-frozen-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temporary folder");
        let nvme = json!({"device": "nvme", "nvme_path": nvme_dir.path()});
        let swapped = with_offload(&base, "offload_param", &nvme, None);
        for (cfg, label) in [
            (&base, "stage 3"),
            (&offloaded, "stage 3 + offload_param"),
            (&swapped, "stage 3 + offload_param nvme"),
        ] {
            let ctx = format!("world {world}, {precision}, {label} (seed {seed})");
            let stage3 = train(world, cfg, seed);
            for r in 0..world {
                assert_eq!(bits(&stage3[r].0), bits(&stage2[r].0), "{ctx}, rank {r}");
            }
            // The frozen weights did not move.
            for l in 0..2 {
                let mut init = vec![0f32; DIMS[l + 1] * DIMS[l]];
                init_values(seed, 2 * l, &mut init);
                let round = |x: f32| match precision {
                    "bf16" => half::bf16::from_f32(x).to_f32(),
                    _ => x,
                };
                let want: Vec<u32> = init.iter().map(|&x| round(x).to_bits()).collect();
                let got: Vec<u32> = stage3[0].0[l][0].iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{ctx}: layer{l}.weight changed");
            }
            let p = if precision == "bf16" { 2 } else { 4 };
            let whole = stage2[0].1.frozen;
            assert!(
                whole >= (91 + 65) * p,
                "{ctx}: stage 2 holds the frozen weights whole"
            );
            let mut held = 0;
            for (r, (_, mem, comm)) in stage3.iter().enumerate() {
                let device = mem.frozen;
                // The parameter tier's partitions, trained and frozen: host or NVMe.
                let host = mem.host.params + mem.nvme.params;
                // (Partitions align to 512 bytes: on this small model the padding is most
                // of them; the byte count below is the formula's.)
                if label == "stage 3" {
                    held += device;
                } else {
                    assert_eq!(
                        device, 0,
                        "{ctx}, rank {r}: the frozen partitions are in the parameter tier"
                    );
                }
                // Frozen buckets pad to the world: each rank's partition is Φ'/N.
                let phi = comm.frozen_padded_numel;
                assert!(phi >= 91 + 65 && phi % world == 0, "{ctx}: Φ' = {phi}");
                if label == "stage 3" {
                    assert_eq!(device, phi / world * p, "{ctx}, rank {r}");
                } else {
                    assert!(host >= phi / world * p, "{ctx}, rank {r}: host {host}");
                }
                // Every gather of the last step, trainable and frozen, to the element.
                let n = world as u64;
                let psi = comm.padded_numel as u64;
                assert_eq!(
                    comm.theory,
                    (3 * psi + 2 * phi as u64) * (n - 1) / n,
                    "{ctx}"
                );
                assert_eq!(
                    comm.last_step.grad_reduce + comm.last_step.param_gather,
                    comm.theory,
                    "{ctx}, rank {r}: {comm:?}"
                );
                assert!(comm.theory_formula.contains("2Φ(N-1)/N"), "{ctx}: {comm:?}");
            }
            if label == "stage 3" {
                assert_eq!(held, stage3[0].2.frozen_padded_numel * p, "{ctx}");
            }
        }
    }
}

#[test]
fn a_stage_3_checkpoint_with_a_partitioned_frozen_base_loads_anywhere() {
    let seed = seed("frozen_checkpoint");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dataset(seed, STEPS * 2 * MICRO_BATCH);
    let saved = run(2, &mlp_config(3, "bf16", 1, 0.5, false), seed, |e| {
        for s in 0..2 {
            step(e, &data, s).expect("step");
        }
        e.save_checkpoint(dir.path(), Some("all"), json!(null))
            .expect("save");
        let only_trained = SaveOptions {
            exclude_frozen_parameters: true,
        };
        e.save_checkpoint_with(dir.path(), Some("trained"), json!(null), only_trained)
            .expect("save without the frozen parameters");
        e.save_hf_weights(&dir.path().join("hf"), 1 << 20, zero_kernels::DType::F32)
            .expect("save_hf_weights");
        full_params(e).expect("params")
    });
    let want = bits(&saved[0]);
    for (world, stage) in [(1, 0), (3, 2), (4, 3), (2, 3)] {
        let cfg = mlp_config(stage, "bf16", 1, 0.5, false);
        let ctx = format!("world {world}, stage {stage} (seed {seed})");
        // Another seed: every value must come from the checkpoint.
        let loaded = run(world, &cfg, seed ^ 1, |e| {
            e.load_checkpoint(dir.path(), Some("all"), LoadOptions::default())
                .expect("load");
            full_params(e).expect("params")
        });
        for (r, p) in loaded.iter().enumerate() {
            assert_eq!(bits(p), want, "{ctx}, rank {r}");
        }
        // Without the frozen parameters: a non-strict load keeps the model's own.
        let kept = run(world, &cfg, seed ^ 1, |e| {
            let before = full_params(e).expect("params");
            let options = LoadOptions {
                strict: false,
                ..LoadOptions::default()
            };
            e.load_checkpoint(dir.path(), Some("trained"), options)
                .expect("load without the frozen parameters");
            (before, full_params(e).expect("params"))
        });
        for (r, (before, after)) in kept.iter().enumerate() {
            for l in 0..3 {
                for k in 0..2 {
                    let from = if trainable(l, k) { &saved[0] } else { before };
                    let got: Vec<u32> = after[l][k].iter().map(|x| x.to_bits()).collect();
                    let exp: Vec<u32> = from[l][k].iter().map(|x| x.to_bits()).collect();
                    assert_eq!(got, exp, "{ctx}, rank {r}: layer{l} parameter {k}");
                }
            }
        }
    }
    // The Hugging Face weights hold the frozen base (and the trained rest) whole.
    let mut ck = zero_runtime::checkpoint::hf::HfCheckpoint::open(&dir.path().join("hf"), 1 << 16)
        .expect("open the saved weights");
    for (l, layer) in saved[0].iter().enumerate().take(2) {
        let name = format!("layer{l}.weight");
        let n = ck.tensors()[&name].numel();
        let mut vals = vec![0f32; n];
        ck.read_f32(&name, 0..n, &mut vals).expect("read");
        let got: Vec<u32> = vals.iter().map(|x| x.to_bits()).collect();
        let exp: Vec<u32> = layer[0].iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, exp, "{name} in the Hugging Face weights");
    }
}

#[test]
fn a_partitioned_frozen_base_on_the_gpu_gives_the_host_engines_bits() {
    if gpu_or_skip("frozen base at stage 3 on the GPU").is_none() {
        return;
    }
    let seed = seed("frozen_stage3_gpu");
    let world = 2;
    let data = dataset(seed, STEPS * world * MICRO_BATCH);
    let base = one_module_per_bucket(3, "bf16");
    let offloaded = with_offload(&base, "offload_param", &json!({"device": "cpu"}), None);
    for (cfg, label) in [(&base, "stage 3"), (&offloaded, "stage 3 + offload_param")] {
        let host = run(world, cfg, seed, |e| steps_then_params(e, &data));
        let comms = DeviceGroup::with_timeout(world, Duration::from_secs(60)).expect("group");
        let dev = run_ranks_model(
            comms,
            || CudaDevice::new().expect("device"),
            cfg,
            seed,
            frozen_mlp,
            |e| steps_then_params(e, &data),
        );
        for r in 0..world {
            assert_eq!(
                bits(&dev[r]),
                bits(&host[r]),
                "{label}, rank {r} (seed {seed})"
            );
        }
    }
}
