//! The checked layer over NCCL's communicator calls: each checks its symbol and return
//! code and turns them into [`NcclError`]s. Communicators are created non-blocking, so
//! no call can hang on a dead peer; the price is that a call may answer `ncclInProgress`
//! and must then be polled to completion before anything else touches the communicator.
//! These calls do not poll: they are crate-private, and [`PolledComm`](super::PolledComm)
//! is the one public way to drive a communicator. The collectives take raw device
//! pointers and stay `unsafe`.

use super::bindings::{self as b, ncclComm_t};
use super::{Nccl, NcclError};
use std::os::raw::c_void;

/// Bytes of a unique id.
pub const UNIQUE_ID_BYTES: usize = b::NCCL_UNIQUE_ID_BYTES as usize;

/// An NCCL communicator handle. Owned: abort or destroy consumes it.
#[derive(Debug)]
pub struct RawComm(ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; RawComm is not Sync, and every call takes it by reference from one owner.
unsafe impl Send for RawComm {}

/// Where a communicator stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommState {
    /// Ready for (more) work.
    Ready,
    /// Initialization or a non-blocking call is still in progress.
    InProgress,
    /// An asynchronous error occurred (a peer died, a network error): abort it.
    Failed(NcclError),
}

/// Element types NCCL reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclType {
    /// `ncclFloat32`.
    F32,
    /// `ncclFloat16`.
    F16,
    /// `ncclBfloat16`.
    BF16,
}

impl NcclType {
    fn raw(self) -> b::ncclDataType_t {
        match self {
            NcclType::F32 => b::ncclDataType_t_ncclFloat32,
            NcclType::F16 => b::ncclDataType_t_ncclFloat16,
            NcclType::BF16 => b::ncclDataType_t_ncclBfloat16,
        }
    }
}

/// Reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclOp {
    /// `ncclSum`.
    Sum,
    /// `ncclAvg`.
    Avg,
    /// `ncclMax`.
    Max,
}

impl NcclOp {
    fn raw(self) -> b::ncclRedOp_t {
        match self {
            NcclOp::Sum => b::ncclRedOp_t_ncclSum,
            NcclOp::Avg => b::ncclRedOp_t_ncclAvg,
            NcclOp::Max => b::ncclRedOp_t_ncclMax,
        }
    }
}

/// `NCCL_CONFIG_INITIALIZER` of the bindings' `nccl.h` with `blocking = 0`: the header
/// (size, magic, version) and every other field "undefined" (`INT_MIN` or null), so NCCL
/// uses its defaults. A newer NCCL reads `size` and `version` and defaults the fields this
/// header does not have; CI checks size, magic and field offsets against the headers of
/// the NCCL wheels it installs.
pub fn nonblocking_config() -> b::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    b::ncclConfig_t {
        size: std::mem::size_of::<b::ncclConfig_t>(),
        magic: CONFIG_MAGIC,
        version: b::NCCL_VERSION_CODE,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
    }
}

/// The magic number of `NCCL_CONFIG_INITIALIZER`.
pub const CONFIG_MAGIC: u32 = 0xcafe_beef;

macro_rules! sym {
    ($self:expr, $name:ident) => {
        $self
            .raw()
            .$name
            .as_ref()
            .map_err(|_| NcclError::MissingSymbol(stringify!($name)))?
    };
}

