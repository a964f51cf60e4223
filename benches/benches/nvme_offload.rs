//! ZeRO-Infinity's optimizer step against this machine's disk: a synthetic model of 1B
//! parameters (`ZERO_BENCH_NVME_PARAMS`) whose fp32 optimizer state — 12 bytes per
//! parameter, 12 GB — lives in an NVMe swap file, stepped sub-group by sub-group through
//! the triple-buffered pipeline (read ahead, Adam, write behind).
//!
//! In the same run:
//! 1. the roofline: our own `O_DIRECT` probe writes then reads 8 GiB sequentially in 8 MiB
//!    requests, with 1 and 4 threads, before and after the steps; the fastest read and the
//!    fastest write count;
//! 2. one warm-up step, then `ZERO_BENCH_STEPS` (3) timed `step()`s; each reads and writes
//!    every block once: 24 bytes per parameter of traffic;
//!    and a mixed probe reads half of such a file while rewriting the other half, as the
//!    pipeline does;
//! 3. the step against the roofline: the faster of 12Ψ / read + 12Ψ / write and
//!    24Ψ / mixed, over the step time;
//! 4. peak RSS (`VmHWM`), whole and less the engine's device-tier buffers at their peak
//!    (parameters, gradients, gradient staging, gathered buckets: on HostDevice the
//!    "device" is host memory; on a GPU host those bytes are in GPU memory) and the
//!    bench's own gradient source.
//!
//! ```sh
//! cargo bench --bench nvme_offload
//! ZERO_BENCH_DIR=/nvme/tmp ZERO_BENCH_NVME_PARAMS=2000000000 cargo bench --bench nvme_offload
//! ```
//!
//! Not a criterion bench: one step moves 24 GB.

use std::time::Instant;
use zero_benches::disk::{gbs, peak_rss_bytes, probe, probe_mixed};
use zero_comm::HostGroup;
use zero_runtime::{Engine, HostDevice, ModuleSpec, ParamSpec, ZeroConfig};

fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--exact") {
        return; // `cargo test --benches` / a harness probing for test names.
    }
    let params = env_or("ZERO_BENCH_NVME_PARAMS", 1_000_000_000);
    let steps = env_or("ZERO_BENCH_STEPS", 3).max(1);
    let sub_group = env_or("ZERO_BENCH_SUB_GROUP", 25_000_000);
    let modules_n = 64;
    let per = params / modules_n;
    let params = per * modules_n;
    let base = std::env::var_os("ZERO_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("zero-nvme-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench folder");
    let state = 12 * params as u64;
    println!(
        "nvme offload bench: {params} parameters (bf16), {} of fp32 optimizer state on NVMe in {}, sub_group_size {sub_group}",
        gib(state),
        dir.display()
    );

    // 1. The roofline, probed before and after the steps (a virtual disk swings): the
    //    fastest of the four probes counts, the conservative choice.
    let probe_bytes = 8u64 << 30;
    let mut probes = Vec::new();
    let mut mixed = Vec::new();
    let mut run_probes = |when: &str| {
        for threads in [1, 4] {
            let (w, r) = probe(&dir, probe_bytes, threads);
            let m = probe_mixed(&dir, probe_bytes, threads);
            println!(
                "probe {when}, {threads} thread(s), 8 GiB in 8 MiB O_DIRECT requests: write {}, read {}, read+write at once {}",
                gbs(w),
                gbs(r),
                gbs(m)
            );
            probes.push((w, r));
            mixed.push(m);
        }
    };
    run_probes("before");

    // 2. The engine: world 1, stage 3 with no persistent parameters (at world 1 every
    //    stage holds the same model states; stage 3 has no all-gather after the step, so
    //    no transient copy of the parameters).
    let modules: Vec<ModuleSpec> = (0..modules_n)
        .map(|m| ModuleSpec::new(format!("block{m}"), vec![ParamSpec::new("w", &[per])]))
        .collect();
    let cfg = ZeroConfig::from_json_str(
        &serde_json::json!({
            "train_micro_batch_size_per_gpu": 1,
            "bf16": {"enabled": true},
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "zero_optimization": {
                "stage": 3,
                "reduce_bucket_size": 100_000_000,
                "stage3_param_persistence_threshold": 0,
                "stage3_prefetch_bucket_size": 0,
                "stage3_max_reuse_distance": 0,
                "sub_group_size": sub_group,
                "offload_optimizer": {"device": "nvme", "nvme_path": dir, "buffer_count": 3}
            },
            "aio": {"block_size": 8 << 20, "queue_depth": 4, "intra_op_parallelism": 1}
        })
        .to_string(),
        1,
    )
    .expect("config");
    let comm = HostGroup::new(1).expect("group").remove(0);
    let t = Instant::now();
    let mut e = Engine::new(cfg, modules, comm, HostDevice, |id, _, v| {
        for (i, x) in v.iter_mut().enumerate() {
            *x = ((i * 7 + id) % 1000) as f32 * 1e-4;
        }
    })
    .expect("engine");
    println!(
        "engine up (state written to NVMe) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let grads: Vec<f32> = (0..per).map(|i| ((i % 97) as f32 - 48.0) * 1e-5).collect();
    let mut times = Vec::new();
    for s in 0..=steps {
        for m in (0..modules_n).rev() {
            e.fetch(m).expect("fetch");
            e.add_grads_f32(m, &[&grads]).expect("grads");
            e.grads_ready(m).expect("ready");
            e.release(m).expect("release");
        }
        let t = Instant::now();
        let out = e.step().expect("step");
        let secs = t.elapsed().as_secs_f64();
        assert!(!out.skipped);
        println!(
            "  step {s}{}: {secs:.2} s",
            if s == 0 { " (warm-up)" } else { "" }
        );
        if s > 0 {
            times.push(secs);
        }
    }
    times.sort_by(f64::total_cmp);
    let step = times[times.len() / 2];
    let mem = e.memory_report();
    run_probes("after");
    let write_bw = probes.iter().map(|p| p.0).fold(0.0, f64::max);
    let read_bw = probes.iter().map(|p| p.1).fold(0.0, f64::max);
    let mixed_bw = mixed.iter().copied().fold(0.0, f64::max);
    let traffic = 2 * mem.nvme.total() as u64; // every block read and written once
                                               // The roofline step: the faster of reading then writing at the probes' best, and
                                               // moving all of it at the mixed probe's best.
    let roof = ((traffic / 2) as f64 / read_bw + (traffic / 2) as f64 / write_bw)
        .min(traffic as f64 / mixed_bw);
    // The device tier at its peak: parameters, gradients, gradient staging and the most
    // gathered buckets at once.
    let device_tier =
        (mem.params + mem.grads + mem.buckets + mem.peak_gathered + mem.frozen) as u64;
    let scaffold = (grads.len() * 4) as u64;
    let hwm = peak_rss_bytes();
    let host_side = hwm.saturating_sub(device_tier + scaffold);
    println!();
    println!("| Ψ | state on NVMe | step (median of {steps}) | I/O per step | achieved | roofline step | vs roofline | peak RSS | RSS less device tier | host memory the offload reports |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {:.2}B | {} | {step:.2} s | {} | {} | {roof:.2} s (read {}, write {}, mixed {}) | {:.0}% | {} | {} ({:.0}% of the state) | {} |",
        params as f64 / 1e9,
        gib(mem.nvme.total() as u64),
        gib(traffic),
        gbs(traffic as f64 / step),
        gbs(read_bw),
        gbs(write_bw),
        gbs(mixed_bw),
        100.0 * roof / step,
        gib(hwm),
        gib(host_side),
        100.0 * host_side as f64 / state as f64,
        gib(mem.host.total() as u64),
    );
    drop(e);
    let _ = std::fs::remove_dir_all(&dir);
}
