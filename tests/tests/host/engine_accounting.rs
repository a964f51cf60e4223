//! Memory by category against the ZeRO paper's formulas (with the optimizer state moved to
//! the host or NVMe tier by offloading, too), and elements communicated per step against
//! 2Ψ(N−1)/N (stages 0–2) and 3Ψ(N−1)/N (stage 3), from the comm counters — with K
//! micro-steps of accumulation, (K+1)Ψ(N−1)/N in stage 2 and 3KΨ(N−1)/N in stage 3.

use zero_tests::{dataset, run_ranks, seed, train_step};

fn config(stage: u8, accum: usize, bucket: u64) -> String {
    format!(
        r#"{{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": {accum},
            "bf16": {{"enabled": true}},
            "optimizer": {{"type": "AdamW", "params": {{"lr": 0.001}}}},
            "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": {bucket},
                "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
                "stage3_prefetch_bucket_size": 1000}}}}"#
    )
}

#[test]
fn model_state_bytes_follow_the_paper_per_stage() {
    let seed = seed("memory");
    let world = 4;
    let data = dataset(seed, 3 * world * 3);
    let mut totals = Vec::new();
    for stage in 0..=3u8 {
        // (accumulation, data_types.grad_accum_dtype): DeepSpeed's default sums bf16
        // gradients in bf16, "fp32" in fp32.
        for (accum, sum_in) in [(1, "bf16"), (3, "bf16"), (3, "fp32")] {
            let cfg = config(stage, accum, 1_000_000).replace(
                r#""bf16": {"enabled": true},"#,
                &format!(
                    r#""bf16": {{"enabled": true}}, "data_types": {{"grad_accum_dtype": "{sum_in}"}},"#
                ),
            );
            let reports = run_ranks(world, &cfg, seed, |e| {
                train_step(e, &data, 0, None).unwrap();
                e.memory_report()
            });
            let r = reports[0];
            let (psi, padded, n) = (r.numel, r.padded_numel, world);
            // Alignment padding: one bucket, 6 tensors starting every 512 bytes (256 bf16
            // elements), total padded to a multiple of 4 × 256.
            let align = zero_kernels::align_elems(zero_kernels::DType::BF16);
            assert!(
                padded - psi < 6 * align + 4 * align,
                "stage {stage}: padding {}",
                padded - psi
            );
            let paper = match stage {
                0 => 16 * padded,
                1 => 4 * padded + 12 * padded / n,
                2 => 2 * padded + 14 * padded / n,
                _ => 16 * padded / n,
            };
            assert_eq!(r.formula, paper, "stage {stage}");
            assert_eq!(
                r.model_states(),
                paper,
                "stage {stage} accum {accum}: measured {r:?}"
            );
            // bf16 sums need no buffer (stages 0-1 sum in place, stages 2-3 in the shard);
            // fp32 sums take a whole-model buffer at stages 0-1, a partition at 2-3.
            let accum_bytes = match (accum, stage, sum_in) {
                (1, _, _) | (_, _, "bf16") => 0,
                (_, 0 | 1, _) => 4 * padded,
                _ => 4 * padded / n,
            };
            assert_eq!(
                r.grad_accum, accum_bytes,
                "stage {stage} accum {accum} in {sum_in}: accumulation buffer"
            );
            if stage >= 2 {
                // One bucket: one staging buffer of the whole bucket, plus (bf16 sums of
                // 3 micro-steps) one scratch partition that the later reductions go to.
                let scratch = if accum > 1 && sum_in == "bf16" {
                    2 * padded / n
                } else {
                    0
                };
                assert_eq!(
                    r.buckets,
                    2 * padded + scratch,
                    "stage {stage} accum {accum} in {sum_in}: staging buckets are reported"
                );
            }
            if stage == 3 {
                assert!(
                    r.peak_gathered > 0 && r.gathered == 0,
                    "stage 3 gathers, then frees at the step: {r:?}"
                );
            }
            for other in &reports[1..] {
                assert_eq!(
                    other.model_states(),
                    r.model_states(),
                    "every rank holds the same"
                );
            }
            if accum == 1 {
                totals.push(r.model_states());
            }
        }
    }
    assert!(
        totals.windows(2).all(|w| w[1] < w[0]),
        "each stage holds less than the one before: {totals:?}"
    );
}

