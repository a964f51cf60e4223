//! NCCL: the backend for one rank per GPU, bootstrapped from the launcher's environment.

pub mod bootstrap;
mod comm;
pub mod launch;

pub use bootstrap::rendezvous;
pub use comm::{NcclComm, NcclWork};
pub use launch::{first_host, BootstrapError, LaunchEnv, Launcher, LAUNCH_VARIABLES};
