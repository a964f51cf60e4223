//! NVRTC, the CUDA run-time compiler, through `cudarc`, loaded at run time.
//!
//! `cudarc` panics when it cannot find the library, so [`compile_cubin`] first opens it
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

/// The options [`compile_cubin`] always passes besides the architecture, for cache keys:
/// IEEE division and square root, no flush-to-zero and no FMA contraction, so the kernels
/// round like the CPU ones.
pub const COMPILE_FLAGS: [&str; 4] = [
    "-ftz=false",
    "-prec-sqrt=true",
    "-prec-div=true",
    "-fmad=false",
];

/// A program compiled to a cubin.
#[derive(Debug, Clone)]
pub struct Cubin {
    /// The ELF image, loadable with `cuModuleLoadData`.
    pub image: Vec<u8>,
    /// NVRTC's log (with `--ptxas-options=-v` among the options, ptxas' resource report).
    pub log: String,
}

/// Compiles CUDA C `source` to a cubin for the real architecture `sm` (for example
/// `sm_90`) with [`COMPILE_FLAGS`] and `extra` options.
///
/// A cubin, not PTX: PTX must be JIT-compiled by the driver and is refused by a driver
/// older than the NVRTC that wrote it (NVRTC 13.2 writes PTX ISA 9.2, which a CUDA 13.0
/// driver rejects), while a cubin for the device's exact architecture loads on any driver
/// of the same major version.
pub fn compile_cubin(
    source: &str,
    name: &str,
    sm: &str,
    extra: &[&str],
) -> Result<Cubin, NvrtcError> {
    use cudarc::nvrtc::{result, sys};
    library()?;
    let compile_error = |log: String| NvrtcError::Compile {
        name: name.to_string(),
        arch: sm.to_string(),
        log,
    };
    let src = std::ffi::CString::new(source).map_err(|e| compile_error(e.to_string()))?;
    let cname = std::ffi::CString::new(name).map_err(|e| compile_error(e.to_string()))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| NvrtcError::Call {
        call: "nvrtcCreateProgram",
        message: format!("{e:?}"),
    })?;
    let mut opts: Vec<String> = vec![format!("--gpu-architecture={sm}")];
    opts.extend(COMPILE_FLAGS.iter().map(|s| s.to_string()));
    opts.extend(extra.iter().map(|s| s.to_string()));
    // SAFETY: prog was created above and is destroyed once, at the end; the log and image
    // buffers are sized by NVRTC's own size queries before being written.
    let out = unsafe {
        let compiled = result::compile_program(prog, &opts);
        let log = result::get_program_log(prog)
            .map(|l| {
                let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        match compiled {
            Err(e) => Err(compile_error(format!("{e:?}: {log}"))),
            Ok(()) => {
                let mut size = 0usize;
                let rc = sys::nvrtcGetCUBINSize(prog, &mut size);
                if rc != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                    Err(NvrtcError::Call {
                        call: "nvrtcGetCUBINSize",
                        message: format!("{rc:?}, {size} bytes"),
                    })
                } else {
                    let mut image = vec![0u8; size];
                    let rc = sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast());
                    if rc == sys::nvrtcResult::NVRTC_SUCCESS {
                        Ok(Cubin { image, log })
                    } else {
                        Err(NvrtcError::Call {
                            call: "nvrtcGetCUBIN",
                            message: format!("{rc:?}"),
                        })
                    }
                }
            }
        }
    };
    // SAFETY: prog is live and not used after this.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_nvrtc_is_an_error_naming_it() {
        // The override is tried alone, so a bogus path means "not found", never a panic.
        std::env::set_var("ZERO_NVRTC_LIB", "/nonexistent/libnvrtc.so.13");
        match super::compile_cubin("extern \"C\" __global__ void k() {}", "k.cu", "sm_80", &[]) {
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
