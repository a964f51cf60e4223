//! What the training examples print: the memory table against the paper's formulas, the
//! communication table against theory, the time split and the final loss against the
//! entropy rate. Shared by this example and zero-candle's GPT example.

use indicatif::{ProgressBar, ProgressStyle};
use std::thread::ScopedJoinHandle;
use std::time::Duration;
use zero_runtime::{CommReport, MemoryReport, Timings, ZeroConfig};

/// The progress bar of a training run of `steps` steps at ZeRO `stage` (rank 0 advances it).
pub fn progress_bar(steps: usize, stage: u8, visible: bool) -> Result<ProgressBar, String> {
    if !visible {
        return Ok(ProgressBar::hidden());
    }
    let pb = ProgressBar::new(steps as u64);
    pb.set_style(
        ProgressStyle::with_template("stage {prefix} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    pb.set_prefix(stage.to_string());
    Ok(pb)
}

/// Joins the threads of this process's ranks (`first`, `first + 1`, …) and returns the
/// first one's result (rank 0's in-process), or the first failing rank's error, named.
pub fn rank_zero<T>(
    handles: Vec<ScopedJoinHandle<'_, Result<T, String>>>,
    first: usize,
) -> Result<T, String> {
    let results: Vec<Result<T, String>> = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
        .collect();
    let mut ok = Vec::with_capacity(results.len());
    for (i, r) in results.into_iter().enumerate() {
        ok.push(r.map_err(|e| format!("rank {}: {e}", first + i))?);
    }
    Ok(ok.swap_remove(0))
}

/// What one rank measured.
pub struct RankResult {
    pub eval_loss: f32,
    pub train_loss: f32,
    pub memory: MemoryReport,
    pub comm: CommReport,
    pub time: Timings,
    pub skipped: u64,
    pub loss_scale: f64,
    pub elapsed: Duration,
}

pub fn mib(b: usize) -> String {
    format!("{:.2} MiB", b as f64 / (1 << 20) as f64)
}

pub fn fmt_count(n: u64) -> String {
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

pub fn formula_name(stage: u8) -> &'static str {
    ["16Ψ", "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N", "16Ψ/N"][stage as usize]
}

pub fn report(cfg: &ZeroConfig, r: &RankResult, entropy: f64, world: usize) {
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
        ("gradients", m.grads, m.host.grads, 0),
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
        let off =
            |t: &zero_runtime::TierBytes| t.params + t.grads + t.master + t.exp_avg + t.exp_avg_sq;
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
    if cfg.ranks_per_node.is_some_and(|g| g < world) {
        // More than one node: what stayed inside a node and what crossed (docs/SCALING.md).
        let t = &r.comm.last_step_tiers;
        println!(
            "  by tier: inside a node {} (theory {}), across nodes {} (theory {})",
            fmt_count(t.intra_node.grad_reduce + t.intra_node.param_gather),
            fmt_count(r.comm.theory_intra_node),
            fmt_count(t.inter_node.grad_reduce + t.inter_node.param_gather),
            fmt_count(r.comm.theory_inter_node)
        );
    }
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
    // Runs that agree to the bit print the same line, in-process or one process per rank.
    println!(
        "final loss bits: {:#010x} held-out, {:#010x} training",
        r.eval_loss.to_bits(),
        r.train_loss.to_bits()
    );
}

pub fn compare(results: &[(u8, RankResult)], entropy: f64, world: usize) {
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
