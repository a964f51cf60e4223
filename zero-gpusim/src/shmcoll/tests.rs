//! The engine across real processes: each rank is this test binary again
//! ([`child_rank`], launched with `--exact … --ignored` and its parameters in environment
//! variables). Every child is bounded by a deadline and killed on overrun, and every test
//! checks that it left nothing in `/dev/shm`.
//!
//! - every collective (and its in-place form) at 2 and 3 processes, in f32, f16 and bf16
//!   (and f64, i32, u8, i64 at small lengths), at lengths 0, 1, 7, 1023 and 3 Mi + 5
//!   elements (many chunks), and again with 4 KiB windows: the same bits as a reference
//!   computed here with the rule (rank order, `f32`, one rounding);
//! - mismatched count, dtype, op, root and call: every rank fails naming every rank's call;
//! - a rank that never calls, or never joins; two ranks on one device; nranks disagreeing;
//!   a rank number taken twice; bad arguments on one rank;
//! - `abort` from another thread; a peer killed with `SIGKILL`; a peer that leaves;
//! - the time of a 16 MiB bf16 all-reduce between 2 processes.

use super::{unique_id, AbortFlag, CollError, DType, Member, RedOp, ShmComm, UNIQUE_ID_BYTES};
use half::{bf16, f16};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use zero_kernels::testing::finish_children;

const ENV_CASE: &str = "ZERO_GPUSIM_TEST_CASE";
const ENV_ID: &str = "ZERO_GPUSIM_TEST_ID";
const ENV_RANK: &str = "ZERO_GPUSIM_TEST_RANK";
const ENV_NRANKS: &str = "ZERO_GPUSIM_TEST_NRANKS";
const ENV_KEY: &str = "ZERO_GPUSIM_TEST_DEVICE";
const ENV_SEED: &str = "ZERO_GPUSIM_TEST_SEED";
const ENV_LENGTHS: &str = "ZERO_GPUSIM_TEST_LENGTHS";
const ENV_WHICH: &str = "ZERO_GPUSIM_TEST_WHICH";
const ENV_JOIN_S: &str = "ZERO_GPUSIM_TEST_JOIN_S";
const ENV_JOIN_DELAY_MS: &str = "ZERO_GPUSIM_TEST_JOIN_DELAY_MS";
const ENV_WINDOW: &str = "ZERO_GPUSIM_NCCL_WINDOW";
const ENV_TIMEOUT: &str = "ZERO_GPUSIM_NCCL_TIMEOUT_S";

/// One process test at a time: they time waits, and share 2 cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// The pids of the ranks this test binary started ([`spawn`]).
static OURS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The name libtest knows [`child_rank`] by (the module path without the crate).
fn child_test_name() -> String {
    let path = module_path!();
    let rest = path.split_once("::").map_or(path, |(_, r)| r);
    format!("{rest}::child_rank")
}

