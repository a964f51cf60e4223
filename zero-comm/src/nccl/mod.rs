//! NCCL: the backend for one rank per GPU, bootstrapped from the launcher's environment
//! ([`crate::launch`]).

mod comm;

pub use crate::launch::rendezvous::{self as bootstrap};
pub use crate::launch::{
    first_host, rendezvous, BootstrapError, LaunchEnv, Launcher, LAUNCH_VARIABLES,
};
pub use comm::{NcclComm, NcclWork};
