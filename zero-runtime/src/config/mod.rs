//! `ZeroConfig`: the DeepSpeed JSON (`ds_config.json`) users already have.
//!
//! Defaults are DeepSpeed's *code* defaults. Unknown or misspelled keys are errors that
//! name the key and suggest the closest known one; DeepSpeed keys we do not implement are
//! errors that say so, unless set to DeepSpeed's default (which changes nothing).
//!
//! # `"auto"`
//! - Batch keys: derived from the others (see [`ZeroConfig::from_json`]).
//! - Every other key: DeepSpeed's default for that key, except `warmup_max_lr`, which is
//!   each parameter group's `lr` (as DeepSpeed's schedulers take it when it is unset), and
//!   a scheduler's `total_num_steps`, which has no default and is an error.

mod json;
mod offload;

pub use offload::{AioConfig, OffloadDevice, OffloadOptimizerConfig, OffloadParamConfig};

use json::{Auto, Obj};
use serde_json::{json, Value};
use zero_kernels::{AdamConfig, WeightDecay};

/// A configuration that cannot be used, naming the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The text is not JSON.
    #[error("config is not valid JSON: {0}")]
    Json(String),
    /// A key nobody knows.
    #[error("unknown config key `{key}`{}", suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownKey {
        /// The full dotted path of the key.
        key: String,
        /// The closest known key, if one is close.
        suggestion: Option<String>,
    },
    /// A DeepSpeed key (or value) zero does not implement yet.
    #[error("config key `{key}` is not supported yet: {reason}")]
    Unsupported {
        /// The full dotted path of the key.
        key: String,
        /// Why, and what is supported.
        reason: String,
    },
    /// A value of the wrong type or out of range.
    #[error("config key `{key}`: {reason}")]
    InvalidValue {
        /// The full dotted path of the key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// Keys that contradict each other.
    #[error("inconsistent config: {0}")]
    Inconsistent(String),
}

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
            key: "optimizer.type".into(),
            reason: format!(
                "`{}` is not built into zero-runtime (it implements Adam and AdamW); a front-end can step it on the rank's fp32 shard (zero-torch builds torch.optim.{})",
                self.name, self.name
            ),
        })
    }
}

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

/// The `zero_optimization` section (sizes in elements).
#[derive(Debug, Clone, PartialEq)]
pub struct ZeroOptimization {
    /// `stage`: 0 (data parallel), 1, 2 or 3.
    pub stage: u8,
    /// `overlap_comm`: reductions overlap the rest of backward (default: true for stage 3).
    pub overlap_comm: bool,
    /// `contiguous_gradients`: zero always writes gradients into contiguous buckets.
    pub contiguous_gradients: bool,
    /// `reduce_bucket_size`.
    pub reduce_bucket_size: u64,
    /// `allgather_bucket_size`.
    pub allgather_bucket_size: u64,
    /// `stage3_prefetch_bucket_size`.
    pub prefetch_bucket_size: u64,
    /// `stage3_param_persistence_threshold`.
    pub param_persistence_threshold: u64,
    /// `stage3_max_live_parameters`.
    pub max_live_parameters: u64,
    /// `stage3_max_reuse_distance`.
    pub max_reuse_distance: u64,
    /// `stage3_gather_16bit_weights_on_model_save`.
    pub gather_16bit_weights_on_model_save: bool,
    /// `sub_group_size`: elements per step of an offloaded optimizer (the unit the NVMe
    /// pipeline reads, steps and writes).
    pub sub_group_size: u64,
    /// `offload_optimizer`.
    pub offload_optimizer: OffloadOptimizerConfig,
    /// `offload_param` (stage 3).
    pub offload_param: OffloadParamConfig,
}

