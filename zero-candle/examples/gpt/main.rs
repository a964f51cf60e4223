//! The main job: a small GPT, written with candle-nn, trained through zero-candle with
//! ZeRO on CPU ranks: threads of one process, or one process per rank under a launcher.
//!
//! ```sh
//! cargo run --release --example gpt                      # stage 3, 4 ranks, bf16
//! cargo run --release --example gpt -- --compare-stages  # stages 0-3 side by side
//! cargo run --release --example gpt -- --stage 2 --ranks 2 --precision fp32
//! cargo run --release --example gpt -- --config ds_config.json --steps 200
//! torchrun --no-python --nproc-per-node 4 target/release/examples/gpt   # 4 processes
//! ```

#[path = "../../../zero-runtime/examples/train/flags.rs"]
mod flags;
#[path = "../../../zero-runtime/examples/train/ranks.rs"]
mod ranks;
#[path = "../../../zero-runtime/examples/train/report.rs"]
mod report;
#[path = "../../../zero-runtime/examples/train/source.rs"]
mod source;

use candle_core::{Device, Tensor};
use clap::Parser;
use flags::ConfigFlags;
use ranks::Ranks;
use report::RankResult;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use zero_candle::gpt::{self, Gpt, GptConfig};
use zero_candle::{Options, ZeroCandle};
use zero_comm::{Communicator, HostBuffer, HostGroup};
use zero_runtime::{HostDevice, ZeroConfig};

/// Train a small GPT (candle-nn) on text from a random Markov chain through zero-candle,
/// and show what ZeRO saves.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    flags: ConfigFlags,
    /// In-process ranks (under a launcher: one rank per process instead).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// The local rank, as the deepspeed launcher passes it (`--local_rank=N`); it must
    /// agree with the launcher's environment.
    #[arg(long = "local_rank", alias = "local-rank")]
    local_rank: Option<usize>,
    /// Seed of the text source, the data and the initial weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Width of the residual stream (4 heads, 4 blocks).
    #[arg(long, default_value_t = 160)]
    dim: usize,
}

const DEFAULT_CONFIG: &str = r#"{
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.98], "weight_decay": 0.0}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 30, "warmup_type": "linear", "cos_min_ratio": 0.05}},
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1e5, "stage3_prefetch_bucket_size": 2e5, "stage3_param_persistence_threshold": 1e3, "stage3_max_reuse_distance": 0}
}"#;

/// Optimizer steps of the default run (4 ranks, 256 letters a step: 256K letters).
const DEFAULT_STEPS: usize = 1000;

/// Held-out sequences for the final loss.
const EVAL_SEQUENCES: usize = 512;

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

/// The architecture and the data caches of CPU 0 as Linux describes them (`x86_64, L1d
/// 48K 12-way, L2 2048K 16-way, ...`; `unknown` caches elsewhere). candle's CPU matrix
/// products (gemm) size their blocks from these, which sets the order of their sums: two
/// machines with other caches end in other bits.
fn cpu_caches() -> String {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |i: usize, f: &str| {
        std::fs::read_to_string(dir.join(format!("index{i}/{f}")))
            .map(|s| s.trim().to_string())
            .ok()
    };
    let mut out = vec![std::env::consts::ARCH.to_string()];
    for i in 0..8 {
        let (Some(level), Some(kind), Some(size)) =
            (read(i, "level"), read(i, "type"), read(i, "size"))
        else {
            continue;
        };
        if kind == "Instruction" {
            continue;
        }
        let d = if kind == "Data" { "d" } else { "" };
        let ways = read(i, "ways_of_associativity").unwrap_or_else(|| "?".into());
        out.push(format!("L{level}{d} {size} {ways}-way"));
    }
    if out.len() == 1 {
        out.push("unknown".into());
    }
    out.join(", ")
}

