//! How the ranks of a job hand each other rank 0's id (NCCL's unique id, or the
//! shared-memory group's nonce): zero's own TCP rendezvous ([`TcpRendezvous`], on the port
//! the launcher's variables imply), or whatever a framework already runs beside zero (a
//! [`IdExchange`] of its own: zero_torch's goes through torch's store, so no port of
//! zero's is opened where torch's group exists).

use super::env::{BootstrapError, LaunchEnv};
use super::rendezvous::{rendezvous, ID_BYTES};
use std::time::Duration;

/// Hands rank 0's id to every rank of `env`'s job.
pub trait IdExchange {
    /// Rank 0 passes `Some(id)`, every other rank `None`; returns rank 0's id on every
    /// rank, or an error within `timeout` (a rank that never gets it must not hang).
    fn exchange(
        &mut self,
        env: &LaunchEnv,
        id: Option<[u8; ID_BYTES]>,
        timeout: Duration,
    ) -> Result<[u8; ID_BYTES], BootstrapError>;
}

/// zero's own rendezvous ([`rendezvous`]): rank 0 listens on [`LaunchEnv::port`] and
/// checks every rank's world size and job before it answers.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpRendezvous;

impl IdExchange for TcpRendezvous {
    fn exchange(
        &mut self,
        env: &LaunchEnv,
        id: Option<[u8; ID_BYTES]>,
        timeout: Duration,
    ) -> Result<[u8; ID_BYTES], BootstrapError> {
        rendezvous(env, id, timeout)
    }
}
