//! NCCL: the backend for one rank per GPU, bootstrapped from the launcher's environment.

pub mod bootstrap;

pub use bootstrap::{rendezvous, BootstrapError, LaunchEnv};
