//! The `zero_optimization` section.

use super::json::Obj;
use super::offload::{self, OffloadDevice, OffloadOptimizerConfig, OffloadParamConfig};
use super::zero_keys::{
    ALLGATHER_BUCKET_SIZE, ALLGATHER_PARTITIONS, CONTIGUOUS_GRADIENTS, MEMORY_EFFICIENT_LINEAR,
    OVERLAP_COMM, REDUCE_BUCKET_SIZE, REDUCE_SCATTER, STAGE,
    STAGE3_GATHER_16BIT_WEIGHTS_ON_MODEL_SAVE, STAGE3_MAX_LIVE_PARAMETERS,
    STAGE3_MAX_REUSE_DISTANCE, STAGE3_PARAM_PERSISTENCE_THRESHOLD, STAGE3_PREFETCH_BUCKET_SIZE,
    SUB_GROUP_SIZE, ZERO,
};
use super::zero_keys::{MICS_HIERARCHICAL_PARAMS_GATHER, MICS_SHARD_SIZE, ZERO_HPZ_PARTITION_SIZE};
use super::ConfigError;
use serde_json::{json, Value};

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
    /// `mics_shard_size`: ranks per shard group (`None`: the whole world; stage 0: always
    /// `None`).
    pub shard_size: Option<usize>,
    /// `zero_hpz_partition_size`: ranks per hpZ secondary group (1: no hpZ; below stage 3:
    /// always 1).
    pub hpz_partition_size: usize,
    /// `mics_hierarchical_params_gather`: stage 3 gathers a shard group that spans nodes
    /// across the nodes first (below stage 3: always `false`).
    pub hierarchical_gather: bool,
}

/// DeepSpeed's `zero_optimization` takes its stage-3 keys by their field names too
/// (`prefetch_bucket_size` for `stage3_prefetch_bucket_size`, ...): read as the
/// `stage3_` names. Both names at once is an error.
fn stage3_aliases(section: &Value) -> Result<Value, ConfigError> {
    let mut v = section.clone();
    if let Some(map) = v.as_object_mut() {
        for (short, long) in ZERO.aliases() {
            if let Some(val) = map.remove(short) {
                if map.contains_key(long) {
                    return Err(ConfigError::Inconsistent(format!(
                        "zero_optimization has both `{short}` and `{long}`, which name one setting"
                    )));
                }
                map.insert(long.into(), val);
            }
        }
    }
    Ok(v)
}

