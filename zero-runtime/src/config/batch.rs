//! The batch keys: `train_batch_size`, `train_micro_batch_size_per_gpu` and
//! `gradient_accumulation_steps`.

use super::json::{Auto, Obj};
use super::top_keys::{
    GRADIENT_ACCUMULATION_STEPS, TRAIN_BATCH_SIZE, TRAIN_MICRO_BATCH_SIZE_PER_GPU,
};
use super::ConfigError;

fn given(o: &Obj, key: &str) -> Result<Option<u64>, ConfigError> {
    Ok(match o.count(key)? {
        Some(Auto::Value(0)) => return Err(o.invalid(key, "must be at least 1")),
        Some(Auto::Value(v)) => Some(v),
        _ => None,
    })
}

pub(super) fn batch(top: &Obj, world: u64) -> Result<(u64, u64, u64), ConfigError> {
    let tbs = given(top, TRAIN_BATCH_SIZE.name)?;
    let mb = given(top, TRAIN_MICRO_BATCH_SIZE_PER_GPU.name)?;
    let gas = given(top, GRADIENT_ACCUMULATION_STEPS.name)?;
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
