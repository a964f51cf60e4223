//! Where this process sits in a job started by a launcher (`torchrun`, `deepspeed`,
//! `srun`, `mpirun`), and how the ranks hand each other rank 0's id: zero's TCP rendezvous, or an
//! [`IdExchange`] a framework brings (torch's store, under zero_torch). Both
//! multi-process backends start here: NCCL (one rank per GPU) and the shared-memory group
//! (one rank per process on one machine).

mod env;
mod exchange;
pub mod rendezvous;

pub use env::{first_host, BootstrapError, LaunchEnv, Launcher, LAUNCH_VARIABLES};
pub use exchange::{IdExchange, TcpRendezvous};
pub use rendezvous::rendezvous;
