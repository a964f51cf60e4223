#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod config;
pub mod scaler;
pub mod schedule;

pub use config::{ConfigError, Precision, ZeroConfig};

/// The kernels the engine runs (`zero-kernels`).
pub use zero_kernels as kernels;

/// The collectives the engine runs over (`zero-comm`).
pub use zero_comm as comm;