/// A parsed, resolved DeepSpeed configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ZeroConfig {
    /// `train_batch_size` = micro × accumulation × world.
    pub train_batch_size: u64,
    /// `train_micro_batch_size_per_gpu`.
    pub micro_batch_per_rank: u64,
    /// `gradient_accumulation_steps`.
    pub gradient_accumulation_steps: u64,
    /// `gradient_clipping` (0 disables clipping).
    pub gradient_clipping: f64,
    /// `optimizer`: `None` without one. As in DeepSpeed, an engine without an optimizer
    /// runs forward passes (evaluation), and refuses backward and step.
    pub optimizer: Option<OptimizerConfig>,
    /// `scheduler`, if any.
    pub scheduler: Option<SchedulerConfig>,
    /// From `fp16` / `bf16`.
    pub precision: Precision,
    /// `data_types.grad_accum_dtype`: the dtype micro-steps' gradients are summed in.
    pub grad_accum_dtype: GradAccumDtype,
    /// `zero_optimization`.
    pub zero: ZeroOptimization,
    /// `wall_clock_breakdown`.
    pub wall_clock_breakdown: bool,
    /// `steps_per_print`.
    pub steps_per_print: u64,
    /// `checkpoint`.
    pub checkpoint: CheckpointConfig,
    /// `aio`: NVMe file I/O.
    pub aio: AioConfig,
    /// Keys accepted that have no effect in zero, each with why (print them).
    pub notes: Vec<String>,
    /// The JSON this was parsed from (recorded in checkpoints).
    pub source: Value,
}

/// `checkpoint.tag_validation`: what to do when the ranks' checkpoint tags differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagValidation {
    /// Use rank 0's tag and say nothing.
    Ignore,
    /// Use rank 0's tag and print a warning naming the ranks whose tag differed (the
    /// default, as DeepSpeed).
    Warn,
    /// Fail on every rank.
    Fail,
}

/// The `checkpoint` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// `tag_validation` (`Ignore`, `Warn` or `Fail`; default `Warn`).
    pub tag_validation: TagValidation,
    /// `load_universal`: accepted; every zero checkpoint loads at any world size and stage.
    pub load_universal: bool,
    /// `use_node_local_storage`: each node writes its ranks' files to its own storage (a
    /// load then needs the files of the ranks it reads on that node).
    pub use_node_local_storage: bool,
}

const TOP: &[&str] = &[
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "optimizer",
    "scheduler",
    "fp16",
    "bf16",
    "zero_optimization",
    "wall_clock_breakdown",
    "steps_per_print",
    "checkpoint",
    "aio",
    "communication_data_type",
    "data_types",
];

/// Top-level sections of features zero does not implement, each with what it is: accepted
/// while `enabled` is false or absent (DeepSpeed's default), a named error when enabled.
const FEATURES: &[(&str, &str)] = &[
    ("torch_autocast", "torch.autocast inside the engine"),
    ("hybrid_engine", "DeepSpeed's hybrid (RLHF) engine"),
    ("compile", "DeepCompile"),
    ("flops_profiler", "the FLOPs profiler"),
    ("autotuning", "autotuning"),
    ("data_efficiency", "curriculum data sampling and random-LTD"),
    ("comms_logger", "the communication logger"),
    ("tensorboard", "TensorBoard monitoring"),
    ("wandb", "Weights & Biases monitoring"),
    ("csv_monitor", "CSV monitoring"),
    ("comet", "Comet monitoring"),
    ("datastates_ckpt", "DataStates checkpointing"),
    ("nebula", "Nebula checkpointing (removed in DeepSpeed 0.19)"),
    (
        "compression_training",
        "compression training (removed in DeepSpeed 0.19)",
    ),
    ("amp", "NVIDIA apex AMP (removed in DeepSpeed 0.19)"),
    (
        "quantize_training",
        "quantized training (removed in DeepSpeed 0.19)",
    ),
    (
        "sparse_attention",
        "sparse attention (removed in DeepSpeed 0.19)",
    ),
    ("elasticity", "elastic training (removed in DeepSpeed 0.19)"),
    (
        "eigenvalue",
        "eigenvalue computation (removed in DeepSpeed 0.19)",
    ),
    (
        "progressive_layer_drop",
        "progressive layer drop (removed in DeepSpeed 0.19)",
    ),
    (
        "curriculum_learning",
        "curriculum learning (removed in DeepSpeed 0.19)",
    ),
    (
        "graph_harvesting",
        "graph harvesting (removed in DeepSpeed 0.19)",
    ),
    ("weight_quantization", "weight quantization"),
];

