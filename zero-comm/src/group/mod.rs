//! `n` ranks as threads of one process, over any buffer type.
//!
//! Each rank holds a [`GroupComm`]. Issuing a collective moves the rank's buffers to the
//! group's progress thread and returns a [`GroupWork`] at once. When every rank has issued
//! the collective at the same position, the progress thread checks they match, hands
//! every rank's buffers to the group's [`Executor`] (host loops, or kernels on a GPU
//! stream) and gives each rank its buffers back. Matching, timeouts and failures are the
//! same for every executor.

mod progress;

use crate::buffer::CommBuffer;
use crate::op::OpDesc;
use crate::{CommError, CommStats, Communicator, Completion, ReduceOp};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use progress::{Msg, Post};
use std::cell::Cell;
use std::time::Duration;

/// How long a rank waits for the others before the group is aborted, unless set with
/// [`HostGroup::with_timeout`](crate::HostGroup::with_timeout).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Moves the data of a collective, given every rank's buffers (already checked to match).
pub(crate) trait Executor<B>: Send + 'static {
    /// Runs `desc` over `buffers[rank]`; an error fails the collective on every rank.
    fn execute(&mut self, desc: &OpDesc, buffers: &mut [Vec<B>]) -> Result<(), String>;
}

/// Starts a group of `n` ranks whose collectives `exec` runs, with waits that give up after
/// `timeout` (the group is then aborted and every rank's pending and later collectives fail
/// with [`CommError::Timeout`]).
pub(crate) fn spawn<B: CommBuffer, E: Executor<B>>(
    n: usize,
    timeout: Duration,
    exec: E,
) -> Result<Vec<GroupComm<B>>, CommError> {
    if n == 0 {
        return Err(CommError::InvalidArgument {
            rank: 0,
            op: "new group".into(),
            reason: "a group needs at least one rank".into(),
        });
    }
    let (tx, rx) = unbounded();
    std::thread::Builder::new()
        .name("zero-group-comm".into())
        .spawn(move || progress::run(n, rx, exec))
        .map_err(|e| CommError::InvalidArgument {
            rank: 0,
            op: "new group".into(),
            reason: format!("could not start the progress thread: {e}"),
        })?;
    Ok((0..n)
        .map(|rank| GroupComm {
            rank,
            world: n,
            timeout,
            tx: tx.clone(),
            seq: Cell::new(0),
            stats: Cell::new(CommStats::default()),
        })
        .collect())
}

/// One rank of an in-process group. Dropping it (or panicking while holding it) tells the
/// others, whose collectives then fail with [`CommError::RankLeft`].
pub struct GroupComm<B> {
    rank: usize,
    world: usize,
    timeout: Duration,
    tx: Sender<Msg<B>>,
    seq: Cell<u64>,
    stats: Cell<CommStats>,
}

impl<B> std::fmt::Debug for GroupComm<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

/// Handle of a collective issued on a [`GroupComm`].
pub struct GroupWork<B, T> {
    rank: usize,
    seq: u64,
    desc: String,
    timeout: Duration,
    rx: Receiver<Result<Vec<B>, CommError>>,
    tx: Sender<Msg<B>>,
    finish: fn(Vec<B>) -> T,
}

impl<B, T> std::fmt::Debug for GroupWork<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupWork")
            .field("rank", &self.rank)
            .field("seq", &self.seq)
            .field("op", &self.desc)
            .finish()
    }
}

impl<B, T> Completion for GroupWork<B, T> {
    type Output = T;

    fn wait(self) -> Result<T, CommError> {
        let reply = match self.rx.recv_timeout(self.timeout) {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                // Abort the group; the progress thread answers with who never arrived.
                let _ = self.tx.send(Msg::Timeout {
                    waiter: self.rank,
                    seq: self.seq,
                    after: self.timeout,
                });
                match self.rx.recv_timeout(Duration::from_secs(5)) {
                    Ok(r) => r,
                    Err(_) => Err(CommError::Timeout {
                        seq: self.seq,
                        op: self.desc,
                        after: self.timeout,
                        waiter: self.rank,
                        missing: Vec::new(),
                    }),
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(CommError::Disconnected),
        };
        reply.map(self.finish)
    }

    fn is_complete(&self) -> bool {
        !self.rx.is_empty()
    }
}

impl<B: CommBuffer> GroupComm<B> {
    fn issue<T>(
        &self,
        desc: OpDesc,
        buffers: Vec<B>,
        local_check: Result<(), String>,
        finish: fn(Vec<B>) -> T,
    ) -> Result<GroupWork<B, T>, CommError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        if let Err(reason) = local_check {
            let err = CommError::InvalidArgument {
                rank: self.rank,
                op: desc.to_string(),
                reason,
            };
            // Tell the others at once, so they fail instead of waiting out the timeout.
            let _ = self.tx.send(Msg::Invalid(err.clone()));
            return Err(err);
        }
        let mut stats = self.stats.get();
        let size = desc.dtype.map_or(0, |d| d.size_of());
        stats.record(
            desc.kind,
            desc.count,
            size,
            self.rank,
            self.world,
            desc.root.unwrap_or(0),
        );
        self.stats.set(stats);
        let (reply, rx) = bounded(1);
        let text = desc.to_string();
        self.tx
            .send(Msg::Post(Post {
                rank: self.rank,
                seq,
                desc,
                buffers,
                reply,
            }))
            .map_err(|_| CommError::Disconnected)?;
        Ok(GroupWork {
            rank: self.rank,
            seq,
            desc: text,
            timeout: self.timeout,
            rx,
            tx: self.tx.clone(),
            finish,
        })
    }
}

fn one<B>(mut b: Vec<B>) -> B {
    b.swap_remove(0)
}
fn two<B>(mut b: Vec<B>) -> (B, B) {
    let second = b.swap_remove(1);
    (b.swap_remove(0), second)
}
fn none<B>(_: Vec<B>) {}

impl<B: CommBuffer> Communicator for GroupComm<B> {
    type Buffer = B;
    type Pending<T: Send + 'static> = GroupWork<B, T>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(&self, buf: B, op: ReduceOp) -> Result<GroupWork<B, B>, CommError> {
        let (desc, check) = OpDesc::all_reduce(&buf, op);
        self.issue(desc, vec![buf], check, one)
    }

    fn reduce_scatter(
        &self,
        input: B,
        output: B,
        op: ReduceOp,
    ) -> Result<GroupWork<B, (B, B)>, CommError> {
        let (desc, check) = OpDesc::reduce_scatter(&input, &output, op, self.world, self.rank);
        self.issue(desc, vec![input, output], check, two)
    }

    fn all_gather(&self, input: B, output: B) -> Result<GroupWork<B, (B, B)>, CommError> {
        let (desc, check) = OpDesc::all_gather(&input, &output, self.world, self.rank);
        self.issue(desc, vec![input, output], check, two)
    }

    fn broadcast(&self, buf: B, root: usize) -> Result<GroupWork<B, B>, CommError> {
        let (desc, check) = OpDesc::broadcast(&buf, root, self.world);
        self.issue(desc, vec![buf], check, one)
    }

    fn barrier(&self) -> Result<GroupWork<B, ()>, CommError> {
        let (desc, check) = OpDesc::barrier();
        self.issue(desc, Vec::new(), check, none)
    }

    fn stats(&self) -> CommStats {
        self.stats.get()
    }

    fn reset_stats(&self) {
        self.stats.set(CommStats::default());
    }
}

impl<B> Drop for GroupComm<B> {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Leave {
            rank: self.rank,
            panicked: std::thread::panicking(),
        });
    }
}
