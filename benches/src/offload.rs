//! The offload-step benches' shared pieces: the synthetic model and config, one timed
//! step, and the paired measurement (two engines stepped alternately, so a noisy machine
//! slows both alike).

use std::time::{Duration, Instant};
use zero_comm::Communicator;
use zero_runtime::{Device, Engine, ModuleSpec, ParamSpec, ZeroConfig};

/// Modules of the synthetic model.
pub const MODULES: usize = 4;

/// `n` parameters in [`MODULES`] modules of one weight each.
pub fn modules(n: usize) -> Vec<ModuleSpec> {
    (0..MODULES)
        .map(|m| {
            ModuleSpec::new(
                format!("block{m}"),
                vec![ParamSpec::new("w", &[n / MODULES])],
            )
        })
        .collect()
}

/// World 1, stage 1, bf16, AdamW, clipping on, `offload_optimizer.device = offload`.
pub fn config(offload: &str) -> ZeroConfig {
    ZeroConfig::from_json_str(
        &format!(
            r#"{{"train_micro_batch_size_per_gpu": 1, "bf16": {{"enabled": true}},
                "gradient_clipping": 1.0,
                "optimizer": {{"type": "AdamW", "params": {{"lr": 0.0001}}}},
                "zero_optimization": {{"stage": 1, "reduce_bucket_size": 50000000,
                    "offload_optimizer": {{"device": "{offload}"}}}}}}"#
        ),
        1,
    )
    .expect("config")
}

/// The gradient every module gets each step: small values, never overflowing.
pub fn grads(n: usize) -> Vec<f32> {
    let mut g = vec![0f32; n / MODULES];
    crate::fill(&mut g, 99);
    g.iter_mut().for_each(|x| *x *= 1e-3);
    g
}

/// One step of `e`, gradients written outside the timer; the time of `step()`.
pub fn timed_step<C: Communicator, D: Device<Buffer = C::Buffer>>(
    e: &mut Engine<C, D>,
    grads: &[f32],
) -> Duration {
    for m in 0..MODULES {
        e.add_grads_f32(m, &[grads]).expect("grads");
        e.grads_ready(m).expect("ready");
    }
    let t = Instant::now();
    let out = e.step().expect("step");
    let d = t.elapsed();
    assert!(!out.skipped);
    d
}

/// Steps `engines` (no offload, then cpu offload) alternately `steps` times after one
/// warm-up step each; their median step times in ms.
pub fn paired<C: Communicator, D: Device<Buffer = C::Buffer>>(
    engines: &mut [Engine<C, D>; 2],
    grads: &[f32],
    steps: usize,
) -> [f64; 2] {
    for e in engines.iter_mut() {
        timed_step(e, grads); // first touch of the buffers
    }
    let mut times: [Vec<f64>; 2] = Default::default();
    for _ in 0..steps {
        for (e, t) in engines.iter_mut().zip(times.iter_mut()) {
            t.push(timed_step(e, grads).as_secs_f64() * 1e3);
        }
    }
    times.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    })
}