/// Top-level keys DeepSpeed reads that change nothing zero computes (logging, profiling,
/// other parallelisms' settings, the Python front-end's gates): accepted with any value.
const ACCEPTED: &[&str] = &[
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "memory_breakdown",
    "disable_python_gc",
    "log_level",
    "timers",
    "vocabulary_size",
    "seq_parallel_communication_data_type",
    "use_data_before_expert_parallelism",
    "pipeline",
    "dataloader_drop_last",
    "sparse_gradients",
];

/// Checks DeepSpeed's keys that zero accepts without implementing them, and returns the
/// config with them taken out (and `bfloat16` read as `bf16`, as DeepSpeed reads it).
fn deepspeed_keys(v: &Value, notes: &mut Vec<String>) -> Result<Value, ConfigError> {
    let mut v = v.clone();
    let Some(map) = v.as_object_mut() else {
        return Ok(v);
    };
    if let Some(b) = map.remove("bfloat16") {
        if !map.contains_key("bf16") {
            map.insert("bf16".into(), b);
        }
    }
    for (key, what) in FEATURES {
        let Some(section) = map.remove(*key) else {
            continue;
        };
        let enabled = match &section {
            Value::Null | Value::Bool(false) => false,
            Value::Bool(true) => true,
            Value::Object(o) => match o.get("enabled") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => {
                    // DeepCompile has no `enabled`: its switch is `deepcompile`.
                    o.get("deepcompile") == Some(&Value::Bool(true))
                }
                Some(Value::Bool(true)) => true,
                Some(other) => {
                    return Err(ConfigError::InvalidValue {
                        key: format!("{key}.enabled"),
                        reason: format!("expected true or false, got {other}"),
                    })
                }
            },
            other => {
                return Err(ConfigError::InvalidValue {
                    key: (*key).into(),
                    reason: format!("expected an object, got {other}"),
                })
            }
        };
        if enabled {
            return Err(ConfigError::Unsupported {
                key: format!("{key}.enabled"),
                reason: format!(
                    "{what} is not implemented by zero; disable it or remove the section"
                ),
            });
        }
    }
    if let Some(Value::Object(ac)) = map.remove("activation_checkpointing") {
        for key in [
            "partition_activations",
            "cpu_checkpointing",
            "contiguous_memory_optimization",
        ] {
            if ac.get(key) == Some(&Value::Bool(true)) {
                return Err(ConfigError::Unsupported {
                    key: format!("activation_checkpointing.{key}"),
                    reason: "zero's deepspeed.checkpointing recomputes with torch.utils.checkpoint; it does not partition, offload or pack activations".into(),
                });
            }
        }
    }
    for key in ACCEPTED {
        if map.remove(*key).is_some() && *key == "dataloader_drop_last" {
            notes.push("dataloader_drop_last: read by the front-end's dataloader".into());
        }
    }
    if let Some(Value::Number(n)) = map.get("steps_per_print") {
        if n.as_f64().is_some_and(|x| x >= 1.8e19) {
            map.insert("steps_per_print".into(), json!(u64::MAX / 2));
        }
    }
    Ok(v)
}

const ZERO_KEYS: &[&str] = &[
    "stage",
    "overlap_comm",
    "contiguous_gradients",
    "reduce_scatter",
    "reduce_bucket_size",
    "allgather_partitions",
    "allgather_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save",
    "sub_group_size",
    "offload_optimizer",
    "offload_param",
    "cpu_offload",
    "cpu_offload_param",
    "cpu_offload_use_pin_memory",
    "memory_efficient_linear",
];

impl ZeroConfig {
    /// Parses DeepSpeed JSON text for a run of `world` ranks.
    pub fn from_json_str(text: &str, world: usize) -> Result<Self, ConfigError> {
        let v: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
        Self::from_json(&v, world)
    }

