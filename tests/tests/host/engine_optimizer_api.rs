//! What a front end needs from the engine's optimizer to give DeepSpeed's meaning (zero-torch
//! uses each): parameter groups with their own hyper-parameters, a second backward before
//! the step (`reopen_micro_step`), an optimizer the engine does not run itself
//! (`step_external_*`), training state read from another framework's checkpoint
//! (`import_state`), and no optimizer at all.

use std::collections::HashMap;
use std::time::Duration;
use zero_comm::HostGroup;
use zero_runtime::kernels::{adam_step, AdamConfig, WeightDecay};
use zero_runtime::{
    EngineError, ExternalArray, HostDevice, ImportedParam, ImportedState, ModuleSpec, ParamSpec,
    ZeroConfig,
};
use zero_tests::{
    bits, consolidate, dataset, full_params, init_values, loss_and_grads, max_diff, micro_batch,
    mlp_config, mlp_modules, run_ranks, run_ranks_model, seed, train_step, Params, Reference, DIMS,
    MICRO_BATCH,
};

/// The MLP with its biases in parameter group 1 (no weight decay on biases, as most
/// recipes do).
fn grouped_modules() -> Vec<ModuleSpec> {
    mlp_modules()
        .into_iter()
        .map(|m| {
            let params = m
                .params
                .into_iter()
                .map(|p| {
                    let g = usize::from(p.name == "bias");
                    p.in_group(g)
                })
                .collect();
            ModuleSpec::new(m.name, params)
        })
        .collect()
}

/// [`mlp_config`] with Adam's eps [`zero_tests::ROUNDING_SAFE_EPS`], for the runs compared
/// within a tolerance.
fn smooth_config(stage: u8, precision: &str, accum: usize, clip: f32, overlap: bool) -> String {
    zero_tests::with_rounding_safe_eps(&mlp_config(stage, precision, accum, clip, overlap))
}

/// The biases' group: another LR, betas, and no weight decay.
fn bias_group() -> AdamConfig {
    AdamConfig {
        lr: 0.03,
        beta1: 0.8,
        beta2: 0.99,
        weight_decay: 0.0,
        eps: zero_tests::ROUNDING_SAFE_EPS as f32,
        ..AdamConfig::adamw(0.01)
    }
}

fn group_run(world: usize, stage: u8, precision: &str, steps: usize, s: u64) -> Params {
    let data = dataset(s, steps * world * MICRO_BATCH);
    let cfg = smooth_config(stage, precision, 1, 0.5, stage == 3);
    let comms = HostGroup::with_timeout(world, Duration::from_secs(30)).unwrap();
    let runs = run_ranks_model(
        comms,
        || HostDevice,
        &cfg,
        s,
        grouped_modules,
        |e| {
            assert_eq!(e.group_count(), 2);
            e.set_group(1, bias_group()).unwrap();
            for step in 0..steps {
                train_step(e, &data, step, None).unwrap();
            }
            full_params(e).unwrap()
        },
    );
    for r in &runs {
        assert!(bits(r) == bits(&runs[0]), "ranks differ");
    }
    runs.into_iter().next().unwrap()
}

#[test]
fn parameter_groups_step_with_their_own_hyper_parameters_in_every_stage() {
    let s = seed("parameter groups");
    let steps = 8;
    for world in 1..=3 {
        for precision in ["fp32", "bf16"] {
            let runs: Vec<Params> = (0..=3)
                .map(|stage| group_run(world, stage, precision, steps, s))
                .collect();
            for (stage, r) in runs.iter().enumerate() {
                assert!(
                    bits(r) == bits(&runs[0]),
                    "world {world} {precision}: stage {stage} differs from stage 0"
                );
            }
            // Against plain Adam with each parameter's group's hyper-parameters.
            let cfg = ZeroConfig::from_json_str(&smooth_config(0, precision, 1, 0.5, false), world)
                .unwrap();
            let base = cfg.optimizer.as_ref().and_then(|o| o.adam).unwrap();
            let round: fn(f32) -> f32 = match precision {
                "bf16" => |x| half::bf16::from_f32(x).to_f32(),
                _ => |x| x,
            };
            let mut reference = Reference::new(s, round);
            let data = dataset(s, steps * world * MICRO_BATCH);
            let b = world * MICRO_BATCH;
            for st in 0..steps {
                reference.step_groups(&cfg, &data[st * b..(st + 1) * b], &|_, k| {
                    if k == 1 {
                        bias_group()
                    } else {
                        base
                    }
                });
            }
            let want = reference.params_f32();
            let tol = if precision == "fp32" { 1e-3 } else { 0.05 };
            let d = max_diff(&runs[0], &want);
            println!("world {world} {precision}: groups within {d:.2e} of the reference");
            assert!(d <= tol, "world {world} {precision}: {d} > {tol}");
            // The biases moved by their own LR: not the run where they share group 0's.
            let ungrouped = run_ranks(world, &smooth_config(0, precision, 1, 0.5, false), s, |e| {
                for st in 0..steps {
                    train_step(e, &data, st, None).unwrap();
                }
                full_params(e).unwrap()
            });
            assert!(max_diff(&ungrouped[0], &runs[0]) > 1e-3);
        }
    }
}

