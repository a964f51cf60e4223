//! [`PolledComm`]: a non-blocking NCCL communicator driven to completion.
//!
//! On a communicator created with `blocking = 0`, every call may return `ncclInProgress`
//! while NCCL's own thread finishes it (`ncclGroupEndInternal` hands the work to an async
//! job and sets the communicator's async state to in-progress). Until
//! `ncclCommGetAsyncError` says `ncclSuccess` again:
//! - the collective's kernel may not be on the stream yet, so an event recorded now would
//!   not cover it, and buffers released now may still be read;
//! - any other call on the communicator is refused (`ncclCommEnsureReady`: "Attempt to use
//!   communicator before the previous operation returned ncclSuccess");
//! - `ncclCommDestroy` is refused the same way, and the communicator leaks.
//!
//! So every method here returns only once NCCL has finished the call: it polls the async
//! state until it leaves `ncclInProgress`, within the communicator's timeout. An error
//! code, an asynchronous error (a dead peer, a network failure) or the timeout aborts the
//! communicator (`ncclCommAbort` never waits for peers) and is returned; every later call
//! then fails at once with [`NcclError::Aborted`], naming the first failure. Closing
//! settles, finalizes, settles again and destroys, or aborts where any of that fails.

use super::comm::{CommState, RawComm};
use super::{Nccl, NcclError, NcclOp, NcclType, UNIQUE_ID_BYTES};
use std::os::raw::c_void;
use std::time::{Duration, Instant};

/// Polls spent spinning before the poll loop starts sleeping between polls: a collective
/// usually finishes enqueueing within microseconds.
const SPIN_POLLS: u32 = 200;
/// The sleep between polls after that.
const POLL_SLEEP: Duration = Duration::from_micros(20);

/// One rank's communicator whose every call completes (or fails) before it returns.
#[derive(Debug)]
pub struct PolledComm {
    nccl: &'static Nccl,
    raw: Option<RawComm>,
    failure: Option<NcclError>,
    timeout: Duration,
}

impl PolledComm {
    /// Joins a communicator of `world` ranks as `rank` with rank 0's unique `id`, and
    /// waits (up to `timeout`) for the initialization to finish. Every later call is
    /// bounded by the same `timeout`. The calling thread's current CUDA device is the one
    /// the communicator uses.
    pub fn init(
        nccl: &'static Nccl,
        world: usize,
        id: &[u8; UNIQUE_ID_BYTES],
        rank: usize,
        timeout: Duration,
    ) -> Result<Self, NcclError> {
        let raw = nccl.init_rank_nonblocking(world, id, rank)?;
        let mut comm = PolledComm {
            nccl,
            raw: Some(raw),
            failure: None,
            timeout,
        };
        comm.settle("ncclCommInitRankConfig")?;
        Ok(comm)
    }

