//! Accumulation windows the trainer declares (`Engine::set_accumulation_boundary`, what
//! DeepSpeed's `set_gradient_accumulation_boundary` does for accelerate): a window of the
//! micro-steps the trainer ran, ended where it says, gives the bits of the same window
//! counted by `gradient_accumulation_steps`, at every stage, in fp32 and bf16; a short
//! window (one micro-step, an epoch's end) gives the bits of a run that accumulates one;
//! a window the engine cannot hold is refused by name.

use zero_runtime::{Engine, HostDevice};
use zero_tests::{
    bits, dataset, full_params, micro_step, mlp_config, run_ranks, seed, MICRO_BATCH,
};

type HostEngine = Engine<zero_comm::HostComm, HostDevice>;

/// Trains windows of `sizes[i]` micro-steps, each declared (`explicit`) or counted, the
/// gradients those of the loss times 0.5 (the trainer scales its loss itself, as the
/// Trainer does with `scale_wrt_gas=False`); the parameters after.
fn train(
    e: &mut HostEngine,
    data: &[(Vec<f32>, Vec<f32>)],
    sizes: &[usize],
    explicit: bool,
) -> Vec<u32> {
    let (world, rank) = (e.world_size(), e.rank());
    let mut at = 0;
    for &n in sizes {
        for k in 0..n {
            if explicit {
                e.set_accumulation_boundary(Some(k + 1 == n))
                    .expect("declare the window");
            }
            let start = (at * world + rank) * MICRO_BATCH;
            micro_step(e, &data[start..start + MICRO_BATCH], 0.5, |_| {}).expect("micro-step");
            at += 1;
        }
        e.step().expect("step");
    }
    bits(&full_params(e).expect("params"))
}

/// Every rank's parameters after [`train`], with `accum` in the config.
fn windows(
    stage: u8,
    precision: &str,
    accum: usize,
    sizes: &[usize],
    explicit: bool,
    s: u64,
    data: &[(Vec<f32>, Vec<f32>)],
) -> Vec<Vec<u32>> {
    let cfg = mlp_config(stage, precision, accum, 0.5, false);
    run_ranks(2, &cfg, s, |e| train(e, data, sizes, explicit))
}

#[test]
fn declared_windows_give_the_counted_windows_bits() {
    let s = seed("declared accumulation windows");
    let data = dataset(s, 64);
    for stage in 0..=3u8 {
        for precision in ["fp32", "bf16"] {
            // Windows of 2 declared in a config of 3 = windows of 2 counted.
            let counted = windows(stage, precision, 2, &[2, 2, 2], false, s, &data);
            let declared = windows(stage, precision, 3, &[2, 2, 2], true, s, &data);
            assert!(
                counted == declared,
                "stage {stage} {precision}: declared windows differ (seed {s})"
            );
            // A window of one (an epoch's end) = a run that accumulates one micro-step.
            let single = windows(stage, precision, 1, &[1, 1, 1], false, s, &data);
            let short = windows(stage, precision, 3, &[1, 1, 1], true, s, &data);
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