#[test]
fn groups_with_equal_hyper_parameters_change_no_bit() {
    let s = seed("equal groups");
    for stage in [0u8, 1, 3] {
        let cfg = mlp_config(stage, "bf16", 2, 0.5, false);
        let data = dataset(s, 4 * 2 * MICRO_BATCH * 2);
        let plain = run_ranks(2, &cfg, s, |e| {
            (0..4).for_each(|st| {
                train_step(e, &data, st, None).unwrap();
            });
            full_params(e).unwrap()
        });
        let comms = HostGroup::with_timeout(2, Duration::from_secs(30)).unwrap();
        let grouped = run_ranks_model(
            comms,
            || HostDevice,
            &cfg,
            s,
            grouped_modules,
            |e| {
                (0..4).for_each(|st| {
                    train_step(e, &data, st, None).unwrap();
                });
                full_params(e).unwrap()
            },
        );
        assert!(bits(&plain[0]) == bits(&grouped[0]), "stage {stage}");
    }
}

#[test]
fn offloaded_groups_give_the_device_bits() {
    let s = seed("offloaded groups");
    let steps = 4;
    let data = dataset(s, steps * 2 * MICRO_BATCH);
    for stage in [1u8, 3] {
        let cfg = mlp_config(stage, "bf16", 1, 0.5, false);
        let offloaded = zero_tests::with_offload(
            &cfg,
            "offload_optimizer",
            &serde_json::json!({"device": "cpu"}),
            Some(50),
        );
        let run = |cfg: &str| {
            let comms = HostGroup::with_timeout(2, Duration::from_secs(30)).unwrap();
            run_ranks_model(
                comms,
                || HostDevice,
                cfg,
                s,
                grouped_modules,
                |e| {
                    e.set_group(1, bias_group()).unwrap();
                    for st in 0..steps {
                        train_step(e, &data, st, None).unwrap();
                    }
                    full_params(e).unwrap()
                },
            )
        };
        assert!(
            bits(&run(&cfg)[0]) == bits(&run(&offloaded)[0]),
            "stage {stage}"
        );
    }
}

#[test]
fn a_bad_group_is_an_error_that_names_it() {
    let s = seed("bad group");
    let r = run_ranks(1, &mlp_config(1, "fp32", 1, 0.0, false), s, |e| {
        let missing = e
            .set_group(1, AdamConfig::adamw(0.1))
            .unwrap_err()
            .to_string();
        let bad = e
            .set_group(
                0,
                AdamConfig {
                    beta1: 1.5,
                    ..AdamConfig::adamw(0.1)
                },
            )
            .unwrap_err()
            .to_string();
        (missing, bad, e.group(0).unwrap())
    });
    let (missing, bad, kept) = &r[0];
    assert!(missing.contains("group 1"), "{missing}");
    assert!(
        bad.contains("param_groups[0]") && bad.contains("beta1"),
        "{bad}"
    );
    assert_eq!(kept.lr, 0.01, "a refused change must change nothing");
}

