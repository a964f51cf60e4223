//! The main job: train a character-level language model through the zero engine.
//!
//! ```sh
//! cargo run --release --example train                      # stage 3, 4 ranks, bf16, CPU
//! cargo run --release --example train -- --compare-stages  # stages 0-3 side by side
//! cargo run --release --example train -- --config ds_config.json --stage 2 --precision fp16
//! cargo run --release --example train -- --steps 600 --save-dir ckpt --save-every 200
//! cargo run --release --example train -- --ranks 3 --stage 2 --resume ckpt   # any world size and stage
//! cargo run --release --example train -- --offload-optimizer cpu              # ZeRO-Offload
//! cargo run --release --example train -- --config configs/stage3_offload_param_cpu.json
//! ```

mod lm;

use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use zero_comm::nccl::{LaunchEnv, NcclComm};
use zero_comm::{Communicator, DeviceGroup, HostGroup};
use zero_runtime::scaler::ScaleChange;
use zero_runtime::{CommReport, CudaDevice, Engine, HostDevice, MemoryReport, Timings, ZeroConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PrecisionArg {
    Fp32,
    Fp16,
    Bf16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OffloadArg {
    None,
    Cpu,
    Nvme,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
}

/// Train a character-level language model on text from a random Markov chain, through the
/// zero engine, and show what ZeRO saves.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// ZeRO stage 0-3 (default 3, or the config's).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3))]
    stage: Option<u8>,
    /// In-process ranks.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 1200)]
    steps: usize,
    /// Seed of the text source, the data and the initial weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Parameter and gradient precision (default bf16, or the config's).
    #[arg(long, value_enum)]
    precision: Option<PrecisionArg>,
    /// A DeepSpeed config (ds_config.json); flags override its keys.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where to train.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Run stages 0-3 back to back on the same seed and compare them.
    #[arg(long)]
    compare_stages: bool,
    /// Hidden width of the model's two hidden layers.
    #[arg(long, default_value_t = 1280)]
    hidden: usize,
    /// Save a checkpoint to this folder (every `--save-every` steps, and at the end).
    #[arg(long)]
    save_dir: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end).
    #[arg(long, default_value_t = 0)]
    save_every: usize,
    /// Resume from the latest checkpoint in this folder (or `--resume-tag`'s), at any
    /// world size and stage.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// The checkpoint tag to resume from (default: the one `latest` names).
    #[arg(long, requires = "resume")]
    resume_tag: Option<String>,
    /// Offload the optimizer state (ZeRO-Offload: cpu; ZeRO-Infinity: nvme, with
    /// --nvme-path); overrides zero_optimization.offload_optimizer.device.
    #[arg(long, value_enum)]
    offload_optimizer: Option<OffloadArg>,
    /// Offload stage 3's parameter partitions (cpu or nvme); overrides
    /// zero_optimization.offload_param.device.
    #[arg(long, value_enum)]
    offload_param: Option<OffloadArg>,
    /// The folder NVMe offload puts its swap files in (sets both nvme_path keys).
    #[arg(long)]
    nvme_path: Option<PathBuf>,
    /// The local rank, as the deepspeed launcher passes it (`--local_rank=N`, unless it is
    /// given `--no_local_rank`); it must agree with the launcher's environment.
    #[arg(long = "local_rank", alias = "local-rank")]
    local_rank: Option<usize>,
}

