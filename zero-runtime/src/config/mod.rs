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

mod batch;
mod checkpoint;
mod checkpoint_keys;
mod compat;
#[cfg(test)]
mod doc_table;
mod error;
mod json;
mod keys;
mod offload;
mod offload_keys;
mod optimizer;
mod optimizer_keys;
mod precision;
mod precision_keys;
mod scheduler;
mod scheduler_keys;
mod top_keys;
mod zero_keys;
mod zero_optimization;

pub use checkpoint::{CheckpointConfig, TagValidation};
pub use error::ConfigError;
pub use offload::{AioConfig, OffloadDevice, OffloadOptimizerConfig, OffloadParamConfig};
pub use optimizer::OptimizerConfig;
pub use precision::{GradAccumDtype, LossScaleConfig, Precision};
pub use scheduler::{SchedulerConfig, WarmupType};
pub use zero_optimization::ZeroOptimization;

use json::Obj;
use serde_json::Value;
use top_keys::{
    COMMUNICATION_DATA_TYPE, GRADIENT_CLIPPING, STEPS_PER_PRINT, TOP, WALL_CLOCK_BREAKDOWN,
};

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
    /// Consecutive ranks per node, as the launcher says (`LOCAL_WORLD_SIZE`; not a
    /// DeepSpeed key): decides which groups' collectives the comm report books as
    /// inter-node, and bounds hpZ's groups. `None`: every rank on one node. The front-end
    /// sets it (zero_torch does, from the launcher).
    pub ranks_per_node: Option<usize>,
    /// Keys accepted that have no effect in zero, each with why (print them).
    pub notes: Vec<String>,
    /// The JSON this was parsed from (recorded in checkpoints).
    pub source: Value,
}

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
        let v = &compat::deepspeed_keys(v, &mut notes)?;
        let top = Obj::new(TOP.path, v, &TOP.known(), &TOP.unsupported())?;
        let world = world.max(1) as u64;

        let (train_batch_size, micro, accum) = batch::batch(&top, world)?;
        let gradient_clipping =
            top.f64_or(GRADIENT_CLIPPING.name, const { GRADIENT_CLIPPING.float() })?;
        if gradient_clipping < 0.0 {
            return Err(top.invalid(GRADIENT_CLIPPING.name, "must be >= 0 (0 disables clipping)"));
        }
        let optimizer = optimizer::optimizer(&top)?;
        let scheduler = scheduler::scheduler(&top)?;
        let precision = precision::precision(&top)?;
        if let Some(t) = top.str(COMMUNICATION_DATA_TYPE.name)? {
            let training = precision.name();
            if t != training {
                return Err(ConfigError::Unsupported {
                    key: COMMUNICATION_DATA_TYPE.name.into(),
                    reason: format!(
                        "`{t}`: zero reduces gradients in the training dtype ({training}), summing in f32 and rounding once"
                    ),
                });
            }
        }
        let grad_accum_dtype = precision::grad_accum_dtype(&top, precision)?;
        let zero = zero_optimization::zero(&top, &mut notes)?;
        if let Some(s) = zero.shard_size {
            if world % s as u64 != 0 {
                return Err(ConfigError::Inconsistent(format!(
                    "zero_optimization.mics_shard_size is {s}, which does not divide the world size {world}: shard groups are {s} consecutive ranks, each holding the whole model"
                )));
            }
        }
        if zero.hpz_partition_size > 1 && world % zero.hpz_partition_size as u64 != 0 {
            return Err(ConfigError::Inconsistent(format!(
                "zero_optimization.zero_hpz_partition_size is {}, which does not divide the world size {world}",
                zero.hpz_partition_size
            )));
        }
        let checkpoint = checkpoint::checkpoint(&top)?;
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
            wall_clock_breakdown: top.bool_or(
                WALL_CLOCK_BREAKDOWN.name,
                const { WALL_CLOCK_BREAKDOWN.flag() },
            )?,
            steps_per_print: top
                .count_or(STEPS_PER_PRINT.name, const { STEPS_PER_PRINT.count() })?,
            checkpoint,
            aio,
            notes,
            ranks_per_node: None,
            source: v.clone(),
        })
    }
}