fn hex(id: &[u8; UNIQUE_ID_BYTES]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; UNIQUE_ID_BYTES]> {
    let mut id = [0u8; UNIQUE_ID_BYTES];
    if s.len() != 2 * UNIQUE_ID_BYTES {
        return None;
    }
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

fn shm_path(id: &[u8; UNIQUE_ID_BYTES]) -> String {
    super::segment::path_of(&super::segment_name(id).unwrap_or_default())
}

/// The `zero-gpusim-*` names in `/dev/shm`.
fn shm_entries() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("zero-gpusim-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether segment `name` in `/dev/shm` was joined by this binary or a rank it started:
/// another process using the stand-in at the same time (`.ci/run` runs the stand-in pass
/// beside the test command, and both run these tests) has segments of its own there.
/// A segment whose header is not written yet names nobody: not counted.
fn joined_by_us(name: &str) -> bool {
    let ours = OURS.lock().unwrap_or_else(|p| p.into_inner());
    // (Read and write: the segment is mapped shared and writable; nothing is written.)
    let path = format!("/dev/shm/{name}");
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    else {
        return false;
    };
    let Ok(Some(seg)) = super::segment::Segment::open(&file) else {
        return false;
    };
    let me = std::process::id();
    (0..seg.nranks()).any(|r| {
        let pid = seg.pid(r).load(std::sync::atomic::Ordering::Relaxed);
        pid == me || ours.contains(&pid)
    })
}

/// Fails if a segment of `ids`, or any `zero-gpusim-*` name not there `before` that this
/// binary's ranks joined, is left.
fn assert_nothing_left(before: &[String], ids: &[[u8; UNIQUE_ID_BYTES]]) {
    let mut left: Vec<String> = ids
        .iter()
        .map(shm_path)
        .filter(|p| std::path::Path::new(p).exists())
        .collect();
    for p in &left {
        let _ = std::fs::remove_file(p);
    }
    left.extend(
        shm_entries()
            .into_iter()
            .filter(|e| !before.contains(e) && joined_by_us(e)),
    );
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// Starts rank `rank` of `nranks` of communicator `id` running `case`; `extra` adds
/// variables.
fn spawn(
    case: &str,
    id: &[u8; UNIQUE_ID_BYTES],
    rank: usize,
    nranks: usize,
    extra: &[(&str, String)],
) -> Child {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut c = Command::new(exe);
    c.args([
        "--exact",
        &child_test_name(),
        "--nocapture",
        "--test-threads=1",
        "--ignored",
    ])
    .env(ENV_CASE, case)
    .env(ENV_ID, hex(id))
    .env(ENV_RANK, rank.to_string())
    .env(ENV_NRANKS, nranks.to_string())
    .env_remove(ENV_WINDOW)
    .env_remove(ENV_TIMEOUT)
    .env_remove(ENV_KEY)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in extra {
        c.env(k, v);
    }
    let child = c.spawn().expect("starting a rank");
    OURS.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(child.id());
    child
}

/// What a rank printed after `tag`.
fn line<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.find(tag).map(|at| l[at + tag.len()..].trim()))
}

/// Reads `child`'s stdout until it printed `tag` (or ended).
fn await_line(child: &mut Child, tag: &str) -> bool {
    let Some(out) = child.stdout.take() else {
        return false;
    };
    let mut r = BufReader::new(out);
    let mut l = String::new();
    while r.read_line(&mut l).unwrap_or(0) > 0 {
        if l.contains(tag) {
            return true;
        }
        l.clear();
    }
    false
}

fn env_usize(k: &str) -> Option<usize> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

// ---------------------------------------------------------------------------------------
// The sweep: cases, inputs and the reference.

/// One collective of the sweep.
#[derive(Clone, Copy, Debug)]
enum Kind {
    AllReduce(RedOp),
    AllReduceInPlace(RedOp),
    ReduceScatter(RedOp),
    ReduceScatterInPlace(RedOp),
    AllGather,
    AllGatherInPlace,
    Broadcast(usize),
    BroadcastInPlace(usize),
}

/// The sweep, the same in every process: kind × dtype × length (the length is the
/// element count of the buffer, or of each rank's block for reduce-scatter and
/// all-gather).
fn cases(nranks: usize, lengths: &[usize]) -> Vec<(Kind, DType, usize)> {
    let kinds = [
        Kind::AllReduce(RedOp::Sum),
        Kind::AllReduce(RedOp::Avg),
        Kind::AllReduce(RedOp::Max),
        Kind::AllReduce(RedOp::Min),
        Kind::AllReduce(RedOp::Prod),
        Kind::AllReduceInPlace(RedOp::Sum),
        Kind::ReduceScatter(RedOp::Sum),
        Kind::ReduceScatter(RedOp::Avg),
        Kind::ReduceScatter(RedOp::Max),
        Kind::ReduceScatterInPlace(RedOp::Sum),
        Kind::AllGather,
        Kind::AllGatherInPlace,
        Kind::Broadcast(0),
        Kind::Broadcast(1),
        Kind::BroadcastInPlace(nranks - 1),
    ];
    let mut out = Vec::new();
    for &n in lengths {
        for kind in kinds {
            // At lengths over a million elements (slow to check), the plain forms of
            // all-reduce (sum, avg, max), reduce-scatter, all-gather and broadcast (root 0
            // and 1); the rest crosses many chunks with the small windows instead.
            let core = matches!(
                kind,
                Kind::AllReduce(RedOp::Sum | RedOp::Avg | RedOp::Max)
                    | Kind::ReduceScatter(RedOp::Sum)
                    | Kind::AllGather
                    | Kind::Broadcast(_)
            );
            if n > 1 << 20 && !core {
                continue;
            }
            for dtype in DType::ALL {
                let halfs = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
                let other = matches!(dtype, DType::F64 | DType::I32 | DType::U8 | DType::I64);
                if halfs || (other && n <= 1023) {
                    out.push((kind, dtype, n));
                }
            }
        }
    }
    out
}

/// Scales of the sweep's float values.
const SCALES: [f32; 6] = [1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0];

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Elements `range` of rank `rank`'s `n`-element input for case `case`: floats of both
/// signs and several magnitudes, with an inf and a NaN planted in longer inputs; integers
/// of random bits. Any range can be made alone (each element is a hash of its index under
/// a key drawn from the seed).
fn input_range(
    seed: u64,
    case: usize,
    rank: usize,
    dtype: DType,
    n: usize,
    range: std::ops::Range<usize>,
) -> Vec<u8> {
    let key =
        ChaCha8Rng::seed_from_u64(seed ^ ((case as u64) << 24) ^ ((rank as u64) << 56)).next_u64();
    let (inf_at, nan_at) = if n > 30 {
        (
            (mix(key ^ 1) % n as u64) as usize,
            (mix(key ^ 2) % n as u64) as usize,
        )
    } else {
        (usize::MAX, usize::MAX)
    };
    let mut out = Vec::with_capacity(range.len() * dtype.size());
    for i in range {
        let x = mix(key ^ (i as u64).wrapping_mul(0xd605_bbb5_8c8a_bbfd));
        let mut v =
            (f32::from((x & 0xffff) as u16) / 8192.0 - 4.0) * SCALES[(x >> 16) as usize % 6];
        if i == inf_at {
            v = if rank % 2 == 0 {
                f32::INFINITY
            } else {
                f32::NEG_INFINITY
            };
        }
        if i == nan_at {
            v = f32::NAN;
        }
        match dtype {
            DType::F32 => out.extend(v.to_le_bytes()),
            DType::F16 => out.extend(f16::from_f32(v).to_bits().to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f32(v).to_bits().to_le_bytes()),
            DType::F64 => out.extend((f64::from(v) * (1.0 + 1e-9)).to_le_bytes()),
            _ => out.extend(&(x >> 8).to_le_bytes()[..dtype.size()]),
        }
    }
    out
}

/// Rank `rank`'s whole `n`-element input for case `case`.
fn input(seed: u64, case: usize, rank: usize, dtype: DType, n: usize) -> Vec<u8> {
    input_range(seed, case, rank, dtype, n, 0..n)
}

fn nan_aware(op: RedOp, a: f64, b: f64) -> f64 {
    match op {
        RedOp::Sum | RedOp::Avg => a + b,
        RedOp::Prod => a * b,
        RedOp::Max | RedOp::Min if a.is_nan() || b.is_nan() => f64::NAN,
        RedOp::Max => a.max(b),
        RedOp::Min => a.min(b),
    }
}

fn nan_aware32(op: RedOp, a: f32, b: f32) -> f32 {
    match op {
        RedOp::Sum | RedOp::Avg => a + b,
        RedOp::Prod => a * b,
        RedOp::Max | RedOp::Min if a.is_nan() || b.is_nan() => f32::NAN,
        RedOp::Max => a.max(b),
        RedOp::Min => a.min(b),
    }
}

macro_rules! int_reference {
    ($t:ty, $vals:expr, $op:expr, $n:expr, $out:expr) => {{
        let get = |b: &[u8]| <$t>::from_le_bytes(b.try_into().unwrap_or_default());
        let mut a = get($vals[0]);
        for x in &$vals[1..] {
            let x = get(x);
            a = match $op {
                RedOp::Sum | RedOp::Avg => a.wrapping_add(x),
                RedOp::Prod => a.wrapping_mul(x),
                RedOp::Max => a.max(x),
                RedOp::Min => a.min(x),
            };
        }
        if $op == RedOp::Avg {
            a = (a as i128 / $n as i128) as $t;
        }
        $out.copy_from_slice(&a.to_le_bytes());
    }};
}

/// The rule, for one element: rank 0's value widened, each next rank's combined in rank
/// order (in f32; f64 for f64; wrapping for integers), Avg divided by nranks, one rounding
/// through `half`; written to `out`.
fn reference_element(dtype: DType, op: RedOp, vals: &[&[u8]], nranks: usize, out: &mut [u8]) {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            let get = |b: &[u8]| match dtype {
                DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                DType::F16 => f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
                _ => bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
            };
            let mut a = get(vals[0]);
            for v in &vals[1..] {
                a = nan_aware32(op, a, get(v));
            }
            if op == RedOp::Avg {
                a /= nranks as f32;
            }
            match dtype {
                DType::F32 => out.copy_from_slice(&a.to_le_bytes()),
                DType::F16 => out.copy_from_slice(&f16::from_f32(a).to_bits().to_le_bytes()),
                _ => out.copy_from_slice(&bf16::from_f32(a).to_bits().to_le_bytes()),
            }
        }
        DType::F64 => {
            let get = |b: &[u8]| f64::from_le_bytes(b.try_into().unwrap_or_default());
            let mut a = get(vals[0]);
            for v in &vals[1..] {
                a = nan_aware(op, a, get(v));
            }
            if op == RedOp::Avg {
                a /= nranks as f64;
            }
            out.copy_from_slice(&a.to_le_bytes());
        }
        DType::I8 => int_reference!(i8, vals, op, nranks, out),
        DType::U8 => int_reference!(u8, vals, op, nranks, out),
        DType::I32 => int_reference!(i32, vals, op, nranks, out),
        DType::U32 => int_reference!(u32, vals, op, nranks, out),
        DType::I64 => int_reference!(i64, vals, op, nranks, out),
        DType::U64 => int_reference!(u64, vals, op, nranks, out),
    }
}