pub(super) fn zero(top: &Obj, notes: &mut Vec<String>) -> Result<ZeroOptimization, ConfigError> {
    let empty = json!({});
    let section = stage3_aliases(top.get(ZERO.path).unwrap_or(&empty))?;
    let o = Obj::new(ZERO.path, &section, &ZERO.known(), &ZERO.unsupported())?;
    let stage = match o.count_or(STAGE.name, const { STAGE.count() })? {
        s @ 0..=3 => s as u8,
        s => return Err(o.invalid(STAGE.name, &format!("{s}: expected 0, 1, 2 or 3"))),
    };
    for (key, default) in [
        (REDUCE_SCATTER.name, const { REDUCE_SCATTER.flag() }),
        (
            ALLGATHER_PARTITIONS.name,
            const { ALLGATHER_PARTITIONS.flag() },
        ),
    ] {
        if o.bool_or(key, default)? != default {
            return Err(ConfigError::Unsupported {
                key: o.path(key),
                reason: if key == REDUCE_SCATTER.name {
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
    o.bool_or(
        MEMORY_EFFICIENT_LINEAR.name,
        const { MEMORY_EFFICIENT_LINEAR.flag() },
    )?;
    let contiguous_gradients = o.bool_or(
        CONTIGUOUS_GRADIENTS.name,
        const { CONTIGUOUS_GRADIENTS.flag() },
    )?;
    if !contiguous_gradients {
        notes.push("zero_optimization.contiguous_gradients=false: zero always writes gradients into contiguous buckets".into());
    }
    if o.get(ALLGATHER_BUCKET_SIZE.name).is_some() {
        notes.push("zero_optimization.allgather_bucket_size: parameters are all-gathered per reduce bucket (the same units as the reduce-scatter), so this size has no further effect".into());
    }
    if o.get(SUB_GROUP_SIZE.name).is_some() && offload_optimizer.device == OffloadDevice::None {
        notes.push("zero_optimization.sub_group_size: with the optimizer on the device it steps the owned partition in one fused pass; sub-groups matter with offload_optimizer".into());
    }
    if stage < 3 {
        // (stage3_param_persistence_threshold also shapes the bucket plan of every stage.)
        for key in ZERO.noted_below_stage3() {
            if o.get(key).is_some() {
                notes.push(format!("zero_optimization.{key} applies to stage 3 only"));
            }
        }
    }
    let shard_size = match o.get(MICS_SHARD_SIZE.name) {
        None | Some(Value::Null) => None,
        Some(v) if v.as_i64() == Some(-1) => None,
        Some(_) => match o.count(MICS_SHARD_SIZE.name)? {
            Some(super::json::Auto::Value(s)) if s >= 1 => Some(s as usize),
            Some(super::json::Auto::Auto) => None,
            _ => {
                return Err(o.invalid(
                    MICS_SHARD_SIZE.name,
                    "expected a number of ranks >= 1, or -1 for the whole world",
                ))
            }
        },
    };
    let shard_size = if stage == 0 && shard_size.is_some() {
        notes.push("zero_optimization.mics_shard_size: stage 0 shards nothing (every rank holds the whole model), so shard groups change nothing; its gradients are all-reduced over the world".into());
        None
    } else {
        shard_size
    };
    let hpz_partition_size = match o.count_or(
        ZERO_HPZ_PARTITION_SIZE.name,
        const { ZERO_HPZ_PARTITION_SIZE.count() },
    )? {
        0 => {
            return Err(o.invalid(
                ZERO_HPZ_PARTITION_SIZE.name,
                "expected a number of ranks >= 1 (1: no hpZ)",
            ))
        }
        h if stage < 3 => {
            let _ = h; // (noted below with the other stage-3 keys)
            1
        }
        h => h as usize,
    };
    Ok(ZeroOptimization {
        stage,
        overlap_comm: o.bool_or(OVERLAP_COMM.name, stage == 3)?,
        contiguous_gradients,
        reduce_bucket_size: o
            .count_or(
                REDUCE_BUCKET_SIZE.name,
                const { REDUCE_BUCKET_SIZE.count() },
            )?
            .max(1),
        allgather_bucket_size: o.count_or(
            ALLGATHER_BUCKET_SIZE.name,
            const { ALLGATHER_BUCKET_SIZE.count() },
        )?,
        prefetch_bucket_size: o.count_or(
            STAGE3_PREFETCH_BUCKET_SIZE.name,
            const { STAGE3_PREFETCH_BUCKET_SIZE.count() },
        )?,
        param_persistence_threshold: o.count_or(
            STAGE3_PARAM_PERSISTENCE_THRESHOLD.name,
            const { STAGE3_PARAM_PERSISTENCE_THRESHOLD.count() },
        )?,
        max_live_parameters: o.count_or(
            STAGE3_MAX_LIVE_PARAMETERS.name,
            const { STAGE3_MAX_LIVE_PARAMETERS.count() },
        )?,
        max_reuse_distance: o.count_or(
            STAGE3_MAX_REUSE_DISTANCE.name,
            const { STAGE3_MAX_REUSE_DISTANCE.count() },
        )?,
        gather_16bit_weights_on_model_save: o.bool_or(
            STAGE3_GATHER_16BIT_WEIGHTS_ON_MODEL_SAVE.name,
            const { STAGE3_GATHER_16BIT_WEIGHTS_ON_MODEL_SAVE.flag() },
        )?,
        sub_group_size: o
            .count_or(SUB_GROUP_SIZE.name, const { SUB_GROUP_SIZE.count() })?
            .max(1),
        offload_optimizer,
        offload_param,
        shard_size,
        hpz_partition_size,
        hierarchical_gather: stage == 3
            && o.bool_or(MICS_HIERARCHICAL_PARAMS_GATHER.name, false)?,
    })
}
