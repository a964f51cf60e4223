//! Offloading changes where the bytes live, not a single bit: for
//! `offload_optimizer.device` cpu and nvme (stages 1–3) and `offload_param.device` cpu and
//! nvme (stage 3, with and without the optimizer offloaded), fp32/fp16/bf16, accumulation
//! 1 and 3, clipping on and off, and an inf planted in one rank's gradient (a skipped
//! step), the parameters after every step, the step outcomes and the final optimizer state
//! are bit-identical to the same run with everything on the device.
//!
//! The NVMe runs put their swap files in a temporary folder under `target/` (CI's disk:
//! `/tmp` may be tmpfs, which refuses `O_DIRECT`), with sub-groups of 5 elements so every
//! bucket spans several blocks of the pipeline, one of them short.

use zero_runtime::StepOutcome;
use zero_tests::{
    consolidate, dataset, full_params, mlp_config, run_ranks, seed, train_step, with_offload,
    Consolidated, GradHook,
};

const WORLD: usize = 3;
const STEPS: usize = 6;

type Params = Vec<Vec<Vec<f32>>>;

/// Per step: parameters after it and its outcome; then the consolidated state.
type Run = (Vec<(Vec<u32>, StepOutcome)>, Consolidated);

fn bits(p: &Params) -> Vec<u32> {
    p.iter().flatten().flatten().map(|x| x.to_bits()).collect()
}

fn train(cfg: &str, seed: u64, accum: usize, hook: Option<GradHook>) -> Run {
    let data = dataset(seed, STEPS * WORLD * 2 * accum);
    let ranks = run_ranks(WORLD, cfg, seed, |e| {
        let mut steps = Vec::new();
        for s in 0..STEPS {
            let (_, out) = train_step(e, &data, s, hook).expect("step");
            steps.push((bits(&full_params(e).expect("params")), out));
        }
        (steps, e.optimizer_state().expect("state"))
    });
    let states: Vec<_> = ranks.iter().map(|(_, s)| s.clone()).collect();
    let steps = ranks.into_iter().next().map(|(s, _)| s).unwrap_or_default();
    (steps, consolidate(&states))
}

fn same_bits(a: &StepOutcome, b: &StepOutcome) -> bool {
    a.skipped == b.skipped
        && a.grad_norm.to_bits() == b.grad_norm.to_bits()
        && a.loss_scale == b.loss_scale
        && a.scale_change == b.scale_change
}

fn compare(ctx: &str, want: &Run, got: &Run) {
    for (s, ((wp, wo), (gp, go))) in want.0.iter().zip(&got.0).enumerate() {
        assert!(
            same_bits(wo, go),
            "{ctx} step {s}: outcome {go:?}, without offload {wo:?}"
        );
        if let Some(i) = wp.iter().zip(gp).position(|(a, b)| a != b) {
            panic!(
                "{ctx} step {s}: parameter element {i} is {:e}, without offload {:e}",
                f32::from_bits(gp[i]),
                f32::from_bits(wp[i])
            );
        }
    }
    assert_eq!(want.0.len(), got.0.len(), "{ctx}");
    for (name, w) in &want.1 {
        let g = got
            .1
            .get(name)
            .unwrap_or_else(|| panic!("{ctx}: {name} missing"));
        for (k, what) in ["master", "exp_avg", "exp_avg_sq"].iter().enumerate() {
            assert!(w[k] == g[k], "{ctx}: {name}'s {what} differs");
        }
    }
}

/// An inf in rank 1's gradient at step 2, micro-step 0: the step is skipped (fp16) or its
/// norm is inf (fp32/bf16 also skip: DeepSpeed checks overflow in every precision).
fn plant() -> GradHook<'static> {
    &|step, micro, rank, g| {
        if step == 2 && micro == 0 && rank == 1 {
            g[1][0][3] = f32::INFINITY;
        }
    }
}

