//! `ShmGroup`: one rank per process on one machine, over shared memory.
//!
//! The backend for training without GPUs under a launcher (`torchrun`, `deepspeed`,
//! `srun`, `mpirun`): every process holds one [`ShmComm`] over host buffers, started from
//! the launcher's environment ([`ShmGroup::from_env`]). Collectives run in the calling
//! thread and return once done (a CPU rank has nothing else to overlap them with); each
//! rank reduces its own piece, in the fixed rank order of [`HostGroup`](crate::HostGroup),
//! so the bits equal `HostGroup`'s at the same world size.
//!
//! Waits spin briefly, then sleep on a futex in the segment ([`crate::wait`]), so more
//! ranks than cores still make progress. A rank whose process dies (even by `SIGKILL`)
//! fails every other rank's wait at once, naming it ([`watch`]); a rank that stops
//! arriving fails them at the timeout, naming it; a mismatch fails every rank naming what
//! each issued. Nothing is ever left in `/dev/shm`: the segment is a `memfd`, freed with
//! its last mapping.

mod collective;
mod segment;
pub(crate) mod setup;
mod watch;

use crate::buffer::HostBuffer;
use crate::launch::{IdExchange, LaunchEnv, TcpRendezvous};
use crate::op::{split_members, split_message, Issued, OpDesc};
use crate::{CommError, CommStats, Communicator, Completion, ReduceOp};
use collective::{Run, ShmElement};
use half::{bf16, f16};
use segment::{Cause, Segment};
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use zero_kernels::DType;

pub use setup::DEFAULT_WINDOW;

/// Builds a rank of a shared-memory group.
#[derive(Debug)]
pub struct ShmGroup;

impl ShmGroup {
    /// Joins the job the launcher started (see [`LaunchEnv`]), with waits that give up
    /// after `timeout`.
    pub fn from_env(timeout: Duration) -> Result<ShmComm, CommError> {
        let env = LaunchEnv::from_env().map_err(|e| setup::startup_error(e.to_string()))?;
        Self::init(&env, timeout)
    }

    /// Joins the group `env` describes: rank 0 makes the segment, the TCP rendezvous at
    /// `env.addr()` checks every rank (world size, job) and hands out where it is, and
    /// every rank maps it and passes a first barrier in it, all within `timeout`.
    pub fn init(env: &LaunchEnv, timeout: Duration) -> Result<ShmComm, CommError> {
        Self::init_with(env, timeout, &mut TcpRendezvous)
    }

    /// [`init`](Self::init) with where the segment is handed out through `exchange`
    /// instead of zero's rendezvous (a framework's store: no port of zero's is opened).
    pub fn init_with(
        env: &LaunchEnv,
        timeout: Duration,
        exchange: &mut dyn IdExchange,
    ) -> Result<ShmComm, CommError> {
        let seg = Arc::new(setup::connect(env, timeout, exchange)?);
        ShmComm::start(seg, env.rank, env.world_size, timeout)
    }
}

impl ShmComm {
    /// Joins the mapped segment `seg` as rank `me` of `world`: writes this process's pid,
    /// passes the first barrier and starts the watcher.
    fn start(
        seg: Arc<Segment>,
        me: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<ShmComm, CommError> {
        seg.pid(me).store(std::process::id(), Ordering::Relaxed);
        seg.pid_namespace(me)
            .store(watch::pid_namespace(), Ordering::Relaxed);
        let mut comm = ShmComm {
            rank: me,
            world,
            timeout,
            spin: crate::wait::spin_budget(world),
            seg: seg.clone(),
            steps: Cell::new(0),
            seq: Cell::new(0),
            broken: RefCell::new(None),
            stats: Cell::new(CommStats::default()),
            watcher: None,
        };
        // The first barrier: every rank has mapped the segment and written its pid.
        let start = OpDesc::barrier().0;
        comm.run(&start, |run| run.barrier_op())?;
        comm.seq.set(0);
        let watcher = watch::Watcher::start(seg, me, world)
            .map_err(|e| setup::startup_error(format!("starting the watcher thread: {e}")))?;
        comm.watcher = Some(watcher);
        Ok(comm)
    }
}

/// One rank of a shared-memory group (see the module docs). Dropping it tells the other
/// ranks, whose collectives then fail with [`CommError::RankLeft`].
pub struct ShmComm {
    rank: usize,
    world: usize,
    timeout: Duration,
    spin: Duration,
    seg: Arc<Segment>,
    steps: Cell<u64>,
    seq: Cell<u64>,
    broken: RefCell<Option<CommError>>,
    stats: Cell<CommStats>,
    watcher: Option<watch::Watcher>,
}

impl std::fmt::Debug for ShmComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("window", &self.seg.window())
            .finish()
    }
}

