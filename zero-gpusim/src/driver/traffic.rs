//! Global-memory traffic per kernel launch: bytes loaded and stored, and threads'
//! instructions, for the traffic table (bytes moved against each kernel's ideal). It says
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
    /// Bytes loaded from global memory.
    pub read: u64,
    /// Bytes stored to global memory.
    pub written: u64,
    /// Thread instructions executed.
    pub instructions: u64,
}

/// Launches kept (the oldest are dropped beyond this).
const KEEP: usize = 100_000;

fn log() -> &'static Mutex<Vec<Launch>> {
    static L: OnceLock<Mutex<Vec<Launch>>> = OnceLock::new();
    L.get_or_init(Default::default)
}

/// Records a launch.
pub fn record(kernel: &str, dims: &LaunchDims, read: u64, written: u64, instructions: u64) {
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
        instructions,
    });
}

/// Every launch recorded since the last call, and forgets them.
pub fn take() -> Vec<Launch> {
    std::mem::take(&mut *log().lock().unwrap_or_else(|p| p.into_inner()))
}
