//! The micro-step as the engine decides it (`engine/arrivals.rs`, `engine/window.rs`): a
//! front-end that only hands gradients over (`begin_grad` / write / `finish_grad`, then
//! `end_backward`) and counts `step()` calls through the engine (`step_call`) trains to
//! the bits of a trainer that declares every module ready itself, at every stage, with
//! and without accumulation; a module is complete early exactly when the expectation
//! says; a gradient after its module is complete, and `step()` before a backward, are
//! errors naming the problem; `zero_grad` discards the window's counters; what
//! `end_backward` releases is freed as a trainer that declares and releases each module
//! itself frees it.

use zero_comm::HostComm;
use zero_runtime::{Engine, Expectation, HostDevice};
use zero_tests::{
    bits, dataset, full_params, loss_and_grads, micro_step, mlp_config, run_ranks, seed,
    MICRO_BATCH,
};

type HostEngine = Engine<HostComm, HostDevice>;

/// One micro-step through the front-end verbs: the gradients of layers 2, 1, 0 (backward
/// order), `skip` layers' none. Returns the modules `finish_grad` completed, and the end.
fn handed_over(
    e: &mut HostEngine,
    batch: &[(Vec<f32>, Vec<f32>)],
    skip: &[usize],
) -> (Vec<usize>, zero_runtime::BackwardEnd) {
    let mut params = Vec::new();
    for m in 0..3 {
        e.fetch(m).expect("fetch");
        params.push(e.params_f32(m).expect("params"));
        e.release(m).expect("release");
    }
    let (_, grads) = loss_and_grads(&params, batch, 1.0);
    e.backward_call().expect("backward()");
    e.begin_pass().expect("pass");
    let mut early = Vec::new();
    for m in (0..3).rev().filter(|m| !skip.contains(m)) {
        e.fetch(m).expect("fetch");
        for (k, g) in grads[m].iter().enumerate() {
            e.begin_grad(m, k).expect("begin_grad");
            e.add_grad_f32(m, k, g).expect("write");
            if e.finish_grad(m, k).expect("finish_grad") {
                early.push(m);
            }
        }
        e.release(m).expect("release");
    }
    (early, e.end_backward(&[]).expect("end_backward"))
}

/// `steps` micro-steps through the front-end, the optimizer stepping where `step_call`
/// says; the parameters after, and each micro-step's early modules.
fn front_end(
    e: &mut HostEngine,
    data: &[(Vec<f32>, Vec<f32>)],
    steps: usize,
    predict: bool,
) -> (Vec<u32>, Vec<Vec<usize>>) {
    if predict {
        assert!(e.predict_grads(&[0, 1, 2]).expect("predict"));
    }
    let (world, rank) = (e.world_size(), e.rank());
    let mut early = Vec::new();
    for i in 0..steps {
        let start = (i * world + rank) * MICRO_BATCH;
        let (done, end) = handed_over(e, &data[start..start + MICRO_BATCH], &[]);
        assert_eq!(end.missing, vec![]);
        let late: Vec<usize> = (0..3).rev().filter(|m| !done.contains(m)).collect();
        assert_eq!(end.late, late, "the rest, in reverse order");
        early.push(done);
        if e.step_call().expect("step()") {
            e.step().expect("optimizer step");
        }
    }
    assert_eq!(e.micro_steps(), steps as u64);
    (bits(&full_params(e).expect("params")), early)
}

/// The same micro-steps by a trainer that declares each module ready itself.
fn declared(
    e: &mut HostEngine,
    data: &[(Vec<f32>, Vec<f32>)],
    steps: usize,
    accum: usize,
) -> Vec<u32> {
    let (world, rank) = (e.world_size(), e.rank());
    for i in 0..steps {
        let start = (i * world + rank) * MICRO_BATCH;
        micro_step(e, &data[start..start + MICRO_BATCH], 1.0, |_| {}).expect("micro-step");
        if (i + 1) % accum == 0 {
            e.step().expect("step");
        }
    }
    bits(&full_params(e).expect("params"))
}

#[test]
fn the_engines_decision_trains_to_the_declared_bits() {
    let s = seed("the engine's micro-step");
    let data = dataset(s, 64);
    for stage in 0..=3u8 {
        for accum in [1, 2] {
            let cfg = mlp_config(stage, "bf16", accum, 0.5, true);
            let want = run_ranks(2, &cfg, s, |e| declared(e, &data, 4, accum));
            for predict in [false, true] {
                let got = run_ranks(2, &cfg, s, |e| front_end(e, &data, 4, predict));
                for (rank, (bits, early)) in got.iter().enumerate() {
                    assert!(
                        *bits == want[rank],
                        "stage {stage}, accumulation {accum}, predicted {predict}: rank {rank} differs (seed {s})"
                    );
                    // Unknown: nothing early in the first backward; every later one knows
                    // the counts. Predicted: early from the first.
                    let first: &[usize] = if predict { &[2, 1, 0] } else { &[] };
                    assert_eq!(early[0], first, "stage {stage}: first backward");
                    for later in &early[1..] {
                        assert_eq!(later, &[2, 1, 0], "stage {stage}: later backwards");
                    }
                }
            }
        }
    }
    println!("stages 0-3, accumulation 1 and 2: the engine's decision gives the declared bits (seed {s})");
}