fn run(args: &Args) -> Result<(), String> {
    let ranks = Ranks::from_args(args.ranks, args.local_rank)?;
    let (world, leader) = (ranks.world(), ranks.leader());
    let say = |line: String| {
        if leader {
            println!("{line}");
        }
    };
    // Give each rank's candle ops a share of the cores instead of letting every rank's
    // matmuls use all of them (the same share in-process and one process per rank).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let share = (cores / world).max(1);
        std::env::set_var("RAYON_NUM_THREADS", share.to_string());
        say(format!("{cores} cores, {world} ranks: candle uses {share} thread(s) per rank (set RAYON_NUM_THREADS to choose)"));
    }
    say(format!(
        "CPU caches: {} (candle's matrix products block their sums by them: the final bits are this cache layout's)",
        cpu_caches()
    ));
    let (base, origin) = args.flags.base_config(DEFAULT_CONFIG)?;
    let source = source::Source::new(args.seed, 16);
    let model = GptConfig {
        dim: args.dim,
        ..GptConfig::example()
    };
    let entropy = source.entropy_rate();
    say(format!(
        "zero-candle example: GPT in candle-nn ({} parameters: {} blocks, width {}, {} heads, context {}), order-2 Markov text over {} letters (entropy rate {entropy:.4} nats/char), {world} ranks {how}",
        report::fmt_count(model.numel() as u64),
        model.blocks,
        model.dim,
        model.heads,
        model.context,
        source.vocab,
        how = ranks.how(),
    ));
    let steps = args.flags.steps.unwrap_or(DEFAULT_STEPS);
    let mut results = Vec::new();
    for stage in args.flags.stages() {
        let (value, said) = flags::overrides(base.clone(), &args.flags, stage, steps, &origin);
        for line in said {
            say(format!("  {line}"));
        }
        let cfg = ZeroConfig::from_json(&value, world).map_err(|e| format!("config: {e}"))?;
        for note in &cfg.notes {
            say(format!("  note: {note}"));
        }
        let timeout = Duration::from_secs(300);
        let data = Data::new(&cfg, &model, &source, steps, world, args.seed);
        let (r, candle) = match &ranks {
            Ranks::Threads(n) => {
                let comms = HostGroup::with_timeout(*n, timeout).map_err(|e| e.to_string())?;
                train(args, &cfg, &model, &data, steps, comms, leader)?
            }
            Ranks::Launched(env) => train(
                args,
                &cfg,
                &model,
                &data,
                steps,
                Ranks::shm(env, timeout)?,
                leader,
            )?,
        };
        if leader {
            report::report(&cfg, &r, entropy, world);
            println!(
                "parameters in candle storage on rank 0: peak {} while training, {} at rest (the whole model in f32: {})",
                report::mib(candle.peak),
                report::mib(candle.at_rest),
                report::mib(4 * model.numel())
            );
        }
        results.push((cfg.zero.stage, r));
    }
    if args.flags.compare_stages && leader {
        report::compare(&results, entropy, world);
    }
    Ok(())
}

/// The training and held-out text of a run.
struct Data {
    text: Vec<u8>,
    held_out: Vec<u8>,
}

impl Data {
    fn new(
        cfg: &ZeroConfig,
        model: &GptConfig,
        source: &source::Source,
        steps: usize,
        world: usize,
        seed: u64,
    ) -> Data {
        let per_step =
            world * cfg.micro_batch_per_rank as usize * cfg.gradient_accumulation_steps as usize;
        let t = model.context;
        Data {
            text: source.sample(seed, (steps * per_step + 1) * t + 1),
            held_out: source.sample(seed ^ 0xe7a1, (EVAL_SEQUENCES + 1) * t + 1),
        }
    }
}

/// Parameter bytes rank 0 held in candle storage.
struct CandleBytes {
    peak: usize,
    at_rest: usize,
}

/// The sequences of one micro-batch: `rows` sequences of `context + 1` letters starting
/// at sequence `first` of `text` (consecutive sequences overlap by one letter).
fn sequences(
    text: &[u8],
    first: usize,
    rows: usize,
    context: usize,
) -> candle_core::Result<(Tensor, Tensor)> {
    let mut ids = Vec::with_capacity(rows * context);
    let mut targets = Vec::with_capacity(rows * context);
    for i in 0..rows {
        let s = &text[(first + i) * context..(first + i) * context + context + 1];
        ids.extend(s[..context].iter().map(|&c| c as u32));
        targets.extend(s[1..].iter().map(|&c| c as u32));
    }
    Ok((
        Tensor::from_vec(ids, (rows, context), &Device::Cpu)?,
        Tensor::from_vec(targets, (rows, context), &Device::Cpu)?,
    ))
}

