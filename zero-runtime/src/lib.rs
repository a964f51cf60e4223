#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod checkpoint;
pub mod config;
mod cuda_device;
pub mod device;
pub mod engine;
mod error;
pub mod io;
pub mod model;
pub mod plan;
pub mod scaler;
pub mod schedule;

pub use checkpoint::{CheckpointError, LoadOptions};
pub use config::{ConfigError, Precision, ZeroConfig};
pub use cuda_device::CudaDevice;
pub use device::{AdamRun, Device, HostDevice};
pub use engine::{
    CommCounters, CommReport, Engine, ExternalArray, ExternalPiece, ImportedParam, ImportedState,
    MemoryReport, StagePolicy, StatePiece, StepOutcome, TierBytes, Timings,
};
pub use error::EngineError;
pub use model::{ModuleSpec, ParamSpec};

/// The kernels the engine runs (`zero-kernels`).
pub use zero_kernels as kernels;

/// The collectives the engine runs over (`zero-comm`).
pub use zero_comm as comm;
