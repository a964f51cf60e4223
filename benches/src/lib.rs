//! Shared helpers of the benches: sizes, fast input filling, the criterion configuration
//! every bench uses, and the disk probe and memory sampling of the I/O benches.

pub mod disk;
pub mod offload;
pub mod ranks;
pub mod scaling;

use criterion::Criterion;
use std::time::Duration;

/// Element counts the issue asks for: 1M to 64M.
pub const SIZES: [usize; 4] = [1 << 20, 1 << 22, 1 << 24, 1 << 26];

/// Criterion settings sized for a 2-core machine: few samples, short warm-up.
pub fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
}

/// Fills `out` with values in [-1, 1) from a fixed xorshift stream (fast; not for tests).
pub fn fill(out: &mut [f32], seed: u64) {
    let mut s = seed | 1;
    for x in out {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *x = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
    }
}

/// Human size label: `1M`, `64M`.
pub fn label(n: usize) -> String {
    format!("{}M", n >> 20)
}
