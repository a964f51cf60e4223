//! DeepSpeed's top-level keys zero accepts without implementing them: feature sections
//! accepted while disabled, keys that change nothing zero computes, and `bfloat16`.

use super::top_keys::{STEPS_PER_PRINT, TOP};
use super::ConfigError;
use serde_json::{json, Value};

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
/// config with them taken out (and the top level's aliases, `bfloat16`, read as their
/// keys when those are absent, as DeepSpeed reads it).
pub(super) fn deepspeed_keys(v: &Value, notes: &mut Vec<String>) -> Result<Value, ConfigError> {
    let mut v = v.clone();
    let Some(map) = v.as_object_mut() else {
        return Ok(v);
    };
    for (alias, name) in TOP.aliases() {
        if let Some(b) = map.remove(alias) {
            if !map.contains_key(name) {
                map.insert(name.into(), b);
            }
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
    if let Some(Value::Number(n)) = map.get(STEPS_PER_PRINT.name) {
        if n.as_f64().is_some_and(|x| x >= 1.8e19) {
            map.insert(STEPS_PER_PRINT.name.into(), json!(u64::MAX / 2));
        }
    }
    Ok(v)
}
