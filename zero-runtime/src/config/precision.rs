//! The `fp16`, `bf16` and `data_types` sections: the training precision, its loss
//! scaling, and the dtype gradients are summed in.

use super::json::Obj;
use super::keys::Section;
use super::precision_keys::{
    BF16_SECTION, CONSECUTIVE_HYSTERESIS, DATA_TYPES_SECTION, ENABLED, FP16_SECTION,
    GRAD_ACCUM_DTYPE, HYSTERESIS, INITIAL_SCALE_POWER, LOSS_SCALE, LOSS_SCALE_WINDOW,
    MIN_LOSS_SCALE, PARAM_DTYPE,
};
use super::ConfigError;

/// Training precision of parameters and gradients (master weights are always fp32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Precision {
    /// Everything fp32.
    Fp32,
    /// fp16 parameters and gradients with loss scaling.
    Fp16(LossScaleConfig),
    /// bf16 parameters and gradients, no loss scaling.
    Bf16,
}

impl Precision {
    /// The training dtype as DeepSpeed's configs name it: `fp32`, `fp16` or `bf16`.
    pub fn name(&self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16(_) => "fp16",
            Precision::Bf16 => "bf16",
        }
    }
}

/// `data_types.grad_accum_dtype`: what the gradients of a window's micro-steps are summed
/// in, before the optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradAccumDtype {
    /// The training dtype (DeepSpeed's default, the key absent or naming it): 16-bit
    /// gradients are summed in 16 bits, each addition rounded once, as torch adds into a
    /// 16-bit `.grad`; fp32 ones in fp32.
    Model,
    /// fp32 whatever the training dtype (`"fp32"` with fp16 or bf16): 4 more bytes per
    /// summed element, one rounding per window.
    Fp32,
}

/// The `fp16` section.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaleConfig {
    /// `loss_scale`: 0 means dynamic.
    pub loss_scale: f64,
    /// `initial_scale_power`: the dynamic scale starts at 2^this.
    pub initial_scale_power: u32,
    /// `loss_scale_window`: good steps before the scale doubles.
    pub loss_scale_window: u64,
    /// `hysteresis`: overflows tolerated before the scale halves.
    pub hysteresis: u64,
    /// `consecutive_hysteresis`: refill hysteresis on every good step.
    pub consecutive_hysteresis: bool,
    /// `min_loss_scale`.
    pub min_loss_scale: f64,
}

/// The `data_types` section: `grad_accum_dtype` (names as DeepSpeed's `DtypeEnum` takes
/// them) and `param_dtype` when it names the training dtype, as DeepSpeed requires.
pub(super) fn grad_accum_dtype(
    top: &Obj,
    precision: Precision,
) -> Result<GradAccumDtype, ConfigError> {
    let o = DATA_TYPES_SECTION.open(top)?;
    let training = precision.name();
    let parse = |key: &str| -> Result<Option<&'static str>, ConfigError> {
        let Some(v) = o.str(key)? else {
            return Ok(None);
        };
        let name = v.strip_prefix("torch.").unwrap_or(v);
        Ok(Some(match name {
            "fp32" | "float32" | "float" => "fp32",
            "fp16" | "float16" | "half" => "fp16",
            "bf16" | "bfloat16" => "bf16",
            _ => {
                return Err(o.invalid(
                    key,
                    &format!("`{v}`: expected fp32, fp16 or bf16 (or torch's names for them)"),
                ))
            }
        }))
    };
    if let Some(p) = parse(PARAM_DTYPE.name)? {
        if p != training {
            return Err(o.invalid(
                PARAM_DTYPE.name,
                &format!(
                    "`{p}` differs from the training dtype ({training}), as DeepSpeed refuses"
                ),
            ));
        }
    }
    match parse(GRAD_ACCUM_DTYPE.name)? {
        None => Ok(GradAccumDtype::Model),
        Some(a) if a == training => Ok(GradAccumDtype::Model),
        Some("fp32") => Ok(GradAccumDtype::Fp32),
        Some(a) => Err(ConfigError::Unsupported {
            key: o.path(GRAD_ACCUM_DTYPE.name),
            reason: format!(
                "`{a}` with {training} training: gradients are summed in the training dtype or in fp32"
            ),
        }),
    }
}

pub(super) fn precision(top: &Obj) -> Result<Precision, ConfigError> {
    let enabled = |s: &Section| -> Result<Option<Obj>, ConfigError> {
        match top.get(s.path) {
            None => Ok(None),
            Some(v) => {
                let o = Obj::new(s.path, v, &s.known(), &s.unsupported())?;
                Ok(o.bool_or(ENABLED.name, const { ENABLED.flag() })?
                    .then_some(o))
            }
        }
    };
    let fp16 = enabled(&FP16_SECTION)?;
    let bf16 = enabled(&BF16_SECTION)?;
    match (fp16, bf16) {
        (Some(_), Some(_)) => Err(ConfigError::Inconsistent(
            "fp16 and bf16 are both enabled".into(),
        )),
        (None, Some(_)) => Ok(Precision::Bf16),
        (None, None) => Ok(Precision::Fp32),
        (Some(o), None) => {
            let cfg = LossScaleConfig {
                loss_scale: o.f64_or(LOSS_SCALE.name, const { LOSS_SCALE.float() })?,
                initial_scale_power: o
                    .count_or(
                        INITIAL_SCALE_POWER.name,
                        const { INITIAL_SCALE_POWER.count() },
                    )?
                    .min(127) as u32,
                loss_scale_window: o
                    .count_or(LOSS_SCALE_WINDOW.name, const { LOSS_SCALE_WINDOW.count() })?
                    .max(1),
                hysteresis: o
                    .count_or(HYSTERESIS.name, const { HYSTERESIS.count() })?
                    .max(1),
                consecutive_hysteresis: o.bool_or(
                    CONSECUTIVE_HYSTERESIS.name,
                    const { CONSECUTIVE_HYSTERESIS.flag() },
                )?,
                min_loss_scale: o.f64_or(MIN_LOSS_SCALE.name, const { MIN_LOSS_SCALE.float() })?,
            };
            if cfg.loss_scale < 0.0 || !cfg.loss_scale.is_finite() {
                return Err(o.invalid(
                    LOSS_SCALE.name,
                    "must be 0 (dynamic) or a positive static scale",
                ));
            }
            if cfg.min_loss_scale <= 0.0 || cfg.min_loss_scale.is_nan() {
                return Err(o.invalid(MIN_LOSS_SCALE.name, "must be > 0"));
            }
            Ok(Precision::Fp16(cfg))
        }
    }
}
