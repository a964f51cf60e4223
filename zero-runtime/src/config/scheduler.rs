//! The `scheduler` section.

use super::json::{Auto, Obj};
use super::ConfigError;
use serde_json::json;

/// Warm-up shape of a DeepSpeed LR schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmupType {
    /// `"log"` (DeepSpeed's default).
    Log,
    /// `"linear"`.
    Linear,
}

/// The `scheduler` section.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SchedulerConfig {
    /// `WarmupLR`.
    WarmupLr {
        /// `warmup_min_lr`.
        min_lr: f64,
        /// `warmup_max_lr`; `None` (absent or `"auto"`): each parameter group's own `lr`,
        /// as DeepSpeed's schedulers take it.
        max_lr: Option<f64>,
        /// `warmup_num_steps` (at least 2, as DeepSpeed forces).
        warmup_steps: u64,
        /// `warmup_type`.
        warmup: WarmupType,
    },
    /// `WarmupDecayLR`: `WarmupLR`, then linear decay to 0 at `total_num_steps`.
    WarmupDecayLr {
        /// `warmup_min_lr`.
        min_lr: f64,
        /// `warmup_max_lr`; `None` (absent or `"auto"`): each parameter group's own `lr`,
        /// as DeepSpeed's schedulers take it.
        max_lr: Option<f64>,
        /// `warmup_num_steps`.
        warmup_steps: u64,
        /// `warmup_type`.
        warmup: WarmupType,
        /// `total_num_steps`.
        total_steps: u64,
    },
    /// `WarmupCosineLR`: ratios of the optimizer's `lr`.
    WarmupCosineLr {
        /// `warmup_min_ratio`.
        warmup_min_ratio: f64,
        /// `warmup_num_steps`.
        warmup_steps: u64,
        /// `cos_min_ratio`.
        cos_min_ratio: f64,
        /// `warmup_type`.
        warmup: WarmupType,
        /// `total_num_steps`.
        total_steps: u64,
    },
}

pub(super) fn scheduler(top: &Obj) -> Result<Option<SchedulerConfig>, ConfigError> {
    let Some(v) = top.get("scheduler") else {
        return Ok(None);
    };
    let o = Obj::new("scheduler", v, &["type", "params"], &[])?;
    let ty = o.str("type")?.ok_or_else(|| o.invalid("type", "missing"))?;
    let empty = json!({});
    let params = o.get("params").unwrap_or(&empty);
    let common = [
        "warmup_min_lr",
        "warmup_max_lr",
        "warmup_num_steps",
        "warmup_type",
        "last_batch_iteration",
    ];
    let warmup_of = |p: &Obj| -> Result<WarmupType, ConfigError> {
        match p.str("warmup_type")? {
            None | Some("log") | Some("auto") => Ok(WarmupType::Log),
            Some("linear") => Ok(WarmupType::Linear),
            Some(other) => Err(p.invalid(
                "warmup_type",
                &format!("`{other}`: expected \"log\" or \"linear\""),
            )),
        }
    };
    let total_of = |p: &Obj| -> Result<u64, ConfigError> {
        match p.count("total_num_steps")? {
            Some(Auto::Value(v)) => Ok(v),
            Some(Auto::Auto) => Err(p.invalid(
                "total_num_steps",
                "\"auto\" has no default here: set the number of training steps",
            )),
            None => Err(p.invalid("total_num_steps", "missing: required by this scheduler")),
        }
    };
    let steps_of =
        |p: &Obj| -> Result<u64, ConfigError> { Ok(p.count_or("warmup_num_steps", 1000)?.max(2)) };
    Ok(Some(match ty {
        "WarmupLR" => {
            let p = Obj::new("scheduler.params", params, &common, &[])?;
            SchedulerConfig::WarmupLr {
                min_lr: p.f64_or("warmup_min_lr", 0.0)?,
                max_lr: p.number("warmup_max_lr")?.and_then(|v| match v {
                    Auto::Value(v) => Some(v),
                    Auto::Auto => None,
                }),
                warmup_steps: steps_of(&p)?,
                warmup: warmup_of(&p)?,
            }
        }
        "WarmupDecayLR" => {
            let keys: Vec<&str> = common.iter().copied().chain(["total_num_steps"]).collect();
            let p = Obj::new("scheduler.params", params, &keys, &[])?;
            SchedulerConfig::WarmupDecayLr {
                min_lr: p.f64_or("warmup_min_lr", 0.0)?,
                max_lr: p.number("warmup_max_lr")?.and_then(|v| match v {
                    Auto::Value(v) => Some(v),
                    Auto::Auto => None,
                }),
                warmup_steps: steps_of(&p)?,
                warmup: warmup_of(&p)?,
                total_steps: total_of(&p)?,
            }
        }
        "WarmupCosineLR" => {
            let keys = [
                "total_num_steps",
                "warmup_min_ratio",
                "warmup_num_steps",
                "cos_min_ratio",
                "warmup_type",
                "last_batch_iteration",
            ];
            let p = Obj::new("scheduler.params", params, &keys, &[])?;
            SchedulerConfig::WarmupCosineLr {
                warmup_min_ratio: p.f64_or("warmup_min_ratio", 0.0)?,
                warmup_steps: steps_of(&p)?,
                cos_min_ratio: p.f64_or("cos_min_ratio", 0.0001)?,
                warmup: warmup_of(&p)?,
                total_steps: total_of(&p)?,
            }
        }
        other => {
            return Err(ConfigError::Unsupported {
                key: "scheduler.type".into(),
                reason: format!(
                    "`{other}`: zero implements WarmupLR, WarmupDecayLR and WarmupCosineLR"
                ),
            })
        }
    }))
}
