#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod loader;
pub mod nccl;
pub mod nvrtc;

pub use loader::{load_library, LoadError, LoadedLibrary};