const DEFAULT_CONFIG: &str = r#"{
    "train_micro_batch_size_per_gpu": 32,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.98], "weight_decay": 0.0}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 20, "warmup_type": "linear", "cos_min_ratio": 0.05}},
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e5, "stage3_prefetch_bucket_size": 5e5, "stage3_param_persistence_threshold": 1e4, "stage3_max_reuse_distance": 0}
}"#;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    // Under torchrun, the deepspeed launcher, srun or mpirun: one rank per process, over
    // NCCL.
    let launch = if LaunchEnv::launched() {
        let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
        if let Some(flag) = args.local_rank.filter(|&l| l != env.local_rank) {
            return Err(format!(
                "--local_rank={flag} disagrees with the launcher's local rank {} ({:?})",
                env.local_rank, env.launcher
            ));
        }
        if args.device != DeviceArg::Cuda {
            return Err(format!(
                "launched as rank {} of {} ({:?}): one rank per process runs over NCCL, so pass --device cuda (CPU ranks run in one process with --ranks N)",
                env.rank, env.world_size, env.launcher
            ));
        }
        Some(env)
    } else {
        None
    };
    if args.ranks == 0 {
        return Err("--ranks must be at least 1".into());
    }
    if args.compare_stages && (args.save_dir.is_some() || args.resume.is_some()) {
        return Err("--compare-stages runs four separate trainings: it does not take --save-dir or --resume".into());
    }
    let world = launch.as_ref().map_or(args.ranks, |l| l.world_size);
    let leader = launch.as_ref().is_none_or(|l| l.rank == 0);
    // Only rank 0 of a launched job prints.
    let say = |line: String| {
        if leader {
            println!("{line}");
        }
    };
    let (base, origin) = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
            (v, path.display().to_string())
        }
        None => (
            serde_json::from_str(DEFAULT_CONFIG).map_err(|e| e.to_string())?,
            "the built-in config".to_string(),
        ),
    };
    let source = lm::Source::new(args.seed, 16);
    let shape = lm::Shape {
        vocab: 16,
        context: 8,
        embed: 32,
        hidden: args.hidden,
    };
    let entropy = source.entropy_rate();
    say(format!(
        "zero training example: char-level MLP LM ({} parameters), order-2 Markov text over {} letters (entropy rate {entropy:.4} nats/char), {world} ranks",
        fmt_count(shape.numel() as u64),
        source.vocab,
    ));
    let stages: Vec<Option<u8>> = if args.compare_stages {
        (0..=3).map(Some).collect()
    } else {
        vec![args.stage]
    };
    let mut results = Vec::new();
    for stage in stages {
        let (value, said) = overrides(base.clone(), args, stage, &origin);
        for line in said {
            say(format!("  {line}"));
        }
        let cfg = ZeroConfig::from_json(&value, world).map_err(|e| format!("config: {e}"))?;
        for note in &cfg.notes {
            say(format!("  note: {note}"));
        }
        let r = train(args, &cfg, &source, &shape, world, launch.as_ref())?;
        if leader {
            report(&cfg, &r, entropy, world);
        }
        results.push((cfg.zero.stage, r));
    }
    if args.compare_stages && leader {
        compare(&results, entropy, world);
    }
    Ok(())
}

/// Applies the flags to the config, returning what each changed.
fn overrides(
    mut v: Value,
    args: &Args,
    stage_flag: Option<u8>,
    origin: &str,
) -> (Value, Vec<String>) {
    let mut said = Vec::new();
    let mut set = |v: &mut Value, path: &[&str], new: Value, flag: &str| {
        let mut cur = &mut *v;
        for key in &path[..path.len() - 1] {
            if !cur.get(*key).is_some_and(Value::is_object) {
                cur[*key] = json!({});
            }
            cur = &mut cur[*key];
        }
        let last = path[path.len() - 1];
        match cur.get(last) {
            Some(old) if *old != new => said.push(format!(
                "{flag} overrides {} = {old} from {origin}",
                path.join(".")
            )),
            None => said.push(format!(
                "{flag} sets {} (absent from {origin})",
                path.join(".")
            )),
            _ => {}
        }
        cur[last] = new;
    };
    if let Some(stage) = stage_flag {
        set(
            &mut v,
            &["zero_optimization", "stage"],
            json!(stage),
            &format!("--stage {stage}"),
        );
    }
    if let Some(p) = args.precision {
        let flag = format!("--precision {}", format!("{p:?}").to_lowercase());
        set(
            &mut v,
            &["fp16", "enabled"],
            json!(p == PrecisionArg::Fp16),
            &flag,
        );
        set(
            &mut v,
            &["bf16", "enabled"],
            json!(p == PrecisionArg::Bf16),
            &flag,
        );
    }
    for (key, flag) in [
        ("offload_optimizer", args.offload_optimizer),
        ("offload_param", args.offload_param),
    ] {
        if let Some(d) = flag {
            let name = format!("{d:?}").to_lowercase();
            set(
                &mut v,
                &["zero_optimization", key, "device"],
                json!(name),
                &format!("--{} {name}", key.replace('_', "-")),
            );
        }
    }
    if let Some(path) = &args.nvme_path {
        for key in ["offload_optimizer", "offload_param"] {
            set(
                &mut v,
                &["zero_optimization", key, "nvme_path"],
                json!(path),
                &format!("--nvme-path {}", path.display()),
            );
        }
    }
    if v.pointer("/scheduler/params/total_num_steps") == Some(&json!("auto")) {
        v["scheduler"]["params"]["total_num_steps"] = json!(args.steps);
        said.push(format!(
            "--steps {} resolves scheduler.params.total_num_steps = \"auto\"",
            args.steps
        ));
    }
    (v, said)
}