/// The element-wise reduction of `inputs` by the rule.
fn reference_reduce(dtype: DType, op: RedOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let esz = dtype.size();
    let n = inputs[0].len() / esz;
    if matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        // The same rule as `reference_element`, over whole widened inputs (faster).
        let widen = |c: &[u8]| match dtype {
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            DType::F16 => f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
            _ => bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
        };
        let wide: Vec<Vec<f32>> = inputs
            .iter()
            .map(|b| b.chunks_exact(esz).map(widen).collect())
            .collect();
        let mut out = Vec::with_capacity(n * esz);
        for i in 0..n {
            let mut a = wide[0][i];
            for w in &wide[1..] {
                a = nan_aware32(op, a, w[i]);
            }
            if op == RedOp::Avg {
                a /= inputs.len() as f32;
            }
            match dtype {
                DType::F32 => out.extend(a.to_le_bytes()),
                DType::F16 => out.extend(f16::from_f32(a).to_bits().to_le_bytes()),
                _ => out.extend(bf16::from_f32(a).to_bits().to_le_bytes()),
            }
        }
        return out;
    }
    let mut out = vec![0u8; n * esz];
    let mut vals: Vec<&[u8]> = Vec::with_capacity(inputs.len());
    for (i, o) in out.chunks_exact_mut(esz).enumerate() {
        vals.clear();
        vals.extend(inputs.iter().map(|b| &b[i * esz..(i + 1) * esz]));
        reference_element(dtype, op, &vals, inputs.len(), o);
    }
    out
}

