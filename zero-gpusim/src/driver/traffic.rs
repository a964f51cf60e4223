//! Global-memory traffic per kernel launch: bytes the threads loaded and stored, the bytes
//! the memory system moves for them (32-byte sectors per warp instruction), the distinct
//! bytes they touch, and threads' instructions, for the traffic table (bytes moved against each kernel's ideal). It says
//! nothing about speed.

use crate::ptx::LaunchDims;
use std::sync::{Mutex, OnceLock};

/// One launch's traffic.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The kernel.
    pub kernel: String,
    /// Its grid.
    pub grid: [u32; 3],
    /// Its block.
    pub block: [u32; 3],
    /// Bytes the threads loaded from global memory.
    pub read: u64,
    /// Bytes the threads stored to global memory.
    pub written: u64,
    /// Bytes moved for the loads: 32 per distinct sector of each warp instruction.
    pub read_moved: u64,
    /// Bytes moved for the stores, counted the same way.
    pub written_moved: u64,
    /// Distinct bytes loaded (each byte once, however often the threads load it).
    pub read_distinct: u64,
    /// Distinct bytes stored.
    pub written_distinct: u64,
    /// Thread instructions executed.
    pub instructions: u64,
}

/// Launches kept (the oldest are dropped beyond this).
const KEEP: usize = 100_000;

fn log() -> &'static Mutex<Vec<Launch>> {
    static L: OnceLock<Mutex<Vec<Launch>>> = OnceLock::new();
    L.get_or_init(Default::default)
}

/// Records a launch: `bytes` is [loaded, stored] by the threads, then as moved in 32-byte
/// sectors per warp instruction, then as distinct bytes.
pub fn record(kernel: &str, dims: &LaunchDims, bytes: [u64; 6], instructions: u64) {
    let [read, written, read_moved, written_moved, read_distinct, written_distinct] = bytes;
    let mut l = log().lock().unwrap_or_else(|p| p.into_inner());
    if l.len() >= KEEP {
        l.remove(0);
    }
    l.push(Launch {
        kernel: kernel.to_string(),
        grid: dims.grid,
        block: dims.block,
        read,
        written,
        read_moved,
        written_moved,
        read_distinct,
        written_distinct,
        instructions,
    });
}

/// Every launch recorded since the last call, and forgets them.
pub fn take() -> Vec<Launch> {
    std::mem::take(&mut *log().lock().unwrap_or_else(|p| p.into_inner()))
}