/// Trains one engine per communicator (every rank in-process, or this process's rank),
/// each in its own thread; returns the first one's result.
fn train<C: Communicator<Buffer = HostBuffer> + 'static>(
    args: &Args,
    cfg: &ZeroConfig,
    model: &GptConfig,
    data: &Data,
    steps: usize,
    comms: Vec<C>,
    leader: bool,
) -> Result<(RankResult, CandleBytes), String> {
    let world = comms.first().map_or(1, |c| c.world_size());
    let first_rank = comms.first().map_or(0, |c| c.rank());
    let micro = cfg.micro_batch_per_rank as usize;
    let accum = cfg.gradient_accumulation_steps as usize;
    let per_step = world * micro * accum;
    let t = model.context;
    let (text, held_out) = (&data.text, &data.held_out);
    let pb = report::progress_bar(steps, cfg.zero.stage, leader)?;
    let result = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let pb = pb.clone();
                s.spawn(move || -> Result<(RankResult, CandleBytes), String> {
                    let rank = comm.rank();
                    let options = Options {
                        grouping: GptConfig::grouping(),
                        seed: args.seed,
                        ..Default::default()
                    };
                    let (zc, parts) = ZeroCandle::new(cfg.clone(), comm, HostDevice, options, |vb| gpt::parts(model, vb))
                        .map_err(|e| e.to_string())?;
                    let gpt = Gpt::wrapped(&zc, parts).map_err(|e| e.to_string())?;
                    if rank == 0 {
                        for note in zc.notes().map_err(|e| e.to_string())? {
                            pb.suspend(|| println!("  note: {note}"));
                        }
                    }
                    let err = |step: usize| move |e: zero_candle::Error| format!("step {step}: {e}");
                    let cerr = |step: usize| move |e: candle_core::Error| format!("step {step}: {e}");
                    let (mut forward, mut backward) = (Duration::ZERO, Duration::ZERO);
                    let t0 = Instant::now();
                    let mut smooth = None::<f32>;
                    for step in 0..steps {
                        let mut loss_sum = 0.0;
                        for k in 0..accum {
                            let first = (step * accum + k) * world * micro + rank * micro;
                            let f0 = Instant::now();
                            let (ids, targets) = sequences(text, first, micro, t).map_err(cerr(step))?;
                            let loss = gpt.loss(&ids, &targets, 0).map_err(cerr(step))?;
                            loss_sum += loss.to_scalar::<f32>().map_err(cerr(step))?;
                            let b0 = Instant::now();
                            forward += b0 - f0;
                            zc.backward(&loss).map_err(err(step))?;
                            backward += b0.elapsed();
                        }
                        if step == 0 {
                            if let Some(m) = zc.missing_grads_message().map_err(err(step))?.filter(|_| rank == 0) {
                                pb.suspend(|| println!("warning: {m}"));
                            }
                        }
                        let out = zc.step().map_err(err(step))?;
                        if rank == 0 {
                            let loss = loss_sum / accum as f32;
                            let sm = smooth.map_or(loss, |s| 0.95 * s + 0.05 * loss);
                            smooth = Some(sm);
                            if out.skipped {
                                pb.suspend(|| println!("step {step}: gradient overflow, step skipped on every rank; loss scale now {}", out.loss_scale));
                            }
                            let tok_s = ((step + 1) * per_step * t) as f64 / t0.elapsed().as_secs_f64();
                            pb.set_message(format!("loss {sm:.3} | {tok_s:.0} tok/s"));
                            pb.inc(1);
                        }
                    }
                    let elapsed = t0.elapsed();
                    let (_, peak) = zc.candle_param_bytes().map_err(|e| e.to_string())?;
                    let eval_loss = evaluate(&gpt, held_out, t).map_err(|e| format!("evaluation: {e}"))?;
                    let (at_rest, _) = zc.candle_param_bytes().map_err(|e| e.to_string())?;
                    let (memory, comm, mut time, counts, loss_scale) = zc
                        .with_engine(|e| (e.memory_report(), e.comm_report(), e.total_timings(), e.step_counts(), e.loss_scale()))
                        .map_err(|e| e.to_string())?;
                    // The engine sees only the backward's end; candle's forward is timed here.
                    time.forward = forward;
                    time.backward = backward;
                    Ok((
                        RankResult {
                            eval_loss,
                            train_loss: smooth.unwrap_or(f32::NAN),
                            memory,
                            comm,
                            time,
                            skipped: counts.1,
                            loss_scale,
                            elapsed,
                        },
                        CandleBytes { peak, at_rest },
                    ))
                })
            })
            .collect();
        report::rank_zero(handles, first_rank)
    });
    pb.finish_and_clear();
    result
}

/// Mean loss (nats/char) on held-out text, over the positions that see both letters of
/// the order-2 context (the entropy rate is the best possible there).
fn evaluate(gpt: &Gpt, text: &[u8], context: usize) -> candle_core::Result<f32> {
    let chunk = 64;
    let mut total = 0.0;
    for c in 0..EVAL_SEQUENCES / chunk {
        let (ids, targets) = sequences(text, c * chunk, chunk, context)?;
        total += gpt.loss(&ids, &targets, 2)?.to_scalar::<f32>()?;
    }
    Ok(total / (EVAL_SEQUENCES / chunk) as f32)
}
