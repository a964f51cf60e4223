//! Accumulation windows the trainer declares (`Engine::set_accumulation_boundary`, what
//! DeepSpeed's `set_gradient_accumulation_boundary` does for accelerate): a window of the
//! micro-steps the trainer ran, ended where it says, gives the bits of the same window
//! counted by `gradient_accumulation_steps`, at every stage, in fp32 and bf16; a short
//! window (one micro-step, an epoch's end) gives the bits of a run that accumulates one;
//! a window the engine cannot hold is refused by name.

use zero_runtime::{Engine, EngineError, HostDevice};
use zero_tests::{
    bits, dataset, full_params, loss_and_grads, mlp_config, run_ranks, seed, MICRO_BATCH,
};

type HostEngine = Engine<zero_comm::HostComm, HostDevice>;

/// One micro-step on this rank with the samples `at`; gradients of the loss times 0.5 (the
/// trainer scales its loss itself, as the Trainer does with `scale_wrt_gas=False`).
fn micro_step(
    e: &mut HostEngine,
    data: &[(Vec<f32>, Vec<f32>)],
    at: usize,
) -> Result<(), EngineError> {
    let (world, rank) = (e.world_size(), e.rank());
    let start = (at * world + rank) * MICRO_BATCH;
    let mut params = Vec::new();
    for m in 0..3 {
        e.fetch(m)?;
        params.push(e.params_f32(m)?);
        e.release(m)?;
    }
    let (_, grads) = loss_and_grads(&params, &data[start..start + MICRO_BATCH], 0.5);
    for m in (0..3).rev() {
        e.fetch(m)?;
        let g: Vec<&[f32]> = grads[m].iter().map(|v| &v[..]).collect();
        e.add_grads_f32(m, &g)?;
        e.grads_ready(m)?;
        e.release(m)?;
    }
    Ok(())
}

/// Trains windows of `sizes[i]` micro-steps, each declared (`explicit`) or counted; the
/// parameters after.
fn train(
    e: &mut HostEngine,
    data: &[(Vec<f32>, Vec<f32>)],
    sizes: &[usize],
    explicit: bool,
) -> Vec<u32> {
    let mut at = 0;
    for &n in sizes {
        for k in 0..n {
            if explicit {
                e.set_accumulation_boundary(Some(k + 1 == n))
                    .expect("declare the window");
            }
            micro_step(e, data, at).expect("micro-step");
            at += 1;
        }
        e.step().expect("step");
    }
    bits(&full_params(e).expect("params"))
}

#[test]
fn declared_windows_give_the_counted_windows_bits() {
    let s = seed("declared accumulation windows");
    let data = dataset(s, 64);
    for stage in 0..=3u8 {
        for precision in ["fp32", "bf16"] {
            // Windows of 2 declared in a config of 3 = windows of 2 counted.
            let counted = run_ranks(2, &mlp_config(stage, precision, 2, 0.5, false), s, |e| {
                train(e, &data, &[2, 2, 2], false)
            });
            let declared = run_ranks(2, &mlp_config(stage, precision, 3, 0.5, false), s, |e| {
                train(e, &data, &[2, 2, 2], true)
            });
            assert!(
                counted == declared,
                "stage {stage} {precision}: declared windows differ (seed {s})"
            );
            // A window of one (an epoch's end) = a run that accumulates one micro-step.
            let single = run_ranks(2, &mlp_config(stage, precision, 1, 0.5, false), s, |e| {
                train(e, &data, &[1, 1, 1], false)
            });
            let short = run_ranks(2, &mlp_config(stage, precision, 3, 0.5, false), s, |e| {
                train(e, &data, &[1, 1, 1], true)
            });
            assert!(
                single == short,
                "stage {stage} {precision}: short windows differ (seed {s})"
            );
            assert!(
                counted != single,
                "stage {stage} {precision}: the runs do not depend on the windows"
            );
        }
    }
    println!(
        "stages 0-3, fp32 and bf16: declared windows of 2 and 1 give the counted bits (seed {s})"
    );
}

#[test]
fn a_window_the_engine_cannot_hold_is_refused_by_name() {
    let s = seed("refused accumulation windows");
    let errs = run_ranks(2, &mlp_config(2, "bf16", 1, 0.0, false), s, |e| {
        e.set_accumulation_boundary(Some(false))
            .unwrap_err()
            .to_string()
    });
    for err in errs {
        assert!(err.contains("gradient_accumulation_steps"), "{err}");
    }
    let errs = run_ranks(2, &mlp_config(2, "bf16", 2, 0.0, false), s, |e| {
        e.fetch(2).expect("fetch");
        e.add_grads_f32(2, &[&vec![0.25; 15][..], &[0.5; 3][..]])
            .expect("grads");
        e.grads_ready(2).expect("ready");
        e.release(2).expect("release");
        e.set_accumulation_boundary(Some(true))
            .unwrap_err()
            .to_string()
    });
    for err in errs {
        assert!(err.contains("during a micro-step"), "{err}");
    }
}
