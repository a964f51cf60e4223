#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod driver;
mod ffi;
mod nvrtc_real;
pub mod ptx;
pub mod ptx_store;
pub mod shmcoll;

/// The environment variables that select the stand-in, for a test harness that starts
/// processes on it: zero's own three, and the stand-in's real NVRTC.
pub const SELECT_VARS: [&str; 4] = [
    "ZERO_CUDA_LIB",
    "ZERO_NCCL_LIB",
    "ZERO_NVRTC_LIB",
    "ZERO_GPUSIM_NVRTC",
];

/// The stand-in library built beside the running test or binary (`target/<profile>/
/// libzero_gpusim.so`, found from the executable's folder or its parent), if it exists.
pub fn library_path() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?.to_path_buf();
    for _ in 0..2 {
        let candidate = dir.join("libzero_gpusim.so");
        if candidate.is_file() {
            return Some(candidate);
        }
        dir = dir.parent()?.to_path_buf();
    }
    None
}
