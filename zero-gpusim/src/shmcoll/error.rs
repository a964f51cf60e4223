//! The errors of the collective engine. Each names the ranks involved and, for a
//! collective, its sequence number (`collective #n`, counted from 0 per communicator) and
//! the call as the rank made it (`ncclAllReduce(1024 x bf16, sum)`).

use std::time::Duration;

/// Why a join or a collective failed.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum CollError {
    /// The id was not made by [`unique_id`](super::unique_id).
    #[error("ncclCommInitRank: the unique id is not a zero-gpusim id (its first bytes are not the magic prefix)")]
    BadUniqueId,

    /// A member description that cannot be right.
    #[error("ncclCommInitRank: rank {rank} of {nranks}: {reason}")]
    BadMember {
        /// The rank as given.
        rank: usize,
        /// The world size as given.
        nranks: usize,
        /// What is wrong.
        reason: String,
    },

    /// Two ranks were given different world sizes.
    #[error("ncclCommInitRank: rank {rank} was given nranks={nranks}, but rank {other_rank} created the communicator with nranks={other_nranks}")]
    NranksMismatch {
        /// The rank that found the disagreement.
        rank: usize,
        /// Its world size.
        nranks: usize,
        /// The rank that created the segment.
        other_rank: usize,
        /// Its world size.
        other_nranks: usize,
    },

    /// Two processes joined as the same rank.
    #[error(
        "ncclCommInitRank: rank {rank} joined twice: by pid {first_pid} and by pid {second_pid}"
    )]
    RankTaken {
        /// The rank number taken twice.
        rank: usize,
        /// The process that joined first.
        first_pid: u32,
        /// The process that joined second.
        second_pid: u32,
    },

    /// Two ranks are on one device.
    #[error("ncclCommInitRank: ranks {first} and {second} are both on device {device:?}; each rank needs a device of its own (seen by rank {rank})")]
    SameDevice {
        /// The rank that reports it.
        rank: usize,
        /// The lower rank on the device.
        first: usize,
        /// The higher rank on the device.
        second: usize,
        /// The device key both gave.
        device: String,
    },

    /// Not every rank joined in time.
    #[error("ncclCommInitRank: rank {rank} waited {after:?} for rank(s) {missing:?} of {nranks}, which never joined")]
    JoinTimeout {
        /// The rank that waited.
        rank: usize,
        /// The world size.
        nranks: usize,
        /// Ranks that had not joined.
        missing: Vec<usize>,
        /// How long it waited.
        after: Duration,
    },

    /// The join was given up: the caller's [`AbortFlag`](super::AbortFlag) was set.
    #[error("ncclCommInitRank: rank {rank}: aborted while joining")]
    JoinAborted {
        /// The rank whose flag was set.
        rank: usize,
    },

    /// Another rank's join failed, or it aborted or died while joining.
    #[error("ncclCommInitRank: rank {rank}: the communicator was refused by rank {by}: {detail}")]
    JoinRefused {
        /// The rank that reports it.
        rank: usize,
        /// The rank that refused (or failed, or died).
        by: usize,
        /// What that rank said.
        detail: String,
    },

    /// A system call on the segment failed.
    #[error("{what} {path}: {message}")]
    Io {
        /// The operation (`creating`, `mapping`, …).
        what: String,
        /// The file it was about.
        path: String,
        /// The system's message.
        message: String,
    },

    /// A rank called a collective with arguments that cannot be right.
    #[error("collective #{seq}: rank {rank} called {call} with invalid arguments: {reason}")]
    InvalidArgument {
        /// The rank with the bad arguments.
        rank: usize,
        /// Its collective number.
        seq: u64,
        /// Its call.
        call: String,
        /// What is wrong.
        reason: String,
    },

    /// The ranks did not all call the same collective.
    #[error("collective #{seq}: the ranks' calls do not match: {detail}")]
    Mismatch {
        /// The collective number.
        seq: u64,
        /// What each rank called (`rank 0 called …, rank 1 called …`).
        detail: String,
    },

    /// A rank waited longer than the timeout for others.
    #[error("collective #{seq} {call}: rank {waiter} waited {after:?} for rank(s) {missing:?}, which never arrived (timed out)")]
    Timeout {
        /// The collective number.
        seq: u64,
        /// The call the waiter made.
        call: String,
        /// The rank that waited.
        waiter: usize,
        /// The ranks that did not arrive.
        missing: Vec<usize>,
        /// The timeout.
        after: Duration,
    },

    /// A peer's process ended without leaving the communicator.
    #[error(
        "collective #{seq} {call}: rank {dead} (pid {pid}) died; rank {rank} was waiting for it"
    )]
    PeerDied {
        /// The rank that reports it.
        rank: usize,
        /// Its collective number.
        seq: u64,
        /// Its call.
        call: String,
        /// The rank that died.
        dead: usize,
        /// Its process id.
        pid: u32,
    },

    /// A peer destroyed its communicator while this rank waited for it.
    #[error("collective #{seq} {call}: rank {left} left (destroyed its communicator); rank {rank} was waiting for it")]
    PeerLeft {
        /// The rank that reports it.
        rank: usize,
        /// Its collective number.
        seq: u64,
        /// Its call.
        call: String,
        /// The rank that left.
        left: usize,
    },

    /// A rank aborted the communicator ([`ShmComm::abort`](super::ShmComm::abort)).
    #[error("collective #{seq} {call} on rank {rank}: the communicator was aborted by rank {by}: {reason}")]
    Aborted {
        /// The rank that reports it.
        rank: usize,
        /// Its collective number.
        seq: u64,
        /// Its call.
        call: String,
        /// The rank that aborted.
        by: usize,
        /// The reason it gave.
        reason: String,
    },
}

impl CollError {
    /// An I/O error on `path`.
    pub(crate) fn io(what: &str, path: &str, e: &std::io::Error) -> CollError {
        CollError::Io {
            what: what.to_string(),
            path: path.to_string(),
            message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_ranks_and_the_call() {
        let e = CollError::Timeout {
            seq: 4,
            call: "ncclAllReduce(8 x f32, sum)".into(),
            waiter: 0,
            missing: vec![1, 2],
            after: Duration::from_secs(2),
        };
        assert_eq!(
            e.to_string(),
            "collective #4 ncclAllReduce(8 x f32, sum): rank 0 waited 2s for rank(s) [1, 2], which never arrived (timed out)"
        );
        let e = CollError::PeerDied {
            rank: 0,
            seq: 1,
            call: "ncclBroadcast(3 x bf16, root 1)".into(),
            dead: 1,
            pid: 42,
        };
        assert!(e.to_string().contains("rank 1 (pid 42) died"));
    }
}
