//! `NcclComm`: one rank per process and GPU, over NCCL.
//!
//! Collectives run on the communicator's own stream. Before one is queued the comm stream
//! waits for the last write to each buffer (on the compute stream, through `cudarc`'s
//! per-buffer events), and later kernels on any stream wait for the collective's writes:
//! compute and communication order themselves with events, never a device-wide sync.
//!
//! The communicator is non-blocking and driven by zero-sys' [`PolledComm`]: every NCCL
//! call returns only once NCCL has put its kernel on the stream (it polls
//! `ncclCommGetAsyncError` out of `ncclInProgress`, within the timeout). Only then are the
//! buffers' events recorded, the staging copies of uneven splits queued and the work's
//! completion event recorded, so none of them can run ahead of NCCL's kernel.
//! [`Completion::wait`] polls that event and the communicator's health; on an NCCL error
//! or after the timeout it aborts the communicator, so every rank returns an error
//! instead of hanging, and every later collective fails at once.
//!
//! NCCL needs pieces of equal length: where a reduce-scatter or all-gather length does not
//! divide by the world size, the pieces are staged through padded buffers. Results are
//! NCCL's (its summation order, its `Max`), not bit-identical to the host group's.

use crate::launch::{IdExchange, LaunchEnv, TcpRendezvous};
use crate::op::{even_split, OpDesc};
use crate::{CommError, CommStats, Communicator, Completion, ReduceOp};
use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zero_kernels::cuda::{Gpu, GpuBuffer, GpuError, GpuStream};
use zero_kernels::DType;
use zero_sys::cudarc::driver::CudaEvent;
use zero_sys::nccl::{Nccl, NcclError, NcclOp, NcclType, PolledComm};

/// State shared by the communicator and its pending work.
struct Shared {
    comm: Mutex<PolledComm>,
    /// Set once the communicator failed; every later collective returns it.
    broken: Mutex<Option<CommError>>,
    rank: usize,
    timeout: Duration,
}

impl Shared {
    fn failure(&self) -> Option<CommError> {
        self.broken.lock().ok().and_then(|b| b.clone())
    }

    /// Records `err` as the reason (unless one is recorded) and aborts the communicator.
    fn abort(&self, err: CommError) -> CommError {
        if let Ok(mut b) = self.broken.lock() {
            if b.is_none() {
                *b = Some(err.clone());
            }
        }
        if let Ok(mut c) = self.comm.lock() {
            c.abort(NcclError::Aborted(err.to_string()));
        }
        err
    }

    /// One poll of the communicator's health (aborting it on an asynchronous error).
    fn check_health(&self) -> Result<(), NcclError> {
        match self.comm.lock() {
            Ok(mut c) => c.check_health(),
            Err(_) => Err(NcclError::Aborted(
                "a thread panicked holding the communicator".into(),
            )),
        }
    }
}

/// One rank of an NCCL communicator.
pub struct NcclComm {
    shared: Arc<Shared>,
    world: usize,
    stream: GpuStream,
    seq: Cell<u64>,
    stats: Cell<CommStats>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.shared.rank)
            .field("world", &self.world)
            .finish()
    }
}

/// A collective queued on an [`NcclComm`]'s stream.
pub struct NcclWork<T> {
    shared: Arc<Shared>,
    event: CudaEvent,
    seq: u64,
    op: String,
    issued: Instant,
    output: T,
    /// Staging buffers, kept until the work completes.
    _staging: Vec<GpuBuffer>,
}

impl<T> std::fmt::Debug for NcclWork<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclWork")
            .field("seq", &self.seq)
            .field("op", &self.op)
            .finish()
    }
}

impl<T> Completion for NcclWork<T> {
    type Output = T;

