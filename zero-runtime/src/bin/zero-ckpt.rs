//! `zero-ckpt`: inspect a zero checkpoint and export it as Hugging Face safetensors — the
//! `zero_to_fp32.py` of this project, without Python, a second copy of the model in memory,
//! or the original world size.
//!
//! ```sh
//! zero-ckpt inspect CKPT_DIR [--tag TAG]
//! zero-ckpt to-safetensors CKPT_DIR OUT_DIR [--tag TAG] [--dtype fp32|fp16|bf16|model] [--max-shard-size 5GB]
//! ```

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zero_runtime::checkpoint::export::{export_safetensors, parse_dtype_arg, parse_size};
use zero_runtime::checkpoint::CheckpointDir;
use zero_runtime::io::{RangeReader, DEFAULT_BUFFER};

/// Inspect and export zero checkpoints.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a checkpoint's tag, stage, world size, dtypes and sizes, and verify every
    /// file's checksums.
    Inspect {
        /// The folder given to save_checkpoint.
        dir: PathBuf,
        /// The tag (default: the one `latest` names).
        #[arg(long)]
        tag: Option<String>,
    },
    /// Write the weights as model-0000k-of-0000n.safetensors + model.safetensors.index.json,
    /// one parameter at a time (memory: the largest tensor plus the I/O buffers).
    ToSafetensors {
        /// The folder given to save_checkpoint.
        dir: PathBuf,
        /// Where to write the safetensors files.
        out: PathBuf,
        /// The tag (default: the one `latest` names).
        #[arg(long)]
        tag: Option<String>,
        /// fp32 (the master weights as saved), fp16, bf16, or `model` (the run's 16-bit
        /// dtype).
        #[arg(long, default_value = "fp32")]
        dtype: String,
        /// Most bytes per shard (Hugging Face's default: 5GB).
        #[arg(long, default_value = "5GB")]
        max_shard_size: String,
        /// The write buffer (the most memory held for writing).
        #[arg(long, default_value = "64MiB")]
        io_buffer: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect { dir, tag } => inspect(&dir, tag.as_deref()),
        Command::ToSafetensors {
            dir,
            out,
            tag,
            dtype,
            max_shard_size,
            io_buffer,
        } => to_safetensors(
            &dir,
            &out,
            tag.as_deref(),
            &dtype,
            &max_shard_size,
            &io_buffer,
        ),
    };
    if std::env::var_os("ZERO_CKPT_REPORT_PEAK_RSS").is_some() {
        if let Some(kb) = peak_rss_kb() {
            eprintln!("peak RSS: {kb} kB");
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `VmHWM` of this process, from /proc.
fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn inspect(dir: &Path, tag: Option<&str>) -> Result<(), String> {
    let mut ckpt = CheckpointDir::open(dir, tag).map_err(|e| e.to_string())?;
    let m = ckpt.manifest.clone();
    let trainable: usize = m
        .params
        .iter()
        .filter(|p| p.trainable)
        .map(|p| p.numel())
        .sum();
    let frozen: usize = m
        .params
        .iter()
        .filter(|p| !p.trainable)
        .map(|p| p.numel())
        .sum();
    println!("checkpoint {} ({})", m.tag, ckpt.path.display());
    println!(
        "  saved at ZeRO stage {}, world size {}, {} (parameters {}, optimizer state {})",
        m.stage, m.world_size, m.precision, m.dtype, m.master_dtype
    );
    println!(
        "  steps: {} optimizer, {} skipped, {} in all; loss scale {}; LR schedule at iteration {}",
        m.steps.optimizer,
        m.steps.skipped,
        m.steps.global,
        m.loss_scaler.scale,
        m.lr_last_batch_iteration
    );
    println!(
        "  {} parameters: {trainable} trained elements, {frozen} frozen",
        m.params.len()
    );
    let total: u64 = m.files.iter().map(|f| f.bytes).sum();
    println!("  {} files, {}", m.files.len(), human(total));
    let mut bad = Vec::new();
    for f in &m.files {
        let path = ckpt.path.join(&f.name);
        let chunks = match f.kind {
            zero_runtime::checkpoint::format::FileKind::Index => None,
            _ => match ckpt.rank_index(f.rank) {
                Ok(idx) => idx
                    .files
                    .iter()
                    .find(|x| x.entry.name == f.name)
                    .map(|x| x.chunk_crc32c.clone()),
                Err(e) => {
                    bad.push(e.to_string());
                    continue;
                }
            },
        };
        let verdict = verify(&path, f.bytes, f.crc32c, chunks);
        match &verdict {
            Ok(()) => println!("  ok   {:>12}  {}", human(f.bytes), f.name),
            Err(e) => {
                println!("  BAD  {:>12}  {}: {e}", human(f.bytes), f.name);
                bad.push(e.clone());
            }
        }
    }
    if bad.is_empty() {
        println!("every checksum verified");
        Ok(())
    } else {
        Err(format!(
            "{} file(s) failed verification: {}",
            bad.len(),
            bad.join("; ")
        ))
    }
}

/// Reads the whole file once: every chunk against the index, and the whole against the
/// manifest.
fn verify(path: &Path, bytes: u64, crc: u32, chunks: Option<Vec<u32>>) -> Result<(), String> {
    let mut r =
        RangeReader::open(path, bytes, chunks, DEFAULT_BUFFER).map_err(|e| e.to_string())?;
    let mut whole = 0u32;
    r.read(0, bytes, |_, b| {
        whole = crc32c::crc32c_append(whole, b);
        Ok::<(), zero_runtime::io::IoError>(())
    })
    .map_err(|e| e.to_string())?;
    if whole != crc {
        return Err(format!(
            "{}: crc32c {whole:08x}, the manifest says {crc:08x}",
            path.display()
        ));
    }
    Ok(())
}

fn to_safetensors(
    dir: &Path,
    out: &Path,
    tag: Option<&str>,
    dtype: &str,
    max_shard: &str,
    io_buffer: &str,
) -> Result<(), String> {
    let buffer = parse_size(io_buffer)
        .ok_or_else(|| format!("--io-buffer {io_buffer}: expected a size such as 64MiB"))?
        as usize;
    // Readers hold little: one fragment's chunks at a time.
    let mut ckpt = CheckpointDir::open(dir, tag)
        .map_err(|e| e.to_string())?
        .with_buffer(4 << 20);
    let dtype = if dtype == "model" {
        ckpt.manifest.dtype()
    } else {
        parse_dtype_arg(dtype)
            .ok_or_else(|| format!("--dtype {dtype}: expected fp32, fp16, bf16 or model"))?
    };
    let max = parse_size(max_shard).ok_or_else(|| {
        format!("--max-shard-size {max_shard}: expected a size such as 5GB or 500MB")
    })?;
    let files =
        export_safetensors(&mut ckpt, out, dtype, max, buffer).map_err(|e| e.to_string())?;
    for f in &files {
        println!("wrote {} ({})", f.path.display(), human(f.bytes));
    }
    println!(
        "{} parameters of {} (tag {}) as {}",
        ckpt.manifest.params.len(),
        dir.display(),
        ckpt.tag,
        zero_runtime::checkpoint::export::dtype_label(dtype)
    );
    Ok(())
}
