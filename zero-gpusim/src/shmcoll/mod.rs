//! The collective engine behind the stand-in's NCCL: one rank per process, on one
//! machine, through a shared segment in `/dev/shm`.
//!
//! A communicator is named by a 128-byte [`unique_id`] that rank 0 makes and the
//! application hands to the other ranks. [`ShmComm::join`] maps the segment the id names
//! (`/dev/shm/zero-gpusim-nccl-<hex>`; the first rank to arrive creates it), checks that
//! every rank agrees on the world size, that no rank number is taken twice and that no two
//! ranks share a device, and unlinks the name once every rank has it mapped, so nothing is
//! left in `/dev/shm` even if a process is killed later.
//!
//! Every collective ([`ShmComm::all_reduce`], [`ShmComm::reduce_scatter`],
//! [`ShmComm::all_gather`], [`ShmComm::broadcast`], and their `_in_place` forms) blocks the
//! calling thread until this rank's part is done:
//!
//! - each rank first publishes what it called (sequence number, call, count, dtype, op,
//!   root); if any rank's differs, every rank fails naming what each called;
//! - payloads move through a bounded window per rank, in chunks, double-buffered so that
//!   a chunk costs one or two barriers (`comm.rs` has the algorithms);
//! - reductions follow zero's host reduction core bit for bit (`reduce.rs`): rank 0's
//!   value widened to `f32`, each next rank's combined in rank order in `f32`, `Avg`
//!   divided by the world size, rounded once;
//! - a wait spins briefly, then sleeps on a futex in the segment (`wait.rs`); it ends with
//!   an error naming the rank(s) at fault when a peer does not arrive within the timeout,
//!   dies (even by `SIGKILL`: `liveness.rs`), leaves, or when any rank aborts.
//!
//! After any error the communicator is aborted for every rank: no rank goes on with
//! corrupt data.
//!
//! Zero-length collectives are allowed: they move nothing but still take part in the
//! sequence, so the descriptor check (and its synchronisation) runs for them as for any
//! other collective.
//!
//! Settings, from the environment:
//!
//! - `ZERO_GPUSIM_NCCL_TIMEOUT_S`: the per-collective timeout (seconds, default 60; see
//!   [`ShmComm::set_timeout`]);
//! - `ZERO_GPUSIM_NCCL_WINDOW`: bytes of each rank's window half, read by the rank that
//!   creates the segment (default: 32 MiB shared by all halves, between 64 KiB and 4 MiB);
//! - `ZERO_GPUSIM_SPIN_US`: how long a waiter spins before it sleeps (default 50 µs, or
//!   0 when there are more ranks than cores).

mod comm;
mod desc;
mod error;
mod join;
mod liveness;
mod record;
mod reduce;
mod segment;
mod wait;

#[cfg(test)]
mod tests;

pub use comm::ShmComm;
pub use error::CollError;

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of a unique id (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// What every id made by [`unique_id`] starts with.
const ID_MAGIC: &[u8; 16] = b"zero-gpusim-nccl";
/// Random bytes after the magic, naming the segment.
const ID_RANDOM: usize = 16;

/// A fresh id: a magic prefix and 16 random bytes (from `/dev/urandom`, else `getrandom`,
/// else the clock, pid and a counter) naming the segment; the rest is zero.
pub fn unique_id() -> [u8; UNIQUE_ID_BYTES] {
    let mut id = [0u8; UNIQUE_ID_BYTES];
    id[..ID_MAGIC.len()].copy_from_slice(ID_MAGIC);
    let random = &mut id[ID_MAGIC.len()..ID_MAGIC.len() + ID_RANDOM];
    if !fill_random(random) {
        fallback_random(random);
    }
    id
}

/// Fills `buf` from the kernel's random source; `false` if neither source answered.
fn fill_random(buf: &mut [u8]) -> bool {
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .is_ok()
    {
        return true;
    }
    // SAFETY: `buf` is a valid, writable buffer of `buf.len()` bytes for the call.
    let got = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    usize::try_from(got).is_ok_and(|n| n == buf.len())
}

/// Bytes unique enough when the kernel gave no randomness: clock, pid and a counter,
/// mixed.
fn fallback_random(buf: &mut [u8]) {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in buf.chunks_mut(8) {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        b.copy_from_slice(&z.to_le_bytes()[..b.len()]);
    }
}

/// The segment name an id stands for, or `None` if it is not an id of [`unique_id`].
fn segment_name(id: &[u8; UNIQUE_ID_BYTES]) -> Option<String> {
    if &id[..ID_MAGIC.len()] != ID_MAGIC {
        return None;
    }
    let hex: String = id[ID_MAGIC.len()..ID_MAGIC.len() + ID_RANDOM]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(format!("zero-gpusim-nccl-{hex}"))
}

/// An element type of a collective (`ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `ncclFloat32`.
    F32,
    /// `ncclFloat16`.
    F16,
    /// `ncclBfloat16`.
    BF16,
    /// `ncclFloat64`.
    F64,
    /// `ncclInt8`.
    I8,
    /// `ncclUint8`.
    U8,
    /// `ncclInt32`.
    I32,
    /// `ncclUint32`.
    U32,
    /// `ncclInt64`.
    I64,
    /// `ncclUint64`.
    U64,
}

