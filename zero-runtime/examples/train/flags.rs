//! The training examples' config flags: a DeepSpeed config file (or a built-in one) and
//! the flags that override its keys, each override said out loud. Shared by this example
//! and zero-candle's GPT example.

use clap::ValueEnum;
use serde_json::{json, Value};
use std::path::PathBuf;

/// `--precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    Fp32,
    Fp16,
    Bf16,
}

/// `--offload-optimizer` / `--offload-param`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OffloadArg {
    None,
    Cpu,
    Nvme,
}

/// The flags that set config keys.
#[derive(Debug, clap::Args)]
pub struct ConfigFlags {
    /// ZeRO stage 0-3 (default 3, or the config's).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub stage: Option<u8>,
    /// Optimizer steps (default: the example's).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Parameter and gradient precision (default bf16, or the config's).
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionArg>,
    /// A DeepSpeed config (ds_config.json); flags override its keys.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run stages 0-3 back to back on the same seed and compare them.
    #[arg(long)]
    pub compare_stages: bool,
    /// Offload the optimizer state (ZeRO-Offload: cpu; ZeRO-Infinity: nvme, with
    /// --nvme-path); overrides zero_optimization.offload_optimizer.device.
    #[arg(long, value_enum)]
    pub offload_optimizer: Option<OffloadArg>,
    /// Offload stage 3's parameter partitions (cpu or nvme); overrides
    /// zero_optimization.offload_param.device.
    #[arg(long, value_enum)]
    pub offload_param: Option<OffloadArg>,
    /// The folder NVMe offload puts its swap files in (sets both nvme_path keys).
    #[arg(long)]
    pub nvme_path: Option<PathBuf>,
}

impl ConfigFlags {
    /// The config `--config` names, or `default`, with where it came from.
    pub fn base_config(&self, default: &str) -> Result<(Value, String), String> {
        Ok(match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let v: Value = serde_json::from_str(&text)
                    .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
                (v, path.display().to_string())
            }
            None => (
                serde_json::from_str(default).map_err(|e| e.to_string())?,
                "the built-in config".to_string(),
            ),
        })
    }

    /// The stages to run: 0-3 with `--compare-stages`, else `--stage` (or the config's).
    pub fn stages(&self) -> Vec<Option<u8>> {
        if self.compare_stages {
            (0..=3).map(Some).collect()
        } else {
            vec![self.stage]
        }
    }
}

/// The optimizer the examples pass in code when the config names none, as a DeepSpeed
/// script passes `torch.optim.AdamW(...)` to `deepspeed.initialize`.
pub const CODE_OPTIMIZER: &str =
    r#"{"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.98], "weight_decay": 0.0}}"#;

/// Applies the flags to the config, returning what each changed.
pub fn overrides(
    mut v: Value,
    args: &ConfigFlags,
    stage_flag: Option<u8>,
    steps: usize,
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
    if v.get("optimizer").is_none() {
        v["optimizer"] = serde_json::from_str(CODE_OPTIMIZER).unwrap_or(Value::Null);
        said.push(format!(
            "no optimizer section in {origin}: the example passes its own in code, {CODE_OPTIMIZER} (DeepSpeed, like zero, trains only with an optimizer, from the config or passed in code)"
        ));
    }
    if v.pointer("/scheduler/params/total_num_steps") == Some(&json!("auto")) {
        v["scheduler"]["params"]["total_num_steps"] = json!(steps);
        said.push(format!(
            "--steps {} resolves scheduler.params.total_num_steps = \"auto\"",
            steps
        ));
    }
    (v, said)
}