    /// Parses a DeepSpeed JSON value for a run of `world` ranks.
    ///
    /// Batch keys: any two of `train_batch_size`, `train_micro_batch_size_per_gpu` and
    /// `gradient_accumulation_steps` imply the third; all three must agree. With one
    /// given, DeepSpeed's rules fill the rest: a lone `train_batch_size` means accumulation
    /// 1, a lone micro batch or accumulation means the other is 1. With none (or all
    /// `"auto"`), micro batch 1 and accumulation 1.
    pub fn from_json(v: &Value, world: usize) -> Result<Self, ConfigError> {
        let mut notes = Vec::new();
        let v = &deepspeed_keys(v, &mut notes)?;
        let unsupported_top = [
            ("prescale_gradients", json!(false)),
            ("gradient_predivide_factor", json!(1.0)),
            ("gradient_allreduce_op", json!("mean")),
            ("managed_gradient_accumulation", json!(true)),
            ("disable_allgather", json!(false)),
            ("dump_state", json!(false)),
        ];
        let top = Obj::new("", v, TOP, &unsupported_top)?;
        let world = world.max(1) as u64;

        let (train_batch_size, micro, accum) = batch(&top, world)?;
        let gradient_clipping = top.f64_or("gradient_clipping", 1.0)?;
        if gradient_clipping < 0.0 {
            return Err(top.invalid("gradient_clipping", "must be >= 0 (0 disables clipping)"));
        }
        let optimizer = optimizer(&top)?;
        let scheduler = scheduler(&top)?;
        let precision = precision(&top)?;
        if let Some(t) = top.str("communication_data_type")? {
            let training = precision.name();
            if t != training {
                return Err(ConfigError::Unsupported {
                    key: "communication_data_type".into(),
                    reason: format!(
                        "`{t}`: zero reduces gradients in the training dtype ({training}), summing in f32 and rounding once"
                    ),
                });
            }
        }
        let grad_accum_dtype = grad_accum_dtype(&top, precision)?;
        let zero = zero(&top, &mut notes)?;
        let checkpoint = checkpoint(&top)?;
        let aio = offload::aio(&top, &mut notes)?;
        Ok(Self {
            train_batch_size,
            micro_batch_per_rank: micro,
            gradient_accumulation_steps: accum,
            gradient_clipping,
            optimizer,
            scheduler,
            precision,
            grad_accum_dtype,
            zero,
            wall_clock_breakdown: top.bool_or("wall_clock_breakdown", false)?,
            steps_per_print: top.count_or("steps_per_print", 10)?,
            checkpoint,
            aio,
            notes,
            source: v.clone(),
        })
    }
}

/// The `data_types` section: `grad_accum_dtype` (names as DeepSpeed's `DtypeEnum` takes
/// them) and `param_dtype` when it names the training dtype, as DeepSpeed requires.
fn grad_accum_dtype(top: &Obj, precision: Precision) -> Result<GradAccumDtype, ConfigError> {
    let empty = json!({});
    let o = Obj::new(
        "data_types",
        top.get("data_types").unwrap_or(&empty),
        &["grad_accum_dtype", "param_dtype"],
        &[
            ("buffer_dtype", Value::Null),
            ("keep_in_fp32_modules", json!("auto")),
        ],
    )?;
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
    if let Some(p) = parse("param_dtype")? {
        if p != training {
            return Err(o.invalid(
                "param_dtype",
                &format!(
                    "`{p}` differs from the training dtype ({training}), as DeepSpeed refuses"
                ),
            ));
        }
    }
    match parse("grad_accum_dtype")? {
        None => Ok(GradAccumDtype::Model),
        Some(a) if a == training => Ok(GradAccumDtype::Model),
        Some("fp32") => Ok(GradAccumDtype::Fp32),
        Some(a) => Err(ConfigError::Unsupported {
            key: "data_types.grad_accum_dtype".into(),
            reason: format!(
                "`{a}` with {training} training: gradients are summed in the training dtype or in fp32"
            ),
        }),
    }
}