/// What a sweep offloads.
#[derive(Clone, Copy, Debug)]
enum What {
    Optimizer(&'static str),
    Params(&'static str),
    Both(&'static str),
}

fn sweep(what: What) {
    let seed = seed(&format!("offload_equivalence_{what:?}"));
    let nvme = tempfile::Builder::new()
        .prefix("zero-offload-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary folder");
    let tier = |device: &str| match device {
        "nvme" => {
            serde_json::json!({"device": "nvme", "nvme_path": nvme.path(), "pin_memory": true})
        }
        _ => serde_json::json!({"device": "cpu", "pin_memory": true}),
    };
    let stages = match what {
        What::Optimizer(_) => 1..=3u8,
        _ => 3..=3,
    };
    for stage in stages {
        for precision in ["fp32", "fp16", "bf16"] {
            for accum in [1, 3] {
                for clip in [0.0, 0.5] {
                    let hook = (clip > 0.0 && accum == 1).then(plant);
                    let base = mlp_config(stage, precision, accum, clip, stage == 2);
                    let ctx = format!(
                        "{what:?} stage {stage} {precision} accum {accum} clip {clip}{}",
                        if hook.is_some() {
                            " with a skipped step"
                        } else {
                            ""
                        }
                    );
                    let want = train(&base, seed, accum, hook);
                    if hook.is_some() {
                        assert!(want.0[2].1.skipped, "{ctx}: the planted inf must skip");
                    }
                    let cfg = match what {
                        What::Optimizer(d) => {
                            with_offload(&base, "offload_optimizer", &tier(d), Some(5))
                        }
                        What::Params(d) => with_offload(&base, "offload_param", &tier(d), None),
                        What::Both(d) => with_offload(
                            &with_offload(&base, "offload_param", &tier(d), None),
                            "offload_optimizer",
                            &tier(d),
                            Some(5),
                        ),
                    };
                    let got = train(&cfg, seed, accum, hook);
                    compare(&ctx, &want, &got);
                }
            }
        }
    }
    // The swap files are unlinked as soon as they are open, and their folders go with the
    // engines.
    let left: Vec<_> = walk(nvme.path());
    assert!(
        left.iter()
            .all(|p| !p.ends_with("optimizer.swp") && !p.ends_with("params.swp")),
        "swap files left behind: {left:?}"
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn cpu_optimizer_offload_is_bit_identical_to_the_device_state() {
    sweep(What::Optimizer("cpu"));
}

#[test]
fn nvme_optimizer_offload_is_bit_identical_to_the_device_state() {
    sweep(What::Optimizer("nvme"));
}

#[test]
fn cpu_param_offload_is_bit_identical() {
    sweep(What::Params("cpu"));
    sweep(What::Both("cpu"));
}

#[test]
fn nvme_param_offload_is_bit_identical() {
    sweep(What::Params("nvme"));
    sweep(What::Both("nvme"));
}

/// The sub-group size does not change a bit either: one element, a prime, and more than
/// any bucket.
#[test]
fn sub_group_size_changes_nothing() {
    let seed = seed("offload_sub_group_size");
    let base = mlp_config(2, "bf16", 3, 0.5, true);
    let want = train(&base, seed, 3, None);
    let offload = serde_json::json!({"device": "cpu"});
    for sub in [1, 7, 1_000_000_000] {
        let got = train(
            &with_offload(&base, "offload_optimizer", &offload, Some(sub)),
            seed,
            3,
            None,
        );
        compare(&format!("sub_group_size {sub}"), &want, &got);
    }
}

/// NVMe `offload_param` reads the trace's next parameter blocks ahead (into
/// `buffer_count - 1` spare buffers) once the first pass recorded the order: later passes
/// open blocks from a read ahead, with the same bits; `buffer_count: 1` leaves no
/// spare buffer, so every block is read when opened, again with the same bits.
#[test]
fn nvme_param_blocks_are_read_ahead_of_their_gathers() {
    let seed = seed("offload_param_read_ahead");
    let nvme = tempfile::Builder::new()
        .prefix("zero-offload-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary folder");
    let base = mlp_config(3, "bf16", 1, 0.0, false);
    let want = train(&base, seed, 1, None);
    let data = dataset(seed, STEPS * WORLD * 2);
    for buffers in [5u64, 1] {
        let tier = serde_json::json!({"device": "nvme", "nvme_path": nvme.path(), "buffer_count": buffers});
        let cfg = with_offload(&base, "offload_param", &tier, None);
        let got = train(&cfg, seed, 1, None);
        compare(&format!("buffer_count {buffers}"), &want, &got);
        let reads = run_ranks(WORLD, &cfg, seed, |e| {
            for s in 0..STEPS {
                train_step(e, &data, s, None).expect("step");
            }
            e.param_block_reads().expect("an NVMe tier")
        });
        for (r, (ahead, waited)) in reads.iter().enumerate() {
            println!("buffer_count {buffers}, rank {r}: {ahead} blocks opened from a read ahead, {waited} read when opened");
            if buffers == 1 {
                assert_eq!(*ahead, 0, "rank {r}: no spare buffer, no read ahead");
            } else {
                assert!(
                    *ahead > 0,
                    "rank {r}: no block read ahead ({waited} waited for)"
                );
            }
        }
    }
}

/// Stages 2–3 keep the reduced gradient partitions in host memory beside the offloaded
/// optimizer, as DeepSpeed does: the device holds no gradient partition and no
/// accumulator, the host holds each partition in the dtype the step reads (the fp32
/// accumulator where a window of bf16 gradients is summed in fp32), and every bit is the
/// device state's run's.
#[test]
fn gradient_partitions_live_beside_the_offloaded_optimizer() {
    let seed = seed("offload_host_grads");
    for stage in [2u8, 3] {
        for (sum_in, accum) in [("bf16", 1), ("bf16", 3), ("fp32", 3)] {
            let ctx = format!("stage {stage} bf16 summed in {sum_in} over {accum}");
            let types = format!(r#"{{"data_types": {{"grad_accum_dtype": "{sum_in}"}},"#);
            let base = mlp_config(stage, "bf16", accum, 0.5, true).replacen('{', &types, 1);
            let tier = serde_json::json!({"device": "cpu"});
            let cfg = with_offload(&base, "offload_optimizer", &tier, Some(5));
            compare(
                &ctx,
                &train(&base, seed, accum, None),
                &train(&cfg, seed, accum, None),
            );
            let data = dataset(seed, WORLD * 2 * accum);
            // A trainer that declares every module ready at the end of its backward
            // (the first backward of a front end that cannot tell earlier) issues every
            // reduction at once: the most a step keeps in flight.
            let report = |cfg: &str| {
                run_ranks(WORLD, cfg, seed, |e| {
                    train_step(e, &data, 0, None).expect("step");
                    for m in (0..3).rev() {
                        e.fetch(m).expect("fetch");
                        let n: Vec<usize> =
                            e.modules()[m].params.iter().map(|p| p.numel()).collect();
                        let g: Vec<Vec<f32>> = n.iter().map(|&k| vec![1e-3; k]).collect();
                        let g: Vec<&[f32]> = g.iter().map(|v| &v[..]).collect();
                        e.add_grads_f32(m, &g).expect("gradients");
                        e.release(m).expect("release");
                    }
                    for m in (0..3).rev() {
                        e.grads_ready(m).expect("grads_ready");
                    }
                    // (A shard in flight is not in the report: count it back.)
                    e.wait_collectives().expect("reductions");
                    e.memory_report()
                })
            };
            let (reports, on_device) = (report(&cfg), report(&base));
            for (rank, r) in reports.iter().enumerate() {
                // The reductions' outputs on the device stay a few buckets' partitions
                // (overlap_comm is on): less than the partition they no longer hold.
                let d = on_device[rank];
                assert!(
                    r.buckets + r.grads + r.grad_accum < d.buckets + d.grads + d.grad_accum,
                    "{ctx}: rank {rank}: the device holds {} B of gradients and buckets with the optimizer offloaded, {} B without",
                    r.buckets + r.grads + r.grad_accum,
                    d.buckets + d.grads + d.grad_accum
                );
                let owned = r.padded_numel / WORLD;
                assert_eq!((r.grads, r.grad_accum), (0, 0), "{ctx}: rank {rank}: {r:?}");
                let want = if sum_in == "fp32" && accum > 1 {
                    (0, 4 * owned)
                } else {
                    (2 * owned, 0)
                };
                assert_eq!(
                    (r.host.grads, r.host.grad_accum),
                    want,
                    "{ctx}: rank {rank}: {r:?}"
                );
            }
        }
    }
}
