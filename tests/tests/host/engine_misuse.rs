//! Calls out of order and bad input give errors that name the problem.

use zero_comm::HostGroup;
use zero_runtime::{Engine, EngineError, HostDevice, ZeroConfig};
use zero_tests::{init_values, mlp_modules, run_ranks};

const CFG: &str = r#"{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
    "bf16": {"enabled": true}, "optimizer": {"type": "AdamW"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 64, "stage3_param_persistence_threshold": 0}}"#;

#[test]
fn out_of_order_calls_are_errors() {
    let res = run_ranks(2, CFG, 1, |e| {
        let mut errs = Vec::new();
        errs.push(e.step().unwrap_err());
        errs.push(e.params::<half::bf16>(0).unwrap_err());
        e.fetch(2).unwrap();
        errs.push(e.params::<f32>(2).unwrap_err());
        let g = [0.0f32; 15];
        errs.push(e.add_grads_f32(2, &[&g[..], &g[..2]]).unwrap_err());
        errs.push(e.fetch(7).unwrap_err());
        // A complete micro-step, then a second grads_ready for the same module.
        for m in (0..3).rev() {
            e.fetch(m).unwrap();
            e.grads_ready(m).unwrap();
            e.release(m).unwrap();
        }
        e.fetch(2).unwrap();
        e.grads_ready(2).unwrap();
        errs.push(e.grads_ready(2).unwrap_err());
        // zero_grad discards the partial step; a full step then works.
        e.zero_grad().unwrap();
        for _ in 0..2 {
            for m in (0..3).rev() {
                e.fetch(m).unwrap();
                e.grads_ready(m).unwrap();
                e.release(m).unwrap();
            }
        }
        assert!(!e.step().unwrap().skipped);
        errs
    });
    for errs in res {
        let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert!(
            matches!(errs[0], EngineError::Order(_)) && msgs[0].contains("0 of 2 micro-steps"),
            "{}",
            msgs[0]
        );
        assert!(
            matches!(errs[1], EngineError::NotFetched(_)) && msgs[1].contains("layer0"),
            "{}",
            msgs[1]
        );
        assert!(
            matches!(errs[2], EngineError::WrongDType { .. }),
            "{}",
            msgs[2]
        );
        assert!(
            msgs[3].contains("layer2")
                && msgs[3].contains("gradient 1 has 2 elements, the parameter has 3"),
            "{}",
            msgs[3]
        );
        assert!(
            matches!(errs[4], EngineError::UnknownModule { index: 7, count: 3 }),
            "{}",
            msgs[4]
        );
        assert!(msgs[5].contains("already reported"), "{}", msgs[5]);
    }
}

#[test]
fn a_config_for_another_world_size_is_refused() {
    let cfg = ZeroConfig::from_json_str(CFG, 2).unwrap();
    let comms = HostGroup::new(3).unwrap();
    let comm = comms.into_iter().next().unwrap();
    let err = Engine::new(cfg, mlp_modules(), comm, HostDevice, |id, _, v| {
        init_values(1, id, v)
    })
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("world size 2") && err.to_string().contains("3 ranks"),
        "{err}"
    );
}

#[test]
fn an_unusable_model_is_refused() {
    let cfg = ZeroConfig::from_json_str(CFG, 1).unwrap();
    let mut modules = mlp_modules();
    modules[1].params[1].name = "weight".into();
    let comm = HostGroup::new(1).unwrap().into_iter().next().unwrap();
    let err = Engine::new(cfg, modules, comm, HostDevice, |_, _, _| {})
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("two parameters named `weight`"),
        "{err}"
    );
}

/// A rank that leaves mid-step: the collectives the other rank is waiting on fail with
/// `Comm`, and what those collectives held is then `Lost`, naming it: never an internal
/// error, a panic or a hang, at every stage, with reductions overlapping the backward.
#[test]
fn what_a_failed_collective_held_is_lost_and_named() {
    for stage in 0..=3u8 {
        let config = zero_tests::mlp_config(stage, "fp32", 1, 0.0, true);
        let comms = HostGroup::with_timeout(2, std::time::Duration::from_secs(2)).expect("group");
        let errors = zero_tests::run_ranks_on(
            comms,
            || HostDevice,
            &config,
            7,
            |e| {
                if e.rank() == 1 {
                    return Vec::new(); // this rank leaves: its engine and group are dropped
                }
                let data = zero_tests::dataset(7, 8);
                let batch = &data[..zero_tests::MICRO_BATCH];
                let mut errors = Vec::new();
                // As a trainer that catches the error and tries again would.
                for _ in 0..4 {
                    if let Err(err) = zero_tests::micro_step(e, batch, 1.0, |_| {}) {
                        errors.push(err);
                    }
                    for _ in 0..2 {
                        match e.step() {
                            Ok(outcome) => {
                                panic!("stage {stage}: a step without the other rank: {outcome:?}")
                            }
                            Err(err) => errors.push(err),
                        }
                    }
                    if let Err(err) = e.zero_grad() {
                        errors.push(err);
                    }
                }
                errors
            },
        );
        let errors = &errors[0];
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        println!("stage {stage}: {text:#?}");
        assert!(
            matches!(errors.first(), Some(EngineError::Comm(_))),
            "stage {stage}: the first error is the collective's: {text:?}"
        );
        for (err, msg) in errors.iter().zip(&text) {
            match err {
                EngineError::Comm(_) | EngineError::Order(_) => {}
                EngineError::Lost(what) => assert!(
                    what.starts_with("bucket ")
                        && msg.contains("went with a collective that failed"),
                    "stage {stage}: {msg}"
                ),
                _ => panic!("stage {stage}: {msg}"),
            }
        }
        // Stage 3's gathers fail before a reduction holds anything.
        if stage < 3 {
            assert!(
                errors
                    .iter()
                    .any(|e| matches!(e, EngineError::Lost(what) if what.contains("gradients"))),
                "stage {stage}: the gradients a failed reduction held are named: {text:?}"
            );
        }
    }
}
