#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod driver;
mod loader;
pub mod nccl;
pub mod nvrtc;

pub use loader::{load_library, LoadError, LoadedLibrary};

/// `cudarc`, the safe CUDA driver and NVRTC layer the other crates use. Call
/// [`driver::library`] or [`nvrtc::library`] before it: `cudarc` panics on a missing
/// library, those return an error.
pub use cudarc;
