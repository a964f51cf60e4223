//! An inf planted in one rank's gradient makes every rank skip the step, leaves
//! parameters and optimizer state bit-identical, and moves the loss scale as DeepSpeed's
//! `DynamicLossScaler` does.

use zero_runtime::scaler::ScaleChange;
use zero_runtime::EngineError;
use zero_tests::{dataset, full_params, run_ranks, seed, train_step, GradHook};

fn config(stage: u8, hysteresis: u32, min_scale: f64) -> String {
    format!(
        r#"{{"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
            "fp16": {{"enabled": true, "loss_scale": 0, "initial_scale_power": 8, "hysteresis": {hysteresis}, "min_loss_scale": {min_scale}}},
            "optimizer": {{"type": "Adam", "params": {{"lr": 0.01}}}},
            "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": 64, "stage3_max_reuse_distance": 0}}}}"#
    )
}

fn bits(p: &[Vec<Vec<f32>>]) -> Vec<u32> {
    p.iter().flatten().flatten().map(|x| x.to_bits()).collect()
}

const WORLD: usize = 3;

#[test]
fn an_inf_on_one_rank_skips_the_step_everywhere_and_changes_nothing() {
    let seed = seed("overflow");
    let data = dataset(seed, 10 * WORLD * 2);
    let plant: GradHook = &|step, _, rank, g| {
        if (step == 4 || step == 5) && rank == 1 {
            g[1][0][3] = f32::INFINITY;
        }
    };
    for stage in 0..=3 {
        let runs = run_ranks(WORLD, &config(stage, 2, 1.0), seed, |e| {
            let mut outcomes = Vec::new();
            let mut snapshots = Vec::new();
            for s in 0..8 {
                snapshots.push(full_params(e).unwrap());
                outcomes.push(train_step(e, &data, s, Some(plant)).unwrap().1);
            }
            (outcomes, snapshots, full_params(e).unwrap())
        });
        for (rank, (outcomes, snaps, _)) in runs.iter().enumerate() {
            let ctx = format!("stage {stage} rank {rank}");
            for (s, o) in outcomes.iter().enumerate() {
                assert_eq!(o.skipped, s == 4 || s == 5, "{ctx} step {s}");
            }
            // Hysteresis 2: the first overflow only lowers hysteresis, the second halves.
            assert_eq!(
                outcomes[4].scale_change,
                ScaleChange::HysteresisLowered(1),
                "{ctx}"
            );
            assert_eq!(
                outcomes[5].scale_change,
                ScaleChange::Lowered(256.0, 128.0),
                "{ctx}"
            );
            assert_eq!(outcomes[6].loss_scale, 128.0, "{ctx}");
            assert!(
                bits(&snaps[4]) == bits(&snaps[5]),
                "{ctx}: the skipped step changed parameters"
            );
            assert!(
                bits(&snaps[5]) == bits(&snaps[6]),
                "{ctx}: the skipped step changed parameters"
            );
        }
        // A run that never saw steps 4 and 5 ends in the same bits, so the skipped steps
        // left the optimizer state (moments, step count, LR schedule) untouched. (It runs
        // steps 6-7 at loss scale 256 instead of 128: power-of-two scales move fp16
        // gradients exactly, away from under- and overflow.)
        let clean = run_ranks(WORLD, &config(stage, 2, 1.0), seed, |e| {
            for s in [0, 1, 2, 3, 6, 7] {
                assert!(!train_step(e, &data, s, None).unwrap().1.skipped);
            }
            full_params(e).unwrap()
        });
        assert!(
            bits(&runs[0].2) == bits(&clean[0]),
            "stage {stage}: skipped steps left a trace in the optimizer state"
        );
    }
}

#[test]
fn overflow_at_the_minimum_scale_is_an_error_on_every_rank() {
    let seed = seed("overflow at minimum");
    let data = dataset(seed, 4 * WORLD * 2);
    let plant: GradHook = &|step, _, rank, g| {
        if step == 1 && rank == 2 {
            g[0][1][0] = f32::NAN;
        }
    };
    for stage in [0, 3] {
        let res = run_ranks(WORLD, &config(stage, 1, 256.0), seed, |e| {
            train_step(e, &data, 0, Some(plant)).unwrap();
            let before = full_params(e).unwrap();
            let err = train_step(e, &data, 1, Some(plant)).unwrap_err();
            (err, bits(&before), bits(&full_params(e).unwrap()))
        });
        for (err, before, after) in res {
            assert!(matches!(err, EngineError::LossScale(_)), "{err}");
            assert!(err.to_string().contains("already at the minimum"), "{err}");
            assert!(
                before == after,
                "stage {stage}: a failed step changed parameters"
            );
        }
    }
}