impl Nccl {
    /// A new unique id (rank 0 makes it; the bootstrap hands it to the others).
    pub fn unique_id(&self) -> Result<[u8; UNIQUE_ID_BYTES], NcclError> {
        let f = sym!(self, ncclGetUniqueId);
        let mut id = b::ncclUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: ncclGetUniqueId writes one ncclUniqueId through the pointer, to a live
        // local.
        self.check("ncclGetUniqueId", unsafe { f(&mut id) })?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// Starts joining a communicator of `world` ranks as `rank`, non-blocking: poll
    /// [`comm_state`](Self::comm_state) until it is ready. The calling thread's current
    /// CUDA device is the one the communicator uses.
    pub(crate) fn init_rank_nonblocking(
        &self,
        world: usize,
        id: &[u8; UNIQUE_ID_BYTES],
        rank: usize,
    ) -> Result<RawComm, NcclError> {
        let f = sym!(self, ncclCommInitRankConfig);
        let mut config = nonblocking_config();
        let id = b::ncclUniqueId {
            internal: id.map(|x| x as std::os::raw::c_char),
        };
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: writes one handle through `comm` (a live local); `config` is a fully
        // initialized ncclConfig_t of this header's version that outlives the call.
        let rc = unsafe { f(&mut comm, world as i32, id, rank as i32, &mut config) };
        if rc != b::ncclResult_t_ncclInProgress {
            self.check("ncclCommInitRankConfig", rc)?;
        }
        if comm.is_null() {
            return Err(NcclError::Call {
                call: "ncclCommInitRankConfig",
                code: rc,
                message: "no communicator returned".into(),
            });
        }
        Ok(RawComm(comm))
    }

    /// Starts splitting a ready `comm` (`ncclCommSplit`, NCCL 2.18+), non-blocking: the
    /// ranks that pass the same `color` form a new communicator, ranked by `key`. Poll
    /// both `comm` and the new one until they are ready. Every rank of `comm` calls it.
    pub(crate) fn split_nonblocking(
        &self,
        comm: &RawComm,
        color: i32,
        key: i32,
    ) -> Result<RawComm, NcclError> {
        let f = sym!(self, ncclCommSplit);
        let mut config = nonblocking_config();
        let mut new: ncclComm_t = std::ptr::null_mut();
        // SAFETY: comm is a live handle whose previous call completed; one handle is
        // written through `new` (a live local); `config` is a fully initialized
        // ncclConfig_t of this header's version that outlives the call.
        let rc = unsafe { f(comm.0, color, key, &mut new, &mut config) };
        self.enqueued("ncclCommSplit", rc)?;
        if new.is_null() {
            return Err(NcclError::Call {
                call: "ncclCommSplit",
                code: rc,
                message: "no communicator returned".into(),
            });
        }
        Ok(RawComm(new))
    }

    /// `comm`'s rank and size (`ncclCommUserRank`, `ncclCommCount`) once it is ready.
    pub(crate) fn rank_and_size(&self, comm: &RawComm) -> Result<(usize, usize), NcclError> {
        let user_rank = sym!(self, ncclCommUserRank);
        let count = sym!(self, ncclCommCount);
        let (mut rank, mut size) = (0i32, 0i32);
        // SAFETY: comm is a live, ready handle; each call writes one int to a live local.
        self.check("ncclCommUserRank", unsafe { user_rank(comm.0, &mut rank) })?;
        // SAFETY: as above.
        self.check("ncclCommCount", unsafe { count(comm.0, &mut size) })?;
        Ok((rank.max(0) as usize, size.max(0) as usize))
    }

    /// Polls `comm` (`ncclCommGetAsyncError`).
    pub(crate) fn comm_state(&self, comm: &RawComm) -> Result<CommState, NcclError> {
        let f = sym!(self, ncclCommGetAsyncError);
        let mut state: b::ncclResult_t = b::ncclResult_t_ncclSuccess;
        // SAFETY: comm is a live handle; one ncclResult_t is written to a live local.
        self.check("ncclCommGetAsyncError", unsafe { f(comm.0, &mut state) })?;
        Ok(match state {
            b::ncclResult_t_ncclSuccess => CommState::Ready,
            b::ncclResult_t_ncclInProgress => CommState::InProgress,
            other => CommState::Failed(
                self.check("asynchronous error", other)
                    .err()
                    .unwrap_or(NcclError::MissingSymbol("ncclGetErrorString")),
            ),
        })
    }

    /// Aborts `comm`: pending work is dropped and the handle freed; never blocks on peers.
    pub(crate) fn abort(&self, comm: RawComm) -> Result<(), NcclError> {
        let f = sym!(self, ncclCommAbort);
        // SAFETY: comm is a live handle, consumed here.
        self.check("ncclCommAbort", unsafe { f(comm.0) })
    }

    /// Starts finalizing a ready `comm` (`ncclCommFinalize`, NCCL 2.14+): poll it until it
    /// is ready again, then destroy it. `Ok(false)` where this NCCL has no finalize.
    pub(crate) fn finalize(&self, comm: &RawComm) -> Result<bool, NcclError> {
        let Ok(f) = self.raw().ncclCommFinalize.as_ref() else {
            return Ok(false);
        };
        // SAFETY: comm is a live handle whose previous call completed.
        self.enqueued("ncclCommFinalize", unsafe { f(comm.0) })?;
        Ok(true)
    }

    /// Frees a `comm` whose work (and finalize) completed.
    pub(crate) fn destroy(&self, comm: RawComm) -> Result<(), NcclError> {
        let f = sym!(self, ncclCommDestroy);
        // SAFETY: comm is a live handle, consumed here.
        self.check("ncclCommDestroy", unsafe { f(comm.0) })
    }

    /// A call's return code: `ncclInProgress` is not an error, but the caller must poll
    /// [`comm_state`](Self::comm_state) until the call completed.
    fn enqueued(&self, call: &'static str, rc: b::ncclResult_t) -> Result<(), NcclError> {
        if rc == b::ncclResult_t_ncclInProgress {
            Ok(())
        } else {
            self.check(call, rc)
        }
    }

    /// `ncclAllReduce` of `count` elements on `stream`; poll before the next call.
    ///
    /// # Safety
    /// `send` and `recv` are device addresses of `count` elements of `ty` (they may be
    /// equal), valid until the work on `stream` completes; `stream` is a live CUDA stream
    /// of the communicator's device.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn all_reduce(
        &self,
        comm: &RawComm,
        send: u64,
        recv: u64,
        count: usize,
        ty: NcclType,
        op: NcclOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let f = sym!(self, ncclAllReduce);
        let rc = f(
            send as *const c_void,
            recv as *mut c_void,
            count,
            ty.raw(),
            op.raw(),
            comm.0,
            stream as b::cudaStream_t,
        );
        self.enqueued("ncclAllReduce", rc)
    }

