//! The `fp16`, `bf16` and `data_types` sections' keys (DeepSpeed's `FP16_*`, `BFLOAT16_*`
//! and `data_types` config), with their rows of docs/CONFIG.md.

use super::keys::{DocNames, Fixed, Key, KeyDefault, Section};
use super::top_keys::{BF16, DATA_TYPES, FP16};

/// The `fp16` section.
pub(super) const FP16_SECTION: Section = Section {
    path: FP16.name,
    names: DocNames::Path,
    keys: &[
        ENABLED,
        LOSS_SCALE,
        INITIAL_SCALE_POWER,
        LOSS_SCALE_WINDOW,
        HYSTERESIS,
        CONSECUTIVE_HYSTERESIS,
        MIN_LOSS_SCALE,
        Key::only("auto_cast", Fixed::Bool(false)),
        Key::only("fp16_master_weights_and_grads", Fixed::Bool(false)),
    ],
};

/// The `bf16` section.
pub(super) const BF16_SECTION: Section = Section {
    path: BF16.name,
    names: DocNames::Path,
    keys: &[
        ENABLED,
        Key::new("check_grad_overflow", KeyDefault::Bool(false)),
        Key::only("bf16_master_weights_and_grads", Fixed::Bool(false)),
        Key::only("bf16_optimizer_states", Fixed::Bool(false)),
        Key::only("immediate_grad_update", Fixed::Bool(false)),
    ],
};

/// The `data_types` section.
pub(super) const DATA_TYPES_SECTION: Section = Section {
    path: DATA_TYPES.name,
    names: DocNames::Path,
    keys: &[
        GRAD_ACCUM_DTYPE,
        PARAM_DTYPE,
        Key::only("buffer_dtype", Fixed::Null),
        Key::only("keep_in_fp32_modules", Fixed::Str("auto")),
    ],
};

/// Whether the precision is on (`fp16`, `bf16`).
pub(super) const ENABLED: Key = Key::new("enabled", KeyDefault::Bool(false));

/// The static loss scale; 0: dynamic.
pub(super) const LOSS_SCALE: Key = Key::new("loss_scale", KeyDefault::Float(0.0));

/// The dynamic scale starts at 2^this.
pub(super) const INITIAL_SCALE_POWER: Key = Key::new("initial_scale_power", KeyDefault::Count(16));

/// Good steps before the scale doubles.
pub(super) const LOSS_SCALE_WINDOW: Key = Key::new("loss_scale_window", KeyDefault::Count(1000));

/// Overflows tolerated before the scale halves.
pub(super) const HYSTERESIS: Key = Key::new("hysteresis", KeyDefault::Count(2));

/// Whether every good step refills the hysteresis.
pub(super) const CONSECUTIVE_HYSTERESIS: Key =
    Key::new("consecutive_hysteresis", KeyDefault::Bool(false));

/// The smallest dynamic scale.
pub(super) const MIN_LOSS_SCALE: Key = Key::new("min_loss_scale", KeyDefault::Float(1.0));

/// The dtype a window's gradients are summed in.
pub(super) const GRAD_ACCUM_DTYPE: Key =
    Key::new("grad_accum_dtype", KeyDefault::Text("the training dtype")).doc(
        "what a window's micro-steps' gradients are summed in, as DeepSpeed: the training \
        dtype (16-bit sums rounded once per addition; no extra buffer at stages 0–1, a \
        2/N-byte partition at stages 2–3 for 16-bit training) or `fp32` (an fp32 buffer: 4 \
        bytes per parameter at stages 0–1, 4/N at 2–3). torch's names (`float32`, \
        `torch.bfloat16`, `half`, ...) are taken; bf16 sums of fp16 training (or the \
        reverse, or 16-bit sums of fp32 training) are an error. `data_types.param_dtype` \
        must name the training dtype, as DeepSpeed asserts; `buffer_dtype` and \
        `keep_in_fp32_modules` only at their defaults",
    );

/// The parameters' dtype (only the training dtype).
pub(super) const PARAM_DTYPE: Key = Key::new("param_dtype", KeyDefault::Text("the training dtype"));