fn checkpoint(top: &Obj) -> Result<CheckpointConfig, ConfigError> {
    let empty = json!({});
    let o = Obj::new(
        "checkpoint",
        top.get("checkpoint").unwrap_or(&empty),
        &["tag_validation", "load_universal", "use_node_local_storage"],
        &[("parallel_write", json!({"pipeline_stage": false}))],
    )?;
    let tag_validation = match o.str("tag_validation")? {
        None => TagValidation::Warn,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "ignore" => TagValidation::Ignore,
            "warn" => TagValidation::Warn,
            "fail" => TagValidation::Fail,
            _ => {
                return Err(o.invalid(
                    "tag_validation",
                    &format!("`{v}`: expected Ignore, Warn or Fail"),
                ))
            }
        },
    };
    Ok(CheckpointConfig {
        tag_validation,
        load_universal: o.bool_or("load_universal", false)?,
        use_node_local_storage: o.bool_or("use_node_local_storage", false)?,
    })
}

fn given(o: &Obj, key: &str) -> Result<Option<u64>, ConfigError> {
    Ok(match o.count(key)? {
        Some(Auto::Value(0)) => return Err(o.invalid(key, "must be at least 1")),
        Some(Auto::Value(v)) => Some(v),
        _ => None,
    })
}

fn batch(top: &Obj, world: u64) -> Result<(u64, u64, u64), ConfigError> {
    let tbs = given(top, "train_batch_size")?;
    let mb = given(top, "train_micro_batch_size_per_gpu")?;
    let gas = given(top, "gradient_accumulation_steps")?;
    let split = |total: u64, by: u64, what: &str| {
        if total % by == 0 {
            Ok(total / by)
        } else {
            Err(ConfigError::Inconsistent(format!(
                "train_batch_size {total} is not divisible by {what} = {by}"
            )))
        }
    };
    let (mb, gas) = match (tbs, mb, gas) {
        (Some(t), Some(m), Some(g)) => check_triple(t, m, g, world)?,
        (Some(t), Some(m), None) => (m, split(t, m * world, "micro batch × world")?),
        (Some(t), None, Some(g)) => (split(t, g * world, "accumulation × world")?, g),
        (Some(t), None, None) => (split(t, world, "world size")?, 1),
        (None, Some(m), g) => (m, g.unwrap_or(1)),
        (None, None, g) => (1, g.unwrap_or(1)),
    };
    if mb == 0 || gas == 0 {
        return Err(ConfigError::Inconsistent(format!(
            "train_batch_size {} is smaller than world size {world}",
            tbs.unwrap_or(0)
        )));
    }
    Ok((mb * gas * world, mb, gas))
}

