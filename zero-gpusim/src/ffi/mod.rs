//! The `extern "C"` entry points zero loads in place of the real libraries: the CUDA
//! driver (`cu*`), NCCL (`nccl*`) and an NVRTC tap (`nvrtc*`), plus `zero_gpusim_*`
//! queries for the stand-in's own tests. Each entry point converts its raw arguments and
//! calls the checked layer in [`crate::driver`]; none panics across the boundary.

mod cuda_device;
mod cuda_memory;
mod cuda_module;
mod cuda_stream;
mod cuda_stubs;
mod nccl;
mod nvrtc;
mod query;

use crate::driver::errors::{refuse, sticky, CuResult, OK};
use crate::driver::state::registry;
use cudarc::driver::sys::cudaError_enum as E;

/// An entry point's outcome: `Err` carries the code (its message already recorded).
pub(crate) type Res = Result<(), CuResult>;

/// Refuses `name` with `code` and a message starting with the call's name.
pub(crate) fn no(code: E, name: &str, message: impl std::fmt::Display) -> CuResult {
    refuse(code, format!("{name}: {message}"))
}

/// Runs an entry point's body: the driver must be initialized and free of a sticky
/// finding; a panic becomes `CUDA_ERROR_UNKNOWN` naming the call.
pub(crate) fn entry(name: &'static str, body: impl FnOnce() -> Res) -> CuResult {
    entry_with(name, true, body)
}

/// As [`entry`]; `checked` false skips the initialization and sticky checks (error
/// queries, `cuInit`).
pub(crate) fn entry_with(
    name: &'static str,
    checked: bool,
    body: impl FnOnce() -> Res,
) -> CuResult {
    if checked {
        if !registry().initialized {
            return no(
                E::CUDA_ERROR_NOT_INITIALIZED,
                name,
                "cuInit has not been called",
            );
        }
        if let Some(code) = sticky() {
            return code;
        }
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => OK,
        Ok(Err(code)) => code,
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            no(
                E::CUDA_ERROR_UNKNOWN,
                name,
                format!("zero-gpusim panicked: {what}"),
            )
        }
    }
}

/// Writes `v` through `p`, refusing a null pointer.
///
/// # Safety
/// A non-null `p` points to a writable `T` (the driver API's contract for outputs).
pub(crate) unsafe fn put<T>(name: &str, p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(no(
            E::CUDA_ERROR_INVALID_VALUE,
            name,
            "an output pointer is null",
        ));
    }
    // SAFETY: non-null, and writable by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}
