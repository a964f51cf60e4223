//! The keys of `zero_optimization.offload_optimizer`, `zero_optimization.offload_param`
//! and the `aio` section (DeepSpeed's `offload_config.py` and `aio_config.py`). Their doc
//! rows are the `offload_optimizer`, `offload_param` and `aio` rows of the sections above.

use super::keys::{DocNames, Key, KeyDefault, Section};
use super::top_keys::AIO;

/// `zero_optimization.offload_optimizer`.
pub(super) const OFFLOAD_OPTIMIZER_SECTION: Section = Section {
    path: "zero_optimization.offload_optimizer",
    names: DocNames::Path,
    keys: &[
        DEVICE,
        NVME_PATH,
        PIN_MEMORY,
        OPTIMIZER_BUFFER_COUNT,
        PIPELINE_READ,
        PIPELINE_WRITE,
        FAST_INIT,
        RATIO,
    ],
};

/// `zero_optimization.offload_param`.
pub(super) const OFFLOAD_PARAM_SECTION: Section = Section {
    path: "zero_optimization.offload_param",
    names: DocNames::Path,
    keys: &[
        DEVICE,
        NVME_PATH,
        PIN_MEMORY,
        PARAM_BUFFER_COUNT,
        BUFFER_SIZE,
        MAX_IN_CPU,
    ],
};

/// The `aio` section.
pub(super) const AIO_SECTION: Section = Section {
    path: AIO.name,
    names: DocNames::Path,
    keys: &[
        BLOCK_SIZE,
        QUEUE_DEPTH,
        INTRA_OP_PARALLELISM,
        THREAD_COUNT,
        SINGLE_SUBMIT,
        OVERLAP_EVENTS,
        USE_GDS,
    ],
};

/// Where the state lives: `none`, `cpu` or `nvme`.
pub(super) const DEVICE: Key = Key::new("device", KeyDefault::Text("none"));

/// The folder of the swap files (required for `nvme`).
pub(super) const NVME_PATH: Key = Key::new("nvme_path", KeyDefault::Text("none"));

/// Whether the host buffers are pinned (true, as DeepSpeed since PR #8207).
pub(super) const PIN_MEMORY: Key = Key::new("pin_memory", KeyDefault::Bool(true));

/// Host buffers of the optimizer's NVMe pipeline.
pub(super) const OPTIMIZER_BUFFER_COUNT: Key = Key::new("buffer_count", KeyDefault::Count(4));

/// Host buffers of the parameters' NVMe reads.
pub(super) const PARAM_BUFFER_COUNT: Key = Key {
    default: KeyDefault::Count(5),
    ..OPTIMIZER_BUFFER_COUNT
};

/// Read ahead (always, here).
pub(super) const PIPELINE_READ: Key = Key::new("pipeline_read", KeyDefault::Bool(false));

/// Write behind (always, here).
pub(super) const PIPELINE_WRITE: Key = Key::new("pipeline_write", KeyDefault::Bool(false));

/// DeepSpeed's fast initialization (accepted).
pub(super) const FAST_INIT: Key = Key::new("fast_init", KeyDefault::Bool(false));

/// The fraction of the optimizer state offloaded.
pub(super) const RATIO: Key = Key::new("ratio", KeyDefault::Float(1.0));

/// Elements of a host buffer of offloaded parameters.
pub(super) const BUFFER_SIZE: Key = Key::new("buffer_size", KeyDefault::Count(100_000_000));

/// DeepSpeed's cap on parameters kept in host memory (read, no effect).
pub(super) const MAX_IN_CPU: Key = Key::new("max_in_cpu", KeyDefault::Count(1_000_000_000));

/// Bytes per request.
pub(super) const BLOCK_SIZE: Key = Key::new("block_size", KeyDefault::Count(1 << 20));

/// Requests in flight per thread.
pub(super) const QUEUE_DEPTH: Key = Key::new("queue_depth", KeyDefault::Count(8));

/// I/O threads.
pub(super) const INTRA_OP_PARALLELISM: Key = Key::new("intra_op_parallelism", KeyDefault::Count(1));

/// The older name of `intra_op_parallelism`.
pub(super) const THREAD_COUNT: Key = Key::new("thread_count", KeyDefault::Count(1));

/// Accepted (no submission to tune).
pub(super) const SINGLE_SUBMIT: Key = Key::new("single_submit", KeyDefault::Bool(false));

/// Accepted (no submission to tune).
pub(super) const OVERLAP_EVENTS: Key = Key::new("overlap_events", KeyDefault::Bool(true));

/// GPUDirect Storage (not built: only false).
pub(super) const USE_GDS: Key = Key::new("use_gds", KeyDefault::Bool(false));
