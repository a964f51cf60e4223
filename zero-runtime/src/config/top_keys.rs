//! The top-level keys (DeepSpeed's `DeepSpeedConfig`) that `Obj` reads, with their rows of
//! docs/CONFIG.md. Feature sections and keys accepted with any value are taken out before
//! (see `compat`), and are not candidates of the "did you mean" suggestions.

use super::keys::{DocNames, Fixed, Key, KeyDefault, Section};

/// The top level. Its doc rows sit in the doc where it puts them, among the sections'.
pub(super) const TOP: Section = Section {
    path: "",
    names: DocNames::Path,
    keys: &[
        TRAIN_BATCH_SIZE,
        TRAIN_MICRO_BATCH_SIZE_PER_GPU,
        GRADIENT_ACCUMULATION_STEPS,
        GRADIENT_CLIPPING,
        OPTIMIZER,
        SCHEDULER,
        FP16,
        BF16,
        ZERO_OPTIMIZATION,
        WALL_CLOCK_BREAKDOWN,
        STEPS_PER_PRINT,
        CHECKPOINT,
        AIO,
        COMMUNICATION_DATA_TYPE,
        DATA_TYPES,
        Key::only("prescale_gradients", Fixed::Bool(false)).doc(DEEPSPEED_DEFAULTS_ONLY),
        Key::only("gradient_predivide_factor", Fixed::Float(1.0)).doc(DEEPSPEED_DEFAULTS_ONLY),
        Key::only("gradient_allreduce_op", Fixed::Str("mean")).doc(DEEPSPEED_DEFAULTS_ONLY),
        Key::only("managed_gradient_accumulation", Fixed::Bool(true)).doc(DEEPSPEED_DEFAULTS_ONLY),
        Key::only("disable_allgather", Fixed::Bool(false)),
        Key::only("dump_state", Fixed::Bool(false)),
    ],
};

/// The batch: micro × accumulation × world.
pub(super) const TRAIN_BATCH_SIZE: Key = Key::new(
    "train_batch_size",
    KeyDefault::Text("micro × accumulation × world"),
)
.doc(BATCH)
.doc_default(BATCH_DEFAULT);

/// The micro batch of each rank.
pub(super) const TRAIN_MICRO_BATCH_SIZE_PER_GPU: Key =
    Key::new("train_micro_batch_size_per_gpu", KeyDefault::Text("1"))
        .doc(BATCH)
        .doc_default(BATCH_DEFAULT);

/// Micro-steps per optimizer step.
pub(super) const GRADIENT_ACCUMULATION_STEPS: Key =
    Key::new("gradient_accumulation_steps", KeyDefault::Text("1"))
        .doc(BATCH)
        .doc_default(BATCH_DEFAULT);

/// The doc row of the three batch keys (one row).
const BATCH: &str =
    "any two imply the third; an inconsistent triple is an error. One alone: a lone \
    `train_batch_size` means accumulation 1; a lone micro batch or accumulation means the \
    other is 1";

/// The default column of the batch keys' row.
const BATCH_DEFAULT: &str = "micro 1, accumulation 1";

/// The global gradient norm clipped to (0 disables clipping).
pub(super) const GRADIENT_CLIPPING: Key = Key::new("gradient_clipping", KeyDefault::Float(1.0))
    .doc("DeepSpeed's current default (was 0.0 before PR #8068). 0 disables");

/// The `optimizer` section (none: no optimizer).
pub(super) const OPTIMIZER: Key = Key::new("optimizer", KeyDefault::Text("**none**")).doc(
    "absent (or without a `type`): **no optimizer**, as in DeepSpeed: the engine runs \
    forward passes, and backward and step are an error naming the missing optimizer \
    (`EngineError::NoOptimizer`). A front-end may pass one in code (zero_torch's \
    `initialize(optimizer=...)`; the examples pass their own AdamW and say so). Before, \
    zero trained with AdamW's defaults here, a silent difference from DeepSpeed",
);

