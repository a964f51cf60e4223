//! NCCL: the backend for one rank per GPU, bootstrapped from the launcher's environment.

pub mod bootstrap;
mod comm;

pub use bootstrap::{rendezvous, BootstrapError, LaunchEnv};
pub use comm::{NcclComm, NcclWork};