#[test]
fn a_module_a_backward_skipped_waits_for_the_end_and_its_parameters_are_named() {
    let s = seed("a skipped module");
    let data = dataset(s, 16);
    let out = run_ranks(2, &mlp_config(3, "fp32", 1, 0.0, false), s, |e| {
        assert_eq!(e.expectation(), Expectation::Unknown);
        // The first backward reaches no gradient of layer 1: it is zero, named missing.
        let (early, end) = handed_over(e, &data[..MICRO_BATCH], &[1]);
        assert!(early.is_empty() && end.learned_now);
        assert_eq!(end.missing, vec![(1, 0), (1, 1)]);
        assert_eq!(e.expectation(), Expectation::Learned);
        e.step_call().expect("step()");
        e.step().expect("step");
        // Later backwards complete layers 2 and 0 early; layer 1, which got none when the
        // counts were learned, waits for the end even when its gradients arrive.
        let (early, end) = handed_over(e, &data[..MICRO_BATCH], &[]);
        assert_eq!(
            (early, end.late, end.learned_now),
            (vec![2, 0], vec![1], false)
        );
        // A gradient after its module is complete is refused by name.
        e.step_call().expect("step()");
        e.step().expect("step");
        let _ = handed_over(e, &data[..MICRO_BATCH], &[1]);
        e.step_call().expect("step()");
        e.step().expect("step");
        e.begin_pass().expect("pass");
        for k in 0..2 {
            e.begin_grad(2, k).expect("begin");
            e.finish_grad(2, k).expect("finish");
        }
        e.begin_grad(2, 0).unwrap_err().to_string()
    });
    for err in out {
        assert!(
            err.contains("parameter layer2.weight received its gradient 2 times")
                && err.contains("more than the 1 the first backward"),
            "{err}"
        );
    }
}

#[test]
fn the_window_counts_step_calls_and_zero_grad_discards_it() {
    let s = seed("the window");
    let data = dataset(s, 16);
    run_ranks(2, &mlp_config(2, "fp32", 2, 0.0, false), s, |e| {
        let err = e.step_call().unwrap_err().to_string();
        assert!(err.contains("step() was called before backward()"), "{err}");
        assert!(!e.is_gradient_accumulation_boundary());
        handed_over(e, &data[..MICRO_BATCH], &[]);
        assert_eq!(e.passes_since_step(), 1);
        assert!(!e.step_call().expect("first of two"));
        assert!(e.is_gradient_accumulation_boundary());
        // Two passes before step(): the second reopens the micro-step.
        handed_over(e, &data[..MICRO_BATCH], &[]);
        handed_over(e, &data[..MICRO_BATCH], &[]);
        assert_eq!(e.passes_since_step(), 2);
        assert!(e.step_call().expect("second of two"));
        e.step().expect("step");
        assert_eq!(e.micro_steps(), 2);
        // zero_grad discards a window begun: micro_steps back to its start.
        handed_over(e, &data[..MICRO_BATCH], &[]);
        assert!(!e.step_call().expect("first"));
        handed_over(e, &data[..MICRO_BATCH], &[]);
        e.zero_grad().expect("zero_grad");
        assert_eq!((e.micro_steps(), e.passes_since_step()), (2, 0));
        // A declared boundary holds until declared again.
        e.declare_boundary(true);
        assert!(e.is_gradient_accumulation_boundary());
        handed_over(e, &data[..MICRO_BATCH], &[]);
        assert!(e.step_call().expect("declared"));
        e.step().expect("a window of one, declared");
        assert!(e.is_gradient_accumulation_boundary());
    });
}

#[test]
fn what_end_backward_releases_is_freed_as_a_declaring_trainer_frees_it() {
    let s = seed("end_backward releases");
    let data = dataset(s, 16);
    // The fetch trace keeps a released bucket its next use reaches soon.
    let cfg = mlp_config(3, "fp32", 1, 0.0, false).replace(
        r#""stage3_max_reuse_distance": 0"#,
        r#""stage3_max_reuse_distance": 1000000000"#,
    );
    let out = run_ranks(2, &cfg, s, |e| {
        // A trainer that declares each module ready and releases it right after: the last
        // declaration rewinds the fetch trace, so only the module the next forward starts
        // with stays gathered.
        micro_step(e, &data[..MICRO_BATCH], 1.0, |_| {}).expect("micro-step");
        let declared = e.memory_report().gathered;
        e.step().expect("step");
        // A front-end that keeps every module gathered through a backward whose modules
        // are all complete only at its end (nothing expected yet) and hands them to
        // end_backward.
        let mut params = Vec::new();
        for m in 0..3 {
            e.fetch(m).expect("fetch");
            params.push(e.params_f32(m).expect("params"));
            e.release(m).expect("release");
        }
        let (_, grads) = loss_and_grads(&params, &data[..MICRO_BATCH], 1.0);
        for m in (0..3).rev() {
            e.fetch(m).expect("fetch");
            for (k, g) in grads[m].iter().enumerate() {
                e.begin_grad(m, k).expect("begin_grad");
                e.add_grad_f32(m, k, g).expect("write");
                assert!(!e.finish_grad(m, k).expect("finish_grad"));
            }
        }
        let all = e.memory_report().gathered;
        e.end_backward(&[0, 1, 2]).expect("end_backward");
        (declared, e.memory_report().gathered, all)
    });
    for (declared, ours, all) in out {
        assert!(
            declared < all,
            "the trace keeps only part: {declared} of {all} bytes"
        );
        assert_eq!(
            ours, declared,
            "gathered after end_backward, of {all} bytes (seed {s})"
        );
    }
}