/// A collective of a [`ShmComm`]: already complete when issued.
#[derive(Debug)]
pub struct ShmWork<T>(T);

impl<T> Completion for ShmWork<T> {
    type Output = T;

    fn wait(self) -> Result<T, CommError> {
        Ok(self.0)
    }

    fn is_complete(&self) -> bool {
        true
    }
}

/// The error an abort recorded in the segment means for this rank.
fn abort_error(seg: &Segment, timeout: Duration) -> Option<CommError> {
    let a = seg.aborted()?;
    let (op, reason) = a.text.split_once('\0').unwrap_or((&a.text, ""));
    Some(match a.cause {
        Cause::Died => CommError::RankDied {
            rank: a.rank,
            pid: seg.pid(a.rank).load(Ordering::Acquire),
        },
        Cause::Left => CommError::RankLeft {
            rank: a.rank,
            panicked: seg.left(a.rank).load(Ordering::Acquire) == 2,
        },
        Cause::Timeout => CommError::Timeout {
            seq: a.seq,
            op: op.to_string(),
            after: timeout,
            waiter: a.rank,
            missing: reason.split(',').filter_map(|r| r.parse().ok()).collect(),
        },
        Cause::Invalid => CommError::InvalidArgument {
            rank: a.rank,
            op: op.to_string(),
            reason: reason.to_string(),
        },
    })
}

impl ShmComm {
    /// The segment of this rank's new group of a split: its rank 0 creates it and hands
    /// the descriptor to the others over a socket named after its nonce (as at start-up);
    /// a failure on rank 0's side is recorded in the new segment, failing those that got it.
    fn split_segment(
        &self,
        rank: usize,
        world: usize,
        nonce: &[u8],
        deadline: std::time::Instant,
    ) -> Result<Arc<Segment>, CommError> {
        if rank > 0 {
            let seg = setup::receive(rank, world, "this machine", nonce, deadline)?;
            return Ok(Arc::new(seg));
        }
        let (seg, fd, listener) = setup::create(world, self.seg.window(), nonce)?;
        if let Some(l) = listener {
            if let Err(e) = setup::hand_out(&l, std::os::fd::AsFd::as_fd(&fd), world, deadline) {
                let reason = e.to_string();
                seg.abort(Cause::Invalid, 0, 0, &format!("split\0{reason}"));
                return Err(e);
            }
        }
        Ok(Arc::new(seg))
    }

    /// Bytes of each window (the chunk a collective moves per barrier).
    pub fn window_bytes(&self) -> usize {
        self.seg.window()
    }

    /// Ranks whose death this rank cannot see at once (no pidfd, another pid namespace),
    /// with the reason: a wait on them ends at the timeout instead.
    pub fn unwatched(&self) -> Vec<(usize, String)> {
        self.watcher
            .as_ref()
            .map_or(Vec::new(), |w| w.unwatched.clone())
    }

    /// Runs one collective through `f`, with the group's failure handling.
    fn run(
        &self,
        desc: &OpDesc,
        f: impl FnOnce(&Run<'_>) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        if let Some(e) = self.broken.borrow().clone() {
            return Err(e);
        }
        let timeout = self.timeout;
        let run = Run {
            seg: &self.seg,
            me: self.rank,
            world: self.world,
            timeout,
            spin: self.spin,
            steps: &self.steps,
            seq,
            desc,
            abort_error: &|seg| abort_error(seg, timeout),
        };
        let r = f(&run);
        if let Err(e) = &r {
            *self.broken.borrow_mut() = Some(e.clone());
        }
        r
    }

    /// Checks the arguments, counts the collective and runs it.
    fn issue(
        &self,
        (desc, check): Issued,
        f: impl FnOnce(&Run<'_>) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        if let Err(reason) = check {
            let seq = self.seq.get();
            self.seq.set(seq + 1);
            let err = CommError::InvalidArgument {
                rank: self.rank,
                op: desc.to_string(),
                reason: reason.clone(),
            };
            // Tell the others at once, so they fail instead of waiting out the timeout.
            self.seg
                .abort(Cause::Invalid, self.rank, seq, &format!("{desc}\0{reason}"));
            *self.broken.borrow_mut() = Some(err.clone());
            return Err(err);
        }
        let mut stats = self.stats.get();
        stats.count(&desc, self.rank, self.world);
        self.stats.set(stats);
        self.run(&desc, f)
    }
}

