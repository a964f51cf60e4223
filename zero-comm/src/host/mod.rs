//! `HostGroup`: `n` ranks as threads of one process.
//!
//! Each rank holds a [`HostComm`]. Issuing a collective moves the rank's buffers to the
//! group's progress thread and returns a [`HostWork`] at once. When every rank has issued
//! the collective at the same position, the progress thread checks they match, runs it in
//! fixed rank order and hands each rank its buffers back.

mod progress;
mod reduce;

use crate::buffer::HostBuffer;
use crate::op::{even_split, OpDesc, OpKind};
use crate::{CommError, CommStats, Communicator, Completion, ReduceOp};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use progress::{Msg, Post};
use std::cell::Cell;
use std::time::Duration;

/// How long a rank waits for the others before the group is aborted, unless set with
/// [`HostGroup::with_timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds the ranks of an in-process group.
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
        if n == 0 {
            return Err(CommError::InvalidArgument {
                rank: 0,
                op: "HostGroup::new".into(),
                reason: "a group needs at least one rank".into(),
            });
        }
        let (tx, rx) = unbounded();
        std::thread::Builder::new()
            .name("zero-host-comm".into())
            .spawn(move || progress::run(n, rx))
            .map_err(|e| CommError::InvalidArgument {
                rank: 0,
                op: "HostGroup::new".into(),
                reason: format!("could not start the progress thread: {e}"),
            })?;
        Ok((0..n)
            .map(|rank| HostComm {
                rank,
                world: n,
                timeout,
                tx: tx.clone(),
                seq: Cell::new(0),
                stats: Cell::new(CommStats::default()),
            })
            .collect())
    }
}

/// One rank of a [`HostGroup`]. Dropping it (or panicking while holding it) tells the
/// others, whose collectives then fail with [`CommError::RankLeft`].
#[derive(Debug)]
pub struct HostComm {
    rank: usize,
    world: usize,
    timeout: Duration,
    tx: Sender<Msg>,
    seq: Cell<u64>,
    stats: Cell<CommStats>,
}

/// Handle of a collective issued on a [`HostComm`].
#[derive(Debug)]
pub struct HostWork<T> {
    rank: usize,
    seq: u64,
    desc: String,
    timeout: Duration,
    rx: Receiver<Result<Vec<HostBuffer>, CommError>>,
    tx: Sender<Msg>,
    finish: fn(Vec<HostBuffer>) -> T,
}

impl<T> Completion for HostWork<T> {
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

impl HostComm {
    fn issue<T>(
        &self,
        desc: OpDesc,
        buffers: Vec<HostBuffer>,
        local_check: Result<(), String>,
        finish: fn(Vec<HostBuffer>) -> T,
    ) -> Result<HostWork<T>, CommError> {
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
        Ok(HostWork {
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

fn one(mut b: Vec<HostBuffer>) -> HostBuffer {
    b.swap_remove(0)
}
fn two(mut b: Vec<HostBuffer>) -> (HostBuffer, HostBuffer) {
    let second = b.swap_remove(1);
    (b.swap_remove(0), second)
}
fn none(_: Vec<HostBuffer>) {}

fn expect_len(what: &str, expected: usize, actual: usize) -> Result<(), String> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!("{what} has {actual} elements, expected {expected}"))
    }
}

impl Communicator for HostComm {
    type Buffer = HostBuffer;
    type Pending<T: Send + 'static> = HostWork<T>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(&self, buf: HostBuffer, op: ReduceOp) -> Result<HostWork<HostBuffer>, CommError> {
        let desc = OpDesc {
            kind: OpKind::AllReduce,
            dtype: Some(buf.dtype()),
            count: buf.len(),
            reduce: Some(op),
            root: None,
        };
        self.issue(desc, vec![buf], Ok(()), one)
    }

    fn reduce_scatter(
        &self,
        input: HostBuffer,
        output: HostBuffer,
        op: ReduceOp,
    ) -> Result<HostWork<(HostBuffer, HostBuffer)>, CommError> {
        let n = input.len();
        let check = same_dtype(&input, &output).and_then(|_| {
            expect_len(
                "output",
                even_split(n, self.world, self.rank).len(),
                output.len(),
            )
        });
        let desc = OpDesc {
            kind: OpKind::ReduceScatter,
            dtype: Some(input.dtype()),
            count: n,
            reduce: Some(op),
            root: None,
        };
        self.issue(desc, vec![input, output], check, two)
    }

    fn all_gather(
        &self,
        input: HostBuffer,
        output: HostBuffer,
    ) -> Result<HostWork<(HostBuffer, HostBuffer)>, CommError> {
        let n = output.len();
        let check = same_dtype(&input, &output).and_then(|_| {
            expect_len(
                "input",
                even_split(n, self.world, self.rank).len(),
                input.len(),
            )
        });
        let desc = OpDesc {
            kind: OpKind::AllGather,
            dtype: Some(output.dtype()),
            count: n,
            reduce: None,
            root: None,
        };
        self.issue(desc, vec![input, output], check, two)
    }

    fn broadcast(&self, buf: HostBuffer, root: usize) -> Result<HostWork<HostBuffer>, CommError> {
        let check = if root < self.world {
            Ok(())
        } else {
            Err(format!(
                "root {root} is not a rank of a group of {}",
                self.world
            ))
        };
        let desc = OpDesc {
            kind: OpKind::Broadcast,
            dtype: Some(buf.dtype()),
            count: buf.len(),
            reduce: None,
            root: Some(root),
        };
        self.issue(desc, vec![buf], check, one)
    }

    fn barrier(&self) -> Result<HostWork<()>, CommError> {
        let desc = OpDesc {
            kind: OpKind::Barrier,
            dtype: None,
            count: 0,
            reduce: None,
            root: None,
        };
        self.issue(desc, Vec::new(), Ok(()), none)
    }

    fn stats(&self) -> CommStats {
        self.stats.get()
    }

    fn reset_stats(&self) {
        self.stats.set(CommStats::default());
    }
}

fn same_dtype(a: &HostBuffer, b: &HostBuffer) -> Result<(), String> {
    if a.dtype() == b.dtype() {
        Ok(())
    } else {
        Err(format!(
            "input is {} but output is {}",
            a.dtype(),
            b.dtype()
        ))
    }
}

impl Drop for HostComm {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Leave {
            rank: self.rank,
            panicked: std::thread::panicking(),
        });
    }
}
