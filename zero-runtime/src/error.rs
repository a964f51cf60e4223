//! Errors of the engine, each naming what is wrong.

use crate::config::ConfigError;
use crate::scaler::LossScaleAtMinimum;
use zero_comm::CommError;
use zero_kernels::{DType, KernelError};

/// Something the engine could not do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A collective failed (on every rank).
    #[error("communication failed: {0}")]
    Comm(#[from] CommError),
    /// A kernel rejected its arguments.
    #[error("kernel error: {0}")]
    Kernel(#[from] KernelError),
    /// The fp16 loss scale cannot go lower; DeepSpeed stops the run here too.
    #[error(transparent)]
    LossScale(#[from] LossScaleAtMinimum),
    /// The registered model is unusable.
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// No module with this index.
    #[error("module {index} does not exist: the model has {count} modules")]
    UnknownModule {
        /// The index given.
        index: usize,
        /// Modules registered.
        count: usize,
    },
    /// A stage-3 module was used without `fetch`.
    #[error("module `{0}` is not gathered: call fetch() before using its parameters (stage 3)")]
    NotFetched(String),
    /// Views of one dtype were asked of buffers of another.
    #[error("the engine's buffers hold {actual}, not {requested}")]
    WrongDType {
        /// The dtype asked for.
        requested: DType,
        /// The dtype the buffers hold.
        actual: DType,
    },
    /// A range of elements outside the buffer it names (a [`Device`](crate::Device)
    /// call's arguments).
    #[error("{what}: elements {}..{} lie outside a buffer of {len}", range.start, range.end)]
    OutOfRange {
        /// Which call and argument.
        what: String,
        /// The elements asked for.
        range: std::ops::Range<usize>,
        /// The buffer's length.
        len: usize,
    },
    /// Training without an optimizer (none in the config, none given in code).
    #[error("no optimizer: {0}")]
    NoOptimizer(String),
    /// Calls out of order (for example `grads_ready` twice in a micro-step).
    #[error("call out of order: {0}")]
    Order(String),
    /// Gradients of the wrong shape.
    #[error("module `{module}`: {detail}")]
    GradShape {
        /// The module.
        module: String,
        /// What is wrong.
        detail: String,
    },
    /// The device failed (a CUDA driver error, out of memory, no GPU).
    #[error("device error: {0}")]
    Device(String),
    /// A checkpoint could not be saved or loaded.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A buffer went with a collective whose wait failed (that [`Comm`](Self::Comm) error
    /// was returned then): the engine cannot go on, as a DeepSpeed or FSDP run cannot
    /// after a failed collective.
    #[error("{0} went with a collective that failed (its error was returned then): this engine cannot go on; start again from the last checkpoint")]
    Lost(String),
    /// A broken invariant inside the engine (a bug, reported rather than panicked on).
    #[error("internal error: {0}")]
    Internal(String),
}