/// What one rank measured.
struct RankResult {
    eval_loss: f32,
    train_loss: f32,
    memory: MemoryReport,
    comm: CommReport,
    time: Timings,
    skipped: u64,
    loss_scale: f64,
    elapsed: Duration,
}

fn train(
    args: &Args,
    cfg: &ZeroConfig,
    source: &lm::Source,
    shape: &lm::Shape,
    world: usize,
    launch: Option<&LaunchEnv>,
) -> Result<RankResult, String> {
    let tokens_per_step =
        world * (cfg.micro_batch_per_rank * cfg.gradient_accumulation_steps) as usize;
    let text = source.sample(args.seed, args.steps * tokens_per_step + shape.context + 1);
    let held_out = source.sample(args.seed ^ 0xe7a1, 8192 + shape.context);
    let timeout = Duration::from_secs(300);
    if let Some(env) = launch {
        let comm = NcclComm::init(env, timeout).map_err(|e| format!("NCCL: {e}"))?;
        return train_ranks(args, cfg, shape, &text, &held_out, vec![comm], || {
            CudaDevice::new().map_err(|e| format!("--device cuda: {e}"))
        });
    }
    match args.device {
        DeviceArg::Cpu => {
            let comms = HostGroup::with_timeout(world, timeout).map_err(|e| e.to_string())?;
            train_ranks(args, cfg, shape, &text, &held_out, comms, || Ok(HostDevice))
        }
        DeviceArg::Cuda => {
            // Ranks as threads sharing the one GPU (NCCL takes one process per GPU).
            let comms = DeviceGroup::with_timeout(world, timeout)
                .map_err(|e| format!("--device cuda: {e}"))?;
            train_ranks(args, cfg, shape, &text, &held_out, comms, || {
                CudaDevice::new().map_err(|e| format!("--device cuda: {e}"))
            })
        }
    }
}

