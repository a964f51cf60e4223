//! `n` ranks as threads of one process, over any buffer type.
//!
//! Each rank holds a [`GroupComm`]. Issuing a collective posts the rank's buffers at the
//! collective's position in the group's shared state and returns a [`GroupWork`]. The rank
//! whose post completes a position — the last to arrive — checks that every rank issued
//! the same collective, runs it with the group's [`Executor`] (host loops, or kernels on a
//! GPU stream) and hands every rank its buffers back; the others find them when they wait
//! (spinning briefly, then asleep on a futex: [`crate::wait`]). No thread of the group's
//! own sits between the ranks, so a collective costs one hand-off. Positions complete in
//! issue order: the last rank to post position k+1 had already returned from posting k,
//! and if it completed k it ran it before returning.
//!
//! Matching, timeouts and failures are the same for every executor: a mismatch, a bad
//! argument, a backend error, a rank that leaves (drops its communicator or panics) or a
//! wait that outlasts the timeout fails every pending and later collective with an error
//! naming the collective and the ranks.

mod meeting;

use crate::buffer::CommBuffer;
use crate::op::OpDesc;
use crate::{CommError, CommStats, Communicator, Completion, ReduceOp};
use meeting::{Meeting, Slot};
use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a rank waits for the others before the group is aborted, unless set with
/// [`HostGroup::with_timeout`](crate::HostGroup::with_timeout).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Moves the data of a collective, given every rank's buffers (already checked to match).
pub(crate) trait Executor<B>: Send + 'static {
    /// Runs `desc` over `buffers[rank]`; an error fails the collective on every rank.
    fn execute(&mut self, desc: &OpDesc, buffers: &mut [Vec<B>]) -> Result<(), String>;
    /// A new executor for a sub-group made by a split (its own resources: a GPU executor
    /// makes its own stream).
    fn fork(&self) -> Result<Self, String>
    where
        Self: Sized;
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
    let meeting: Arc<dyn Meeting<B>> = Arc::new(meeting::Shared::new(n, exec));
    Ok((0..n)
        .map(|rank| GroupComm {
            rank,
            world: n,
            timeout,
            meeting: meeting.clone(),
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
    meeting: Arc<dyn Meeting<B>>,
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
    issued: Instant,
    slot: Arc<Slot<B>>,
    meeting: Arc<dyn Meeting<B>>,
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
        let deadline = self.issued + self.timeout;
        if let Some(r) = self.meeting.wait(&self.slot, deadline) {
            return r.map(self.finish);
        }
        // Out of time: abort the group, naming the ranks that never issued this one; the
        // abort fills this rank's slot unless the collective completed meanwhile.
        self.meeting
            .time_out(self.seq, self.rank, self.timeout, &self.desc);
        self.slot
            .take()
            .unwrap_or_else(|| {
                Err(CommError::Timeout {
                    seq: self.seq,
                    op: self.desc,
                    after: self.timeout,
                    waiter: self.rank,
                    missing: Vec::new(),
                })
            })
            .map(self.finish)
    }

    fn is_complete(&self) -> bool {
        self.slot.is_ready()
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
            self.meeting.fail(err.clone());
            return Err(err);
        }
        let mut stats = self.stats.get();
        stats.count(&desc, self.rank, self.world);
        self.stats.set(stats);
        let text = desc.to_string();
        let slot = self.meeting.post(self.rank, seq, desc, buffers, None);
        Ok(GroupWork {
            rank: self.rank,
            seq,
            desc: text,
            timeout: self.timeout,
            issued: Instant::now(),
            slot,
            meeting: self.meeting.clone(),
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

    fn split(&self, color: usize, key: usize) -> Result<Self, CommError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let desc = OpDesc::split();
        let text = desc.to_string();
        let slot = self
            .meeting
            .post(self.rank, seq, desc, Vec::new(), Some((color, key)));
        // Waits like any collective: a rank that never splits fails this one at the
        // timeout, one that leaves or mismatches fails it at once.
        GroupWork {
            rank: self.rank,
            seq,
            desc: text,
            timeout: self.timeout,
            issued: Instant::now(),
            slot,
            meeting: self.meeting.clone(),
            finish: none,
        }
        .wait()?;
        let (meeting, rank, world) = self
            .meeting
            .take_split(seq, self.rank)
            .ok_or(CommError::Disconnected)?;
        Ok(GroupComm {
            rank,
            world,
            timeout: self.timeout,
            meeting,
            seq: Cell::new(0),
            stats: Cell::new(CommStats::default()),
        })
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
        self.meeting.fail(CommError::RankLeft {
            rank: self.rank,
            panicked: std::thread::panicking(),
        });
    }
}