/// Runs `$body` with `$t` the element type of `$dtype` and `$($b)` typed slices.
macro_rules! typed {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F16 => {
                type $t = f16;
                $body
            }
            DType::BF16 => {
                type $t = bf16;
                $body
            }
        }
    };
}

fn slice<T: ShmElement>(b: &HostBuffer) -> &[T] {
    b.as_slice::<T>().unwrap_or(&[])
}

fn slice_mut<T: ShmElement>(b: &mut HostBuffer) -> &mut [T] {
    b.as_mut_slice::<T>().unwrap_or(&mut [])
}

impl Communicator for ShmComm {
    type Buffer = HostBuffer;
    type Pending<T: Send + 'static> = ShmWork<T>;

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(
        &self,
        mut buf: HostBuffer,
        op: ReduceOp,
    ) -> Result<ShmWork<HostBuffer>, CommError> {
        let dtype = buf.dtype();
        self.issue(
            OpDesc::all_reduce(&buf, op),
            |run| typed!(dtype, T => run.all_reduce::<T>(slice_mut(&mut buf), op)),
        )?;
        Ok(ShmWork(buf))
    }

    fn reduce_scatter(
        &self,
        input: HostBuffer,
        mut output: HostBuffer,
        op: ReduceOp,
    ) -> Result<ShmWork<(HostBuffer, HostBuffer)>, CommError> {
        let dtype = input.dtype();
        let issued = OpDesc::reduce_scatter(&input, &output, op, self.world, self.rank);
        self.issue(issued, |run| {
            typed!(dtype, T => run.reduce_scatter::<T>(slice(&input), slice_mut(&mut output), op))
        })?;
        Ok(ShmWork((input, output)))
    }

    fn all_gather(
        &self,
        input: HostBuffer,
        mut output: HostBuffer,
    ) -> Result<ShmWork<(HostBuffer, HostBuffer)>, CommError> {
        let dtype = output.dtype();
        let issued = OpDesc::all_gather(&input, &output, self.world, self.rank);
        self.issue(
            issued,
            |run| typed!(dtype, T => run.all_gather::<T>(slice(&input), slice_mut(&mut output))),
        )?;
        Ok(ShmWork((input, output)))
    }

    fn broadcast(
        &self,
        mut buf: HostBuffer,
        root: usize,
    ) -> Result<ShmWork<HostBuffer>, CommError> {
        let dtype = buf.dtype();
        self.issue(
            OpDesc::broadcast(&buf, root, self.world),
            |run| typed!(dtype, T => run.broadcast::<T>(slice_mut(&mut buf), root)),
        )?;
        Ok(ShmWork(buf))
    }

    fn barrier(&self) -> Result<ShmWork<()>, CommError> {
        self.issue(OpDesc::barrier(), |run| run.barrier_op())?;
        Ok(ShmWork(()))
    }

    fn split(&self, color: usize, key: usize) -> Result<Self, CommError> {
        // Every rank publishes (color, key, a fresh nonce) through this group; the new
        // group's rank 0 (lowest key, then parent rank) names its socket after its own.
        let nonce = setup::nonce()?;
        let mut mine = Vec::with_capacity(32);
        mine.extend_from_slice(&split_message(color, key));
        mine.extend_from_slice(&nonce);
        let mut all = Vec::new();
        self.run(&OpDesc::split(), |run| {
            all = run.exchange(&mine)?;
            Ok(())
        })?;
        let members = split_members(&all, color);
        let world = members.len();
        let rank = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or(CommError::Disconnected)?;
        let leader_nonce = &all[members[0]][16..32];
        let deadline = std::time::Instant::now() + self.timeout;
        let seg = self.split_segment(rank, world, leader_nonce, deadline)?;
        ShmComm::start(seg, rank, world, self.timeout)
    }

    fn held_bytes(&self) -> usize {
        segment::segment_bytes(self.world, self.seg.window())
    }

    fn stats(&self) -> CommStats {
        self.stats.get()
    }

    fn reset_stats(&self) {
        self.stats.set(CommStats::default());
    }
}

impl Drop for ShmComm {
    fn drop(&mut self) {
        let how = if std::thread::panicking() { 2 } else { 1 };
        self.seg.left(self.rank).store(how, Ordering::Release);
        self.seg.bell().ring();
        self.watcher.take();
    }
}
