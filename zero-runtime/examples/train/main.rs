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

mod flags;
mod lm;
mod ranks;
mod report;

use clap::{Parser, ValueEnum};
use flags::ConfigFlags;
use ranks::Ranks;
use report::RankResult;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use zero_comm::nccl::NcclComm;
use zero_comm::{Communicator, DeviceGroup, HostGroup};
use zero_runtime::scaler::ScaleChange;
use zero_runtime::{CudaDevice, Engine, HostDevice, ZeroConfig};

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
    #[command(flatten)]
    flags: ConfigFlags,
    /// In-process ranks.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Seed of the text source, the data and the initial weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where to train.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
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

impl Args {
    fn steps(&self) -> usize {
        self.flags.steps.unwrap_or(1200)
    }
}

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
    // NCCL with --device cuda, else over shared memory.
    let ranks = Ranks::from_args(args.ranks, args.local_rank)?;
    if args.flags.compare_stages && (args.save_dir.is_some() || args.resume.is_some()) {
        return Err("--compare-stages runs four separate trainings: it does not take --save-dir or --resume".into());
    }
    let world = ranks.world();
    let leader = ranks.leader();
    // Only rank 0 of a launched job prints.
    let say = |line: String| {
        if leader {
            println!("{line}");
        }
    };
    let (base, origin) = args.flags.base_config(DEFAULT_CONFIG)?;
    let source = lm::Source::new(args.seed, 16);
    let shape = lm::Shape {
        vocab: 16,
        context: 8,
        embed: 32,
        hidden: args.hidden,
    };
    let entropy = source.entropy_rate();
    say(format!(
        "zero training example: char-level MLP LM ({} parameters), order-2 Markov text over {} letters (entropy rate {entropy:.4} nats/char), {world} ranks {}",
        report::fmt_count(shape.numel() as u64),
        source.vocab,
        ranks.how(),
    ));
    let stages = args.flags.stages();
    let mut results = Vec::new();
    for stage in stages {
        let (value, said) =
            flags::overrides(base.clone(), &args.flags, stage, args.steps(), &origin);
        for line in said {
            say(format!("  {line}"));
        }
        let mut cfg = ZeroConfig::from_json(&value, world).map_err(|e| format!("config: {e}"))?;
        if let Ranks::Launched(env) = &ranks {
            // Nodes as the launcher lays them out (shard groups and hpZ cut by them), as
            // zero_torch reads them.
            cfg.ranks_per_node = env.local_world_size;
        }
        for note in &cfg.notes {
            say(format!("  note: {note}"));
        }
        let r = train(args, &cfg, &source, &shape, &ranks)?;
        if leader {
            report::report(&cfg, &r, entropy, world);
        }
        results.push((cfg.zero.stage, r));
    }
    if args.flags.compare_stages && leader {
        report::compare(&results, entropy, world);
    }
    Ok(())
}

fn train(
    args: &Args,
    cfg: &ZeroConfig,
    source: &lm::Source,
    shape: &lm::Shape,
    ranks: &Ranks,
) -> Result<RankResult, String> {
    let world = ranks.world();
    let tokens_per_step =
        world * (cfg.micro_batch_per_rank * cfg.gradient_accumulation_steps) as usize;
    let text = source.sample(
        args.seed,
        args.steps() * tokens_per_step + shape.context + 1,
    );
    let held_out = source.sample(args.seed ^ 0xe7a1, 8192 + shape.context);
    let timeout = Duration::from_secs(300);
    let leader = ranks.leader();
    match (ranks, args.device) {
        (Ranks::Launched(env), DeviceArg::Cuda) => {
            let comm = NcclComm::init(env, timeout).map_err(|e| format!("NCCL: {e}"))?;
            train_ranks(
                args,
                cfg,
                shape,
                &text,
                &held_out,
                vec![comm],
                leader,
                || CudaDevice::new().map_err(|e| format!("--device cuda: {e}")),
            )
        }
        (Ranks::Launched(env), DeviceArg::Cpu) => {
            let comms = Ranks::shm(env, timeout)?;
            train_ranks(args, cfg, shape, &text, &held_out, comms, leader, || {
                Ok(HostDevice)
            })
        }
        (Ranks::Threads(n), DeviceArg::Cpu) => {
            let comms = HostGroup::with_timeout(*n, timeout).map_err(|e| e.to_string())?;
            train_ranks(args, cfg, shape, &text, &held_out, comms, leader, || {
                Ok(HostDevice)
            })
        }
        (Ranks::Threads(n), DeviceArg::Cuda) => {
            // Ranks as threads sharing the one GPU (NCCL takes one process per GPU).
            let comms = DeviceGroup::with_timeout(*n, timeout)
                .map_err(|e| format!("--device cuda: {e}"))?;
            train_ranks(args, cfg, shape, &text, &held_out, comms, leader, || {
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
    leader: bool,
    device: impl Fn() -> Result<D, String> + Sync,
) -> Result<RankResult, String>
where
    C: Communicator,
    D: zero_runtime::Device<Buffer = C::Buffer>,
{
    let world = comms.first().map_or(1, |c| c.world_size());
    let first = comms.first().map_or(0, |c| c.rank());
    let tokens_per_step =
        world * (cfg.micro_batch_per_rank * cfg.gradient_accumulation_steps) as usize;
    let pb = report::progress_bar(args.steps(), cfg.zero.stage, leader)?;
    let result = std::thread::scope(|s| {
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
                    for step in first..args.steps() {
                        let (loss, out) = lm::train_step(&mut e, shape, text, step).map_err(|e| format!("step {step}: {e}"))?;
                        if args.save_every > 0 && (step + 1) % args.save_every == 0 && step + 1 < args.steps() {
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
                    save(&mut e, args.steps())?;
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
        report::rank_zero(handles, first)
    });
    pb.finish_and_clear();
    result
}
