//! The proof: stages 0–3 on 1–5 ranks, in fp32, fp16 (dynamic loss scaling) and bf16,
//! with accumulation 1 and 3 and clipping on, train the MLP for 20 steps and
//! - with accumulation 1, give bit-identical parameters in every stage at a fixed world
//!   size (the reductions and the norm sum in a stage-independent order), identical on
//!   every rank;
//! - match a single-process Adam on the same global batch (tolerances below).

use zero_runtime::ZeroConfig;
use zero_tests::{
    bits, dataset, full_params, max_diff, mlp_config, run_ranks, seed, train_step, Params,
    Reference, MICRO_BATCH,
};

const STEPS: usize = 20;
const MICRO: usize = MICRO_BATCH;

fn config(stage: u8, precision: &str, accum: usize, overlap: bool) -> String {
    mlp_config(stage, precision, accum, 0.5, overlap)
}

fn train(world: usize, stage: u8, precision: &str, accum: usize, seed: u64) -> Params {
    let data = dataset(seed, STEPS * world * MICRO * accum);
    let cfg = config(stage, precision, accum, stage % 2 == 1);
    let results = run_ranks(world, &cfg, seed, |e| {
        if world == 5 {
            // The model has what the issue asks to cover: a parameter smaller than N (the
            // last bias, 3 elements) and parameters some rank owns none of.
            let plan = e.plan();
            let sizes: Vec<usize> = plan
                .buckets
                .iter()
                .flat_map(|b| b.layout.sizes().to_vec())
                .collect();
            assert!(sizes.iter().any(|&n| n < world), "{sizes:?}");
            let partial = plan.buckets.iter().any(|b| {
                (0..b.layout.num_tensors())
                    .any(|t| b.layout.tensor_shards(t).unwrap().len() < world)
            });
            assert!(partial, "some rank must own nothing of some parameter");
            assert!(sizes.iter().any(|&n| n % world != 0), "{sizes:?}");
        }
        for s in 0..STEPS {
            let (_, out) = train_step(e, &data, s, None).expect("step");
            assert!(!out.skipped, "no overflow expected at scale 2^8");
        }
        full_params(e).expect("params")
    });
    for (r, p) in results.iter().enumerate() {
        assert!(
            bits(p) == bits(&results[0]),
            "world {world} stage {stage} {precision}: rank {r} differs from rank 0"
        );
    }
    results.into_iter().next().unwrap_or_default()
}

fn reference(world: usize, precision: &str, accum: usize, seed: u64) -> Params {
    let cfg = ZeroConfig::from_json_str(&config(0, precision, accum, false), world).unwrap();
    let round: fn(f32) -> f32 = match precision {
        "bf16" => |x| half::bf16::from_f32(x).to_f32(),
        "fp16" => |x| half::f16::from_f32(x).to_f32(),
        _ => |x| x,
    };
    let data = dataset(seed, STEPS * world * MICRO * accum);
    let mut r = Reference::new(seed, round);
    let b = world * MICRO * accum;
    for s in 0..STEPS {
        r.step(&cfg, &data[s * b..(s + 1) * b]);
    }
    r.params_f32()
}

fn mean_diff(a: &Params, b: &Params) -> f32 {
    let d: Vec<f32> = a
        .iter()
        .flatten()
        .flatten()
        .zip(b.iter().flatten().flatten())
        .map(|(x, y)| (x - y).abs())
        .collect();
    d.iter().sum::<f32>() / d.len().max(1) as f32
}

#[test]
fn every_stage_world_precision_and_accumulation_matches() {
    let seed = seed("engine equivalence");
    for world in 1..=5 {
        for precision in ["fp32", "fp16", "bf16"] {
            for accum in [1, 3] {
                let runs: Vec<Params> = (0..=3)
                    .map(|stage| train(world, stage, precision, accum, seed))
                    .collect();
                if accum == 1 {
                    for (stage, run) in runs.iter().enumerate() {
                        assert!(bits(run) == bits(&runs[0]), "world {world} {precision}: stage {stage} differs from stage 0 in the bits");
                    }
                }
                let want = reference(world, precision, accum, seed);
                // Every weight moves by lr-sized Adam steps whose direction m/√v is
                // normalized, so where a gradient is near zero any perturbation can flip its
                // sign and the update then differs by up to lr per step. The max is bounded
                // by that worst case; the mean, which tracks the ordinary rounding, tightly.
                // fp32: only the summation order differs (per-rank, per-micro-step f32 means
                // vs one f64 reference). 16-bit: the forward pass sees weights rounded to 8
                // (bf16) or 11 (fp16) significant bits and gradients rounded likewise.
                // Measured over 10-30 seeds × N = 1-5 × accumulation 1, 3:
                //   fp32 max 1.9e-4, mean 3.4e-6; fp16 max 9.8e-3, mean 1.7e-4;
                //   bf16 max 2.25e-2, mean 8.0e-4. Since 16-bit windows sum in 16 bits
                //   (DeepSpeed's default grad_accum_dtype; the reference sums in f64),
                //   over 12 seeds with accumulation 3: fp16 max 1.95e-2, mean 3.0e-4;
                //   bf16 max 1.9e-2, mean 6.9e-4.
                let (max_tol, mean_tol) = match precision {
                    "fp32" => (1e-2, 2e-5),
                    "fp16" => (0.05, 1e-3),
                    _ => (0.05, 4e-3),
                };
                for (stage, run) in runs.iter().enumerate() {
                    let (d, m) = (max_diff(run, &want), mean_diff(run, &want));
                    let ctx = format!("world {world} {precision} accum {accum} stage {stage}");
                    assert!(d <= max_tol, "{ctx}: max |Δ| vs reference {d} > {max_tol}");
                    assert!(
                        m <= mean_tol,
                        "{ctx}: mean |Δ| vs reference {m} > {mean_tol}"
                    );
                }
                println!(
                    "world {world} {precision} accum {accum}: max |Δ| {:.2e}, mean |Δ| {:.2e} vs reference",
                    runs.iter().map(|r| max_diff(r, &want)).fold(0.0, f32::max),
                    runs.iter().map(|r| mean_diff(r, &want)).fold(0.0, f32::max)
                );
            }
        }
    }
}