#[test]
fn a_schedule_starts_from_each_groups_own_lr() {
    let s = seed("group schedule");
    let mut v: serde_json::Value =
        serde_json::from_str(&mlp_config(2, "fp32", 1, 0.0, false)).unwrap();
    v["scheduler"] = serde_json::json!({"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}});
    let cfg = v.to_string();
    let data = dataset(s, 16 * MICRO_BATCH);
    let comms = HostGroup::with_timeout(1, Duration::from_secs(30)).unwrap();
    let lrs = run_ranks_model(
        comms,
        || HostDevice,
        &cfg,
        s,
        grouped_modules,
        |e| {
            e.set_group(1, bias_group()).unwrap();
            let mut seen = Vec::new();
            for st in 0..6 {
                seen.push(e.group_lrs());
                train_step(e, &data, st, None).unwrap();
            }
            seen
        },
    );
    let lrs = &lrs[0];
    // Linear warm-up over 4 steps from 0 to each group's lr (WarmupLR without
    // warmup_max_lr, as DeepSpeed's).
    assert_eq!(lrs[0], vec![0.0, 0.0]);
    for (i, l) in lrs.iter().enumerate().skip(1) {
        let frac = ((i - 1) as f64 / 4.0).min(1.0);
        assert!(
            (l[0] - 0.01 * frac).abs() < 1e-9 && (l[1] - 0.03 * frac).abs() < 1e-9,
            "{lrs:?}"
        );
    }
}

/// One pass (forward and backward of every module) of micro-batch `batch`, gradients
/// handed in, modules reported ready.
pub(crate) fn pass<C: zero_comm::Communicator, D: zero_runtime::Device<Buffer = C::Buffer>>(
    e: &mut zero_runtime::Engine<C, D>,
    batch: &[(Vec<f32>, Vec<f32>)],
    extra: Option<&[(Vec<f32>, Vec<f32>)]>,
) {
    let mut params = Vec::new();
    for m in 0..3 {
        e.fetch(m).unwrap();
        params.push(e.params_f32(m).unwrap());
        e.release(m).unwrap();
    }
    let f = e.loss_scale_factor() as f32;
    let (_, g) = loss_and_grads(&params, batch, f);
    let g2 = extra.map(|b| loss_and_grads(&params, b, f).1);
    for m in (0..3).rev() {
        e.fetch(m).unwrap();
        let gs: Vec<&[f32]> = g[m].iter().map(|v| &v[..]).collect();
        e.add_grads_f32(m, &gs).unwrap();
        if let Some(g2) = &g2 {
            let gs: Vec<&[f32]> = g2[m].iter().map(|v| &v[..]).collect();
            e.add_grads_f32(m, &gs).unwrap();
        }
        e.grads_ready(m).unwrap();
        e.release(m).unwrap();
    }
}

#[test]
fn a_reopened_micro_step_adds_the_next_pass_in_every_stage() {
    let s = seed("reopen");
    let world = 2;
    let steps = 4;
    for precision in ["fp32", "bf16"] {
        for accum in [1usize, 2] {
            let data = dataset(s, steps * accum * world * MICRO_BATCH * 2);
            let half = |st: usize, k: usize, r: usize, which: usize| {
                let m = micro_batch(st, k, r, world, 2 * MICRO_BATCH, accum);
                let mid = m.start + MICRO_BATCH;
                if which == 0 {
                    m.start..mid
                } else {
                    mid..m.end
                }
            };
            let mut runs = Vec::new();
            for stage in 0..=3u8 {
                let cfg = smooth_config(stage, precision, accum, 0.5, stage == 2);
                // Two passes per micro-step (the second reopens it) ...
                let reopen = |cfg: &str| {
                    run_ranks(world, cfg, s, |e| {
                        for st in 0..steps {
                            for k in 0..accum {
                                let r = e.rank();
                                pass(e, &data[half(st, k, r, 0)], None);
                                e.reopen_micro_step().unwrap();
                                pass(e, &data[half(st, k, r, 1)], None);
                            }
                            assert!(!e.step().unwrap().skipped);
                        }
                        full_params(e).unwrap()
                    })
                };
                let reopened = reopen(&cfg);
                // ... against one pass that adds both gradients.
                let together = run_ranks(world, &cfg, s, |e| {
                    for st in 0..steps {
                        for k in 0..accum {
                            let r = e.rank();
                            pass(e, &data[half(st, k, r, 0)], Some(&data[half(st, k, r, 1)]));
                        }
                        e.step().unwrap();
                    }
                    full_params(e).unwrap()
                });
                let d = max_diff(&reopened[0], &together[0]);
                let tol = if precision == "fp32" { 1e-5 } else { 0.02 };
                println!(
                    "{precision} accum {accum} stage {stage}: reopened within {d:.2e} of one pass"
                );
                assert!(
                    d <= tol,
                    "{precision} accum {accum} stage {stage}: {d} > {tol}"
                );
                assert!(bits(&reopened[1]) == bits(&reopened[0]), "ranks differ");
                if stage >= 1 {
                    // The carry of the offloaded optimizer's host gradients (stages 2–3)
                    // and of stage 1's device gradients: the same bits.
                    let offloaded = zero_tests::with_offload(
                        &cfg,
                        "offload_optimizer",
                        &serde_json::json!({"device": "cpu"}),
                        None,
                    );
                    let off = reopen(&offloaded);
                    assert!(
                        bits(&off[0]) == bits(&reopened[0]),
                        "{precision} accum {accum} stage {stage}: reopened with the optimizer offloaded differs"
                    );
                }
                runs.push(reopened.into_iter().next().unwrap());
            }
            if accum == 1 {
                for (stage, r) in runs.iter().enumerate() {
                    assert!(
                        bits(r) == bits(&runs[0]),
                        "{precision}: stage {stage} differs"
                    );
                }
            }
        }
    }
}

#[test]
fn reopening_out_of_order_is_an_error() {
    let s = seed("reopen order");
    let r = run_ranks(1, &mlp_config(2, "fp32", 1, 0.0, false), s, |e| {
        e.reopen_micro_step().unwrap_err().to_string()
    });
    assert!(r[0].contains("reopen_micro_step"), "{}", r[0]);
}

/// Adam over a group's flat vectors, with the kernels' own step (what a front end's
/// external optimizer computes; equal in the bits to the engine's fused step).
struct ExternalAdam {
    state: Vec<(Vec<f32>, Vec<f32>)>,
    step: u64,
}

impl ExternalAdam {
    fn run<C: zero_comm::Communicator, D: zero_runtime::Device<Buffer = C::Buffer>>(
        &mut self,
        e: &mut zero_runtime::Engine<C, D>,
        hyper: &[AdamConfig],
    ) -> zero_runtime::StepOutcome {
        if let Some(skipped) = e.step_external_begin().unwrap() {
            return skipped;
        }
        self.step += 1;
        let lrs = e.group_lrs();
        let mut masters = Vec::new();
        for (g, cfg) in hyper.iter().enumerate() {
            let n = e.external_group_len(g);
            let (mut w, mut grad) = (vec![0f32; n], vec![0f32; n]);
            e.external_read(g, ExternalArray::Master, &mut w).unwrap();
            e.external_read(g, ExternalArray::Grad, &mut grad).unwrap();
            if self.state.len() <= g {
                self.state.push((vec![0.0; n], vec![0.0; n]));
            }
            let (m, v) = &mut self.state[g];
            let cfg = AdamConfig {
                lr: lrs[g] as f32,
                ..*cfg
            };
            adam_step::<f32, f32>(&cfg, self.step, 1.0, &mut w, m, v, &grad, None).unwrap();
            masters.push(w);
        }
        let refs: Vec<&[f32]> = masters.iter().map(|m| &m[..]).collect();
        e.step_external_finish(&refs).unwrap()
    }
}

/// `config` with an optimizer the engine does not implement (an external one).
fn external_config(config: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(config).unwrap();
    v["optimizer"] = serde_json::json!({"type": "ClientAdam", "params": {}});
    v.to_string()
}

#[test]
fn an_external_optimizer_gets_the_shard_and_gives_the_fused_steps_bits() {
    let s = seed("external optimizer");
    let steps = 5;
    for world in [1usize, 3] {
        for (stage, precision, accum) in [
            (0u8, "fp32", 1usize),
            (1, "bf16", 2),
            (2, "fp16", 1),
            (3, "bf16", 1),
            (3, "fp32", 2),
        ] {
            let cfg = mlp_config(stage, precision, accum, 0.5, false);
            let data = dataset(s, steps * world * MICRO_BATCH * accum);
            let built_in = {
                let comms = HostGroup::with_timeout(world, Duration::from_secs(30)).unwrap();
                run_ranks_model(
                    comms,
                    || HostDevice,
                    &cfg,
                    s,
                    grouped_modules,
                    |e| {
                        e.set_group(1, bias_group()).unwrap();
                        for st in 0..steps {
                            train_step(e, &data, st, None).unwrap();
                        }
                        full_params(e).unwrap()
                    },
                )
            };
            let base = AdamConfig {
                weight_decay: 0.01,
                decay: WeightDecay::Decoupled,
                ..AdamConfig::adam(0.01)
            };
            let external = {
                let comms = HostGroup::with_timeout(world, Duration::from_secs(30)).unwrap();
                run_ranks_model(
                    comms,
                    || HostDevice,
                    &external_config(&cfg),
                    s,
                    grouped_modules,
                    |e| {
                        assert!(e.step().unwrap_err().to_string().contains("ClientAdam"));
                        e.zero_grad().unwrap();
                        // The front end says each group's hyper-parameters (the LR the
                        // external optimizer uses comes from the engine's schedule).
                        e.set_group(0, base).unwrap();
                        e.set_group(1, bias_group()).unwrap();
                        let mut opt = ExternalAdam {
                            state: Vec::new(),
                            step: 0,
                        };
                        for st in 0..steps {
                            let micro = e.config().gradient_accumulation_steps as usize;
                            for k in 0..micro {
                                let r = micro_batch(st, k, e.rank(), world, MICRO_BATCH, micro);
                                pass(e, &data[r], None);
                            }
                            let out = opt.run(e, &[base, bias_group()]);
                            assert!(!out.skipped);
                        }
                        full_params(e).unwrap()
                    },
                )
            };
            assert!(
                bits(&built_in[0]) == bits(&external[0]),
                "world {world} stage {stage} {precision} accum {accum}: the external step differs from the fused one (max {:e})",
                max_diff(&built_in[0], &external[0])
            );
        }
    }
}

#[test]
fn external_pieces_place_every_parameter_in_the_shard() {
    // Stage 0: each parameter whole in its group's shard, holding its fp32 values (a
    // front end shapes views of the shard like the parameters). Stages 1–3: the ranks'
    // pieces of each parameter cover its elements once.
    let s = seed("external pieces");
    for (world, stage) in [(3usize, 0u8), (3, 1), (3, 2), (3, 3), (1, 0)] {
        let cfg = external_config(&mlp_config(stage, "fp32", 1, 0.0, false));
        let comms = HostGroup::with_timeout(world, Duration::from_secs(30)).unwrap();
        let per_rank = run_ranks_model(
            comms,
            || HostDevice,
            &cfg,
            s,
            grouped_modules,
            |e| {
                let params = full_params(e).unwrap();
                (0..e.group_count())
                    .map(|g| {
                        let len = e.external_group_len(g);
                        let mut master = vec![f32::NAN; len];
                        e.external_read(g, ExternalArray::Master, &mut master)
                            .unwrap();
                        let pieces = e.external_group_pieces(g).unwrap();
                        for w in pieces.windows(2) {
                            assert!(w[0].shard.end <= w[1].shard.start, "{pieces:?}");
                        }
                        for p in &pieces {
                            assert!(
                                p.shard.end <= len && p.shard.len() == p.elements.len(),
                                "{p:?}"
                            );
                            let want = &params[p.module][p.param][p.elements.clone()];
                            let got = &master[p.shard.clone()];
                            assert!(
                                got.iter()
                                    .zip(want)
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{p:?}: the shard does not hold the parameter's values"
                            );
                        }
                        pieces
                    })
                    .collect::<Vec<_>>()
            },
        );
        let modules = grouped_modules();
        for (m, module) in modules.iter().enumerate() {
            for (k, spec) in module.params.iter().enumerate() {
                let mut covered = vec![0u32; spec.numel()];
                for rank in &per_rank {
                    for (g, pieces) in rank.iter().enumerate() {
                        for p in pieces.iter().filter(|p| (p.module, p.param) == (m, k)) {
                            assert_eq!(g, spec.group, "{p:?}");
                            if stage == 0 {
                                assert_eq!(
                                    p.elements,
                                    0..spec.numel(),
                                    "stage 0 keeps {p:?} whole"
                                );
                            }
                            covered[p.elements.clone()].iter_mut().for_each(|c| *c += 1);
                        }
                    }
                }
                let want = if stage == 0 { world as u32 } else { 1 };
                assert!(
                    covered.iter().all(|&c| c == want),
                    "world {world} stage {stage}: {}.{} is not covered {want} time(s)",
                    module.name,
                    spec.name
                );
            }
        }
    }
}

#[test]
fn an_external_step_that_overflows_or_is_aborted_changes_nothing() {
    let s = seed("external skip");
    let cfg = external_config(&mlp_config(2, "fp16", 1, 0.0, false));
    let data = dataset(s, 8 * 2 * MICRO_BATCH);
    let out = run_ranks(2, &cfg, s, |e| {
        let before = full_params(e).unwrap();
        // An overflow: skipped, nothing to step.
        let r = e.rank();
        let mut params = Vec::new();
        for m in 0..3 {
            e.fetch(m).unwrap();
            params.push(e.params_f32(m).unwrap());
            e.release(m).unwrap();
        }
        let (_, mut g) =
            loss_and_grads(&params, &data[micro_batch(0, 0, r, 2, MICRO_BATCH, 1)], 1.0);
        g[0][0][0] = f32::INFINITY;
        for m in (0..3).rev() {
            e.fetch(m).unwrap();
            let gs: Vec<&[f32]> = g[m].iter().map(|v| &v[..]).collect();
            e.add_grads_f32(m, &gs).unwrap();
            e.grads_ready(m).unwrap();
            e.release(m).unwrap();
        }
        let skipped = e.step_external_begin().unwrap().expect("an overflow skips");
        let after_skip = full_params(e).unwrap();
        // Begun, then given up.
        pass(e, &data[micro_batch(1, 0, r, 2, MICRO_BATCH, 1)], None);
        assert!(e.step_external_begin().unwrap().is_none());
        let counts = e.step_counts();
        let mut bad = vec![0f32; 3];
        let wrong_len = e
            .external_read(0, ExternalArray::Master, &mut bad)
            .unwrap_err();
        e.step_external_abort().unwrap();
        let after_abort = full_params(e).unwrap();
        (
            before,
            skipped.skipped,
            after_skip,
            after_abort,
            counts,
            e.step_counts(),
            wrong_len,
        )
    });
    for (before, skipped, after_skip, after_abort, during, after, wrong_len) in out {
        assert!(skipped);
        assert!(bits(&before) == bits(&after_skip) && bits(&before) == bits(&after_abort));
        assert_eq!((during.0, during.2), (1, 2));
        assert_eq!(after, (0, 1, 1), "the aborted step is not counted");
        assert!(
            matches!(wrong_len, EngineError::InvalidModel(_)),
            "{wrong_len}"
        );
    }
}

#[test]
fn imported_state_continues_the_run_bit_for_bit() {
    let s = seed("import state");
    let data = dataset(s, 8 * 2 * MICRO_BATCH);
    let mut v: serde_json::Value =
        serde_json::from_str(&mlp_config(1, "fp16", 1, 0.5, false)).unwrap();
    v["scheduler"] = serde_json::json!({"type": "WarmupLR", "params": {"warmup_num_steps": 10}});
    let source_cfg = v.to_string();
    // The source run: 3 steps, its state read whole, then 3 more steps.
    let source = run_ranks(2, &source_cfg, s, |e| {
        for st in 0..3 {
            train_step(e, &data, st, None).unwrap();
        }
        let state = e.optimizer_state().unwrap();
        let counts = e.step_counts();
        let scaler = e.loss_scaler().state();
        for st in 3..6 {
            train_step(e, &data, st, None).unwrap();
        }
        (state, counts, scaler, full_params(e).unwrap())
    });
    let pieces: Vec<_> = source.iter().map(|r| r.0.clone()).collect();
    let whole = consolidate(&pieces);
    let (counts, scaler) = (source[0].1, source[0].2);
    let f = |b: &Vec<u32>| b.iter().map(|x| f32::from_bits(*x)).collect::<Vec<f32>>();
    let state = ImportedState {
        params: whole
            .iter()
            .map(|(name, [m, a, b])| {
                (
                    name.clone(),
                    ImportedParam {
                        master: f(m),
                        moments: Some((f(a), f(b))),
                    },
                )
            })
            .collect::<HashMap<_, _>>(),
        optimizer_steps: counts.0,
        skipped_steps: counts.1,
        global_steps: counts.2,
        loss_scaler: Some(scaler),
        lr_last_batch_iteration: Some(counts.0 as i64 - 1),
        strict: true,
    };
    // Another stage at the same world size (stages agree in the bits) starts from
    // different values, imports, and continues.
    for stage in [0u8, 3] {
        let mut v: serde_json::Value = serde_json::from_str(&source_cfg).unwrap();
        v["zero_optimization"]["stage"] = stage.into();
        let cont = run_ranks(2, &v.to_string(), s ^ 1, |e| {
            e.import_state(&state).unwrap();
            assert_eq!(e.step_counts(), counts);
            for st in 3..6 {
                train_step(e, &data, st, None).unwrap();
            }
            full_params(e).unwrap()
        });
        assert!(bits(&cont[0]) == bits(&source[0].3), "stage {stage}");
    }
}

#[test]
fn an_import_that_does_not_fit_fails_every_rank_and_changes_nothing() {
    let s = seed("bad import");
    let data = dataset(s, 4 * 2 * MICRO_BATCH);
    let cfg = mlp_config(2, "fp32", 1, 0.0, false);
    let n0 = DIMS[0] * DIMS[1];
    for (what, state) in [
        ("elements", {
            let mut st = ImportedState::default();
            st.params.insert(
                "layer0.weight".into(),
                ImportedParam {
                    master: vec![0.5; n0 + 1],
                    moments: None,
                },
            );
            st
        }),
        ("not a parameter", {
            let mut st = ImportedState {
                strict: true,
                ..Default::default()
            };
            st.params
                .insert("layer9.weight".into(), ImportedParam::default());
            st
        }),
        (
            "has no value",
            ImportedState {
                strict: true,
                ..Default::default()
            },
        ),
    ] {
        let r = run_ranks(2, &cfg, s, |e| {
            let err = e.import_state(&state).unwrap_err().to_string();
            train_step(e, &data, 0, None).unwrap();
            (err, full_params(e).unwrap())
        });
        let clean = run_ranks(2, &cfg, s, |e| {
            train_step(e, &data, 0, None).unwrap();
            full_params(e).unwrap()
        });
        for (err, p) in &r {
            assert!(err.contains(what), "{what}: {err}");
            assert!(
                bits(p) == bits(&clean[0]),
                "{what}: the failed import changed the run"
            );
        }
    }
}

#[test]
fn without_an_optimizer_the_engine_runs_forward_only() {
    let s = seed("no optimizer");
    let cfg = r#"{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 4, "reduce_bucket_size": 64}}"#;
    let comms = HostGroup::with_timeout(2, Duration::from_secs(30)).unwrap();
    let out = run_ranks_model(
        comms,
        || HostDevice,
        cfg,
        s,
        mlp_modules,
        |e| {
            let p = full_params(e).unwrap();
            e.fetch(2).unwrap();
            let err = e.grads_ready(2).unwrap_err();
            e.release(2).unwrap();
            (p, err, e.step().unwrap_err())
        },
    );
    for (p, a, b) in out {
        let mut want = vec![0f32; DIMS[0] * DIMS[1]];
        init_values(s, 0, &mut want);
        assert_eq!(p[0][0], want);
        for e in [a, b] {
            assert!(matches!(e, EngineError::NoOptimizer(_)), "{e}");
            assert!(e.to_string().contains("optimizer"), "{e}");
        }
    }
    // A registration with no group 0 parameter still has group 0 (groups count from 0).
    let _ = ParamSpec::new("x", &[2]).in_group(0);
}
