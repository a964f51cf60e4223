//! The training example's loop at small size: its gradients are right, the loss falls in
//! every stage, and stages 0-3 give the same loss.

#[path = "../examples/train/lm.rs"]
mod lm;

use zero_comm::HostGroup;
use zero_runtime::{Engine, HostDevice, ZeroConfig};

const SHAPE: lm::Shape = lm::Shape {
    vocab: 6,
    context: 3,
    embed: 4,
    hidden: 8,
};

#[test]
fn gradients_match_finite_differences() {
    let source = lm::Source::new(3, SHAPE.vocab);
    let text = source.sample(4, 64);
    let modules = SHAPE.modules();
    let mut id = 0;
    let mut params: Vec<Vec<Vec<f32>>> = modules
        .iter()
        .map(|m| {
            m.params
                .iter()
                .map(|p| {
                    let mut v = vec![0f32; p.numel()];
                    SHAPE.init(5, id, p, &mut v);
                    id += 1;
                    // Non-zero biases, so their gradients are exercised too.
                    v.iter_mut()
                        .enumerate()
                        .for_each(|(i, x)| *x += 0.01 * (i % 7) as f32);
                    v
                })
                .collect()
        })
        .collect();
    let batch = lm::Batch {
        text: &text,
        start: 0,
        len: 16,
    };
    let (_, grads) = lm::forward_backward(&SHAPE, &params, &batch, 1.0);
    let grads = grads.unwrap();
    let h = 1e-2f32;
    let mut worst = 0f32;
    for m in 0..params.len() {
        for t in 0..params[m].len() {
            for i in (0..params[m][t].len()).step_by(3) {
                let keep = params[m][t][i];
                params[m][t][i] = keep + h;
                let (up, _) = lm::forward_backward(&SHAPE, &params, &batch, 0.0);
                params[m][t][i] = keep - h;
                let (down, _) = lm::forward_backward(&SHAPE, &params, &batch, 0.0);
                params[m][t][i] = keep;
                let numeric = (up - down) / (2.0 * h);
                let err = (numeric - grads[m][t][i]).abs()
                    / (1e-3 + numeric.abs().max(grads[m][t][i].abs()));
                worst = worst.max(err);
                assert!(
                    err < 5e-2,
                    "module {m} param {t} [{i}]: analytic {} vs numeric {numeric}",
                    grads[m][t][i]
                );
            }
        }
    }
    println!("worst relative gradient error {worst:.2e}");
}

/// Trains `steps` steps at stage `stage` on 3 ranks; returns (loss before, loss after) on
/// held-out text, from rank 0 (every rank agrees).
fn run(stage: u8, steps: usize) -> (f32, f32) {
    let world = 3;
    let cfg = format!(
        r#"{{"train_micro_batch_size_per_gpu": 16, "gradient_clipping": 1.0,
            "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2, "weight_decay": 0.0}}}},
            "bf16": {{"enabled": true}},
            "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": 64, "stage3_param_persistence_threshold": 8, "stage3_max_reuse_distance": 0}}}}"#
    );
    let cfg = ZeroConfig::from_json_str(&cfg, world).unwrap();
    let source = lm::Source::new(7, SHAPE.vocab);
    let text = source.sample(8, steps * world * 16 + 16);
    let held_out = source.sample(9, 2048);
    let results: Vec<(f32, f32)> = std::thread::scope(|s| {
        let hs: Vec<_> = HostGroup::new(world)
            .unwrap()
            .into_iter()
            .map(|comm| {
                let (cfg, text, held_out) = (cfg.clone(), &text, &held_out);
                s.spawn(move || {
                    let mut e =
                        Engine::new(cfg, SHAPE.modules(), comm, HostDevice, |id, spec, v| {
                            SHAPE.init(1, id, spec, v)
                        })
                        .unwrap();
                    let before = lm::evaluate(&mut e, &SHAPE, held_out, held_out.len()).unwrap();
                    for step in 0..steps {
                        lm::train_step(&mut e, &SHAPE, text, step).unwrap();
                    }
                    (
                        before,
                        lm::evaluate(&mut e, &SHAPE, held_out, held_out.len()).unwrap(),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        results
            .iter()
            .all(|r| r.1.to_bits() == results[0].1.to_bits()),
        "ranks disagree: {results:?}"
    );
    results[0]
}

#[test]
fn loss_falls_in_every_stage_and_stages_agree() {
    let runs: Vec<(f32, f32)> = (0..=3).map(|stage| run(stage, 30)).collect();
    for (stage, (before, after)) in runs.iter().enumerate() {
        assert!(
            after < &(before - 0.1),
            "stage {stage}: loss {before} -> {after} did not fall"
        );
        assert_eq!(
            after.to_bits(),
            runs[0].1.to_bits(),
            "stage {stage} ends at {after}, stage 0 at {}",
            runs[0].1
        );
    }
    println!("loss {} -> {} in every stage", runs[0].0, runs[0].1);
}