/// Trains one engine per communicator, each rank in its own thread; returns rank 0's
/// result.
#[allow(clippy::too_many_arguments)]
fn train_ranks<C, D>(
    args: &Args,
    cfg: &ZeroConfig,
    shape: &lm::Shape,
    text: &[u8],
    held_out: &[u8],
    comms: Vec<C>,
    device: impl Fn() -> Result<D, String> + Sync,
) -> Result<RankResult, String>
where
    C: Communicator,
    D: zero_runtime::Device<Buffer = C::Buffer>,
{
    let world = comms.first().map_or(1, |c| c.world_size());
    let tokens_per_step =
        world * (cfg.micro_batch_per_rank * cfg.gradient_accumulation_steps) as usize;
    let pb = ProgressBar::new(args.steps as u64);
    pb.set_style(
        ProgressStyle::with_template("stage {prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    pb.set_prefix(cfg.zero.stage.to_string());
    let results: Vec<Result<RankResult, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let (pb, device) = (pb.clone(), &device);
                s.spawn(move || -> Result<RankResult, String> {
                    let rank = comm.rank();
                    let mut e: Engine<_, _> = Engine::new(cfg.clone(), shape.modules(), comm, device()?, |id, spec, v| shape.init(args.seed, id, spec, v))
                        .map_err(|e| e.to_string())?;
                    let mut first = 0;
                    if let Some(dir) = &args.resume {
                        let client = e
                            .load_checkpoint(dir, args.resume_tag.as_deref(), zero_runtime::LoadOptions::default())
                            .map_err(|e| format!("--resume {}: {e}", dir.display()))?;
                        first = client["data_step"].as_u64().unwrap_or(e.step_counts().2) as usize;
                        if rank == 0 {
                            pb.suspend(|| println!("resumed from {} at step {first}", dir.display()));
                        }
                        pb.set_position(first as u64);
                    }
                    let save = |e: &mut Engine<_, _>, step: usize| -> Result<(), String> {
                        let Some(dir) = &args.save_dir else { return Ok(()) };
                        let tag = e
                            .save_checkpoint(dir, None, json!({"data_step": step}))
                            .map_err(|e| format!("--save-dir {}: {e}", dir.display()))?;
                        if rank == 0 {
                            pb.suspend(|| println!("step {step}: saved checkpoint {}", dir.join(tag).display()));
                        }
                        Ok(())
                    };
                    let t0 = Instant::now();
                    let mut smooth = None::<f32>;
                    for step in first..args.steps {
                        let (loss, out) = lm::train_step(&mut e, shape, text, step).map_err(|e| format!("step {step}: {e}"))?;
                        if args.save_every > 0 && (step + 1) % args.save_every == 0 && step + 1 < args.steps {
                            save(&mut e, step + 1)?;
                        }
                        if rank == 0 {
                            let s = smooth.map_or(loss, |s| 0.95 * s + 0.05 * loss);
                            smooth = Some(s);
                            if out.skipped {
                                let what = match out.scale_change {
                                    ScaleChange::Lowered(a, b) => format!("loss scale {a} -> {b}"),
                                    ScaleChange::HysteresisLowered(h) => format!("loss scale kept at {}, hysteresis now {h}", out.loss_scale),
                                    _ => String::new(),
                                };
                                pb.println(format!("step {step}: gradient overflow, step skipped on every rank; {what}"));
                            }
                            let tok_s = ((step + 1 - first) * tokens_per_step) as f64 / t0.elapsed().as_secs_f64();
                            pb.set_message(format!("loss {s:.3} | {tok_s:.0} tok/s | scale {}", e.loss_scale()));
                            pb.inc(1);
                        }
                    }
                    let elapsed = t0.elapsed();
                    save(&mut e, args.steps)?;
                    let eval_loss = lm::evaluate(&mut e, shape, held_out, held_out.len()).map_err(|e| e.to_string())?;
                    Ok(RankResult {
                        eval_loss,
                        train_loss: smooth.unwrap_or(f32::NAN),
                        memory: e.memory_report(),
                        comm: e.comm_report(),
                        time: e.total_timings(),
                        skipped: e.step_counts().1,
                        loss_scale: e.loss_scale(),
                        elapsed,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    pb.finish_and_clear();
    let mut ok = Vec::new();
    for (rank, r) in results.into_iter().enumerate() {
        ok.push(r.map_err(|e| format!("rank {rank}: {e}"))?);
    }
    Ok(ok.swap_remove(0))
}

fn mib(b: usize) -> String {
    format!("{:.2} MiB", b as f64 / (1 << 20) as f64)
}

fn fmt_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn formula_name(stage: u8) -> &'static str {
    ["16Ψ", "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N", "16Ψ/N"][stage as usize]
}

fn report(cfg: &ZeroConfig, r: &RankResult, entropy: f64, world: usize) {
    let m = &r.memory;
    let stage = cfg.zero.stage;
    let precision = match cfg.precision {
        zero_runtime::Precision::Fp32 => "fp32".to_string(),
        zero_runtime::Precision::Bf16 => "bf16".to_string(),
        zero_runtime::Precision::Fp16(l) if l.loss_scale == 0.0 => {
            format!("fp16, dynamic loss scale from 2^{}", l.initial_scale_power)
        }
        zero_runtime::Precision::Fp16(l) => format!("fp16, static loss scale {}", l.loss_scale),
    };
    println!(
        "\n== stage {stage}, {world} ranks, {precision}: {:.1} s ==",
        r.elapsed.as_secs_f64()
    );
    println!(
        "memory per rank (Ψ = {} parameters, {} with alignment padding):",
        fmt_count(m.numel as u64),
        fmt_count(m.padded_numel as u64)
    );
    let offloaded = m.host.total() + m.nvme.total() > 0;
    if offloaded {
        println!(
            "  {:<18} {:>12} {:>12} {:>12}",
            "", "device", "host", "nvme"
        );
    }
    for (name, b, h, n) in [
        ("parameters", m.params, m.host.params, m.nvme.params),
        ("gradients", m.grads, 0, 0),
        ("fp32 master", m.master, m.host.master, m.nvme.master),
        ("fp32 exp_avg", m.exp_avg, m.host.exp_avg, m.nvme.exp_avg),
        (
            "fp32 exp_avg_sq",
            m.exp_avg_sq,
            m.host.exp_avg_sq,
            m.nvme.exp_avg_sq,
        ),
    ] {
        if offloaded {
            println!("  {name:<18} {:>12} {:>12} {:>12}", mib(b), mib(h), mib(n));
        } else {
            println!("  {name:<18} {:>12}", mib(b));
        }
    }
    let paper = if matches!(cfg.precision, zero_runtime::Precision::Fp32) {
        "paper (fp32: 4-byte params and grads)"
    } else {
        "paper"
    };
    if offloaded {
        let off = |t: &zero_runtime::TierBytes| t.params + t.master + t.exp_avg + t.exp_avg_sq;
        println!(
            "  {:<18} {:>12} {:>12} {:>12}   all tiers {} = {paper} {} = {}",
            "model states",
            mib(m.model_states()),
            mib(off(&m.host)),
            mib(off(&m.nvme)),
            mib(m.model_states_all_tiers()),
            formula_name(stage),
            mib(m.formula)
        );
        println!(
            "  {:<18} {:>12} {:>12} {:>12}   (host: staging of one chunk and the NVMe pipeline; nvme: block alignment)",
            "offload buffers",
            "",
            mib(m.host.buffers),
            mib(m.nvme.buffers)
        );
    } else {
        println!(
            "  {:<18} {:>12}   {paper} {} = {}",
            "model states",
            mib(m.model_states()),
            formula_name(stage),
            mib(m.formula)
        );
    }
    if stage == 3 && m.model_states() > m.formula {
        let extra = fmt_count((m.model_states() - m.formula) as u64);
        println!("  {:<18} {:>12}   bytes above the formula: parameters at or under stage3_param_persistence_threshold stay whole", "", format!("+{extra}"));
    }
    println!(
        "  {:<18} {:>12}   (gradient staging, stages 2-3)",
        "buckets",
        mib(m.buckets)
    );
    println!(
        "  {:<18} {:>12}   (stage 3 peak of gathered buckets)",
        "gathered, peak",
        mib(m.peak_gathered)
    );
    if m.grad_accum > 0 {
        println!(
            "  {:<18} {:>12}   (fp32 gradient accumulation)",
            "accumulation",
            mib(m.grad_accum)
        );
    }
    let c = &r.comm.last_step;
    println!(
        "elements sent per step per rank: {} (gradient reduction {} + parameter gather {}) vs theory {} = {}; norm/overflow exchange {}",
        fmt_count(c.grad_reduce + c.param_gather),
        fmt_count(c.grad_reduce),
        fmt_count(c.param_gather),
        r.comm.theory_formula,
        fmt_count(r.comm.theory),
        c.control
    );
    let sent = c.grad_reduce + c.param_gather;
    if stage == 3 && sent < r.comm.theory {
        println!(
            "  ({} fewer than theory: parameters at or under stage3_param_persistence_threshold stay whole and are gathered once per step, not twice per micro-step)",
            fmt_count(r.comm.theory - sent)
        );
    }
    let t = &r.time;
    println!(
        "time on rank 0: forward {:.2} s | backward {:.2} s | communication {:.2} s (reduce {:.2} + gather {:.2}) | optimizer step {:.2} s",
        t.forward.as_secs_f64(),
        t.backward.as_secs_f64(),
        (t.reduce + t.gather).as_secs_f64(),
        t.reduce.as_secs_f64(),
        t.gather.as_secs_f64(),
        t.step.as_secs_f64()
    );
    if r.skipped > 0 {
        println!(
            "skipped steps (overflow): {}; final loss scale {}",
            r.skipped, r.loss_scale
        );
    }
    println!(
        "final loss: {:.4} nats/char on held-out text (training, smoothed: {:.4}) | entropy rate {entropy:.4} | gap {:.4}",
        r.eval_loss,
        r.train_loss,
        r.eval_loss as f64 - entropy
    );
}

fn compare(results: &[(u8, RankResult)], entropy: f64, world: usize) {
    println!("\n== stages compared, {world} ranks, per rank ==");
    println!(
        "{:<6} {:>11} {:>15} {:>22} {:>16} {:>16}",
        "stage", "final loss", "model states", "paper formula", "elements/step", "theory"
    );
    for (stage, r) in results {
        println!(
            "{:<6} {:>11.5} {:>15} {:>22} {:>16} {:>16}",
            stage,
            r.eval_loss,
            mib(r.memory.model_states()),
            format!("{} = {}", formula_name(*stage), mib(r.memory.formula)),
            fmt_count(r.comm.last_step.grad_reduce + r.comm.last_step.param_gather),
            fmt_count(r.comm.theory)
        );
    }
    let first = results[0].1.eval_loss;
    if results
        .iter()
        .all(|(_, r)| r.eval_loss.to_bits() == first.to_bits())
    {
        println!("final losses agree to the bit across stages (entropy rate {entropy:.4})");
    } else {
        let spread = results
            .iter()
            .map(|(_, r)| (r.eval_loss - first).abs())
            .fold(0.0, f32::max);
        println!("final losses differ across stages by up to {spread:.2e} (accumulation > 1 changes where gradients are rounded)");
    }
}
