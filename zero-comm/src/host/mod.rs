//! `HostGroup`: `n` ranks as threads of one process, over host memory.
//!
//! The group machinery (matching, timeouts, failures) is [`crate::group`]'s; this module
//! supplies the executor that moves host buffers, in fixed rank order.

mod reduce;

use crate::buffer::HostBuffer;
use crate::group::{self, Executor, GroupComm, GroupWork, DEFAULT_TIMEOUT};
use crate::op::OpDesc;
use crate::CommError;
use std::time::Duration;

/// One rank of a [`HostGroup`].
pub type HostComm = GroupComm<HostBuffer>;
/// Handle of a collective issued on a [`HostComm`].
pub type HostWork<T> = GroupWork<HostBuffer, T>;

/// Builds the ranks of an in-process group over host memory.
#[derive(Debug)]
pub struct HostGroup;

impl HostGroup {
    /// `n` ranks with [`DEFAULT_TIMEOUT`]. Move each [`HostComm`] into its own thread.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(n: usize) -> Result<Vec<HostComm>, CommError> {
        Self::with_timeout(n, DEFAULT_TIMEOUT)
    }

    /// `n` ranks whose waits give up after `timeout`: the group is then aborted and every
    /// rank's pending and later collectives fail with [`CommError::Timeout`].
    pub fn with_timeout(n: usize, timeout: Duration) -> Result<Vec<HostComm>, CommError> {
        group::spawn(n, timeout, HostExec)
    }
}

/// Runs collectives with host loops (rayon, multiversioned).
struct HostExec;

impl Executor<HostBuffer> for HostExec {
    fn execute(&mut self, desc: &OpDesc, buffers: &mut [Vec<HostBuffer>]) -> Result<(), String> {
        reduce::execute(desc, buffers);
        Ok(())
    }

    fn fork(&self) -> Result<Self, String> {
        Ok(HostExec)
    }
}