    /// `ncclReduceScatter`: `send` holds `recv_count × world` elements.
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce), with `send` of `recv_count × world` elements
    /// and `recv` of `recv_count`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn reduce_scatter(
        &self,
        comm: &RawComm,
        send: u64,
        recv: u64,
        recv_count: usize,
        ty: NcclType,
        op: NcclOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let f = sym!(self, ncclReduceScatter);
        let rc = f(
            send as *const c_void,
            recv as *mut c_void,
            recv_count,
            ty.raw(),
            op.raw(),
            comm.0,
            stream as b::cudaStream_t,
        );
        self.enqueued("ncclReduceScatter", rc)
    }

    /// `ncclAllGather`: `recv` holds `send_count × world` elements.
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce), with `send` of `send_count` elements and
    /// `recv` of `send_count × world`.
    pub(crate) unsafe fn all_gather(
        &self,
        comm: &RawComm,
        send: u64,
        recv: u64,
        send_count: usize,
        ty: NcclType,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let f = sym!(self, ncclAllGather);
        let rc = f(
            send as *const c_void,
            recv as *mut c_void,
            send_count,
            ty.raw(),
            comm.0,
            stream as b::cudaStream_t,
        );
        self.enqueued("ncclAllGather", rc)
    }

    /// `ncclBroadcast` from `root`, in place.
    ///
    /// # Safety
    /// As [`all_reduce`](Self::all_reduce), with `buf` of `count` elements.
    pub(crate) unsafe fn broadcast(
        &self,
        comm: &RawComm,
        buf: u64,
        count: usize,
        ty: NcclType,
        root: usize,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let f = sym!(self, ncclBroadcast);
        let rc = f(
            buf as *const c_void,
            buf as *mut c_void,
            count,
            ty.raw(),
            root as i32,
            comm.0,
            stream as b::cudaStream_t,
        );
        self.enqueued("ncclBroadcast", rc)
    }
}
