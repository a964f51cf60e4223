//! The `scheduler` section's keys and each schedule's `params` (DeepSpeed's `WarmupLR`,
//! `WarmupDecayLR` and `WarmupCosineLR` arguments). The section's doc row is the top
//! level's `scheduler` row.

use super::keys::{DocNames, Key, KeyDefault, Section};
use super::optimizer_keys::{PARAMS, TYPE};
use super::top_keys::SCHEDULER;

/// The `scheduler` section.
pub(super) const SCHEDULER_SECTION: Section = Section {
    path: SCHEDULER.name,
    names: DocNames::Path,
    keys: &[TYPE, PARAMS],
};

/// `scheduler.params` of `WarmupLR`.
pub(super) const WARMUP_LR_PARAMS: Section = Section {
    path: "scheduler.params",
    names: DocNames::Path,
    keys: &[
        WARMUP_MIN_LR,
        WARMUP_MAX_LR,
        WARMUP_NUM_STEPS,
        WARMUP_TYPE,
        LAST_BATCH_ITERATION,
    ],
};

/// `scheduler.params` of `WarmupDecayLR`: `WarmupLR`'s and the decay's end.
pub(super) const WARMUP_DECAY_LR_PARAMS: Section = Section {
    keys: &[
        WARMUP_MIN_LR,
        WARMUP_MAX_LR,
        WARMUP_NUM_STEPS,
        WARMUP_TYPE,
        LAST_BATCH_ITERATION,
        TOTAL_NUM_STEPS,
    ],
    ..WARMUP_LR_PARAMS
};

/// `scheduler.params` of `WarmupCosineLR`.
pub(super) const WARMUP_COSINE_LR_PARAMS: Section = Section {
    keys: &[
        TOTAL_NUM_STEPS,
        WARMUP_MIN_RATIO,
        WARMUP_NUM_STEPS,
        COS_MIN_RATIO,
        WARMUP_TYPE,
        LAST_BATCH_ITERATION,
    ],
    ..WARMUP_LR_PARAMS
};

/// The learning rate the warm-up starts from.
pub(super) const WARMUP_MIN_LR: Key = Key::new("warmup_min_lr", KeyDefault::Float(0.0));

/// The learning rate the warm-up ends at.
pub(super) const WARMUP_MAX_LR: Key = Key::new(
    "warmup_max_lr",
    KeyDefault::Text("each parameter group's lr"),
);

/// The warm-up's steps (at least 2, as DeepSpeed forces).
pub(super) const WARMUP_NUM_STEPS: Key = Key::new("warmup_num_steps", KeyDefault::Count(1000));

/// The warm-up's shape, `log` or `linear`.
pub(super) const WARMUP_TYPE: Key = Key::new("warmup_type", KeyDefault::Text("log"));

/// DeepSpeed's starting iteration (accepted, not read).
pub(super) const LAST_BATCH_ITERATION: Key =
    Key::new("last_batch_iteration", KeyDefault::Text("-1"));

/// The schedule's length (required).
pub(super) const TOTAL_NUM_STEPS: Key = Key::new("total_num_steps", KeyDefault::Text("none"));

/// `WarmupCosineLR`'s starting ratio of the lr.
pub(super) const WARMUP_MIN_RATIO: Key = Key::new("warmup_min_ratio", KeyDefault::Float(0.0));

/// `WarmupCosineLR`'s final ratio of the lr.
pub(super) const COS_MIN_RATIO: Key = Key::new("cos_min_ratio", KeyDefault::Float(0.0001));
