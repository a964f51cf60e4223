//! Errors of the collectives: each names the collective and the ranks involved.

use std::time::Duration;

/// A collective failed. Once a group has failed, every later collective on it fails too
/// (as an NCCL communicator does after an abort).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    /// Ranks issued different collectives at the same position.
    #[error("collective #{seq} does not match across ranks: {detail}")]
    Mismatch {
        /// Position of the collective in issue order (from 0).
        seq: u64,
        /// What each rank issued.
        detail: String,
    },
    /// A rank issued a collective with arguments that are wrong on their own.
    #[error("rank {rank}: invalid {op}: {reason}")]
    InvalidArgument {
        /// The rank that made the call.
        rank: usize,
        /// The collective.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// A rank dropped its communicator (or panicked), so collectives can no longer complete.
    #[error("rank {rank} {} the group; no collective can complete any more", if *.panicked { "panicked and left" } else { "left" })]
    RankLeft {
        /// The rank that left.
        rank: usize,
        /// Whether it left by panicking.
        panicked: bool,
    },
    /// A rank's process ended without leaving the group (killed, or crashed).
    #[error("rank {rank} (pid {pid}) died; no collective can complete any more")]
    RankDied {
        /// The rank whose process ended.
        rank: usize,
        /// Its process id.
        pid: u32,
    },
    /// A rank waited longer than the group's timeout.
    #[error("collective #{seq} ({op}) timed out after {after:?} on rank {waiter}; ranks that never issued it: {missing:?}")]
    Timeout {
        /// Position of the collective.
        seq: u64,
        /// The collective.
        op: String,
        /// The timeout that expired.
        after: Duration,
        /// The rank whose wait expired.
        waiter: usize,
        /// Ranks that had not issued the collective when the wait expired.
        missing: Vec<usize>,
    },
    /// The backend failed to run a collective (a CUDA or NCCL error).
    #[error("collective #{seq} ({op}) failed in the backend: {reason}")]
    Backend {
        /// Position of the collective.
        seq: u64,
        /// The collective.
        op: String,
        /// The backend's message.
        reason: String,
    },
    /// The communicator's internal state is gone (a bug, reported rather than hung on).
    #[error("the communicator's internal state is gone")]
    Disconnected,
}