/// The `scheduler` section.
pub(super) const SCHEDULER: Key = Key::new("scheduler", KeyDefault::Text("none")).doc(
    "`WarmupLR`, `WarmupDecayLR`, `WarmupCosineLR` with DeepSpeed's params and defaults \
    (warmup_min_lr 0, **warmup_max_lr: each parameter group's own lr** when absent, as \
    DeepSpeed's schedulers take it; warmup_num_steps 1000 (at least 2), warmup_type `log`, \
    cos_min_ratio 1e-4; `WarmupCosineLR`'s ratios multiply each group's lr). As in \
    DeepSpeed the first optimizer step uses iteration −1 (min LR, or ratio 0) and skipped \
    steps do not advance the schedule. The LR is computed in f64 from the lr as written, \
    then rounded to f32 for the step. A scheduler a front-end is given in code wins over \
    this section (as in DeepSpeed)",
);

/// The `fp16` section.
pub(super) const FP16: Key = Key::new("fp16", KeyDefault::Text("disabled")).doc(
    "enabled, loss_scale (0 = dynamic), initial_scale_power 16, loss_scale_window 1000, \
    hysteresis 2, consecutive_hysteresis false, min_loss_scale 1 — \
    `DynamicLossScaler.update_scale` exactly, including the error at the minimum scale",
);

/// The `bf16` section (`bfloat16` is read as it when `bf16` is absent).
pub(super) const BF16: Key = Key::new("bf16", KeyDefault::Text("disabled"))
    .alias("bfloat16")
    .doc(
        "enabled; `check_grad_overflow` is read (zero skips a step with non-finite gradients \
        in every precision). fp16 and bf16 together is an error",
    );

/// The `zero_optimization` section (its rows are its keys').
pub(super) const ZERO_OPTIMIZATION: Key =
    Key::new("zero_optimization", KeyDefault::Text("stage 0"));

/// Whether rank 0 prints the phases' times.
pub(super) const WALL_CLOCK_BREAKDOWN: Key =
    Key::new("wall_clock_breakdown", KeyDefault::Bool(false)).doc(
        "rank 0 prints forward, backward, reduce, gather and step times every \
        `steps_per_print` steps",
    );

/// Steps between prints.
pub(super) const STEPS_PER_PRINT: Key = Key::new("steps_per_print", KeyDefault::Count(10)).doc("");

/// The `checkpoint` section (its rows are its keys').
pub(super) const CHECKPOINT: Key = Key::new("checkpoint", KeyDefault::Text("see its keys"));

/// The `aio` section: how swap files are read and written.
pub(super) const AIO: Key = Key::new(
    "aio",
    KeyDefault::Text("block_size 1 MiB, queue_depth 8, intra_op_parallelism 1"),
)
.doc(
    "how swap files are read and written: `O_DIRECT` `pread`/`pwrite` in `block_size` \
    requests, `intra_op_parallelism × queue_depth` of them in flight (capped at 64 \
    threads), one transfer job after another on an I/O thread; `single_submit`, \
    `overlap_events` are read (no effect: there is no io_uring/libaio submission to tune); \
    the older `thread_count` is read as `intra_op_parallelism` (DeepSpeed now ignores it \
    silently) and noted, and the two disagreeing is an error; `use_gds: true` is an error \
    (no GPUDirect Storage)",
);

/// The dtype gradients are reduced in (only the training dtype).
pub(super) const COMMUNICATION_DATA_TYPE: Key = Key::new(
    "communication_data_type",
    KeyDefault::Text("the training dtype"),
)
.doc(
    "only the training dtype: zero reduces gradients in it, summing in f32 and rounding \
    once; another value is an error",
);

/// The `data_types` section (its rows are its keys').
pub(super) const DATA_TYPES: Key = Key::new("data_types", KeyDefault::Text("see its keys"));

/// The doc row of the keys accepted only at DeepSpeed's default (one row).
const DEEPSPEED_DEFAULTS_ONLY: &str = "only DeepSpeed's defaults";
