#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

/// The kernels the engine runs (`zero-kernels`).
pub use zero_kernels as kernels;

/// The collectives the engine runs over (`zero-comm`).
pub use zero_comm as comm;
