//! Checkpoint speed against this machine's disk, in one run:
//! 1. the roofline: a probe of our own writes then reads a file sequentially with
//!    `O_DIRECT` (8 MiB blocks, `fsync` at the end), no checksums, no engine;
//! 2. `save_checkpoint` of one rank's state of at least 1 GiB (world 1, stage 1, bf16:
//!    fp32 master, exp_avg and exp_avg_sq), `fsync`s included, with the extra host memory
//!    it takes sampled every 2 ms;
//! 3. `load_checkpoint` of it back;
//! 4. `zero-ckpt to-safetensors` of it (in-process): read the fp32 master, write it out.
//!
//! ```sh
//! cargo bench --bench checkpoint_io            # ZERO_BENCH_CKPT_PARAMS=90000000
//! ZERO_BENCH_DIR=/nvme/tmp cargo bench --bench checkpoint_io
//! ```
//!
//! Not a criterion bench: each pass moves gigabytes. The probe and the three operations run
//! in turn three times (`ZERO_BENCH_REPS`), and the table shows each one's median, so a
//! virtual disk's swings hit the roofline and the operations alike; it is the table
//! docs/BENCHMARKS.md records.

use serde_json::json;
use zero_benches::disk::{gbs, measured, probe, BLOCK};
use zero_comm::HostGroup;
use zero_kernels::DType;
use zero_runtime::checkpoint::export::export_safetensors;
use zero_runtime::checkpoint::CheckpointDir;
use zero_runtime::io::DEFAULT_BUFFER;
use zero_runtime::{Engine, HostDevice, LoadOptions, ModuleSpec, ParamSpec, ZeroConfig};

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--exact") {
        return; // `cargo test --benches` / a harness probing for test names.
    }
    let params: usize = std::env::var("ZERO_BENCH_CKPT_PARAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(90_000_000);
    let base = std::env::var_os("ZERO_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("zero-ckpt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench folder");
    let state_bytes = params as u64 * 12;
    println!(
        "checkpoint bench: {params} parameters, {:.2} GiB of fp32 optimizer state, in {}",
        state_bytes as f64 / (1u64 << 30) as f64,
        dir.display()
    );

    let reps: usize = std::env::var("ZERO_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let probe_bytes = state_bytes.max(1 << 30) / BLOCK as u64 * BLOCK as u64;

    // One rank: four modules of params/4 elements each.
    let modules: Vec<ModuleSpec> = (0..4)
        .map(|m| {
            ModuleSpec::new(
                format!("block{m}"),
                vec![ParamSpec::new("w", &[params / 4])],
            )
        })
        .collect();
    let cfg = ZeroConfig::from_json_str(
        r#"{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
            "zero_optimization": {"stage": 1, "reduce_bucket_size": 50000000}}"#,
        1,
    )
    .expect("config");
    let comm = HostGroup::new(1).expect("group").remove(0);
    let mut e = Engine::new(cfg, modules, comm, HostDevice, |id, _, v| {
        for (i, x) in v.iter_mut().enumerate() {
            *x = ((i + id) % 1000) as f32 * 1e-3;
        }
    })
    .expect("engine");
    let ckpt = dir.join("ckpt");
    let out = dir.join("hf");
    let (mut w, mut r, mut sv, mut ld, mut ex) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut written, mut read, mut exported) = (0u64, 0u64, 0u64);
    let (mut save_mem, mut load_mem, mut export_mem) = (0u64, 0u64, 0u64);
    for rep in 0..reps {
        let (wb, rb) = probe(&dir, probe_bytes, 1);
        w.push(wb);
        r.push(rb);
        let _ = std::fs::remove_dir_all(&ckpt);
        let _ = std::fs::remove_dir_all(&out);
        let (tag, save_s, m1) =
            measured(|| e.save_checkpoint(&ckpt, None, json!(null)).expect("save"));
        written = std::fs::read_dir(ckpt.join(&tag))
            .expect("tag")
            .flatten()
            .map(|f| f.metadata().map(|m| m.len()).unwrap_or(0))
            .sum();
        sv.push(written as f64 / save_s);
        let (_, load_s, m2) = measured(|| {
            e.load_checkpoint(&ckpt, None, LoadOptions::default())
                .expect("load")
        });
        read = e.last_load_read_stats().read;
        ld.push(read as f64 / load_s);
        let (files, export_s, m3) = measured(|| {
            let mut c = CheckpointDir::open(&ckpt, None).expect("open");
            export_safetensors(&mut c, &out, DType::F32, 5_000_000_000, DEFAULT_BUFFER)
                .expect("export")
        });
        exported = files.iter().map(|f| f.bytes).sum();
        ex.push(exported as f64 / export_s);
        save_mem = save_mem.max(m1);
        load_mem = load_mem.max(m2);
        export_mem = export_mem.max(m3);
        println!(
            "  run {}: probe write {} read {}; save {}, load {}, export {}",
            rep + 1,
            gbs(wb),
            gbs(rb),
            gbs(sv[rep]),
            gbs(ld[rep]),
            gbs(ex[rep])
        );
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (w_roof, r_roof) = (median(&mut w), median(&mut r));
    let (save_bw, load_bw, export_bw) = (median(&mut sv), median(&mut ld), median(&mut ex));
    let (save_s, load_s, export_s) = (
        written as f64 / save_bw,
        read as f64 / load_bw,
        exported as f64 / export_bw,
    );
    println!(
        "roofline (own O_DIRECT probe, {} GiB, median of {reps}): write {} (with fsync), read {}",
        probe_bytes >> 30,
        gbs(w_roof),
        gbs(r_roof)
    );
    println!();
    println!("| operation | bytes | time | bandwidth | vs roofline | extra host memory |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| save (fsync) | {:.2} GiB | {save_s:.2} s | {} | {:.0}% of write | {} MiB |",
        written as f64 / (1u64 << 30) as f64,
        gbs(save_bw),
        100.0 * save_bw / w_roof,
        save_mem >> 20
    );
    println!(
        "| load | {:.2} GiB read | {load_s:.2} s | {} | {:.0}% of read | {} MiB (the new state, swapped in) |",
        read as f64 / (1u64 << 30) as f64,
        gbs(load_bw),
        100.0 * load_bw / r_roof,
        load_mem >> 20
    );
    // An export reads every byte it writes from the same disk: its roofline is the time
    // to read and then write that many bytes.
    let both = 1.0 / (1.0 / r_roof + 1.0 / w_roof);
    println!(
        "| export fp32 (reads the master, writes it) | {:.2} GiB read + written | {export_s:.2} s | {} | {:.0}% of read+write ({}) | {} MiB |",
        exported as f64 / (1u64 << 30) as f64,
        gbs(export_bw),
        100.0 * export_bw / both,
        gbs(both),
        export_mem >> 20
    );
    let _ = std::fs::remove_dir_all(&dir);
}
