//! NVRTC, the CUDA run-time compiler, through `cudarc`, loaded at run time.
//!
//! `cudarc` panics when it cannot find the library, so [`compile_ptx`] first opens it
//! itself — from `ZERO_NVRTC_LIB` if set, else under the names `cudarc` tries — and turns
//! a missing library into an [`NvrtcError::NotFound`] that names it and where we looked.
//! Once our handle is open, `cudarc`'s own lookup by soname finds the same library.

use crate::{load_library, LoadError, LoadedLibrary};
use std::sync::OnceLock;

/// Compiling with NVRTC failed.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// The library is not on this machine.
    #[error(transparent)]
    NotFound(#[from] LoadError),
    /// An NVRTC call other than compiling failed.
    #[error("{call} failed: {message}")]
    Call {
        /// The function.
        call: &'static str,
        /// NVRTC's result code.
        message: String,
    },
    /// The source did not compile; holds NVRTC's log.
    #[error("NVRTC could not compile `{name}` for {arch}: {log}")]
    Compile {
        /// The program's name.
        name: String,
        /// The virtual architecture asked for.
        arch: String,
        /// NVRTC's message and log.
        log: String,
    },
}

static LIBRARY: OnceLock<Result<LoadedLibrary, String>> = OnceLock::new();

/// Opens NVRTC once per process.
pub fn library() -> Result<&'static LoadedLibrary, NvrtcError> {
    let opened = LIBRARY.get_or_init(|| {
        let names = cudarc::get_lib_name_candidates("nvrtc");
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        load_library("NVRTC", &names, Some("ZERO_NVRTC_LIB")).map_err(|e| e.to_string())
    });
    match opened {
        Ok(lib) => Ok(lib),
        Err(msg) => Err(NvrtcError::NotFound(LoadError::NotFound {
            library: "NVRTC".into(),
            tried: vec![msg.clone()],
            env_override: Some("ZERO_NVRTC_LIB".into()),
        })),
    }
}

/// NVRTC's version as `(major, minor)`, part of the kernel cache key.
pub fn version() -> Result<(i32, i32), NvrtcError> {
    library()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes one int through each pointer, both to live locals; the
    // library was opened above, so cudarc's lazy symbol lookup finds it.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(NvrtcError::Call {
            call: "nvrtcVersion",
            message: format!("{rc:?}"),
        });
    }
    Ok((major, minor))
}

/// The options [`compile_ptx`] always passes, for cache keys: change this with them.
pub const COMPILE_FLAGS: &str = "-ftz=false -prec-sqrt=true -prec-div=true -fmad=false";

/// Compiles CUDA C `source` to PTX for the virtual architecture `arch` (for example
/// `compute_90`), with IEEE division and square root and no FMA contraction (so the
/// kernels round like the CPU ones), plus `extra` options.
pub fn compile_ptx(
    source: &str,
    name: &str,
    arch: &'static str,
    extra: &[&str],
) -> Result<String, NvrtcError> {
    library()?;
    let opts = cudarc::nvrtc::CompileOptions {
        ftz: Some(false),
        prec_sqrt: Some(true),
        prec_div: Some(true),
        fmad: Some(false),
        options: extra.iter().map(|s| s.to_string()).collect(),
        arch: Some(arch),
        name: Some(name.to_string()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map(|ptx| ptx.to_src())
        .map_err(|e| NvrtcError::Compile {
            name: name.to_string(),
            arch: arch.to_string(),
            log: format!("{e:?}"),
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_nvrtc_is_an_error_naming_it() {
        // The override is tried alone, so a bogus path means "not found", never a panic.
        std::env::set_var("ZERO_NVRTC_LIB", "/nonexistent/libnvrtc.so.13");
        match super::compile_ptx(
            "extern \"C\" __global__ void k() {}",
            "k.cu",
            "compute_80",
            &[],
        ) {
            Err(super::NvrtcError::NotFound(e)) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("NVRTC") && msg.contains("/nonexistent/libnvrtc.so.13"),
                    "{msg}"
                );
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
    }
}
