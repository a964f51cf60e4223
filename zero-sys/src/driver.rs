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
