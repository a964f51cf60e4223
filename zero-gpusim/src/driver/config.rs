//! The simulated machine, from the environment.
//!
//! - `ZERO_GPUSIM_DEVICES`: GPUs on the host (default 8, like an HGX board); each process
//!   sees them through `CUDA_VISIBLE_DEVICES` as a real driver does.
//! - `ZERO_GPUSIM_MEMORY_GB`: memory per GPU (default 80, an H100).
//! - `ZERO_GPUSIM_BACKING_GB`: cap on device bytes live at once in this process, all
//!   devices together (default 8): device memory is host memory here.
//! - `ZERO_GPUSIM_SEED`: the seed of the shuffled thread order in kernels (default: from
//!   the clock; printed once).
//! - `ZERO_GPUSIM_MAX_INSTRUCTIONS`: warp instructions one launch may run before it is a
//!   finding (an endless loop; default 2e9, minutes of interpretation).

use std::sync::OnceLock;

/// The stand-in's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Physical ordinals of the devices this process sees, in visible order.
    pub visible: Vec<usize>,
    /// GPUs on the host.
    pub physical: usize,
    /// Bytes per device.
    pub memory_bytes: u64,
    /// Cap on live device bytes over all devices.
    pub backing_cap: u64,
    /// Seed of the shuffled thread order.
    pub seed: u64,
    /// The most warp instructions one launch may run before it is called endless.
    pub max_warp_instructions: u64,
}

/// The CUDA version the stand-in's driver reports (13.0).
pub const DRIVER_VERSION: i32 = 13000;
/// The compute capability of every simulated device (an H100: sm_90).
pub const CC: (i32, i32) = (9, 0);
/// Its architecture name, as in a PTX `.target`.
pub const ARCH: &str = "sm_90";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// `CUDA_VISIBLE_DEVICES` as the driver reads it: a comma-separated list of ordinals;
/// the list stops at the first entry that is not a valid ordinal.
pub fn visible_devices(var: Option<&str>, physical: usize) -> Vec<usize> {
    let Some(v) = var else {
        return (0..physical).collect();
    };
    let mut out = Vec::new();
    for part in v.split(',') {
        match part.trim().parse::<usize>() {
            Ok(i) if i < physical && !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// The settings, read once.
pub fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        let physical = env_u64("ZERO_GPUSIM_DEVICES", 8) as usize;
        let visible = visible_devices(
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
            physical,
        );
        let seed = std::env::var("ZERO_GPUSIM_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(7)
            });
        let c = Config {
            visible,
            physical,
            memory_bytes: env_u64("ZERO_GPUSIM_MEMORY_GB", 80) << 30,
            backing_cap: env_u64("ZERO_GPUSIM_BACKING_GB", 8) << 30,
            seed,
            max_warp_instructions: env_u64("ZERO_GPUSIM_MAX_INSTRUCTIONS", 2_000_000_000),
        };
        if std::env::var_os("ZERO_GPUSIM_QUIET").is_none() {
            eprintln!(
                "zero-gpusim: {} of {} simulated sm_90 GPUs visible ({} GiB each, CUDA 13.0 \
                 driver); kernel thread-order seed {seed} (replay with ZERO_GPUSIM_SEED={seed})",
                c.visible.len(),
                c.physical,
                c.memory_bytes >> 30
            );
        }
        c
    })
}

#[cfg(test)]
mod tests {
    use super::visible_devices;

    #[test]
    fn visible_devices_read_like_the_driver() {
        assert_eq!(visible_devices(None, 3), [0, 1, 2]);
        assert_eq!(visible_devices(Some("2,0"), 3), [2, 0]);
        assert_eq!(visible_devices(Some("1,7,0"), 3), [1]);
        assert_eq!(visible_devices(Some(""), 3), Vec::<usize>::new());
    }
}
