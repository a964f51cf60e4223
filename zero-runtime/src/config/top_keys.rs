//! The top-level keys (DeepSpeed's `DeepSpeedConfig`) that `Obj` reads. Feature sections
//! and keys accepted with any value are taken out before (see `compat`), and are not
//! candidates of the "did you mean" suggestions. The doc's rows for these keys are not
//! generated from this table yet: it has no doc rows.

use super::keys::{Fixed, Key, KeyDefault, Section};

/// The top level.
pub(super) const TOP: Section = Section {
    path: "",
    keys: &[
        Key::new(
            "train_batch_size",
            KeyDefault::Text("micro × accumulation × world"),
        ),
        Key::new("train_micro_batch_size_per_gpu", KeyDefault::Text("1")),
        Key::new("gradient_accumulation_steps", KeyDefault::Text("1")),
        GRADIENT_CLIPPING,
        Key::new("optimizer", KeyDefault::Text("none")),
        Key::new("scheduler", KeyDefault::Text("none")),
        Key::new("fp16", KeyDefault::Text("disabled")),
        Key::new("bf16", KeyDefault::Text("disabled")),
        Key::new("zero_optimization", KeyDefault::Text("stage 0")),
        WALL_CLOCK_BREAKDOWN,
        STEPS_PER_PRINT,
        Key::new("checkpoint", KeyDefault::Text("see its keys")),
        Key::new("aio", KeyDefault::Text("see its keys")),
        COMMUNICATION_DATA_TYPE,
        Key::new("data_types", KeyDefault::Text("see its keys")),
        Key::only("prescale_gradients", Fixed::Bool(false)),
        Key::only("gradient_predivide_factor", Fixed::Float(1.0)),
        Key::only("gradient_allreduce_op", Fixed::Str("mean")),
        Key::only("managed_gradient_accumulation", Fixed::Bool(true)),
        Key::only("disable_allgather", Fixed::Bool(false)),
        Key::only("dump_state", Fixed::Bool(false)),
    ],
};

/// The global gradient norm clipped to (0 disables clipping).
pub(super) const GRADIENT_CLIPPING: Key = Key::new("gradient_clipping", KeyDefault::Float(1.0));

/// Whether rank 0 prints the phases' times.
pub(super) const WALL_CLOCK_BREAKDOWN: Key =
    Key::new("wall_clock_breakdown", KeyDefault::Bool(false));

/// Steps between prints.
pub(super) const STEPS_PER_PRINT: Key = Key::new("steps_per_print", KeyDefault::Count(10));

/// The dtype gradients are reduced in (only the training dtype).
pub(super) const COMMUNICATION_DATA_TYPE: Key = Key::new(
    "communication_data_type",
    KeyDefault::Text("the training dtype"),
);
