//! What a stage-3 module costs on the host: `fetch` (all-gather of its bucket) and
//! `release` (free) of each of 2,000 modules in a forward pass, at 2 ranks, in-process
//! (`HostGroup`) and one process per rank (`ShmGroup`). Each module is one parameter of 256
//! f32 in its own bucket, never persistent, so every fetch is a collective. Each pass is a
//! whole training step (forward, backward with reduce-scatters, step), so the trace and
//! the prefetch work as in training; only the forward's fetches and releases are timed, and
//! the throughput is in modules.
//!
//! `no prefetch`: `stage3_prefetch_bucket_size` 0, every fetch waits for its gather.
//! `prefetch`: the next 64 modules' gathers are issued ahead.

use criterion::{BenchmarkId, Criterion, Throughput};
use std::time::{Duration, Instant};
use zero_benches::ranks;
use zero_comm::{Communicator, HostBuffer, HostGroup, ShmGroup};
use zero_runtime::{Engine, HostDevice, ModuleSpec, ParamSpec, ZeroConfig};

const MODULES: usize = 2000;
const NUMEL: usize = 256;
const WORLD: usize = 2;

fn cfg(prefetch: bool) -> String {
    let window = if prefetch { 64 * NUMEL } else { 0 };
    serde_json::json!({
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": NUMEL,
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": window,
            "stage3_max_reuse_distance": 0
        }
    })
    .to_string()
}

/// Runs `passes` training steps on `comm`; returns the time spent in the forward
/// passes' fetches and releases.
fn passes<C: Communicator<Buffer = HostBuffer>>(comm: C, prefetch: bool, passes: u64) -> Duration {
    let world = comm.world_size();
    let cfg = ZeroConfig::from_json_str(&cfg(prefetch), world).expect("config");
    let modules: Vec<ModuleSpec> = (0..MODULES)
        .map(|m| ModuleSpec::new(format!("m{m}"), vec![ParamSpec::new("w", &[NUMEL])]))
        .collect();
    let mut e =
        Engine::new(cfg, modules, comm, HostDevice, |_, _, v| v.fill(0.01)).expect("engine");
    let grad = vec![1e-3f32; NUMEL];
    let pass = |e: &mut Engine<C, HostDevice>| -> Duration {
        let t0 = Instant::now();
        for m in 0..MODULES {
            e.fetch(m).expect("fetch");
            e.release(m).expect("release");
        }
        let forward = t0.elapsed();
        for m in (0..MODULES).rev() {
            e.fetch(m).expect("fetch");
            e.add_grad_f32(m, 0, &grad).expect("grad");
            e.grads_ready(m).expect("grads_ready");
            e.release(m).expect("release");
        }
        e.step().expect("step");
        forward
    };
    // The first pass records the trace.
    pass(&mut e);
    (0..passes).map(|_| pass(&mut e)).sum()
}

fn in_process(prefetch: bool, n: u64) -> Duration {
    let comms = HostGroup::new(WORLD).expect("group");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || passes(c, prefetch, n)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .next()
            .unwrap_or_default()
    })
}

fn child(task: &str) {
    let mut f = task.split_whitespace();
    let prefetch = f.next() == Some("prefetch");
    let n: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(1);
    let comm = ShmGroup::from_env(Duration::from_secs(120)).expect("join the group");
    let rank = comm.rank();
    let t = passes(comm, prefetch, n);
    ranks::report(rank, t);
}

fn fetch_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("stage3 fetch+release, 2000 modules, 2 ranks");
    g.throughput(Throughput::Elements(MODULES as u64));
    for prefetch in [false, true] {
        let what = if prefetch { "prefetch" } else { "no prefetch" };
        g.bench_function(BenchmarkId::new("host (threads)", what), |b| {
            b.iter_custom(|n| in_process(prefetch, n))
        });
        g.bench_function(BenchmarkId::new("shm (processes)", what), |b| {
            b.iter_custom(|n| {
                ranks::run_job(
                    WORLD,
                    &format!("{} {n}", if prefetch { "prefetch" } else { "plain" }),
                )
            })
        });
    }
    g.finish();
}

fn main() {
    ranks::bench_main(child, &[fetch_release]);
}
