//! NCCL over the stand-in's devices: each rank is a process, communicators meet in
//! `/dev/shm` ([`crate::shmcoll`]), and every collective is an operation on the CUDA
//! stream it was issued on: its buffers are checked and recorded like a kernel's, and it
//! runs when the stream reaches it. Disagreeing ranks, a missing rank, two ranks on one
//! device and aborts fail on every rank, through `ncclCommGetAsyncError` as NCCL reports
//! them.
//!
//! `ncclCommSplit` waits for the parent's queued collectives to run, then exchanges every
//! rank's (color, key, a fresh unique id) through the parent as one of its collectives (an
//! all-gather, so a rank that issues anything else there fails every rank naming both
//! calls); each color's ranks then join a new communicator, ranked by (key, parent rank),
//! under the id of its first rank, with the usual checks (one rank per device). While it
//! splits, the parent reports `ncclInProgress` and refuses collectives, as NCCL does.
//! `NCCL_SPLIT_NOCOLOR` is not implemented.

use crate::driver::errors::{finding, FindingKind};
use crate::driver::memory::memory;
use crate::driver::state::{current, registry};
use crate::driver::work::{DevRange, Work};
use crate::shmcoll::{self, AbortFlag, CollError, DType, Member, RedOp, ShmComm, UNIQUE_ID_BYTES};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type NcclResult = u32;
const SUCCESS: NcclResult = 0;
const SYSTEM_ERROR: NcclResult = 2;
const INTERNAL_ERROR: NcclResult = 3;
const INVALID_ARGUMENT: NcclResult = 4;
const INVALID_USAGE: NcclResult = 5;
const REMOTE_ERROR: NcclResult = 6;
const IN_PROGRESS: NcclResult = 7;

/// `ncclUniqueId`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    internal: [u8; UNIQUE_ID_BYTES],
}

/// The head of `ncclConfig_t` (every NCCL 2.14+ header starts with these fields).
#[repr(C)]
struct ConfigHead {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
}

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

fn fail(code: NcclResult, message: String) -> NcclResult {
    eprintln!("zero-gpusim NCCL: {message}");
    *LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()) = message;
    code
}

enum State {
    Joining,
    Ready(Arc<ShmComm>),
    Failed(NcclResult, String),
}

/// A communicator as the application holds it.
struct Comm {
    rank: usize,
    nranks: usize,
    device: usize,
    state: Mutex<State>,
    abort: AbortFlag,
    /// Whether it was created blocking (a split with no config inherits it).
    blocking: bool,
    /// Collectives queued on a stream that have not run yet (a split waits for them).
    queued: AtomicUsize,
    /// Set while `ncclCommSplit` exchanges through this communicator.
    splitting: AtomicBool,
}

/// Counts a queued collective until it ran (or was dropped unrun: a failed stream).
struct Queued(Arc<Comm>);