    fn wait(self) -> Result<T, CommError> {
        let sh = &self.shared;
        loop {
            if let Some(err) = sh.failure() {
                return Err(err);
            }
            match self.event.try_is_complete() {
                // The stream got past the collective, but that is no proof it succeeded:
                // an aborted NCCL kernel exits early (a peer's failure, a disagreement) and
                // leaves the error in the communicator. Ask once more before handing out
                // the result (found on zero-gpusim: a rank whose collective failed after
                // the last poll returned its unreduced buffer as the result).
                Ok(true) => {
                    if let Err(e) = sh.check_health() {
                        return Err(sh.abort(backend(self.seq, &self.op, e.to_string())));
                    }
                    return Ok(self.output);
                }
                Ok(false) => {}
                Err(e) => {
                    return Err(sh.abort(backend(self.seq, &self.op, format!("{e:?}"))));
                }
            }
            if let Err(e) = sh.check_health() {
                return Err(sh.abort(backend(self.seq, &self.op, e.to_string())));
            }
            if self.issued.elapsed() > sh.timeout {
                return Err(sh.abort(CommError::Timeout {
                    seq: self.seq,
                    op: self.op.clone(),
                    after: sh.timeout,
                    waiter: sh.rank,
                    missing: Vec::new(),
                }));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn is_complete(&self) -> bool {
        self.event.try_is_complete().unwrap_or(true)
    }
}

fn backend(seq: u64, op: &str, reason: String) -> CommError {
    CommError::Backend {
        seq,
        op: op.to_string(),
        reason,
    }
}

fn nccl_type(d: DType) -> NcclType {
    match d {
        DType::F32 => NcclType::F32,
        DType::F16 => NcclType::F16,
        DType::BF16 => NcclType::BF16,
    }
}

fn nccl_op(op: ReduceOp) -> NcclOp {
    match op {
        ReduceOp::Sum => NcclOp::Sum,
        ReduceOp::Avg => NcclOp::Avg,
        ReduceOp::Max => NcclOp::Max,
    }
}

impl NcclComm {
    /// Joins the job the launcher started (see [`LaunchEnv`]): rank 0 makes the unique
    /// id, the TCP rendezvous hands it out, and every rank initializes non-blocking on its
    /// GPU (the one visible GPU, else its local rank). Every step gives up after `timeout`
    /// with an error.
    pub fn from_env(timeout: Duration) -> Result<Self, CommError> {
        let env = LaunchEnv::from_env().map_err(|e| init_error(e.to_string()))?;
        Self::init(&env, timeout)
    }

    /// [`from_env`](Self::from_env) with an explicit environment: the process's GPU if one
    /// is open already (a framework opened the device its model is on:
    /// [`Gpu::open_ordinal`]), else the one `env.local_rank` picks (see [`Gpu::open`]), not
    /// the process environment's.
    pub fn init(env: &LaunchEnv, timeout: Duration) -> Result<Self, CommError> {
        Self::init_with(env, timeout, &mut TcpRendezvous)
    }

    /// [`init`](Self::init) with the unique id handed out through `exchange` instead of
    /// zero's rendezvous (a framework's store: no port of zero's is opened).
    pub fn init_with(
        env: &LaunchEnv,
        timeout: Duration,
        exchange: &mut dyn IdExchange,
    ) -> Result<Self, CommError> {
        let nccl = Nccl::get().map_err(|e| init_error(e.to_string()))?;
        if let Ok(v) = nccl.version() {
            eprintln!(
                "rank {}: NCCL {}.{}.{} from {}",
                env.rank,
                v.major,
                v.minor,
                v.patch,
                nccl.opened_as()
            );
        }
        let gpu = match Gpu::opened() {
            Some(gpu) => gpu,
            None => Gpu::open(Some(env.local_rank)).map_err(gpu_init)?,
        };
        let stream = gpu.new_stream().map_err(gpu_init)?;
        let id = if env.rank == 0 {
            Some(nccl.unique_id().map_err(|e| init_error(e.to_string()))?)
        } else {
            None
        };
        let id = exchange
            .exchange(env, id, timeout)
            .map_err(|e| init_error(e.to_string()))?;
        // NCCL uses the calling thread's current device.
        stream
            .cuda()
            .context()
            .bind_to_thread()
            .map_err(|e| init_error(format!("{e:?}")))?;
        let comm = PolledComm::init(nccl, env.world_size, &id, env.rank, timeout)
            .map_err(|e| init_error(e.to_string()))?;
        Ok(NcclComm {
            shared: Arc::new(Shared {
                comm: Mutex::new(comm),
                broken: Mutex::new(None),
                rank: env.rank,
                timeout,
            }),
            world: env.world_size,
            stream,
            seq: Cell::new(0),
            stats: Cell::new(CommStats::default()),
        })
    }

    /// The stream collectives run on.
    pub fn stream(&self) -> &GpuStream {
        &self.stream
    }

    /// Queues `launch` (NCCL calls, each settled before it returns, and staging copies on
    /// the comm stream) and returns the work; `local_check` failing is an error before
    /// anything is queued.
    fn issue<T>(
        &self,
        desc: OpDesc,
        local_check: Result<(), String>,
        launch: impl FnOnce(&mut PolledComm, &GpuStream) -> Result<(T, Vec<GpuBuffer>), String>,
    ) -> Result<NcclWork<T>, CommError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let op = desc.to_string();
        if let Some(err) = self.shared.failure() {
            return Err(err);
        }
        local_check.map_err(|reason| CommError::InvalidArgument {
            rank: self.shared.rank,
            op: op.clone(),
            reason,
        })?;
        let mut stats = self.stats.get();
        stats.count(&desc, self.shared.rank, self.world);
        self.stats.set(stats);
        let queued = {
            let mut comm = self
                .shared
                .comm
                .lock()
                .map_err(|_| CommError::Disconnected)?;
            launch(&mut comm, &self.stream)
        };
        let (output, staging) = queued.map_err(|r| self.shared.abort(backend(seq, &op, r)))?;
        let event = self
            .stream
            .cuda()
            .record_event(None)
            .map_err(|e| self.shared.abort(backend(seq, &op, format!("{e:?}"))))?;
        Ok(NcclWork {
            shared: self.shared.clone(),
            event,
            seq,
            op,
            issued: Instant::now(),
            output,
            _staging: staging,
        })
    }
}

fn init_error(reason: String) -> CommError {
    backend(0, "NCCL init", reason)
}

fn gpu_init(e: GpuError) -> CommError {
    init_error(e.to_string())
}

fn raw_stream(st: &GpuStream) -> *mut std::os::raw::c_void {
    st.cuda().cu_stream() as *mut std::os::raw::c_void
}

impl Communicator for NcclComm {
    type Buffer = GpuBuffer;
    type Pending<T: Send + 'static> = NcclWork<T>;

    fn rank(&self) -> usize {
        self.shared.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(
        &self,
        mut buf: GpuBuffer,
        op: ReduceOp,
    ) -> Result<NcclWork<GpuBuffer>, CommError> {
        let (desc, check) = OpDesc::all_reduce(&buf, op);
        self.issue(desc, check, move |comm, st| {
            let (n, ty) = (buf.len(), nccl_type(buf.dtype()));
            if n > 0 {
                let (addr, guard) = buf.write_addr(st.cuda());
                // SAFETY: addr is the live allocation of buf (n elements of ty), kept
                // alive in the returned work until the event completes; the stream is
                // the comm stream of the communicator's device.
                unsafe { comm.all_reduce(addr, addr, n, ty, nccl_op(op), raw_stream(st)) }
                    .map_err(|e| e.to_string())?;
                drop(guard);
            }
            Ok((buf, Vec::new()))
        })
    }

    fn reduce_scatter(
        &self,
        input: GpuBuffer,
        mut output: GpuBuffer,
        op: ReduceOp,
    ) -> Result<NcclWork<(GpuBuffer, GpuBuffer)>, CommError> {
        let (n, world, rank) = (input.len(), self.world, self.shared.rank);
        let (desc, check) = OpDesc::reduce_scatter(&input, &output, op, world, rank);
        self.issue(desc, check, move |comm, st| {
            let q = n.div_ceil(world);
            let ty = nccl_type(input.dtype());
            if q == 0 {
                return Ok(((input, output), Vec::new()));
            }
            let err = |e: GpuError| e.to_string();
            let mut staging = Vec::new();
            if n % world == 0 {
                let (src, g1) = input.read_addr(st.cuda());
                let (dst, g2) = output.write_addr(st.cuda());
                // SAFETY: src holds q·world elements, dst q, both alive in the returned
                // work until its event completes; comm stream of this device.
                unsafe { comm.reduce_scatter(src, dst, q, ty, nccl_op(op), raw_stream(st)) }
                    .map_err(|e| e.to_string())?;
                drop((g1, g2));
            } else {
                // Rank r's piece goes to block r of a padded buffer.
                let mut padded = st.zeros(input.dtype(), q * world).map_err(err)?;
                for r in 0..world {
                    let piece = even_split(n, world, r);
                    st.copy(&input, piece, &mut padded, r * q).map_err(err)?;
                }
                let mut mine = st.zeros(input.dtype(), q).map_err(err)?;
                {
                    let (src, g1) = padded.read_addr(st.cuda());
                    let (dst, g2) = mine.write_addr(st.cuda());
                    // SAFETY: padded holds q·world elements and mine q, both kept in the
                    // work's staging until its event completes.
                    unsafe { comm.reduce_scatter(src, dst, q, ty, nccl_op(op), raw_stream(st)) }
                        .map_err(|e| e.to_string())?;
                    drop((g1, g2));
                }
                let len = output.len();
                st.copy(&mine, 0..len, &mut output, 0).map_err(err)?;
                staging.extend([padded, mine]);
            }
            Ok(((input, output), staging))
        })
    }

    fn all_gather(
        &self,
        input: GpuBuffer,
        mut output: GpuBuffer,
    ) -> Result<NcclWork<(GpuBuffer, GpuBuffer)>, CommError> {
        let (n, world, rank) = (output.len(), self.world, self.shared.rank);
        let (desc, check) = OpDesc::all_gather(&input, &output, world, rank);
        self.issue(desc, check, move |comm, st| {
            let q = n.div_ceil(world);
            let ty = nccl_type(output.dtype());
            if q == 0 {
                return Ok(((input, output), Vec::new()));
            }
            let err = |e: GpuError| e.to_string();
            let mut staging = Vec::new();
            if n % world == 0 {
                let (src, g1) = input.read_addr(st.cuda());
                let (dst, g2) = output.write_addr(st.cuda());
                // SAFETY: src holds q elements, dst q·world, both alive in the returned
                // work until its event completes; comm stream of this device.
                unsafe { comm.all_gather(src, dst, q, ty, raw_stream(st)) }
                    .map_err(|e| e.to_string())?;
                drop((g1, g2));
            } else {
                let mut mine = st.zeros(input.dtype(), q).map_err(err)?;
                st.copy(&input, 0..input.len(), &mut mine, 0).map_err(err)?;
                let mut padded = st.zeros(input.dtype(), q * world).map_err(err)?;
                {
                    let (src, g1) = mine.read_addr(st.cuda());
                    let (dst, g2) = padded.write_addr(st.cuda());
                    // SAFETY: mine holds q elements and padded q·world, both kept in the
                    // work's staging until its event completes.
                    unsafe { comm.all_gather(src, dst, q, ty, raw_stream(st)) }
                        .map_err(|e| e.to_string())?;
                    drop((g1, g2));
                }
                for r in 0..world {
                    let piece = even_split(n, world, r);
                    let start = piece.start;
                    st.copy(&padded, r * q..r * q + piece.len(), &mut output, start)
                        .map_err(err)?;
                }
                staging.extend([mine, padded]);
            }
            Ok(((input, output), staging))
        })
    }

    fn broadcast(&self, mut buf: GpuBuffer, root: usize) -> Result<NcclWork<GpuBuffer>, CommError> {
        let (desc, check) = OpDesc::broadcast(&buf, root, self.world);
        self.issue(desc, check, move |comm, st| {
            let (n, ty) = (buf.len(), nccl_type(buf.dtype()));
            if n > 0 {
                let (addr, guard) = buf.write_addr(st.cuda());
                // SAFETY: addr is buf's live allocation of n elements, kept in the work
                // until its event completes; comm stream of this device.
                unsafe { comm.broadcast(addr, n, ty, root, raw_stream(st)) }
                    .map_err(|e| e.to_string())?;
                drop(guard);
            }
            Ok((buf, Vec::new()))
        })
    }

    fn barrier(&self) -> Result<NcclWork<()>, CommError> {
        let (desc, check) = OpDesc::barrier();
        // An all-reduce of one element: it completes only once every rank issued it.
        self.issue(desc, check, |comm, st| {
            let mut one = st.zeros(DType::F32, 1).map_err(|e| e.to_string())?;
            {
                let (addr, guard) = one.write_addr(st.cuda());
                // SAFETY: one element, kept in the work's staging until its event
                // completes; comm stream of this device.
                unsafe {
                    comm.all_reduce(addr, addr, 1, NcclType::F32, NcclOp::Sum, raw_stream(st))
                }
                .map_err(|e| e.to_string())?;
                drop(guard);
            }
            Ok(((), vec![one]))
        })
    }

    fn stats(&self) -> CommStats {
        self.stats.get()
    }

    fn split(&self, color: usize, key: usize) -> Result<Self, CommError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let op = OpDesc::split().to_string();
        if let Some(err) = self.shared.failure() {
            return Err(err);
        }
        let invalid = |reason: String| CommError::InvalidArgument {
            rank: self.shared.rank,
            op: op.clone(),
            reason,
        };
        // ncclCommSplit takes ints (a negative color means "no new communicator").
        let color = i32::try_from(color)
            .map_err(|_| invalid(format!("color {color} does not fit NCCL's int")))?;
        let key = i32::try_from(key)
            .map_err(|_| invalid(format!("key {key} does not fit NCCL's int")))?;
        let mut comm = self
            .shared
            .comm
            .lock()
            .map_err(|_| CommError::Disconnected)?;
        let nccl = comm.nccl();
        if nccl.raw().ncclCommSplit.is_err() {
            let version = nccl
                .version()
                .map_or("of unknown version".to_string(), |v| {
                    format!("{}.{}.{}", v.major, v.minor, v.patch)
                });
            return Err(invalid(format!(
                "the loaded NCCL ({version}, {}) has no ncclCommSplit; splitting needs NCCL 2.18 \
                 or newer",
                nccl.opened_as()
            )));
        }
        // NCCL uses the calling thread's current device.
        self.stream
            .cuda()
            .context()
            .bind_to_thread()
            .map_err(|e| backend(seq, &op, format!("{e:?}")))?;
        let split = comm.split(color, key);
        drop(comm);
        let new = split.map_err(|e| self.shared.abort(backend(seq, &op, e.to_string())))?;
        let (rank, world) = new
            .rank_and_size()
            .map_err(|e| backend(seq, &op, e.to_string()))?;
        let stream = self
            .stream
            .gpu()
            .new_stream()
            .map_err(|e| backend(seq, &op, e.to_string()))?;
        Ok(NcclComm {
            shared: Arc::new(Shared {
                comm: Mutex::new(new),
                broken: Mutex::new(None),
                rank,
                timeout: self.shared.timeout,
            }),
            world,
            stream,
            seq: Cell::new(0),
            stats: Cell::new(CommStats::default()),
        })
    }

    fn reset_stats(&self) {
        self.stats.set(CommStats::default());
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // Let queued work finish. The communicator is finalized and destroyed (or, if that
        // fails, aborted) when the last pending work holding it is gone too.
        let _ = self.stream.synchronize();
    }
}
