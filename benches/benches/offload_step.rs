//! The optimizer step with the state on the device against the same step with
//! `offload_optimizer.device: cpu`, in one run, on HostDevice (the CI path): what the
//! offload's sub-groups, host staging and copies cost when the "device" is host memory.
//! Per iteration the gradients are written and declared ready outside the timer; only
//! `step()` is timed (the overflow check, the norm, the fused Adam, the parameter
//! update). World 1, stage 1, bf16, 16M and 64M parameters in four modules. Before the
//! criterion runs, a paired pass steps the two engines alternately and prints the ratio of
//! their medians: the figure to quote on a noisy machine.
//!
//! ```sh
//! cargo bench --bench offload_step
//! ```

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use zero_benches::offload::{config, grads, modules, paired, timed_step};
use zero_benches::{fill, label};
use zero_comm::{HostComm, HostGroup};
use zero_runtime::{Engine, HostDevice};

/// Alternating steps per engine in the paired pass.
const PAIRED: usize = 25;

fn engine(n: usize, offload: &str) -> Engine<HostComm, HostDevice> {
    let comm = HostGroup::new(1).expect("group").remove(0);
    Engine::new(config(offload), modules(n), comm, HostDevice, |id, _, v| {
        fill(v, id as u64 + 1)
    })
    .expect("engine")
}

fn offload_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("offload_step");
    for n in [1 << 24, 1 << 26] {
        let grads = grads(n);
        let mut engines = [engine(n, "none"), engine(n, "cpu")];
        let [a, b] = paired(&mut engines, &grads, PAIRED);
        println!(
            "offload_step paired {}: none {a:.2} ms, cpu {b:.2} ms per step (median of {PAIRED} alternating), cpu/none = {:.3}",
            label(n),
            b / a
        );
        g.throughput(Throughput::Elements(n as u64));
        for (offload, e) in ["none", "cpu"].into_iter().zip(engines.iter_mut()) {
            g.bench_function(format!("{offload}/{}", label(n)), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| timed_step(e, &grads)).sum())
            });
        }
    }
    g.finish();
}

criterion_group! { name = benches; config = zero_benches::config(); targets = offload_step }
criterion_main!(benches);
