//! The CUDA driver (`libcuda`), through `cudarc`, loaded at run time.
//!
//! `cudarc` panics when the driver is missing, so callers open it with [`library`] first:
//! a machine without a GPU driver gets a [`LoadError`] naming the library and the places
//! tried. Once our handle is open, `cudarc`'s lookup by soname finds the same library.

use crate::{load_library, LoadError, LoadedLibrary};
use std::sync::OnceLock;

static LIBRARY: OnceLock<Result<LoadedLibrary, LoadError>> = OnceLock::new();

/// Opens the CUDA driver once per process (`ZERO_CUDA_LIB` overrides the search).
pub fn library() -> Result<&'static LoadedLibrary, LoadError> {
    LIBRARY
        .get_or_init(|| {
            let names = cudarc::get_lib_name_candidates("cuda");
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            load_library("the CUDA driver (libcuda)", &names, Some("ZERO_CUDA_LIB"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The CUDA version the driver supports, as `(major, minor)` (`cuDriverGetVersion`:
/// 13000 → (13, 0)). Needs no GPU, only the driver library.
pub fn version() -> Result<(i32, i32), String> {
    library().map_err(|e| e.to_string())?;
    let mut v: std::os::raw::c_int = 0;
    // SAFETY: writes one int through the pointer, to a live local; the library was opened
    // above, so cudarc's lazy symbol lookup finds it.
    let rc = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if rc != cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS {
        return Err(format!("cuDriverGetVersion failed: {rc:?}"));
    }
    Ok((v / 1000, v % 1000 / 10))
}
