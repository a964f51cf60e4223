//! The simulated machine, from the environment.
//!
//! - `ZERO_GPUSIM_DEVICES`: GPUs on the host (default 8, like an HGX board); each process
//!   sees them through `CUDA_VISIBLE_DEVICES` as a real driver does.
//! - `ZERO_GPUSIM_MEMORY_MIB`: memory per GPU in MiB (a cap small enough that a test's
//!   model does not fit one device), or `ZERO_GPUSIM_MEMORY_GB` in GiB (default 80, an
//!   H100); not both.
//! - `ZERO_GPUSIM_BACKING_GB`: cap on device bytes live at once in this process, all
//!   devices together (default 8): device memory is host memory here.
//! - `ZERO_GPUSIM_SEED`: the seed of the shuffled thread order in kernels (default: from
//!   the clock; printed once).
//! - `ZERO_GPUSIM_MAX_INSTRUCTIONS`: warp instructions one launch may run before it is a
//!   finding (an endless loop; default 2e9, minutes of interpretation).
//!
//! Each is a whole number; anything else (`1.5`, `80G`, empty) makes `cuInit` fail with
//! `CUDA_ERROR_INVALID_VALUE` naming the variable, never a silent default.

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

/// `name`'s whole number, `default` where it is unset; an error naming it otherwise.
fn env_whole(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => Ok(default),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!("{name}={v:?} is not text")),
        Ok(v) => parse_whole(name, &v),
    }
}

/// `v` as the whole number `name` must be.
pub fn parse_whole(name: &str, v: &str) -> Result<u64, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{name}={v:?} is not a whole number"))
}

/// Bytes per device: `ZERO_GPUSIM_MEMORY_MIB` or `ZERO_GPUSIM_MEMORY_GB` (not both,
/// neither zero), 80 GiB where neither is set.
pub fn memory_bytes(mib: Option<&str>, gib: Option<&str>) -> Result<u64, String> {
    let (bytes, name) = match (mib, gib) {
        (Some(_), Some(_)) => {
            return Err(
                "ZERO_GPUSIM_MEMORY_MIB and ZERO_GPUSIM_MEMORY_GB are both set: set one".into(),
            )
        }
        (Some(m), None) => (
            parse_whole("ZERO_GPUSIM_MEMORY_MIB", m)?.checked_mul(1 << 20),
            "ZERO_GPUSIM_MEMORY_MIB",
        ),
        (None, Some(g)) => (
            parse_whole("ZERO_GPUSIM_MEMORY_GB", g)?.checked_mul(1 << 30),
            "ZERO_GPUSIM_MEMORY_GB",
        ),
        (None, None) => (Some(80 << 30), ""),
    };
    match bytes {
        Some(0) => Err(format!("{name} is 0: a device needs memory")),
        Some(b) => Ok(b),
        None => Err(format!("{name} is too large")),
    }
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

/// The settings, read once: an error names the variable that is not a whole number.
pub fn settings() -> &'static Result<Config, String> {
    static C: OnceLock<Result<Config, String>> = OnceLock::new();
    C.get_or_init(|| {
        let c = read();
        match &c {
            Ok(c) if std::env::var_os("ZERO_GPUSIM_QUIET").is_none() => eprintln!(
                "zero-gpusim: {} of {} simulated sm_90 GPUs visible ({} MiB each, CUDA 13.0 \
                 driver); kernel thread-order seed {} (replay with ZERO_GPUSIM_SEED={})",
                c.visible.len(),
                c.physical,
                c.memory_bytes >> 20,
                c.seed,
                c.seed
            ),
            Ok(_) => {}
            Err(e) => eprintln!("zero-gpusim: {e}"),
        }
        c
    })
}

/// The settings; only called after `cuInit` succeeded, which checked them.
pub fn config() -> &'static Config {
    match settings() {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

fn read() -> Result<Config, String> {
    let var = |name: &str| std::env::var(name).ok();
    let physical = env_whole("ZERO_GPUSIM_DEVICES", 8)? as usize;
    let visible = visible_devices(var("CUDA_VISIBLE_DEVICES").as_deref(), physical);
    let seed = match var("ZERO_GPUSIM_SEED") {
        Some(v) => parse_whole("ZERO_GPUSIM_SEED", &v)?,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7),
    };
    Ok(Config {
        visible,
        physical,
        memory_bytes: memory_bytes(
            var("ZERO_GPUSIM_MEMORY_MIB").as_deref(),
            var("ZERO_GPUSIM_MEMORY_GB").as_deref(),
        )?,
        backing_cap: env_whole("ZERO_GPUSIM_BACKING_GB", 8)?
            .checked_mul(1 << 30)
            .ok_or("ZERO_GPUSIM_BACKING_GB is too large")?,
        seed,
        max_warp_instructions: env_whole("ZERO_GPUSIM_MAX_INSTRUCTIONS", 2_000_000_000)?,
    })
}

#[cfg(test)]
mod tests {
    use super::{memory_bytes, visible_devices};

    #[test]
    fn memory_is_a_whole_number_of_mib_or_gib_never_a_silent_default() {
        assert_eq!(memory_bytes(None, None), Ok(80 << 30));
        assert_eq!(memory_bytes(Some("96"), None), Ok(96 << 20));
        assert_eq!(memory_bytes(None, Some(" 2 ")), Ok(2 << 30));
        for (mib, gib, says) in [
            (
                Some("1.5"),
                None,
                "ZERO_GPUSIM_MEMORY_MIB=\"1.5\" is not a whole number",
            ),
            (
                Some("64M"),
                None,
                "ZERO_GPUSIM_MEMORY_MIB=\"64M\" is not a whole number",
            ),
            (
                Some(""),
                None,
                "ZERO_GPUSIM_MEMORY_MIB=\"\" is not a whole number",
            ),
            (
                Some("-1"),
                None,
                "ZERO_GPUSIM_MEMORY_MIB=\"-1\" is not a whole number",
            ),
            (
                None,
                Some("0.5"),
                "ZERO_GPUSIM_MEMORY_GB=\"0.5\" is not a whole number",
            ),
            (Some("0"), None, "ZERO_GPUSIM_MEMORY_MIB is 0"),
            (Some("64"), Some("1"), "both set"),
            (
                None,
                Some("99999999999999"),
                "ZERO_GPUSIM_MEMORY_GB is too large",
            ),
        ] {
            let e = memory_bytes(mib, gib).expect_err(says);
            assert!(e.contains(says), "{mib:?} {gib:?}: {e}");
        }
    }

    #[test]
    fn visible_devices_read_like_the_driver() {
        assert_eq!(visible_devices(None, 3), [0, 1, 2]);
        assert_eq!(visible_devices(Some("2,0"), 3), [2, 0]);
        assert_eq!(visible_devices(Some("1,7,0"), 3), [1]);
        assert_eq!(visible_devices(Some(""), 3), Vec::<usize>::new());
    }
}
