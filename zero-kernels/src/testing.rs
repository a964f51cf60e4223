//! Support for tests across the workspace.

/// A fresh seed for a randomized test — or the one in `ZERO_TEST_SEED`, to replay a
/// failure — printed with the test's name so every run can be reproduced.
pub fn fresh_seed(test: &str) -> u64 {
    let seed = std::env::var("ZERO_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x5eed)
        });
    println!("{test}: seed = {seed} (replay with ZERO_TEST_SEED={seed})");
    seed
}

/// The process's GPU for a GPU test, or `None` after printing a visible skip where this
/// machine has no CUDA driver. A driver that is present but fails is a test failure.
pub fn gpu_or_skip(test: &str) -> Option<&'static crate::cuda::Gpu> {
    match crate::cuda::Gpu::get() {
        Ok(g) => {
            println!("{test}: on {} ({})", g.name(), g.arch);
            Some(g)
        }
        Err(crate::cuda::GpuError::NoDriver(e)) => {
            println!("SKIPPED {test}: no GPU on this machine ({e})");
            None
        }
        Err(e) => panic!("{test}: a GPU driver is present but the GPU path failed: {e}"),
    }
}
