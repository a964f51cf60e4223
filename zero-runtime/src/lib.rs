#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod config;
mod cuda_device;
pub mod device;
pub mod engine;
mod error;
pub mod model;
pub mod plan;
pub mod scaler;
pub mod schedule;

pub use config::{ConfigError, GradAccumDtype, Precision, ZeroConfig};
pub use cuda_device::CudaDevice;
pub use device::{AdamRun, Device, HostDevice};
pub use engine::{
    BackwardEnd, CommCounters, CommReport, Engine, Expectation, ExternalArray, ExternalPiece,
    HeldParam, HfLoadOptions, ImportedParam, ImportedState, MemoryReport, SaveOptions, StagePolicy,
    StatePiece, StepOutcome, TierBytes, TierCounters, Timings,
};
pub use error::EngineError;
pub use model::{ModuleSpec, ParamSpec};
/// The checkpoint format, its files, the Hugging Face export and the one file I/O layer
/// (`zero-checkpoint`), which the engine's saves, loads and NVMe offload build on.
pub use zero_checkpoint as checkpoint;
pub use zero_checkpoint::io;
pub use zero_checkpoint::{CheckpointError, LoadOptions};

/// The kernels the engine runs (`zero-kernels`).
pub use zero_kernels as kernels;

/// The collectives the engine runs over (`zero-comm`).
pub use zero_comm as comm;