    /// The library this communicator calls.
    pub fn nccl(&self) -> &'static Nccl {
        self.nccl
    }

    /// The deadline of every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Why the communicator was aborted, if it was.
    pub fn failure(&self) -> Option<&NcclError> {
        self.failure.as_ref()
    }

    fn live(&self) -> Result<&RawComm, NcclError> {
        match (&self.raw, &self.failure) {
            (Some(raw), None) => Ok(raw),
            (_, Some(first)) => Err(NcclError::Aborted(first.to_string())),
            (None, None) => Err(NcclError::Aborted("the communicator was closed".into())),
        }
    }

    /// Aborts the communicator (once) and records `err` as the reason, unless an earlier
    /// failure is already recorded; returns `err`.
    pub fn abort(&mut self, err: NcclError) -> NcclError {
        if self.failure.is_none() {
            self.failure = Some(err.clone());
        }
        if let Some(raw) = self.raw.take() {
            // The abort's own failure adds nothing: the handle is gone either way.
            let _ = self.nccl.abort(raw);
        }
        err
    }

    /// Polls until the last call finished: `Ok` once NCCL reports success, or the
    /// error (after aborting) on an asynchronous error or past the timeout.
    fn settle(&mut self, call: &'static str) -> Result<(), NcclError> {
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            let state = self.live().and_then(|raw| self.nccl.comm_state(raw));
            match state {
                Ok(CommState::Ready) => return Ok(()),
                Ok(CommState::InProgress) => {}
                Ok(CommState::Failed(e)) | Err(e) => return Err(self.abort(e)),
            }
            if start.elapsed() >= self.timeout {
                let after = self.timeout;
                return Err(self.abort(NcclError::Timeout { call, after }));
            }
            polls += 1;
            if polls < SPIN_POLLS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        }
    }

    /// One poll of the communicator's health, for waiting on queued work: `Ok` while it
    /// is healthy (or finishing a call), the error (after aborting) once NCCL reports an
    /// asynchronous error.
    pub fn check_health(&mut self) -> Result<(), NcclError> {
        let state = self.live().and_then(|raw| self.nccl.comm_state(raw));
        match state {
            Ok(CommState::Ready | CommState::InProgress) => Ok(()),
            Ok(CommState::Failed(e)) | Err(e) => Err(self.abort(e)),
        }
    }

    /// Runs one call on the live communicator, then settles it.
    fn run(
        &mut self,
        call: &'static str,
        f: impl FnOnce(&Nccl, &RawComm) -> Result<(), NcclError>,
    ) -> Result<(), NcclError> {
        let raw = self.live()?;
        if let Err(e) = f(self.nccl, raw) {
            return Err(self.abort(e));
        }
        self.settle(call)
    }

    /// `ncclAllReduce` of `count` elements on `stream`; returns once the reduction is
    /// queued on the stream.
    ///
    /// # Safety
    /// `send` and `recv` are device addresses of `count` elements of `ty` (they may be
    /// equal), valid until the work on `stream` completes; `stream` is a live CUDA stream
    /// of the communicator's device.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        ty: NcclType,
        op: NcclOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        self.run("ncclAllReduce", |nccl, raw| {
            // SAFETY: the caller's contract, passed on.
            unsafe { nccl.all_reduce(raw, send, recv, count, ty, op, stream) }
        })
    }

    /// `ncclReduceScatter`: `send` holds `recv_count × world` elements; returns once the
    /// reduction is queued on the stream.
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce), with `send` of `recv_count × world` elements
    /// and `recv` of `recv_count`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        &mut self,
        send: u64,
        recv: u64,
        recv_count: usize,
        ty: NcclType,
        op: NcclOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        self.run("ncclReduceScatter", |nccl, raw| {
            // SAFETY: the caller's contract, passed on.
            unsafe { nccl.reduce_scatter(raw, send, recv, recv_count, ty, op, stream) }
        })
    }

    /// `ncclAllGather`: `recv` holds `send_count × world` elements; returns once the
    /// gather is queued on the stream.
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce), with `send` of `send_count` elements and
    /// `recv` of `send_count × world`.
    pub unsafe fn all_gather(
        &mut self,
        send: u64,
        recv: u64,
        send_count: usize,
        ty: NcclType,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        self.run("ncclAllGather", |nccl, raw| {
            // SAFETY: the caller's contract, passed on.
            unsafe { nccl.all_gather(raw, send, recv, send_count, ty, stream) }
        })
    }

    /// `ncclBroadcast` from `root`, in place; returns once it is queued on the stream.
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce), with `buf` of `count` elements.
    pub unsafe fn broadcast(
        &mut self,
        buf: u64,
        count: usize,
        ty: NcclType,
        root: usize,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        self.run("ncclBroadcast", |nccl, raw| {
            // SAFETY: the caller's contract, passed on.
            unsafe { nccl.broadcast(raw, buf, count, ty, root, stream) }
        })
    }

    /// Splits this communicator (`ncclCommSplit`, NCCL 2.18+): the ranks that pass the
    /// same `color` form a new communicator, ranked by `key` (ties by rank here), with
    /// the same timeout. Every rank calls it at the same point of its calls. Returns once
    /// both this communicator and the new one are ready; a failure or the timeout aborts
    /// both (this one, too: the ranks of a failed split disagree on what comes next).
    pub fn split(&mut self, color: i32, key: i32) -> Result<PolledComm, NcclError> {
        let raw = self.live()?;
        let new = match self.nccl.split_nonblocking(raw, color, key) {
            Ok(new) => new,
            Err(e) => return Err(self.abort(e)),
        };
        let mut new = PolledComm {
            nccl: self.nccl,
            raw: Some(new),
            failure: None,
            timeout: self.timeout,
        };
        if let Err(e) = self.settle("ncclCommSplit") {
            new.abort(e.clone());
            return Err(e);
        }
        if let Err(e) = new.settle("ncclCommSplit (the new communicator)") {
            return Err(self.abort(e));
        }
        Ok(new)
    }

    /// This rank and the number of ranks, as NCCL counts them (after a split, the new
    /// communicator's).
    pub fn rank_and_size(&self) -> Result<(usize, usize), NcclError> {
        let raw = self.live()?;
        self.nccl.rank_and_size(raw)
    }

    /// Frees the communicator: waits for its last call, finalizes (polled), destroys.
    /// Where any of that fails or times out, the communicator is aborted instead and the
    /// error returned. The caller first waits for the work queued on its streams.
    pub fn close(mut self) -> Result<(), NcclError> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> Result<(), NcclError> {
        if self.raw.is_none() {
            return match self.failure.take() {
                Some(e) => Err(NcclError::Aborted(e.to_string())),
                None => Ok(()),
            };
        }
        self.settle("the last call before ncclCommFinalize")?;
        let finalizing = match self.live().and_then(|raw| self.nccl.finalize(raw)) {
            Ok(started) => started,
            Err(e) => return Err(self.abort(e)),
        };
        if finalizing {
            self.settle("ncclCommFinalize")?;
        }
        match self.raw.take() {
            Some(raw) => self.nccl.destroy(raw),
            None => Ok(()),
        }
    }
}

impl Drop for PolledComm {
    fn drop(&mut self) {
        // Errors here have no one to go to; the communicator is freed or aborted either way.
        let _ = self.shut_down();
    }
}
