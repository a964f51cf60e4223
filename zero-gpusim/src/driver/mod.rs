//! The CUDA driver's state and checks, behind the `extern "C"` entry points of
//! [`crate::ffi`].

pub mod clock;
pub mod config;
pub mod errors;
pub mod event;
pub mod exec;
pub mod exec_ctx;
pub mod host;
pub mod launch;
pub mod memory;
pub mod module;
pub mod shadow;
pub mod state;
pub mod stream;
pub mod traffic;
pub mod work;
