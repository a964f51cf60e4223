//! What an operation does: copies, fills, allocations and frees, kernels, host functions,
//! collectives (`exec.rs` runs them).

use super::errors::FindingKind;
pub use super::exec_ctx::DevRange;
use super::exec_ctx::ExecCtx;
use super::host::PinnedAlloc;
use super::launch::KernelWork;
use super::memory::Allocation;
use std::sync::Arc;

/// The host end of a copy to the device.
pub enum HostSrc {
    /// Pageable memory, copied when the call was made (CUDA stages it then).
    Snapshot(Vec<u8>),
    /// A pinned range, read when the copy runs; `ticket` marks it pending.
    Pinned {
        /// The allocation.
        alloc: Arc<PinnedAlloc>,
        /// Offset in it.
        off: usize,
        /// Its pending-copy ticket.
        ticket: u64,
    },
}

/// The host end of a copy to the host.
pub enum HostDst {
    /// Pageable memory: the call waits until the copy ran, so the pointer stays valid.
    Pageable(usize),
    /// A pinned range, written when the copy runs.
    Pinned {
        /// The allocation.
        alloc: Arc<PinnedAlloc>,
        /// Offset in it.
        off: usize,
        /// Its pending-copy ticket.
        ticket: u64,
    },
}

/// A function run on the stream's thread (collectives): it gets the operation to check
/// and record its device accesses.
pub type Custom = Box<dyn FnOnce(&ExecCtx<'_>) -> Result<(), (FindingKind, String)> + Send>;

/// What an operation does.
pub enum Work {
    /// Host to device.
    HtoD {
        /// Destination.
        dst: DevRange,
        /// Source.
        src: HostSrc,
    },
    /// Device to host.
    DtoH {
        /// Source.
        src: DevRange,
        /// Destination.
        dst: HostDst,
    },
    /// Device to device.
    DtoD {
        /// Source.
        src: DevRange,
        /// Destination.
        dst: DevRange,
    },
    /// Fills a range with a repeated 1-, 2- or 4-byte pattern.
    Memset {
        /// Destination.
        dst: DevRange,
        /// The pattern.
        pattern: Vec<u8>,
    },
    /// A stream-ordered allocation comes into being (`cuMemAllocAsync`).
    Birth(Arc<Allocation>),
    /// A stream-ordered free (`cuMemFreeAsync`).
    Free(Arc<Allocation>),
    /// A kernel launch.
    Kernel(Box<KernelWork>),
    /// `cuLaunchHostFunc`.
    HostFn {
        /// The function.
        f: unsafe extern "C" fn(*mut std::ffi::c_void),
        /// Its argument.
        data: usize,
    },
    /// Only ordering: an event record, or a wait for another stream.
    Marker,
    /// A collective or other custom work.
    Custom(Custom),
}
