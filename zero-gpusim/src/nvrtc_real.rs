//! The real NVRTC behind the tap: `ZERO_GPUSIM_NVRTC` names its `libnvrtc.so`; its
//! builtins library beside it is opened first (NVRTC looks it up by soname).

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

type Prog = *mut c_void;

/// The entry points the tap forwards.
pub struct Real {
    /// `nvrtcVersion`.
    pub version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    /// `nvrtcGetErrorString`.
    pub error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    /// `nvrtcCreateProgram`.
    pub create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    /// `nvrtcCompileProgram`.
    pub compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int,
    /// `nvrtcGetProgramLogSize`.
    pub log_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    /// `nvrtcGetProgramLog`.
    pub log: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    /// `nvrtcGetCUBINSize`.
    pub cubin_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    /// `nvrtcGetCUBIN`.
    pub cubin: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    /// `nvrtcGetPTXSize`.
    pub ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    /// `nvrtcGetPTX`.
    pub ptx: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    /// `nvrtcDestroyProgram`.
    pub destroy: unsafe extern "C" fn(*mut Prog) -> c_int,
    /// Its version.
    pub v: (i32, i32),
    _lib: libloading::Library,
    _builtins: Vec<libloading::Library>,
}

/// The variable naming the real NVRTC.
pub const VAR: &str = "ZERO_GPUSIM_NVRTC";

/// The real NVRTC, opened once; `Err` says why not.
pub fn real() -> Result<&'static Real, String> {
    static R: OnceLock<Result<Real, String>> = OnceLock::new();
    R.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> Result<Real, String> {
    let path = std::env::var(VAR).map_err(|_| {
        format!("zero-gpusim's NVRTC tap: {VAR} is not set (the path of a real libnvrtc.so, e.g. from pip install nvidia-cuda-nvrtc)")
    })?;
    let mut builtins = Vec::new();
    if let Some(dir) = std::path::Path::new(&path).parent() {
        if let Ok(rd) = std::fs::read_dir(dir) {
            let mut found: Vec<_> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .is_some_and(|n| {
                            n.starts_with("libnvrtc-builtins.so.") && !n.contains(".alt.")
                        })
                })
                .collect();
            found.sort();
            for b in found {
                // SAFETY: NVRTC's builtins library has no initialisers with preconditions.
                if let Ok(l) = unsafe { libloading::Library::new(&b) } {
                    builtins.push(l);
                }
            }
        }
    }
    // SAFETY: opening the NVRTC the user named; its initialisers have no preconditions.
    let lib = unsafe { libloading::Library::new(&path) }
        .map_err(|e| format!("zero-gpusim's NVRTC tap: {VAR}={path}: {e}"))?;
    // SAFETY: each symbol is NVRTC's entry point of that name with the declared
    // signature (nvrtc.h, CUDA 12 and 13); the pointers live as long as `lib` (kept).
    unsafe {
        macro_rules! sym {
            ($n:literal) => {
                *lib.get(concat!($n, "\0").as_bytes())
                    .map_err(|e| format!("{path} has no {}: {e}", $n))?
            };
        }
        let mut r = Real {
            version: sym!("nvrtcVersion"),
            error_string: sym!("nvrtcGetErrorString"),
            create: sym!("nvrtcCreateProgram"),
            compile: sym!("nvrtcCompileProgram"),
            log_size: sym!("nvrtcGetProgramLogSize"),
            log: sym!("nvrtcGetProgramLog"),
            cubin_size: sym!("nvrtcGetCUBINSize"),
            cubin: sym!("nvrtcGetCUBIN"),
            ptx_size: sym!("nvrtcGetPTXSize"),
            ptx: sym!("nvrtcGetPTX"),
            destroy: sym!("nvrtcDestroyProgram"),
            v: (0, 0),
            _lib: lib,
            _builtins: builtins,
        };
        let (mut a, mut b) = (0, 0);
        if (r.version)(&mut a, &mut b) != 0 {
            return Err(format!("{path}: nvrtcVersion failed"));
        }
        r.v = (a, b);
        Ok(r)
    }
}