impl DType {
    /// Every dtype, in the order of their codes in the segment.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The short name used in messages (`f32`, `bf16`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction (`ncclRedOp_t`). On floats, `Max` and `Min` give NaN if any input is NaN;
/// `Avg` is the `f32` (`f64` for `F64`) sum divided by the world size. On integers every
/// operation wraps, and `Avg` is the wrapped sum divided by the world size, truncated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`.
    Avg,
}

impl RedOp {
    /// Every op, in the order of their codes in the segment.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// The short name used in messages (`sum`, `max`, …).
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }
}

impl std::fmt::Display for RedOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What identifies this rank's device: two ranks with the same `device_key` (host name +
/// the device's UUID) are refused, as NCCL refuses two ranks on one GPU.
#[derive(Clone, Debug)]
pub struct Member {
    /// This rank's number, `0..nranks`.
    pub rank: usize,
    /// The number of ranks of the communicator.
    pub nranks: usize,
    /// Host name and device UUID (at most [`MAX_DEVICE_KEY`] bytes).
    pub device_key: String,
    /// This rank's process id (`std::process::id()`): peers watch it to notice a death.
    pub pid: u32,
}

/// The longest `device_key` a [`Member`] may have, in bytes.
pub const MAX_DEVICE_KEY: usize = segment::MAX_KEY;

/// A flag the caller can set from another thread to stop a [`ShmComm::join`] in progress
/// (`ncclCommAbort` during init). Clones share the flag.
#[derive(Default, Clone, Debug)]
pub struct AbortFlag(Arc<AtomicBool>);

impl AbortFlag {
    /// A flag not set.
    pub fn new() -> AbortFlag {
        AbortFlag::default()
    }

    /// Sets the flag: a `join` waiting with it gives up within a few milliseconds.
    pub fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the flag is set.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The per-collective timeout unless [`ShmComm::set_timeout`] says otherwise:
/// `ZERO_GPUSIM_NCCL_TIMEOUT_S` (seconds, fractions allowed), else 60 s.
pub fn default_timeout() -> std::time::Duration {
    std::env::var("ZERO_GPUSIM_NCCL_TIMEOUT_S")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(std::time::Duration::from_secs(60), |s| {
            std::time::Duration::from_secs_f64(s.min(1e9))
        })
}

#[cfg(test)]
mod id_tests {
    use super::*;

    #[test]
    fn ids_are_fresh_and_name_a_segment() {
        let (a, b) = (unique_id(), unique_id());
        assert_ne!(a, b);
        let name = segment_name(&a).expect("an id of ours");
        assert!(name.starts_with("zero-gpusim-nccl-") && name.len() == 17 + 32);
        assert!(a[32..].iter().all(|&x| x == 0));
        let mut bad = a;
        bad[0] ^= 1;
        assert_eq!(segment_name(&bad), None);
        let mut f = [0u8; 16];
        fallback_random(&mut f);
        assert_ne!(f, [0u8; 16]);
    }

    #[test]
    fn dtypes_and_ops_have_names_and_sizes() {
        let sizes: Vec<usize> = DType::ALL.iter().map(|d| d.size()).collect();
        assert_eq!(sizes, [4, 2, 2, 8, 1, 1, 4, 4, 8, 8]);
        assert_eq!(DType::BF16.to_string(), "bf16");
        assert_eq!(RedOp::Avg.to_string(), "avg");
    }
}
