#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod driver;
pub mod fs;
pub mod host_vec;
pub mod ipc;
mod loader;
pub mod malloc;
pub mod nccl;
pub mod nvrtc;
#[cfg(feature = "python")]
pub mod python;
pub mod stream;

pub use loader::{load_library, LoadError, LoadedLibrary};

/// `cudarc`, the safe CUDA driver layer the other crates use. Call [`driver::library`]
/// before it: `cudarc` panics on a missing library, that returns an error. NVRTC is called
/// through [`nvrtc::Nvrtc`], never through `cudarc`'s own loader.
pub use cudarc;
