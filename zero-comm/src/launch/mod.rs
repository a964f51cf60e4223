//! Where this process sits in a job started by a launcher (`torchrun`, `deepspeed`,
//! `srun`, `mpirun`), and the TCP rendezvous that lets the ranks find each other. Both
//! multi-process backends start here: NCCL (one rank per GPU) and the shared-memory group
//! (one rank per process on one machine).

mod env;
pub mod rendezvous;

pub use env::{first_host, BootstrapError, LaunchEnv, Launcher, LAUNCH_VARIABLES};
pub use rendezvous::rendezvous;