/// fp32 parameters are their own master weights (as DeepSpeed's optimizer steps fp32
/// parameters in place): stage 0 keeps 16 bytes per parameter, not 20, and no stage keeps
/// a master copy beside the parameters; the stages still agree to the bit.
#[test]
fn fp32_parameters_are_their_own_master_weights() {
    let seed = seed("memory fp32");
    let world = 4;
    let data = dataset(seed, 3 * world * 3);
    let fp32 = |stage: u8| config(stage, 1, 1_000_000).replace(r#""bf16": {"enabled": true},"#, "");
    let mut finals = Vec::new();
    for stage in 0..=3u8 {
        let out = run_ranks(world, &fp32(stage), seed, |e| {
            for step in 0..3 {
                train_step(e, &data, step, None).unwrap();
            }
            (e.memory_report(), zero_tests::full_params(e).unwrap())
        });
        let (r, params) = &out[0];
        let (padded, n) = (r.padded_numel, world);
        let paper = match stage {
            0 => 16 * padded,
            1 => 8 * padded + 8 * padded / n,
            2 => 4 * padded + 12 * padded / n,
            _ => 16 * padded / n,
        };
        assert_eq!(r.master, 0, "stage {stage}: no master copy: {r:?}");
        assert_eq!(r.formula, paper, "stage {stage}");
        assert_eq!(r.model_states(), paper, "stage {stage}: {r:?}");
        finals.push(zero_tests::bits(params));
    }
    assert!(
        finals.windows(2).all(|w| w[0] == w[1]),
        "fp32 stages 0-3 give the same parameters"
    );
    // With accumulation, fp32 whole-bucket gradients (stages 0-1) are their own
    // accumulator, and stages 2-3 sum their reduced partitions in the shard: no buffer.
    for stage in 0..=3u8 {
        let cfg = config(stage, 3, 1_000_000).replace(r#""bf16": {"enabled": true},"#, "");
        let r = run_ranks(world, &cfg, seed, |e| {
            train_step(e, &data, 0, None).unwrap();
            (e.memory_report(), e.grads_accumulate_in_place())
        })[0];
        let (report, in_place) = r;
        assert_eq!(report.grad_accum, 0, "stage {stage}: {report:?}");
        assert_eq!(in_place, stage <= 1, "stage {stage}");
    }
}

/// A pass that adds every module's gradients before declaring any ready (a front-end's
/// first backward, which cannot tell when a module is complete) holds a staging buffer per
/// bucket; once a pass holds one or two at a time, the pool lets the others go, and the
/// memory report says so.
#[test]
fn idle_gradient_staging_is_freed_after_a_pass_that_needs_less() {
    use zero_tests::{loss_and_grads, micro_batch};
    let seed = seed("staging pool");
    let world = 2;
    let data = dataset(seed, 3 * world * 3);
    // One bucket per module: three buckets.
    let cfg = config(2, 1, 64);
    let reports = run_ranks(world, &cfg, seed, |e| {
        let mut seen = Vec::new();
        for step in 0..3 {
            let batch = &data[micro_batch(step, 0, e.rank(), world, 1, 1)];
            let params: Vec<_> = (0..3).map(|m| e.params_f32(m).unwrap()).collect();
            let (_, grads) = loss_and_grads(&params, batch, e.loss_scale_factor() as f32);
            let all_then_ready = step == 0;
            for m in (0..3).rev() {
                let g: Vec<&[f32]> = grads[m].iter().map(|v| &v[..]).collect();
                e.add_grads_f32(m, &g).unwrap();
                if !all_then_ready {
                    e.grads_ready(m).unwrap();
                }
            }
            if all_then_ready {
                for m in (0..3).rev() {
                    e.grads_ready(m).unwrap();
                }
            }
            e.step().unwrap();
            seen.push(e.memory_report().buckets);
        }
        seen
    });
    let seen = &reports[0];
    assert!(
        seen[0] > seen[1] && seen[1] == seen[2] && seen[1] > 0,
        "staging bytes after each step: {seen:?}"
    );
}

#[test]
fn elements_sent_per_step_are_exactly_the_papers() {
    let seed = seed("communication");
    for world in 2..=5usize {
        for (stage, k) in (0..=3u8).flat_map(|s| [(s, 1u64), (s, 3)]) {
            // One module per bucket (bucket size 1), no persistence, no reuse: every bucket
            // is gathered exactly twice per micro-step in stage 3.
            let data = dataset(seed, 4 * world * k as usize);
            let reports = run_ranks(world, &config(stage, k as usize, 1), seed, |e| {
                for s in 0..3 {
                    train_step(e, &data, s, None).unwrap();
                }
                e.comm_report()
            });
            for (rank, c) in reports.iter().enumerate() {
                let ctx = format!("world {world} stage {stage} accumulation {k} rank {rank}");
                let psi = c.padded_numel as u64;
                let n = world as u64;
                // Stage 2 reduce-scatters every micro-step and gathers once; stage 3
                // gathers twice and reduce-scatters once every micro-step.
                let (factor, reductions) = match stage {
                    0 => (2, 2),
                    1 => (2, 1),
                    2 => (k + 1, k),
                    _ => (3 * k, k),
                };
                assert_eq!(c.theory, factor * psi * (n - 1) / n, "{ctx}");
                assert_eq!(
                    c.last_step.grad_reduce + c.last_step.param_gather,
                    c.theory,
                    "{ctx}: {c:?}"
                );
                let reduce = reductions * psi * (n - 1) / n;
                assert_eq!(
                    c.last_step.grad_reduce,
                    reduce,
                    "{ctx}: {}",
                    if stage == 0 {
                        "all-reduce"
                    } else {
                        "reduce-scatter, not all-reduce"
                    }
                );
                // Norm partials and overflow flags: 2 floats all-gathered per rank.
                assert_eq!(c.last_step.control, 2 * (n - 1), "{ctx}");
            }
        }
    }
}

/// Offloading moves the fp32 state off the device byte for byte: the device keeps the
/// 16-bit parameters and gradients, the host (cpu) or NVMe holds master, exp_avg and
/// exp_avg_sq of the owned partition, and the tiers together hold the paper's bytes. The
/// host's staging stays a few MiB whatever the model.
#[test]
fn offloaded_state_is_reported_in_its_tier() {
    let seed = seed("memory offload");
    let world = 4;
    let data = dataset(seed, 3 * world);
    let nvme = tempfile::Builder::new()
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    for stage in 1..=3u8 {
        for device in ["cpu", "nvme"] {
            let offload = serde_json::json!({"device": device, "nvme_path": nvme.path()});
            let cfg = zero_tests::with_offload(
                &config(stage, 1, 1_000_000),
                "offload_optimizer",
                &offload,
                None,
            );
            let reports = run_ranks(world, &cfg, seed, |e| {
                train_step(e, &data, 0, None).unwrap();
                e.memory_report()
            });
            let r = reports[0];
            let ctx = format!("stage {stage} {device}");
            let owned = 4 * r.padded_numel / world;
            assert_eq!(
                (r.master, r.exp_avg, r.exp_avg_sq),
                (0, 0, 0),
                "{ctx}: {r:?}"
            );
            let (tier, other) = if device == "cpu" {
                (r.host, r.nvme)
            } else {
                (r.nvme, r.host)
            };
            assert_eq!(
                (tier.master, tier.exp_avg, tier.exp_avg_sq),
                (owned, owned, owned),
                "{ctx}: {r:?}"
            );
            assert_eq!(other.master + other.exp_avg + other.exp_avg_sq, 0, "{ctx}");
            assert_eq!(r.model_states_all_tiers(), r.formula, "{ctx}: {r:?}");
            assert!(
                r.host.buffers > 0 && r.host.buffers < 64 << 20,
                "{ctx}: host staging {}",
                r.host.buffers
            );
        }
    }
}

/// `offload_param` moves stage 3's owned 16-bit partitions off the device: the device
/// keeps no parameter bytes at rest (no bucket is persistent here), the tier holds 2Ψ'/N,
/// and the tiers together still hold the paper's bytes.
#[test]
fn offloaded_parameters_are_reported_in_their_tier() {
    let seed = seed("memory param offload");
    let world = 4;
    let data = dataset(seed, 3 * world);
    let nvme = tempfile::Builder::new()
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    for device in ["cpu", "nvme"] {
        let tier = serde_json::json!({"device": device, "nvme_path": nvme.path()});
        let cfg = zero_tests::with_offload(
            &zero_tests::with_offload(&config(3, 1, 1_000_000), "offload_param", &tier, None),
            "offload_optimizer",
            &tier,
            None,
        );
        let reports = run_ranks(world, &cfg, seed, |e| {
            train_step(e, &data, 0, None).unwrap();
            e.memory_report()
        });
        let r = reports[0];
        let owned16 = 2 * r.padded_numel / world;
        let (t, other) = if device == "cpu" {
            (r.host, r.nvme)
        } else {
            (r.nvme, r.host)
        };
        assert_eq!(r.params, 0, "{device}: {r:?}");
        assert_eq!(t.params, owned16, "{device}: {r:?}");
        assert_eq!(other.params, 0, "{device}: {r:?}");
        assert_eq!(r.model_states_all_tiers(), r.formula, "{device}: {r:?}");
    }
}

/// Modules `m0..m{n}` of 1,000 elements each (one parameter `w`) under the config `json`
/// on two in-process ranks, trained three steps by hand: each module fetched and released
/// in the forward, then in reverse fetched, given a gradient and released. `after` reads
/// each rank's engine at the end.
fn three_steps_by_hand<R: Send>(
    json: &str,
    n: usize,
    after: impl Fn(&zero_runtime::Engine<zero_comm::HostComm, zero_runtime::HostDevice>) -> R + Sync,
) -> Vec<R> {
    use zero_comm::HostGroup;
    use zero_runtime::{Engine, HostDevice, ModuleSpec, ParamSpec, ZeroConfig};
    let world = 2;
    let cfg = ZeroConfig::from_json_str(json, world).unwrap();
    let modules: Vec<ModuleSpec> = (0..n)
        .map(|m| ModuleSpec::new(format!("m{m}"), vec![ParamSpec::new("w", &[1000])]))
        .collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = HostGroup::new(world)
            .unwrap()
            .into_iter()
            .map(|comm| {
                let (cfg, modules, after) = (cfg.clone(), modules.clone(), &after);
                s.spawn(move || {
                    let mut e = Engine::new(cfg, modules, comm, HostDevice, |id, _, v| {
                        v.iter_mut()
                            .enumerate()
                            .for_each(|(i, x)| *x = ((i + id) % 7) as f32 * 0.1)
                    })
                    .unwrap();
                    let grad = vec![0.01f32; 1000];
                    for _ in 0..3 {
                        for m in 0..n {
                            e.fetch(m).unwrap();
                            e.release(m).unwrap();
                        }
                        for m in (0..n).rev() {
                            e.fetch(m).unwrap();
                            e.add_grads_f32(m, &[&grad]).unwrap();
                            e.grads_ready(m).unwrap();
                            e.release(m).unwrap();
                        }
                        e.step().unwrap();
                    }
                    after(&e)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn stage3_prefetch_keeps_to_its_window() {
    // Eight modules of 1,000 elements, a bucket each, and a prefetch window of 1,500
    // elements: once the trace is recorded, a fetch gathers at most the window ahead,
    // counting buckets already gathered or in flight, so a pass holds the bucket in use
    // and at most two ahead, never the whole model.
    let json = r#"{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000, "stage3_prefetch_bucket_size": 1500,
            "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0}}"#;
    let peaks = three_steps_by_hand(json, 8, |e| {
        let r = e.memory_report();
        (r.peak_gathered, r.padded_numel)
    });
    let (peak, padded) = peaks[0];
    let bucket = 2 * padded / 8; // bf16 bytes of one bucket
    println!(
        "peak gathered {peak} B; one bucket {bucket} B; the model {} B",
        2 * padded
    );
    assert!(
        peak <= 3 * bucket,
        "peak {peak} B: more than the bucket in use and the window"
    );
    assert!(peak >= 2 * bucket, "peak {peak} B: nothing was prefetched");
}

/// A bucket spanning several modules stays gathered from one of its modules to the next:
/// `stage3_max_reuse_distance` counts the other buckets' elements before the next use, not
/// the bucket's own (freeing it would only gather it again at once). Four modules in one
/// bucket, a reuse distance of 1 element: once the trace is recorded, a step gathers the
/// bucket once (kept through the forward, the turn and the backward), where gathering it
/// again for each module would send 8 times that. At 0 (DeepSpeed's "no reuse") every
/// module gathers it.
#[test]
fn stage3_keeps_a_bucket_between_its_own_modules() {
    for (reuse, gathers) in [(1u64, 1u64), (0, 8)] {
        let json = format!(
            r#"{{"train_micro_batch_size_per_gpu": 1, "bf16": {{"enabled": true}},
            "optimizer": {{"type": "AdamW"}},
            "zero_optimization": {{"stage": 3, "reduce_bucket_size": 4096, "stage3_prefetch_bucket_size": 0,
                "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": {reuse}}}}}"#
        );
        let sent = three_steps_by_hand(&json, 4, |e| {
            let c = e.comm_report();
            (c.last_step.param_gather, c.padded_numel)
        });
        let (gathered, padded) = sent[0];
        let once = padded as u64 / 2; // a bucket's all-gather on 2 ranks: (N - 1) / N of it
        assert_eq!(
            gathered,
            gathers * once,
            "reuse distance {reuse}: {gathered} elements gathered in the last step, one gather is {once}"
        );
    }
}
