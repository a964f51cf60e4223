//! The config as zero's parser resolves it ("auto" filled in), as the typed object
//! `resolve_config` returns to the Python layer: what `initialize`, the engine and
//! `DeepSpeedConfig` read of it.

use crate::results::result_class;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use zero_runtime::config::OffloadDevice;
use zero_runtime::kernels::WeightDecay;
use zero_runtime::{Precision, ZeroConfig};

/// An `f32` read back as the `f64` of its shortest decimal text (0.01, not
/// 0.009999999776482582): what the user wrote, as torch's optimizers take it.
fn decimal(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

result_class! {
    /// Adam's hyper-parameters from the config's `optimizer` section.
    AdamHyper {
        /// `lr`.
        lr: f64,
        /// `betas[0]`.
        beta1: f64,
        /// `betas[1]`.
        beta2: f64,
        /// `eps`.
        eps: f64,
        /// `weight_decay`.
        weight_decay: f64,
        /// AdamW's decoupled weight decay (else Adam's L2).
        decoupled: bool,
        /// Whether the moments are bias-corrected.
        bias_correction: bool,
    }
}

result_class! {
    /// The config's `optimizer` section.
    ResolvedOptimizer {
        /// Its `type`, as written.
        name: String,
        /// Its `params`, as JSON text.
        params_json: String,
        /// Adam's hyper-parameters, when the type is an Adam zero steps itself.
        adam: Option<AdamHyper>,
    }
}

result_class! {
    /// The resolved config: the values every part of zero_torch reads.
    ResolvedConfig {
        /// The `optimizer` section, if any.
        optimizer: Option<ResolvedOptimizer>,
        /// Whether the config has a `scheduler` section.
        scheduler: bool,
        /// Whether `offload_optimizer` moves the optimizer off the device.
        offload_optimizer: bool,
        /// `offload_optimizer.ratio` below 1 (a partial offload).
        offload_optimizer_partial: bool,
        /// `train_batch_size`.
        train_batch_size: u64,
        /// `train_micro_batch_size_per_gpu`.
        train_micro_batch_size_per_gpu: u64,
        /// `gradient_accumulation_steps`.
        gradient_accumulation_steps: u64,
        /// `gradient_clipping` (0: none).
        gradient_clipping: f64,
        /// The ZeRO stage.
        stage: u8,
        /// The training dtype: `"float32"`, `"float16"` or `"bfloat16"`.
        dtype: String,
        /// `gather_16bit_weights_on_model_save`.
        gather_16bit_weights_on_model_save: bool,
        /// `stage3_param_persistence_threshold`.
        param_persistence_threshold: u64,
        /// What the parser noted (keys accepted at DeepSpeed's default, values filled in).
        notes: Vec<String>,
    }
}

impl From<&ZeroConfig> for ResolvedConfig {
    fn from(c: &ZeroConfig) -> Self {
        let dtype = match c.precision {
            Precision::Fp32 => "float32",
            Precision::Fp16(_) => "float16",
            Precision::Bf16 => "bfloat16",
        };
        let optimizer = c.optimizer.as_ref().map(|o| ResolvedOptimizer {
            name: o.name.clone(),
            params_json: o.params.to_string(),
            adam: o.adam.map(|a| AdamHyper {
                lr: decimal(a.lr),
                beta1: decimal(a.beta1),
                beta2: decimal(a.beta2),
                eps: decimal(a.eps),
                weight_decay: decimal(a.weight_decay),
                decoupled: a.decay == WeightDecay::Decoupled,
                bias_correction: a.bias_correction,
            }),
        });
        Self {
            optimizer,
            scheduler: c.scheduler.is_some(),
            offload_optimizer: c.zero.offload_optimizer.device != OffloadDevice::None,
            offload_optimizer_partial: c.zero.offload_optimizer.partial,
            train_batch_size: c.train_batch_size,
            train_micro_batch_size_per_gpu: c.micro_batch_per_rank,
            gradient_accumulation_steps: c.gradient_accumulation_steps,
            gradient_clipping: c.gradient_clipping,
            stage: c.zero.stage,
            dtype: dtype.to_string(),
            gather_16bit_weights_on_model_save: c.zero.gather_16bit_weights_on_model_save,
            param_persistence_threshold: c.zero.param_persistence_threshold,
            notes: c.notes.clone(),
        }
    }
}

/// Reads a DeepSpeed config (JSON text) for `world_size` ranks with zero's parser and
/// returns it resolved ("auto" filled in), with the notes it made: the same checks and
/// "did you mean" errors as everywhere else.
#[pyfunction]
pub fn resolve_config(config_json: &str, world_size: usize) -> PyResult<ResolvedConfig> {
    let c = ZeroConfig::from_json_str(config_json, world_size)
        .map_err(|e| crate::errors::ConfigError::new_err(e.to_string()))?;
    Ok(ResolvedConfig::from(&c))
}
