//! The `optimizer` section.

use super::json::Obj;
use super::optimizer_keys::{
    ADAM_PARAMS, ADAM_W_MODE, BETAS, BIAS_CORRECTION, EPS, LR, OPTIMIZER_SECTION, PARAMS,
    TORCH_ADAM, TYPE, WEIGHT_DECAY,
};
use super::ConfigError;
use serde_json::{json, Value};
use zero_kernels::{AdamConfig, WeightDecay};

/// The `optimizer` section, with DeepSpeed 0.19.8's meaning.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerConfig {
    /// `type`: DeepSpeed's own optimizers lower-cased (`"adam"`, `"adamw"`), any other
    /// name as written (DeepSpeed then builds `torch.optim.<type>`).
    pub name: String,
    /// The fused Adam's hyper-parameters, for the Adam family (`Adam`, `AdamW`, with or
    /// without `torch_adam`): every default is the one of the optimizer DeepSpeed builds.
    /// `None` for any other type: zero-runtime does not implement it, and a front-end
    /// steps it on the rank's fp32 shard ([`crate::Engine::step_external_begin`]).
    pub adam: Option<AdamConfig>,
    /// `params` as written (a front-end builds other optimizers from it).
    pub params: Value,
}

impl OptimizerConfig {
    /// The fused Adam's hyper-parameters, or an error naming the optimizer zero-runtime
    /// cannot step itself.
    pub fn adam(&self) -> Result<AdamConfig, ConfigError> {
        self.adam.ok_or_else(|| ConfigError::Unsupported {
            key: format!("{}.{}", OPTIMIZER_SECTION.path, TYPE.name),
            reason: format!(
                "`{}` is not built into zero-runtime (it implements Adam and AdamW); a front-end can step it on the rank's fp32 shard (zero-torch builds torch.optim.{})",
                self.name, self.name
            ),
        })
    }
}

/// DeepSpeed's own optimizer types (lower-cased as DeepSpeed matches them) that zero does
/// not implement: refused by name. Any other type that is not Adam or AdamW is a
/// `torch.optim` class for DeepSpeed, and an external optimizer here.
const DEEPSPEED_ONLY_OPTIMIZERS: &[(&str, &str)] = &[
    ("lamb", "DeepSpeed's FusedLamb"),
    ("lion", "DeepSpeed's FusedLion / DeepSpeedCPULion"),
    ("onebitadam", "DeepSpeed's 1-bit Adam"),
    ("zerooneadam", "DeepSpeed's 0/1 Adam"),
    ("onebitlamb", "DeepSpeed's 1-bit LAMB"),
    ("muadam", "mup's MuAdam"),
    ("muadamw", "mup's MuAdamW"),
    ("musgd", "mup's MuSGD"),
    ("muon", "DeepSpeed's Muon"),
];

pub(super) fn optimizer(top: &Obj) -> Result<Option<OptimizerConfig>, ConfigError> {
    let s = &OPTIMIZER_SECTION;
    let Some(v) = top.get(s.path) else {
        return Ok(None);
    };
    let o = Obj::new(s.path, v, &s.known(), &s.unsupported())?;
    let Some(ty) = o.str(TYPE.name)? else {
        // DeepSpeed reads an optimizer section without a type as no optimizer.
        return Ok(None);
    };
    let lower = ty.to_ascii_lowercase();
    let empty = json!({});
    let params = o.get(PARAMS.name).unwrap_or(&empty).clone();
    if let Some(map) = params.as_object() {
        if map.contains_key("max_grad_norm") {
            return Err(ConfigError::InvalidValue {
                key: format!("{}.max_grad_norm", o.path(PARAMS.name)),
                reason: "not an optimizer parameter: use the top-level `gradient_clipping` (as DeepSpeed requires)".into(),
            });
        }
    } else {
        return Err(o.invalid(
            PARAMS.name,
            &format!("expected a JSON object, got {params}"),
        ));
    }
    if let Some((_, what)) = DEEPSPEED_ONLY_OPTIMIZERS.iter().find(|(n, _)| *n == lower) {
        return Err(ConfigError::Unsupported {
            key: o.path(TYPE.name),
            reason: format!("`{ty}` ({what}) is not implemented by zero: use Adam, AdamW, or a torch.optim optimizer"),
        });
    }
    if lower != "adam" && lower != "adamw" {
        let name = if lower == "adagrad" {
            "Adagrad".to_string()
        } else {
            ty.to_string()
        };
        return Ok(Some(OptimizerConfig {
            name,
            adam: None,
            params,
        }));
    }
    Ok(Some(OptimizerConfig {
        name: lower.clone(),
        adam: Some(adam_family(&lower, &params)?),
        params,
    }))
}

/// `Adam` / `AdamW` as DeepSpeed 0.19.8 builds them (`_configure_basic_optimizer`):
/// `adam_w_mode` (default true) makes `Adam` decoupled too; `torch_adam: true` builds
/// `torch.optim.AdamW` (decoupled) or `torch.optim.Adam`, whose weight decay defaults to
/// 0.01 and 0; otherwise DeepSpeed's `FusedAdam` (or `DeepSpeedCPUAdam` with an offloaded
/// optimizer), whose weight decay defaults to 0. Every other default is the same in all
/// of them: lr 1e-3, betas (0.9, 0.999), eps 1e-8, bias correction on.
fn adam_family(name: &str, params: &Value) -> Result<AdamConfig, ConfigError> {
    let s = &ADAM_PARAMS;
    let p = Obj::new(s.path, params, &s.known(), &s.unsupported())?;
    let default_betas = const { BETAS.pair() };
    let betas = match p.get(BETAS.name) {
        None => default_betas,
        Some(Value::String(s)) if s == "auto" => default_betas,
        Some(Value::Array(a)) if a.len() == 2 => match (a[0].as_f64(), a[1].as_f64()) {
            (Some(b1), Some(b2)) => (b1, b2),
            _ => return Err(p.invalid(BETAS.name, "expected two numbers")),
        },
        Some(other) => {
            return Err(p.invalid(BETAS.name, &format!("expected [beta1, beta2], got {other}")))
        }
    };
    let torch_adam = p.bool_or(TORCH_ADAM.name, const { TORCH_ADAM.flag() })?;
    let decoupled = name == "adamw" || p.bool_or(ADAM_W_MODE.name, const { ADAM_W_MODE.flag() })?;
    let default_decay = if torch_adam && decoupled { 0.01 } else { 0.0 };
    let adam = AdamConfig {
        lr: p.f64_or(LR.name, const { LR.float() })? as f32,
        beta1: betas.0 as f32,
        beta2: betas.1 as f32,
        eps: p.f64_or(EPS.name, const { EPS.float() })? as f32,
        weight_decay: p.f64_or(WEIGHT_DECAY.name, default_decay)? as f32,
        decay: if decoupled {
            WeightDecay::Decoupled
        } else {
            WeightDecay::L2
        },
        bias_correction: p.bool_or(BIAS_CORRECTION.name, const { BIAS_CORRECTION.flag() })?,
    };
    adam.validate().map_err(|e| ConfigError::InvalidValue {
        key: s.path.into(),
        reason: e.to_string(),
    })?;
    Ok(adam)
}
