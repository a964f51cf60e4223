//! The `scheduler` section.

use super::json::{Auto, Obj};
use super::keys::Section;
use super::optimizer_keys::{PARAMS, TYPE};
use super::scheduler_keys::{
    COS_MIN_RATIO, SCHEDULER_SECTION, TOTAL_NUM_STEPS, WARMUP_COSINE_LR_PARAMS,
    WARMUP_DECAY_LR_PARAMS, WARMUP_LR_PARAMS, WARMUP_MAX_LR, WARMUP_MIN_LR, WARMUP_MIN_RATIO,
    WARMUP_NUM_STEPS, WARMUP_TYPE,
};
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
    let s = &SCHEDULER_SECTION;
    let Some(v) = top.get(s.path) else {
        return Ok(None);
    };
    let o = Obj::new(s.path, v, &s.known(), &s.unsupported())?;
    let ty = o
        .str(TYPE.name)?
        .ok_or_else(|| o.invalid(TYPE.name, "missing"))?;
    let empty = json!({});
    let params = o.get(PARAMS.name).unwrap_or(&empty);
    let params_of = |t: &Section| Obj::new(t.path, params, &t.known(), &t.unsupported());
    let warmup_of = |p: &Obj| -> Result<WarmupType, ConfigError> {
        match p.str(WARMUP_TYPE.name)? {
            None | Some("log") | Some("auto") => Ok(WarmupType::Log),
            Some("linear") => Ok(WarmupType::Linear),
            Some(other) => Err(p.invalid(
                WARMUP_TYPE.name,
                &format!("`{other}`: expected \"log\" or \"linear\""),
            )),
        }
    };
    let total_of = |p: &Obj| -> Result<u64, ConfigError> {
        match p.count(TOTAL_NUM_STEPS.name)? {
            Some(Auto::Value(v)) => Ok(v),
            Some(Auto::Auto) => Err(p.invalid(
                TOTAL_NUM_STEPS.name,
                "\"auto\" has no default here: set the number of training steps",
            )),
            None => Err(p.invalid(TOTAL_NUM_STEPS.name, "missing: required by this scheduler")),
        }
    };
    let steps_of = |p: &Obj| -> Result<u64, ConfigError> {
        Ok(
            p.count_or(WARMUP_NUM_STEPS.name, const { WARMUP_NUM_STEPS.count() })?
                .max(2),
        )
    };
    let min_lr_of = |p: &Obj| p.f64_or(WARMUP_MIN_LR.name, const { WARMUP_MIN_LR.float() });
    let max_lr_of = |p: &Obj| -> Result<Option<f64>, ConfigError> {
        Ok(p.number(WARMUP_MAX_LR.name)?.and_then(|v| match v {
            Auto::Value(v) => Some(v),
            Auto::Auto => None,
        }))
    };
    Ok(Some(match ty {
        "WarmupLR" => {
            let p = params_of(&WARMUP_LR_PARAMS)?;
            SchedulerConfig::WarmupLr {
                min_lr: min_lr_of(&p)?,
                max_lr: max_lr_of(&p)?,
                warmup_steps: steps_of(&p)?,
                warmup: warmup_of(&p)?,
            }
        }
        "WarmupDecayLR" => {
            let p = params_of(&WARMUP_DECAY_LR_PARAMS)?;
            SchedulerConfig::WarmupDecayLr {
                min_lr: min_lr_of(&p)?,
                max_lr: max_lr_of(&p)?,
                warmup_steps: steps_of(&p)?,
                warmup: warmup_of(&p)?,
                total_steps: total_of(&p)?,
            }
        }
        "WarmupCosineLR" => {
            let p = params_of(&WARMUP_COSINE_LR_PARAMS)?;
            SchedulerConfig::WarmupCosineLr {
                warmup_min_ratio: p
                    .f64_or(WARMUP_MIN_RATIO.name, const { WARMUP_MIN_RATIO.float() })?,
                warmup_steps: steps_of(&p)?,
                cos_min_ratio: p.f64_or(COS_MIN_RATIO.name, const { COS_MIN_RATIO.float() })?,
                warmup: warmup_of(&p)?,
                total_steps: total_of(&p)?,
            }
        }
        other => {
            return Err(ConfigError::Unsupported {
                key: o.path(TYPE.name),
                reason: format!(
                    "`{other}`: zero implements WarmupLR, WarmupDecayLR and WarmupCosineLR"
                ),
            })
        }
    }))
}