/// Nanoseconds this process spent inside collectives (the sweep's own cost aside).
static IN_COLLECTIVES_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs `f`, adding its time to [`IN_COLLECTIVES_NS`].
fn timed<R>(f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    IN_COLLECTIVES_NS.fetch_add(
        t.elapsed().as_nanos() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    r
}

/// Runs case `i` on `comm` and checks this rank's result against the reference; `Err`
/// says where it differs.
fn run_case(
    comm: &ShmComm,
    seed: u64,
    i: usize,
    (kind, dtype, n): (Kind, DType, usize),
) -> Result<(), String> {
    let (rank, nranks) = (comm.rank(), comm.nranks());
    let esz = dtype.size();
    let whole = match kind {
        Kind::ReduceScatter(_) | Kind::ReduceScatterInPlace(_) => n * nranks,
        _ => n,
    };
    let mine = &input(seed, i, rank, dtype, whole);
    // Another rank's elements `range` (only what the reference needs is made).
    let theirs = |r: usize, range: std::ops::Range<usize>| {
        if r == rank {
            mine[range.start * esz..range.end * esz].to_vec()
        } else {
            input_range(seed, i, r, dtype, whole, range)
        }
    };
    let all = || -> Vec<Vec<u8>> { (0..nranks).map(|r| theirs(r, 0..whole)).collect() };
    let fail = |e: CollError| format!("{e}");
    let (got, want) = match kind {
        Kind::AllReduce(op) => {
            let mut recv = vec![0xa5u8; mine.len()];
            timed(|| comm.all_reduce(mine, &mut recv, dtype, op)).map_err(fail)?;
            (recv, reference_reduce(dtype, op, &all()))
        }
        Kind::AllReduceInPlace(op) => {
            let mut buf = mine.clone();
            timed(|| comm.all_reduce_in_place(&mut buf, dtype, op)).map_err(fail)?;
            (buf, reference_reduce(dtype, op, &all()))
        }
        Kind::ReduceScatter(op) | Kind::ReduceScatterInPlace(op) => {
            let block = n * esz;
            let got = if let Kind::ReduceScatter(_) = kind {
                let mut recv = vec![0xa5u8; block];
                timed(|| comm.reduce_scatter(mine, &mut recv, dtype, op)).map_err(fail)?;
                recv
            } else {
                let mut buf = mine.clone();
                timed(|| comm.reduce_scatter_in_place(&mut buf, dtype, op)).map_err(fail)?;
                buf[rank * block..(rank + 1) * block].to_vec()
            };
            let blocks: Vec<Vec<u8>> = (0..nranks)
                .map(|r| theirs(r, rank * n..(rank + 1) * n))
                .collect();
            (got, reference_reduce(dtype, op, &blocks))
        }
        Kind::AllGather | Kind::AllGatherInPlace => {
            let mut recv = vec![0xa5u8; n * esz * nranks];
            if let Kind::AllGather = kind {
                timed(|| comm.all_gather(mine, &mut recv, dtype)).map_err(fail)?;
            } else {
                recv[rank * n * esz..(rank + 1) * n * esz].copy_from_slice(mine);
                timed(|| comm.all_gather_in_place(&mut recv, dtype)).map_err(fail)?;
            }
            (recv, all().concat())
        }
        Kind::Broadcast(root) => {
            let mut recv = vec![0xa5u8; mine.len()];
            // Only the root's send is read: the others pass an empty one.
            let send: &[u8] = if rank == root { mine } else { &[] };
            timed(|| comm.broadcast(send, &mut recv, dtype, root)).map_err(fail)?;
            (recv, theirs(root, 0..n))
        }
        Kind::BroadcastInPlace(root) => {
            let mut buf = mine.clone();
            timed(|| comm.broadcast_in_place(&mut buf, dtype, root)).map_err(fail)?;
            (buf, theirs(root, 0..n))
        }
    };
    if got != want {
        let at = (0..got.len().min(want.len()))
            .find(|&b| got[b] != want[b])
            .unwrap_or(0)
            / esz;
        return Err(format!(
            "case {i} {kind:?} {dtype} n={n} on rank {rank}: {} bytes vs {}; element {at}: got {:02x?}, want {:02x?}",
            got.len(),
            want.len(),
            got.get(at * esz..(at + 1) * esz),
            want.get(at * esz..(at + 1) * esz),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The child: one rank of every scenario.

fn small_all_reduce(comm: &ShmComm) -> Result<(), CollError> {
    let send = vec![0u8; 400];
    let mut recv = vec![0u8; 400];
    comm.all_reduce(&send, &mut recv, DType::F32, RedOp::Sum)
}

fn report(r: Result<(), CollError>, t0: Instant) {
    match r {
        Ok(()) => println!("RESULT ok"),
        Err(e) => println!("RESULT ERROR {e} AFTER_MS {}", t0.elapsed().as_millis()),
    }
}

/// One rank of a scenario, run in a child process by the tests below.
#[test]
#[ignore = "a rank of the multi-process tests, started by them in a child process"]
fn child_rank() {
    let Ok(case) = std::env::var(ENV_CASE) else {
        return;
    };
    let Some(id) = std::env::var(ENV_ID).ok().and_then(|s| unhex(&s)) else {
        println!("JOIN ERROR no id given");
        return;
    };
    let (Some(rank), Some(nranks)) = (env_usize(ENV_RANK), env_usize(ENV_NRANKS)) else {
        println!("JOIN ERROR no rank given");
        return;
    };
    if let Some(ms) = env_usize(ENV_JOIN_DELAY_MS) {
        std::thread::sleep(Duration::from_millis(ms as u64));
    }
    let me = Member {
        rank,
        nranks,
        device_key: std::env::var(ENV_KEY).unwrap_or_else(|_| format!("testhost:GPU-{rank}")),
        pid: std::process::id(),
    };
    let join_timeout = Duration::from_secs(env_usize(ENV_JOIN_S).unwrap_or(30) as u64);
    let t0 = Instant::now();
    let comm = match ShmComm::join(&id, me, join_timeout, &AbortFlag::default()) {
        Ok(c) => c,
        Err(e) => {
            println!("JOIN ERROR {e} AFTER_MS {}", t0.elapsed().as_millis());
            return;
        }
    };
    println!("READY");
    let t0 = Instant::now();
    match case.as_str() {
        "plain" => report(small_all_reduce(&comm), t0),
        "sweep" => {
            let seed: u64 = std::env::var(ENV_SEED)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1);
            let lengths: Vec<usize> = std::env::var(ENV_LENGTHS)
                .unwrap_or_default()
                .split(',')
                .filter_map(|v| v.parse().ok())
                .collect();
            let all = cases(nranks, &lengths);
            let mut failures = Vec::new();
            for (i, c) in all.iter().enumerate() {
                if let Err(e) = run_case(&comm, seed, i, *c) {
                    failures.push(e);
                    if failures.len() >= 5 {
                        break;
                    }
                }
            }
            if failures.is_empty() {
                println!(
                    "RESULT ok {} collectives in {} ms, {} ms of it in the collectives",
                    all.len(),
                    t0.elapsed().as_millis(),
                    IN_COLLECTIVES_NS.load(std::sync::atomic::Ordering::Relaxed) / 1_000_000
                );
            } else {
                println!("RESULT FAIL {}", failures.join(" | "));
            }
        }
        "mismatch" => {
            // A good collective first, so the mismatched one is #1.
            if let Err(e) = small_all_reduce(&comm) {
                println!("RESULT FIRST FAILED {e}");
                return;
            }
            let which = std::env::var(ENV_WHICH).unwrap_or_default();
            let other = rank == 1;
            let (count, dtype, op) = match which.as_str() {
                "count" if other => (1000, DType::BF16, RedOp::Sum),
                "dtype" if other => (1024, DType::F16, RedOp::Sum),
                "op" if other => (1024, DType::BF16, RedOp::Max),
                _ => (1024, DType::BF16, RedOp::Sum),
            };
            let send = vec![0u8; count * dtype.size()];
            let mut recv = vec![0u8; count * dtype.size()];
            let r = match which.as_str() {
                "kind" if other => {
                    let mut all = vec![0u8; send.len() * nranks];
                    comm.all_gather(&send, &mut all, dtype)
                }
                "root" => comm.broadcast(&send, &mut recv, dtype, usize::from(other)),
                _ => comm.all_reduce(&send, &mut recv, dtype, op),
            };
            report(r, t0);
            match small_all_reduce(&comm) {
                Ok(()) => println!("NEXT ok"),
                Err(e) => println!("NEXT ERROR {e}"),
            }
        }
        "invalid" => {
            let send = vec![0u8; 40];
            let mut recv = vec![0u8; if rank == 1 { 36 } else { 20 }];
            report(
                comm.reduce_scatter(&send, &mut recv, DType::F32, RedOp::Sum),
                t0,
            );
        }
        "stall" if rank == 1 => std::thread::sleep(Duration::from_secs(600)),
        "stall" => {
            comm.set_timeout(Duration::from_secs(2));
            report(small_all_reduce(&comm), t0);
        }
        "leave" if rank == 1 => {
            drop(comm);
            println!("LEFT");
            std::thread::sleep(Duration::from_secs(600));
        }
        "leave" => report(small_all_reduce(&comm), t0),
        "abort" => {
            comm.set_timeout(Duration::from_secs(30));
            match rank {
                0 => std::thread::scope(|s| {
                    s.spawn(|| {
                        std::thread::sleep(Duration::from_millis(300));
                        println!("ABORTING AT_MS {}", t0.elapsed().as_millis());
                        comm.abort("stopped by the test");
                        comm.abort("a second abort changes nothing");
                    });
                    report(small_all_reduce(&comm), t0);
                }),
                1 => report(small_all_reduce(&comm), t0),
                _ => {
                    std::thread::sleep(Duration::from_millis(1500));
                    let t1 = Instant::now();
                    report(small_all_reduce(&comm), t1);
                }
            }
        }
        "kill" => {
            comm.set_timeout(Duration::from_secs(30));
            let send = vec![0u8; 16 << 20];
            let mut recv = vec![0u8; 16 << 20];
            let mut done = 0u64;
            let r = loop {
                if let Err(e) = comm.all_reduce(&send, &mut recv, DType::BF16, RedOp::Sum) {
                    break Err(e);
                }
                done += 1;
                if done == 1 {
                    println!("LOOPING");
                }
            };
            println!("DONE {done}");
            let t1 = Instant::now();
            report(r, t1);
        }
        "bench" => {
            let n = 8 << 20; // 16 MiB of bf16
            let send: Vec<u8> = (0..n)
                .flat_map(|i| {
                    bf16::from_f32((i % 97) as f32 * 0.25)
                        .to_bits()
                        .to_le_bytes()
                })
                .collect();
            let mut recv = vec![0u8; send.len()];
            let run = |recv: &mut [u8]| comm.all_reduce(&send, recv, DType::BF16, RedOp::Sum);
            for _ in 0..3 {
                if let Err(e) = run(&mut recv) {
                    println!("RESULT ERROR {e}");
                    return;
                }
            }
            let iters = 10u32;
            let t1 = Instant::now();
            for _ in 0..iters {
                if let Err(e) = run(&mut recv) {
                    println!("RESULT ERROR {e}");
                    return;
                }
            }
            let per = t1.elapsed() / iters;
            let want = bf16::from_f32(5.0 * 0.25 * 2.0).to_bits().to_le_bytes();
            if recv[10..12] != want {
                println!("RESULT FAIL element 5: {:02x?}", &recv[10..12]);
                return;
            }
            println!("BENCH_US {}", per.as_micros());
            println!("WINDOW {}", comm.window_bytes());
            println!("RESULT ok");
        }
        other => println!("RESULT ERROR unknown case {other}"),
    }
}

// ---------------------------------------------------------------------------------------
// The tests.

/// A seed: `ZERO_GPUSIM_TEST_SEED` if set, else fresh (printed, to rerun a failure).
fn seed() -> u64 {
    let s = std::env::var(ENV_SEED)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| u64::from_le_bytes(unique_id()[16..24].try_into().unwrap_or_default()));
    println!("seed {s} (rerun with {ENV_SEED}={s})");
    s
}

fn sweep(nranks: usize) {
    let _serial = serial();
    let before = shm_entries();
    let seed = seed();
    let big = 3 * (1 << 20) + 5;
    let mut ids = Vec::new();
    for (window, lengths) in [
        (None, format!("0,1,7,1023,{big}")),
        (Some(4096), "0,1,7,1023,20011".to_string()),
    ] {
        let id = unique_id();
        ids.push(id);
        let mut extra = vec![(ENV_SEED, seed.to_string()), (ENV_LENGTHS, lengths.clone())];
        if let Some(w) = window {
            extra.push((ENV_WINDOW, w.to_string()));
        }
        let t0 = Instant::now();
        let children: Vec<Child> = (0..nranks)
            .map(|r| spawn("sweep", &id, r, nranks, &extra))
            .collect();
        let outs = finish_children(children, Instant::now() + Duration::from_secs(300));
        for (r, (text, _)) in outs.iter().enumerate() {
            let res = line(text, "RESULT").unwrap_or("(none)");
            assert!(
                res.starts_with("ok"),
                "{nranks} ranks, window {window:?}, rank {r}, seed {seed}: {res}\n{text}"
            );
            println!("{nranks} ranks, window {window:?}, lengths {lengths}: rank {r}: {res}");
        }
        println!("  {:?} in all", t0.elapsed());
    }
    assert_nothing_left(&before, &ids);
}

#[test]
fn every_collective_matches_the_reference_bit_for_bit_at_two_processes() {
    sweep(2);
}

#[test]
fn every_collective_matches_the_reference_bit_for_bit_at_three_processes() {
    sweep(3);
}

#[test]
fn mismatched_calls_fail_every_rank_naming_each_call() {
    let _serial = serial();
    let before = shm_entries();
    let mut ids = Vec::new();
    for (which, want0, want1) in [
        (
            "count",
            "rank 0 called ncclAllReduce(1024 x bf16, sum)",
            "rank 1 called ncclAllReduce(1000 x bf16, sum)",
        ),
        (
            "dtype",
            "rank 0 called ncclAllReduce(1024 x bf16, sum)",
            "rank 1 called ncclAllReduce(1024 x f16, sum)",
        ),
        (
            "op",
            "rank 0 called ncclAllReduce(1024 x bf16, sum)",
            "rank 1 called ncclAllReduce(1024 x bf16, max)",
        ),
        (
            "kind",
            "rank 0 called ncclAllReduce(1024 x bf16, sum)",
            "rank 1 called ncclAllGather(1024 x bf16 per rank)",
        ),
        (
            "root",
            "rank 0 called ncclBroadcast(1024 x bf16, root 0)",
            "rank 1 called ncclBroadcast(1024 x bf16, root 1)",
        ),
    ] {
        let id = unique_id();
        ids.push(id);
        let extra = [(ENV_WHICH, which.to_string())];
        let children: Vec<Child> = (0..2)
            .map(|r| spawn("mismatch", &id, r, 2, &extra))
            .collect();
        for (r, (text, _)) in finish_children(children, Instant::now() + Duration::from_secs(60))
            .iter()
            .enumerate()
        {
            let msg =
                line(text, "RESULT ERROR").unwrap_or_else(|| panic!("{which} rank {r}:\n{text}"));
            println!("{which}, rank {r}: {msg}");
            assert!(
                msg.contains("collective #1") && msg.contains(want0) && msg.contains(want1),
                "{which} rank {r}: {msg}"
            );
            let next =
                line(text, "NEXT ERROR").unwrap_or_else(|| panic!("{which} rank {r}:\n{text}"));
            assert!(
                next.contains(want1),
                "{which} rank {r}: the next call: {next}"
            );
        }
    }
    assert_nothing_left(&before, &ids);
}

#[test]
fn a_rank_that_never_calls_fails_the_others_at_the_timeout_naming_it() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let mut children: Vec<Child> = (0..3).map(|r| spawn("stall", &id, r, 3, &[])).collect();
    let stalled = children.remove(1);
    let outs = finish_children(children, Instant::now() + Duration::from_secs(60));
    let _ = finish_children(vec![stalled], Instant::now());
    for (r, (text, _)) in [0, 2].iter().zip(&outs) {
        let msg = line(text, "RESULT ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        println!("rank {r}: {msg}");
        assert!(
            msg.contains("rank(s) [1]") && msg.contains("timed out"),
            "rank {r}: {msg}"
        );
        let ms: u64 = line(msg, "AFTER_MS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX);
        assert!(ms < 4000, "rank {r} took {ms} ms");
    }
    assert_nothing_left(&before, &[id]);
}

#[test]
fn a_rank_that_never_joins_fails_the_join_naming_it() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let extra = [(ENV_JOIN_S, "2".to_string())];
    let children: Vec<Child> = (0..2).map(|r| spawn("plain", &id, r, 3, &extra)).collect();
    for (r, (text, _)) in finish_children(children, Instant::now() + Duration::from_secs(60))
        .iter()
        .enumerate()
    {
        let msg = line(text, "JOIN ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        println!("rank {r}: {msg}");
        // Each rank names rank 2. On a loaded machine it may name the other rank too: one
        // whose process had not joined yet, or had already timed out and left.
        let missing = msg
            .split("rank(s) [")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .unwrap_or_else(|| panic!("rank {r} names no missing rank: {msg}"));
        let missing: Vec<&str> = missing.split(", ").collect();
        assert!(
            missing.contains(&"2") && missing.iter().all(|m| ["0", "1", "2"].contains(m)),
            "rank {r}: {msg}"
        );
        let ms: u64 = line(msg, "AFTER_MS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX);
        assert!(ms < 4000, "rank {r} took {ms} ms");
    }
    assert_nothing_left(&before, &[id]);
}

#[test]
fn two_ranks_on_one_device_are_both_refused_naming_it() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let extra = [(ENV_KEY, "testhost:GPU-0b5e7c1a".to_string())];
    let children: Vec<Child> = (0..2).map(|r| spawn("plain", &id, r, 2, &extra)).collect();
    for (r, (text, _)) in finish_children(children, Instant::now() + Duration::from_secs(60))
        .iter()
        .enumerate()
    {
        let msg = line(text, "JOIN ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        println!("rank {r}: {msg}");
        assert!(
            msg.contains("ranks 0 and 1 are both on device \"testhost:GPU-0b5e7c1a\""),
            "rank {r}: {msg}"
        );
    }
    assert_nothing_left(&before, &[id]);
}

#[test]
fn ranks_given_different_nranks_are_both_refused_naming_both() {
    let _serial = serial();
    let before = shm_entries();
    let mut ids = Vec::new();
    // Either rank may create the segment: try both orders.
    for first in [0usize, 1] {
        let id = unique_id();
        ids.push(id);
        let mut children = Vec::new();
        for r in [first, 1 - first] {
            let nranks = if r == 1 { 3 } else { 2 };
            let delay = if r == first { 0 } else { 300 };
            let extra = [
                (ENV_JOIN_DELAY_MS, delay.to_string()),
                (ENV_JOIN_S, "10".to_string()),
            ];
            children.push((r, spawn("plain", &id, r, nranks, &extra)));
        }
        let (ranks, children): (Vec<usize>, Vec<Child>) = children.into_iter().unzip();
        for (r, (text, _)) in ranks.iter().zip(finish_children(
            children,
            Instant::now() + Duration::from_secs(60),
        )) {
            let msg = line(&text, "JOIN ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
            println!("rank {r} (rank {first} first): {msg}");
            assert!(
                msg.contains("nranks=2") && msg.contains("nranks=3"),
                "rank {r}: {msg}"
            );
            let ms: u64 = line(msg, "AFTER_MS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            assert!(ms < 5000, "rank {r} took {ms} ms");
        }
    }
    assert_nothing_left(&before, &ids);
}

#[test]
fn a_rank_number_taken_twice_is_refused_naming_both_pids() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let late = [(ENV_JOIN_DELAY_MS, "1000".to_string())];
    let children = vec![
        spawn("plain", &id, 0, 2, &[]),
        spawn("plain", &id, 0, 2, &[]),
        spawn("plain", &id, 1, 2, &late),
    ];
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let outs = finish_children(children, Instant::now() + Duration::from_secs(60));
    for (r, (text, _)) in outs.iter().enumerate() {
        let msg = line(text, "JOIN ERROR").unwrap_or_else(|| panic!("process {r}:\n{text}"));
        println!("process {r}: {msg}");
        assert!(
            msg.contains("rank 0 joined twice")
                && msg.contains(&pids[0].to_string())
                && msg.contains(&pids[1].to_string()),
            "process {r}: {msg}"
        );
    }
    assert_nothing_left(&before, &[id]);
}

#[test]
fn bad_arguments_on_one_rank_fail_every_rank_at_once() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let children: Vec<Child> = (0..2).map(|r| spawn("invalid", &id, r, 2, &[])).collect();
    for (r, (text, _)) in finish_children(children, Instant::now() + Duration::from_secs(60))
        .iter()
        .enumerate()
    {
        let msg = line(text, "RESULT ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        println!("rank {r}: {msg}");
        assert!(
            msg.contains(
                "rank 1 called ncclReduceScatter(9 x f32 per rank, sum) with invalid arguments"
            ) && msg.contains("send is 40 bytes but recv 36 bytes"),
            "rank {r}: {msg}"
        );
    }
    assert_nothing_left(&before, &[id]);
}

#[test]
fn abort_from_another_thread_fails_the_waiter_at_once_and_every_peer_naming_it() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let children: Vec<Child> = (0..3).map(|r| spawn("abort", &id, r, 3, &[])).collect();
    let outs = finish_children(children, Instant::now() + Duration::from_secs(60));
    for (r, (text, _)) in outs.iter().enumerate() {
        let msg = line(text, "RESULT ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        println!("rank {r}: {msg}");
        assert!(
            msg.contains("aborted by rank 0: stopped by the test"),
            "rank {r}: {msg}"
        );
        let ms: u64 = line(msg, "AFTER_MS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX);
        // Rank 0 and 1 waited from the start and the abort came at 300 ms; rank 2 called
        // after it and must fail at once.
        let limit = if r == 2 { 500 } else { 1300 };
        assert!(ms < limit, "rank {r} took {ms} ms");
    }
    assert_nothing_left(&before, &[id]);
}

#[test]
fn a_peer_killed_mid_collective_fails_the_others_naming_it() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let mut children: Vec<Child> = (0..3).map(|r| spawn("kill", &id, r, 3, &[])).collect();
    assert!(
        await_line(&mut children[1], "LOOPING"),
        "rank 1 never got going"
    );
    std::thread::sleep(Duration::from_millis(200));
    let killed = Instant::now();
    // SIGKILL; not reaped until the others are done, so it stays a zombie meanwhile.
    assert!(children[1].kill().is_ok());
    let mut victim = children.remove(1);
    let outs = finish_children(children, Instant::now() + Duration::from_secs(60));
    let _ = victim.wait();
    for (r, (text, _)) in [0, 2].iter().zip(&outs) {
        let msg = line(text, "RESULT ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        println!(
            "rank {r}: {msg} (after {})",
            line(text, "DONE").unwrap_or("?")
        );
        assert!(
            msg.contains("rank 1") && msg.contains("died"),
            "rank {r}: {msg}"
        );
    }
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "took {:?}",
        killed.elapsed()
    );
    assert_nothing_left(&before, &[id]);
}

#[test]
fn a_peer_that_leaves_fails_the_others_naming_it() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let mut children: Vec<Child> = (0..2).map(|r| spawn("leave", &id, r, 2, &[])).collect();
    let leaver = children.remove(1);
    let outs = finish_children(children, Instant::now() + Duration::from_secs(60));
    let _ = finish_children(vec![leaver], Instant::now());
    let msg = line(&outs[0].0, "RESULT ERROR").unwrap_or_else(|| panic!("{}", outs[0].0));
    println!("rank 0: {msg}");
    assert!(msg.contains("rank 1 left"), "{msg}");
    assert_nothing_left(&before, &[id]);
}

#[test]
fn a_16_mib_bf16_all_reduce_between_two_processes_takes_well_under_a_second() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let children: Vec<Child> = (0..2).map(|r| spawn("bench", &id, r, 2, &[])).collect();
    let outs = finish_children(children, Instant::now() + Duration::from_secs(120));
    for (r, (text, _)) in outs.iter().enumerate() {
        assert_eq!(line(text, "RESULT"), Some("ok"), "rank {r}:\n{text}");
    }
    let us: u64 = line(&outs[0].0, "BENCH_US")
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    println!(
        "16 MiB bf16 all-reduce, 2 processes: {:.1} ms per call (window {} bytes)",
        us as f64 / 1000.0,
        line(&outs[0].0, "WINDOW").unwrap_or("?")
    );
    assert!(us < 1_000_000, "{us} µs");
    assert_nothing_left(&before, &[id]);
}

// ---------------------------------------------------------------------------------------
// In one process: ranks as threads, and the join's abort flag.

fn member(rank: usize, nranks: usize) -> Member {
    Member {
        rank,
        nranks,
        device_key: format!("thread-host:GPU-{rank}"),
        pid: std::process::id(),
    }
}

#[test]
fn an_abort_flag_stops_a_join_and_leaves_nothing() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let flag = AbortFlag::new();
    let t0 = Instant::now();
    let r = std::thread::scope(|s| {
        let h = s.spawn(|| ShmComm::join(&id, member(0, 2), Duration::from_secs(30), &flag));
        std::thread::sleep(Duration::from_millis(200));
        flag.set();
        h.join()
    });
    let e = r.ok().and_then(|r| r.err());
    assert_eq!(e, Some(CollError::JoinAborted { rank: 0 }));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(flag.is_set());
    assert_nothing_left(&before, &[id]);
}

#[test]
fn a_segment_unlinked_before_its_header_was_written_is_not_waited_on() {
    let _serial = serial();
    let before = shm_entries();
    let id = unique_id();
    let path = shm_path(&id);
    // A "creator" that made the file and died before formatting it.
    assert!(std::fs::File::create(&path).is_ok());
    let t0 = Instant::now();
    let joined = std::thread::scope(|s| {
        let h = s.spawn(|| {
            ShmComm::join(
                &id,
                member(0, 1),
                Duration::from_secs(20),
                &AbortFlag::new(),
            )
        });
        std::thread::sleep(Duration::from_millis(200));
        let _ = std::fs::remove_file(&path);
        h.join()
    });
    assert!(matches!(joined, Ok(Ok(_))), "{:?}", joined.map(|r| r.err()));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_nothing_left(&before, &[id]);
}

#[test]
fn threads_as_ranks_reduce_and_a_lone_rank_reduces_alone() {
    let _serial = serial();
    let before = shm_entries();
    let (id, lone) = (unique_id(), unique_id());
    let flag = AbortFlag::new();
    let results: Vec<Result<Vec<u8>, CollError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (id, flag) = (&id, &flag);
                s.spawn(move || {
                    let comm = ShmComm::join(id, member(r, 2), Duration::from_secs(30), flag)?;
                    let send: Vec<u8> = [1.5f32 + r as f32, -2.0, 0.25]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect();
                    let mut recv = vec![0u8; send.len()];
                    comm.all_reduce(&send, &mut recv, DType::F32, RedOp::Avg)?;
                    Ok(recv)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err(CollError::BadUniqueId)))
            .collect()
    });
    let want: Vec<u8> = [2.0f32, -2.0, 0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    for r in &results {
        assert_eq!(r.as_ref().ok(), Some(&want), "{r:?}");
    }
    let comm = ShmComm::join(&lone, member(0, 1), Duration::from_secs(5), &flag)
        .unwrap_or_else(|e| panic!("{e}"));
    let send = bf16::from_f32(3.0).to_bits().to_le_bytes();
    let mut recv = [0u8; 2];
    assert!(comm
        .all_reduce(&send, &mut recv, DType::BF16, RedOp::Avg)
        .is_ok());
    assert_eq!(recv, send);
    assert_eq!((comm.rank(), comm.nranks()), (0, 1));
    comm.set_timeout(Duration::from_millis(1500));
    assert_eq!(comm.timeout(), Duration::from_millis(1500));
    drop(comm);
    assert_nothing_left(&before, &[id, lone]);
}

#[test]
fn references_follow_the_rule() {
    // Sum in f32 then one rounding: bf16 1 + 2^-9 + 2^-9 + 2^-9 rounds up only at the end.
    let b = |v: f32| bf16::from_f32(v).to_bits().to_le_bytes().to_vec();
    let t = 2f32.powi(-9);
    let ins = [b(1.0), b(t), b(t), b(t)];
    let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
    let mut got = [0u8; 4];
    reference_element(DType::BF16, RedOp::Sum, &refs, 4, &mut got[..2]);
    assert_eq!(got[..2], b(1.0 + 2f32.powi(-7)));
    let nan = f32::NAN.to_le_bytes();
    let one = 1f32.to_le_bytes();
    reference_element(DType::F32, RedOp::Max, &[&one, &nan], 2, &mut got);
    assert!(f32::from_le_bytes(got).is_nan());
    // The engine's core agrees with the reference on a random sample.
    let seed = 7;
    for dtype in DType::ALL {
        for op in RedOp::ALL {
            let inputs: Vec<Vec<u8>> = (0..3).map(|r| input(seed, 1, r, dtype, 257)).collect();
            let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
            let mut out = vec![0u8; inputs[0].len()];
            super::reduce::reduce_bytes(dtype, &mut out, &refs, op, 3);
            assert!(out == reference_reduce(dtype, op, &inputs), "{dtype} {op}");
        }
    }
    assert_eq!(
        unhex(&hex(&[7u8; UNIQUE_ID_BYTES])),
        Some([7u8; UNIQUE_ID_BYTES])
    );
}