fn check_triple(total: u64, m: u64, g: u64, world: u64) -> Result<(u64, u64), ConfigError> {
    if m * g * world == total {
        return Ok((m, g));
    }
    Err(ConfigError::Inconsistent(format!(
        "train_batch_size {total} != train_micro_batch_size_per_gpu {m} × gradient_accumulation_steps {g} × world size {world} = {}",
        m * g * world
    )))
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

fn optimizer(top: &Obj) -> Result<Option<OptimizerConfig>, ConfigError> {
    let Some(v) = top.get("optimizer") else {
        return Ok(None);
    };
    let o = Obj::new("optimizer", v, &["type", "params"], &[])?;
    let Some(ty) = o.str("type")? else {
        // DeepSpeed reads an optimizer section without a type as no optimizer.
        return Ok(None);
    };
    let lower = ty.to_ascii_lowercase();
    let empty = json!({});
    let params = o.get("params").unwrap_or(&empty).clone();
    if let Some(map) = params.as_object() {
        if map.contains_key("max_grad_norm") {
            return Err(ConfigError::InvalidValue {
                key: "optimizer.params.max_grad_norm".into(),
                reason: "not an optimizer parameter: use the top-level `gradient_clipping` (as DeepSpeed requires)".into(),
            });
        }
    } else {
        return Err(o.invalid("params", &format!("expected a JSON object, got {params}")));
    }
    if let Some((_, what)) = DEEPSPEED_ONLY_OPTIMIZERS.iter().find(|(n, _)| *n == lower) {
        return Err(ConfigError::Unsupported {
            key: "optimizer.type".into(),
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
    let p = Obj::new(
        "optimizer.params",
        params,
        &[
            "lr",
            "betas",
            "eps",
            "weight_decay",
            "bias_correction",
            "adam_w_mode",
            "torch_adam",
            "fp32_optimizer_states",
            "set_grad_none",
            "foreach",
        ],
        &[
            ("amsgrad", json!(false)),
            ("fused", Value::Null),
            ("maximize", json!(false)),
            ("capturable", json!(false)),
            ("differentiable", json!(false)),
        ],
    )?;
    let betas = match p.get("betas") {
        None => (0.9, 0.999),
        Some(Value::String(s)) if s == "auto" => (0.9, 0.999),
        Some(Value::Array(a)) if a.len() == 2 => match (a[0].as_f64(), a[1].as_f64()) {
            (Some(b1), Some(b2)) => (b1, b2),
            _ => return Err(p.invalid("betas", "expected two numbers")),
        },
        Some(other) => {
            return Err(p.invalid("betas", &format!("expected [beta1, beta2], got {other}")))
        }
    };
    let torch_adam = p.bool_or("torch_adam", false)?;
    let decoupled = name == "adamw" || p.bool_or("adam_w_mode", true)?;
    let default_decay = if torch_adam && decoupled { 0.01 } else { 0.0 };
    let adam = AdamConfig {
        lr: p.f64_or("lr", 1e-3)? as f32,
        beta1: betas.0 as f32,
        beta2: betas.1 as f32,
        eps: p.f64_or("eps", 1e-8)? as f32,
        weight_decay: p.f64_or("weight_decay", default_decay)? as f32,
        decay: if decoupled {
            WeightDecay::Decoupled
        } else {
            WeightDecay::L2
        },
        bias_correction: p.bool_or("bias_correction", true)?,
    };
    adam.validate().map_err(|e| ConfigError::InvalidValue {
        key: "optimizer.params".into(),
        reason: e.to_string(),
    })?;
    Ok(adam)
}

fn scheduler(top: &Obj) -> Result<Option<SchedulerConfig>, ConfigError> {
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

fn precision(top: &Obj) -> Result<Precision, ConfigError> {
    let enabled = |key: &str,
                   known: &[&str],
                   unsupported: &[(&str, Value)]|
     -> Result<Option<Obj>, ConfigError> {
        match top.get(key) {
            None => Ok(None),
            Some(v) => {
                let o = Obj::new(key, v, known, unsupported)?;
                Ok(o.bool_or("enabled", false)?.then_some(o))
            }
        }
    };
    let fp16 = enabled(
        "fp16",
        &[
            "enabled",
            "loss_scale",
            "initial_scale_power",
            "loss_scale_window",
            "hysteresis",
            "consecutive_hysteresis",
            "min_loss_scale",
        ],
        &[
            ("auto_cast", json!(false)),
            ("fp16_master_weights_and_grads", json!(false)),
        ],
    )?;
    let bf16 = enabled(
        "bf16",
        &["enabled", "check_grad_overflow"],
        &[
            ("bf16_master_weights_and_grads", json!(false)),
            ("bf16_optimizer_states", json!(false)),
            ("immediate_grad_update", json!(false)),
        ],
    )?;
    match (fp16, bf16) {
        (Some(_), Some(_)) => Err(ConfigError::Inconsistent(
            "fp16 and bf16 are both enabled".into(),
        )),
        (None, Some(_)) => Ok(Precision::Bf16),
        (None, None) => Ok(Precision::Fp32),
        (Some(o), None) => {
            let cfg = LossScaleConfig {
                loss_scale: o.f64_or("loss_scale", 0.0)?,
                initial_scale_power: o.count_or("initial_scale_power", 16)?.min(127) as u32,
                loss_scale_window: o.count_or("loss_scale_window", 1000)?.max(1),
                hysteresis: o.count_or("hysteresis", 2)?.max(1),
                consecutive_hysteresis: o.bool_or("consecutive_hysteresis", false)?,
                min_loss_scale: o.f64_or("min_loss_scale", 1.0)?,
            };
            if cfg.loss_scale < 0.0 || !cfg.loss_scale.is_finite() {
                return Err(o.invalid(
                    "loss_scale",
                    "must be 0 (dynamic) or a positive static scale",
                ));
            }
            if cfg.min_loss_scale <= 0.0 || cfg.min_loss_scale.is_nan() {
                return Err(o.invalid("min_loss_scale", "must be > 0"));
            }
            Ok(Precision::Fp16(cfg))
        }
    }
}

/// DeepSpeed's `zero_optimization` takes its stage-3 keys by their field names too
/// (`prefetch_bucket_size` for `stage3_prefetch_bucket_size`, ...): read as the
/// `stage3_` names. Both names at once is an error.
fn stage3_aliases(section: &Value) -> Result<Value, ConfigError> {
    let mut v = section.clone();
    if let Some(map) = v.as_object_mut() {
        for short in [
            "prefetch_bucket_size",
            "param_persistence_threshold",
            "model_persistence_threshold",
            "max_live_parameters",
            "max_reuse_distance",
            "gather_16bit_weights_on_model_save",
            "module_granularity_threshold",
            "use_all_reduce_for_fetch_params",
            "allgather_sequential",
        ] {
            if let Some(val) = map.remove(short) {
                let long = format!("stage3_{short}");
                if map.contains_key(&long) {
                    return Err(ConfigError::Inconsistent(format!(
                        "zero_optimization has both `{short}` and `{long}`, which name one setting"
                    )));
                }
                map.insert(long, val);
            }
        }
    }
    Ok(v)
}

fn zero(top: &Obj, notes: &mut Vec<String>) -> Result<ZeroOptimization, ConfigError> {
    let empty = json!({});
    let unsupported = [
        ("load_from_fp32_weights", json!(true)),
        ("elastic_checkpoint", json!(false)),
        ("use_multi_rank_bucket_allreduce", json!(true)),
        ("ignore_unused_parameters", json!(true)),
        ("round_robin_gradients", json!(false)),
        ("legacy_stage1", json!(false)),
        ("stage3_model_persistence_threshold", Value::Null),
        ("stage3_module_granularity_threshold", json!(0)),
        ("stage3_use_all_reduce_for_fetch_params", json!(false)),
        ("stage3_allgather_sequential", json!(false)),
        ("zero_hpz_partition_size", json!(1)),
        ("zero_quantized_weights", json!(false)),
        ("zero_quantized_nontrainable_weights", json!(false)),
        ("zero_quantized_gradients", json!(false)),
        ("mics_shard_size", json!(-1)),
        ("mics_hierarchical_params_gather", json!(false)),
        ("stage3_gather_fp16_weights_on_model_save", json!(false)),
        ("compute_grad_norm", json!(true)),
        ("zenflow", Value::Null),
        ("parameter_alignment", json!(false)),
        ("pipeline_loading_checkpoint", json!(false)),
        ("override_module_apply", json!(true)),
        ("log_trace_cache_warnings", json!(false)),
        ("enable_sanity_checks", json!(false)),
        ("save_muon_momentum_buffer_in_memory", json!(false)),
        ("leaf_module", Value::Null),
    ];
    let section = stage3_aliases(top.get("zero_optimization").unwrap_or(&empty))?;
    let o = Obj::new("zero_optimization", &section, ZERO_KEYS, &unsupported)?;
    let stage = match o.count_or("stage", 0)? {
        s @ 0..=3 => s as u8,
        s => return Err(o.invalid("stage", &format!("{s}: expected 0, 1, 2 or 3"))),
    };
    for (key, default) in [("reduce_scatter", true), ("allgather_partitions", true)] {
        if o.bool_or(key, default)? != default {
            return Err(ConfigError::Unsupported {
                key: o.path(key),
                reason: if key == "reduce_scatter" {
                    "stages 1-3 always reduce-scatter straight into the owning rank (never all-reduce then slice)".into()
                } else {
                    "parameters are always re-gathered with all-gather, not a series of broadcasts"
                        .into()
                },
            });
        }
    }
    let legacy = offload::Legacy::read(&o, notes)?;
    let offload_optimizer = offload::offload_optimizer(&o, &legacy)?;
    if offload_optimizer.partial {
        if stage != 3 {
            return Err(ConfigError::Unsupported {
                key: o.path("offload_optimizer.ratio"),
                reason: "a ratio below 1 is DeepSpeed's stage-3 partial offload (Twin-Flow); at stages 1-2 the whole optimizer state is offloaded (ratio 1.0)".into(),
            });
        }
        notes.push("zero_optimization.offload_optimizer.ratio below 1: zero offloads the whole optimizer state (the numbers are DeepSpeed's partial offload's; only where the state lives differs)".into());
    }
    let mut offload_param = offload::offload_param(&o, &legacy)?;
    if offload_optimizer.device != OffloadDevice::None && stage == 0 {
        return Err(ConfigError::Inconsistent(
            "zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3 (stage 0 keeps the whole optimizer state on every rank)".into(),
        ));
    }
    if offload_param.device != OffloadDevice::None && stage != 3 {
        // DeepSpeed 0.19.8 reads offload_param only at stage 3 and ignores it below, without a
        // word (DeepSpeedExamples' own sweeps run stage 2 with it): the same here, noted.
        notes.push(format!(
            "zero_optimization.offload_param is ignored at stage {stage}, as in DeepSpeed: it offloads the partitioned 16-bit parameters of stage 3, and stage {stage} keeps the parameters whole on every rank"
        ));
        offload_param.device = OffloadDevice::None;
    }
    // Either value trains the same: DeepSpeed's `true` swaps F.linear for a function that
    // saves the weight instead of its transpose; zero's stage 3 always saves the parameter
    // (not the gathered view) for backward, with torch's own F.linear arithmetic.
    o.bool_or("memory_efficient_linear", true)?;
    let contiguous_gradients = o.bool_or("contiguous_gradients", true)?;
    if !contiguous_gradients {
        notes.push("zero_optimization.contiguous_gradients=false: zero always writes gradients into contiguous buckets".into());
    }
    if o.get("allgather_bucket_size").is_some() {
        notes.push("zero_optimization.allgather_bucket_size: parameters are all-gathered per reduce bucket (the same units as the reduce-scatter), so this size has no further effect".into());
    }
    if o.get("sub_group_size").is_some() && offload_optimizer.device == OffloadDevice::None {
        notes.push("zero_optimization.sub_group_size: with the optimizer on the device it steps the owned partition in one fused pass; sub-groups matter with offload_optimizer".into());
    }
    if stage < 3 {
        // (stage3_param_persistence_threshold also shapes the bucket plan of every stage.)
        for key in [
            "stage3_prefetch_bucket_size",
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
        ] {
            if o.get(key).is_some() {
                notes.push(format!("zero_optimization.{key} applies to stage 3 only"));
            }
        }
    }
    Ok(ZeroOptimization {
        stage,
        overlap_comm: o.bool_or("overlap_comm", stage == 3)?,
        contiguous_gradients,
        reduce_bucket_size: o.count_or("reduce_bucket_size", 500_000_000)?.max(1),
        allgather_bucket_size: o.count_or("allgather_bucket_size", 500_000_000)?,
        prefetch_bucket_size: o.count_or("stage3_prefetch_bucket_size", 50_000_000)?,
        param_persistence_threshold: o.count_or("stage3_param_persistence_threshold", 100_000)?,
        max_live_parameters: o.count_or("stage3_max_live_parameters", 1_000_000_000)?,
        max_reuse_distance: o.count_or("stage3_max_reuse_distance", 1_000_000_000)?,
        gather_16bit_weights_on_model_save: o
            .bool_or("stage3_gather_16bit_weights_on_model_save", false)?,
        sub_group_size: o.count_or("sub_group_size", 1_000_000_000)?.max(1),
        offload_optimizer,
        offload_param,
    })
}
