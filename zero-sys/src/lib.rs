//! `zero-sys`: the one home of raw `extern` declarations and dynamic library loads.
//!
//! Nothing here is needed to *build* the workspace: every GPU library (CUDA driver,
//! NVRTC, NCCL) is opened at run time with [`load_library`], and a missing library is
//! a [`LoadError`] naming the library and every place we looked, never a panic.
//!
//! The CUDA driver and NVRTC bindings arrive with the CUDA-path issue (through
//! `cudarc`); NCCL arrives with its own loader built on [`load_library`].

mod loader;

pub use loader::{load_library, LoadError, LoadedLibrary};