impl Queued {
    fn new(c: Arc<Comm>) -> Queued {
        c.queued.fetch_add(1, Ordering::AcqRel);
        Queued(c)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Comm {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fails the communicator (`ncclCommGetAsyncError` reports it from now on).
    fn set_failed(&self, code: NcclResult, message: String) {
        let mut st = self.state();
        if let State::Ready(c) = &*st {
            c.abort(&message);
        }
        if !matches!(*st, State::Failed(..)) {
            fail(
                code,
                format!("rank {} of {}: {message}", self.rank, self.nranks),
            );
            *st = State::Failed(code, message);
        }
    }
}

/// The `ncclResult_t` NCCL gives for each kind of failure: misuse (two ranks on one
/// device, disagreeing calls, bad arguments) is `ncclInvalidUsage`; a peer that died,
/// left, aborted or never came is `ncclRemoteError`; the stand-in's own I/O is
/// `ncclSystemError`.
fn code_of(e: &CollError) -> NcclResult {
    match e {
        CollError::BadUniqueId
        | CollError::BadMember { .. }
        | CollError::NranksMismatch { .. }
        | CollError::RankTaken { .. }
        | CollError::SameDevice { .. }
        | CollError::InvalidArgument { .. }
        | CollError::Mismatch { .. } => INVALID_USAGE,
        CollError::Io { .. } => SYSTEM_ERROR,
        _ => REMOTE_ERROR,
    }
}

fn timeout() -> Duration {
    Duration::from_secs_f64(
        std::env::var("ZERO_GPUSIM_NCCL_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60.0),
    )
}

fn comm<'a>(p: *mut c_void) -> Option<&'a Comm> {
    // SAFETY: handles are `Arc::into_raw` of a Comm made by init below (null refused).
    (!p.is_null()).then(|| unsafe { &*(p as *const Comm) })
}

#[no_mangle]
unsafe extern "C" fn ncclGetVersion(v: *mut c_int) -> NcclResult {
    if v.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: a writable int.
    unsafe { *v = 22809 };
    SUCCESS
}

#[no_mangle]
extern "C" fn ncclGetErrorString(code: NcclResult) -> *const c_char {
    let s: &'static [u8] = match code {
        0 => b"no error\0",
        1 => b"unhandled cuda error\0",
        2 => b"unhandled system error\0",
        3 => b"internal error\0",
        4 => b"invalid argument\0",
        5 => b"invalid usage\0",
        6 => b"remote process exited or there was a network error\0",
        7 => b"NCCL operation in progress\0",
        _ => b"unknown result code\0",
    };
    s.as_ptr().cast()
}

#[no_mangle]
extern "C" fn ncclGetLastError(_comm: *mut c_void) -> *const c_char {
    let m = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()).clone();
    crate::driver::errors::static_cstr(&m)
}

#[no_mangle]
unsafe extern "C" fn ncclGetUniqueId(out: *mut UniqueId) -> NcclResult {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: a writable ncclUniqueId.
    unsafe {
        *out = UniqueId {
            internal: shmcoll::unique_id(),
        }
    };
    SUCCESS
}

fn init(
    out: *mut *mut c_void,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    blocking: bool,
) -> NcclResult {
    if out.is_null() || nranks < 1 || rank < 0 || rank >= nranks {
        return fail(
            INVALID_ARGUMENT,
            format!("ncclCommInitRank: rank {rank} of {nranks} (or a null output)"),
        );
    }
    let device = current().unwrap_or(0);
    start(
        out,
        id,
        rank as usize,
        nranks as usize,
        device,
        blocking,
        "ncclCommInitRank",
    )
}

/// Makes the communicator `*out` (rank `rank` of `nranks` on `device`) and joins the
/// segment `id` names: at once where `blocking`, else on a thread (the communicator
/// reports `ncclInProgress` until it is joined).
fn start(
    out: *mut *mut c_void,
    id: UniqueId,
    rank: usize,
    nranks: usize,
    device: usize,
    blocking: bool,
    call: &str,
) -> NcclResult {
    let c = Arc::new(Comm {
        rank,
        nranks,
        device,
        state: Mutex::new(State::Joining),
        abort: AbortFlag::default(),
        blocking,
        queued: AtomicUsize::new(0),
        splitting: AtomicBool::new(false),
    });
    let member = Member {
        rank,
        nranks,
        device_key: super::cuda_device::device_key(device),
        pid: std::process::id(),
    };
    let joiner = c.clone();
    let join = move || {
        let got = ShmComm::join(&id.internal, member, timeout(), &joiner.abort);
        match got {
            Ok(s) => *joiner.state() = State::Ready(Arc::new(s)),
            Err(e) => joiner.set_failed(code_of(&e), e.to_string()),
        }
    };
    // SAFETY: a writable ncclComm_t (checked non-null above).
    unsafe { *out = Arc::into_raw(c.clone()) as *mut c_void };
    if blocking {
        join();
        return match &*c.state() {
            State::Failed(code, _) => *code,
            _ => SUCCESS,
        };
    }
    if std::thread::Builder::new()
        .name("gpusim-nccl-init".into())
        .spawn(join)
        .is_err()
    {
        return fail(SYSTEM_ERROR, format!("{call}: could not start a thread"));
    }
    IN_PROGRESS
}

#[no_mangle]
unsafe extern "C" fn ncclCommInitRank(
    out: *mut *mut c_void,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> NcclResult {
    init(out, nranks, id, rank, true)
}

#[no_mangle]
unsafe extern "C" fn ncclCommInitRankConfig(
    out: *mut *mut c_void,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *const c_void,
) -> NcclResult {
    // SAFETY: the caller's config, passed on.
    match unsafe { config_blocking(config, "ncclCommInitRankConfig") } {
        Ok(blocking) => init(out, nranks, id, rank, blocking.unwrap_or(true)),
        Err(code) => code,
    }
}

/// The `blocking` field of an `ncclConfig_t` (`None` for a null config).
///
/// # Safety
/// `config` is null or an `ncclConfig_t` made by `NCCL_CONFIG_INITIALIZER`.
unsafe fn config_blocking(config: *const c_void, call: &str) -> Result<Option<bool>, NcclResult> {
    if config.is_null() {
        return Ok(None);
    }
    // SAFETY: an ncclConfig_t made by NCCL_CONFIG_INITIALIZER (its head is common to every
    // version).
    let head = unsafe { &*(config as *const ConfigHead) };
    if head.magic != 0xcafe_beef || head.size < std::mem::size_of::<ConfigHead>() {
        return Err(fail(
            INVALID_ARGUMENT,
            format!("{call}: not an ncclConfig_t (magic {:#x})", head.magic),
        ));
    }
    Ok(Some(head.blocking != 0))
}

/// The bytes each rank gives the split's exchange: color, key (little-endian `i32`s) and
/// a fresh unique id.
const SPLIT_ENTRY: usize = 8 + UNIQUE_ID_BYTES;

#[no_mangle]
unsafe extern "C" fn ncclCommSplit(
    c: *mut c_void,
    color: c_int,
    key: c_int,
    out: *mut *mut c_void,
    config: *const c_void,
) -> NcclResult {
    const CALL: &str = "ncclCommSplit";
    let Some(parent) = comm(c) else {
        return fail(
            INVALID_ARGUMENT,
            format!("{CALL}: the communicator is null"),
        );
    };
    if out.is_null() {
        return fail(INVALID_ARGUMENT, format!("{CALL}: null output"));
    }
    if color < 0 {
        return fail(
            INVALID_USAGE,
            format!("{CALL}: color {color} (NCCL_SPLIT_NOCOLOR) is not implemented by zero-gpusim"),
        );
    }
    // SAFETY: the caller's config, passed on.
    let blocking = match unsafe { config_blocking(config, CALL) } {
        Ok(b) => b.unwrap_or(parent.blocking),
        Err(code) => return code,
    };
    let shm = match &*parent.state() {
        State::Ready(s) => s.clone(),
        State::Joining => return fail(INVALID_USAGE, format!("{CALL}: the communicator is still initializing (poll ncclCommGetAsyncError until ncclSuccess)")),
        State::Failed(code, m) => return fail(*code, format!("{CALL}: the communicator failed earlier: {m}")),
    };
    if parent.splitting.swap(true, Ordering::AcqRel) {
        return fail(
            INVALID_USAGE,
            format!("{CALL}: the communicator is already splitting"),
        );
    }
    let done = |code: NcclResult| {
        parent.splitting.store(false, Ordering::Release);
        code
    };
    // The parent's collectives already queued come first, on every rank.
    let deadline = std::time::Instant::now() + shm.timeout();
    while parent.queued.load(Ordering::Acquire) > 0 {
        if std::time::Instant::now() > deadline {
            let m = format!(
                "{CALL}: the communicator's queued collectives did not run within {:?}",
                shm.timeout()
            );
            parent.set_failed(REMOTE_ERROR, m.clone());
            return done(fail(REMOTE_ERROR, m));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let mut mine = Vec::with_capacity(SPLIT_ENTRY);
    mine.extend_from_slice(&color.to_le_bytes());
    mine.extend_from_slice(&key.to_le_bytes());
    mine.extend_from_slice(&shmcoll::unique_id());
    let mut all = vec![0u8; SPLIT_ENTRY * parent.nranks];
    if let Err(e) = shm.all_gather(&mine, &mut all, DType::U8) {
        let code = code_of(&e);
        parent.set_failed(code, format!("{CALL}: {e}"));
        return done(code);
    }
    let int = |b: &[u8]| c_int::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let mut members: Vec<(c_int, usize)> = all
        .chunks(SPLIT_ENTRY)
        .enumerate()
        .filter(|(_, e)| int(&e[..4]) == color)
        .map(|(r, e)| (int(&e[4..8]), r))
        .collect();
    members.sort_unstable();
    let Some(rank) = members.iter().position(|&(_, r)| r == parent.rank) else {
        return done(fail(
            INTERNAL_ERROR,
            format!("{CALL}: this rank is not in its own color"),
        ));
    };
    let first = members[0].1 * SPLIT_ENTRY + 8;
    let mut id = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    id.internal
        .copy_from_slice(&all[first..first + UNIQUE_ID_BYTES]);
    done(start(
        out,
        id,
        rank,
        members.len(),
        parent.device,
        blocking,
        CALL,
    ))
}

#[no_mangle]
unsafe extern "C" fn ncclCommGetAsyncError(c: *mut c_void, out: *mut NcclResult) -> NcclResult {
    let (Some(c), false) = (comm(c), out.is_null()) else {
        return INVALID_ARGUMENT;
    };
    let code = match &*c.state() {
        _ if c.splitting.load(Ordering::Acquire) => IN_PROGRESS,
        State::Joining => IN_PROGRESS,
        State::Ready(_) => SUCCESS,
        State::Failed(code, m) => {
            *LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()) = m.clone();
            *code
        }
    };
    // SAFETY: a writable ncclResult_t.
    unsafe { *out = code };
    SUCCESS
}

#[no_mangle]
extern "C" fn ncclCommAbort(c: *mut c_void) -> NcclResult {
    let Some(cm) = comm(c) else { return SUCCESS };
    cm.abort.set();
    let reason = format!("rank {} called ncclCommAbort", cm.rank);
    if let State::Ready(s) = &*cm.state() {
        s.abort(&reason);
    }
    // SAFETY: the handle's own reference, released once (the handle is dead after abort).
    drop(unsafe { Arc::from_raw(c as *const Comm) });
    SUCCESS
}

#[no_mangle]
extern "C" fn ncclCommFinalize(c: *mut c_void) -> NcclResult {
    match comm(c) {
        Some(_) => SUCCESS,
        None => INVALID_ARGUMENT,
    }
}

#[no_mangle]
extern "C" fn ncclCommDestroy(c: *mut c_void) -> NcclResult {
    if comm(c).is_none() {
        return SUCCESS;
    }
    // SAFETY: the handle's own reference, released once.
    drop(unsafe { Arc::from_raw(c as *const Comm) });
    SUCCESS
}

#[no_mangle]
unsafe extern "C" fn ncclCommCount(c: *mut c_void, n: *mut c_int) -> NcclResult {
    let (Some(c), false) = (comm(c), n.is_null()) else {
        return INVALID_ARGUMENT;
    };
    // SAFETY: a writable int.
    unsafe { *n = c.nranks as c_int };
    SUCCESS
}

#[no_mangle]
unsafe extern "C" fn ncclCommCuDevice(c: *mut c_void, d: *mut c_int) -> NcclResult {
    let (Some(c), false) = (comm(c), d.is_null()) else {
        return INVALID_ARGUMENT;
    };
    // SAFETY: a writable int.
    unsafe { *d = c.device as c_int };
    SUCCESS
}

#[no_mangle]
unsafe extern "C" fn ncclCommUserRank(c: *mut c_void, r: *mut c_int) -> NcclResult {
    let (Some(c), false) = (comm(c), r.is_null()) else {
        return INVALID_ARGUMENT;
    };
    // SAFETY: a writable int.
    unsafe { *r = c.rank as c_int };
    SUCCESS
}

#[no_mangle]
extern "C" fn ncclGroupStart() -> NcclResult {
    SUCCESS
}

#[no_mangle]
extern "C" fn ncclGroupEnd() -> NcclResult {
    SUCCESS
}

fn dtype(t: c_int) -> Option<(DType, usize)> {
    Some(match t {
        0 => (DType::I8, 1),
        1 => (DType::U8, 1),
        2 => (DType::I32, 4),
        3 => (DType::U32, 4),
        4 => (DType::I64, 8),
        5 => (DType::U64, 8),
        6 => (DType::F16, 2),
        7 => (DType::F32, 4),
        8 => (DType::F64, 8),
        9 => (DType::BF16, 2),
        _ => return None,
    })
}

fn red_op(op: c_int) -> Option<RedOp> {
    Some(match op {
        0 => RedOp::Sum,
        1 => RedOp::Prod,
        2 => RedOp::Max,
        3 => RedOp::Min,
        4 => RedOp::Avg,
        _ => return None,
    })
}

/// The collectives.
#[derive(Clone, Copy)]
enum Kind {
    AllReduce(RedOp),
    ReduceScatter(RedOp),
    AllGather,
    Broadcast(usize),
}

#[allow(clippy::too_many_arguments)]
fn collective(
    name: &'static str,
    kind: Kind,
    send: u64,
    recv: u64,
    send_bytes: usize,
    recv_bytes: usize,
    dt: DType,
    c: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    let Some(cm) = comm(c) else {
        return fail(
            INVALID_ARGUMENT,
            format!("{name}: the communicator is null"),
        );
    };
    let shm = match &*cm.state() {
        State::Ready(s) => s.clone(),
        State::Joining => return fail(INVALID_USAGE, format!("{name}: the communicator is still initializing (poll ncclCommGetAsyncError until ncclSuccess)")),
        State::Failed(code, m) => return fail(*code, format!("{name}: the communicator failed earlier: {m}")),
    };
    let mut reg = registry();
    let s = match reg.stream(stream as u64) {
        Ok(s) => s,
        Err(m) => return fail(INVALID_ARGUMENT, format!("{name}: {m}")),
    };
    let range = |addr: u64, len: usize, side: &str| -> Result<DevRange, NcclResult> {
        let what = format!("{name} on {} ({side}, {len} bytes)", s.name());
        memory()
            .range(addr, len as u64, &what)
            .map(|(alloc, off)| DevRange {
                alloc,
                off,
                len: len as u64,
            })
            .map_err(|m| {
                finding(FindingKind::Memory, m.clone());
                fail(INVALID_ARGUMENT, m)
            })
    };
    let is_root = matches!(kind, Kind::Broadcast(r) if r == cm.rank);
    let send_r = if send_bytes == 0 || (matches!(kind, Kind::Broadcast(_)) && !is_root) {
        None
    } else {
        match range(send, send_bytes, "send buffer") {
            Ok(r) => Some(r),
            Err(code) => return code,
        }
    };
    let recv_r = if recv_bytes == 0 {
        None
    } else {
        match range(recv, recv_bytes, "receive buffer") {
            Ok(r) => Some(r),
            Err(code) => return code,
        }
    };
    if cm.splitting.load(Ordering::Acquire) {
        return fail(INVALID_USAGE, format!("{name}: the communicator is splitting (poll ncclCommGetAsyncError until ncclSuccess)"));
    }
    let owner = unsafe_clone(c);
    let queued = owner.clone().map(Queued::new);
    let work = Work::Custom(Box::new(move |cx| {
        let _queued = queued;
        let Some(owner) = owner.as_ref() else {
            return Ok(());
        };
        let input = match &send_r {
            Some(r) => cx.read(r, false)?,
            None => vec![0u8; send_bytes],
        };
        let mut out = vec![0u8; recv_bytes];
        let done = match kind {
            Kind::AllReduce(op) => shm.all_reduce(&input, &mut out, dt, op),
            Kind::ReduceScatter(op) => shm.reduce_scatter(&input, &mut out, dt, op),
            Kind::AllGather => shm.all_gather(&input, &mut out, dt),
            Kind::Broadcast(root) => shm.broadcast(&input, &mut out, dt, root),
        };
        match done {
            Ok(()) => match &recv_r {
                Some(r) => cx.write(r, &out),
                None => Ok(()),
            },
            Err(e) => {
                owner.set_failed(code_of(&e), format!("{name}: {e}"));
                Ok(())
            }
        }
    }));
    reg.enqueue(&s, work, name, None);
    SUCCESS
}

/// Another reference to the communicator for a queued collective.
fn unsafe_clone(c: *mut c_void) -> Option<Arc<Comm>> {
    if c.is_null() {
        return None;
    }
    // SAFETY: `c` is `Arc::into_raw` of a live Comm (the handle holds a reference while
    // the application may call collectives on it): one more strong count, then an Arc.
    unsafe {
        Arc::increment_strong_count(c as *const Comm);
        Some(Arc::from_raw(c as *const Comm))
    }
}

macro_rules! typed {
    ($name:literal, $t:expr, $op:expr) => {{
        let Some((dt, size)) = dtype($t) else {
            return fail(
                INVALID_ARGUMENT,
                format!("{}: unknown data type {}", $name, $t),
            );
        };
        let Some(op) = $op else {
            return fail(INVALID_ARGUMENT, format!("{}: unknown reduction", $name));
        };
        (dt, size, op)
    }};
}

#[no_mangle]
extern "C" fn ncclAllReduce(
    send: u64,
    recv: u64,
    count: usize,
    t: c_int,
    op: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    let (dt, size, op) = typed!("ncclAllReduce", t, red_op(op));
    collective(
        "ncclAllReduce",
        Kind::AllReduce(op),
        send,
        recv,
        count * size,
        count * size,
        dt,
        c,
        stream,
    )
}

#[no_mangle]
extern "C" fn ncclReduceScatter(
    send: u64,
    recv: u64,
    count: usize,
    t: c_int,
    op: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    let (dt, size, op) = typed!("ncclReduceScatter", t, red_op(op));
    let n = comm(c).map_or(1, |c| c.nranks);
    collective(
        "ncclReduceScatter",
        Kind::ReduceScatter(op),
        send,
        recv,
        count * size * n,
        count * size,
        dt,
        c,
        stream,
    )
}

#[no_mangle]
extern "C" fn ncclAllGather(
    send: u64,
    recv: u64,
    count: usize,
    t: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    let (dt, size, _) = typed!("ncclAllGather", t, Some(()));
    let n = comm(c).map_or(1, |c| c.nranks);
    collective(
        "ncclAllGather",
        Kind::AllGather,
        send,
        recv,
        count * size,
        count * size * n,
        dt,
        c,
        stream,
    )
}

#[no_mangle]
extern "C" fn ncclBroadcast(
    send: u64,
    recv: u64,
    count: usize,
    t: c_int,
    root: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    let (dt, size, _) = typed!("ncclBroadcast", t, Some(()));
    if root < 0 {
        return fail(INVALID_ARGUMENT, format!("ncclBroadcast: root {root}"));
    }
    collective(
        "ncclBroadcast",
        Kind::Broadcast(root as usize),
        send,
        recv,
        count * size,
        count * size,
        dt,
        c,
        stream,
    )
}

#[no_mangle]
extern "C" fn ncclBcast(
    buf: u64,
    count: usize,
    t: c_int,
    root: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    ncclBroadcast(buf, buf, count, t, root, c, stream)
}

fn nccl_unimplemented(name: &str) -> NcclResult {
    fail(
        INTERNAL_ERROR,
        format!("{name} is not implemented by zero-gpusim"),
    )
}

macro_rules! nccl_stubs {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            extern "C" fn $name() -> NcclResult {
                nccl_unimplemented(stringify!($name))
            }
        )*
    };
}

nccl_stubs!(
    ncclAlltoAll,
    ncclCommDeregister,
    ncclCommInitAll,
    ncclCommInitRankScalable,
    ncclCommRegister,
    ncclCommRevoke,
    ncclCommShrink,
    ncclCommWindowDeregister,
    ncclCommWindowRegister,
    ncclGather,
    ncclGroupSimulateEnd,
    ncclMemAlloc,
    ncclMemFree,
    ncclRecv,
    ncclRedOpCreatePreMulSum,
    ncclRedOpDestroy,
    ncclReduce,
    ncclResetDebugInit,
    ncclScatter,
    ncclSend,
);
