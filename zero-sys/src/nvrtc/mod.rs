//! NVRTC, the CUDA run-time compiler, loaded at run time by our own loader and called
//! through our own declarations (the handful of entry points we use), so the library that
//! compiles is always the one chosen here — never another that `cudarc`'s search by
//! soname happens to find first.
//!
//! Which library ([`Nvrtc::get`], see [`discover`](fn@discover)): `ZERO_NVRTC_LIB` if
//! set; else the NVRTC of the driver's major version (`libnvrtc.so.13` for a 13.x driver,
//! `libnvrtc.so.12` for 12.x), then of each older major down to 12, from the pip wheels'
//! usual folders, then the loader's search path. A cubin from NVRTC 13 does not load on a
//! 12.x driver, so a newer major is never taken; an older one's cubins load on a newer
//! driver. Below sm_75, NVRTC 13 is skipped ([`Nvrtc::for_device`]). Without a driver (a
//! machine that only compiles), the newest major found. When nothing fits, the error
//! names the driver's version and every NVRTC found.

mod discover;

pub use discover::{discover, majors_to_try, wheel_roots, OLDEST_MAJOR, WHEEL_LIB_DIRS};

use crate::LoadError;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

/// Compiling with NVRTC failed.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// The library is not on this machine.
    #[error(transparent)]
    NotFound(#[from] LoadError),
    /// No NVRTC fits the driver.
    #[error("no NVRTC for the {driver} driver: tried {}; NVRTC found: {}. Install the NVRTC of the driver's major version (pip install nvidia-cuda-nvrtc for 13.x, nvidia-cuda-nvrtc-cu12 for 12.x) or set ZERO_NVRTC_LIB to its libnvrtc.so", tried.join(", "), if found.is_empty() { "none".to_string() } else { found.join(", ") })]
    NoMatch {
        /// The driver's CUDA version (`CUDA 12.4`), or that there is none.
        driver: String,
        /// Every place tried, with the loader's reason.
        tried: Vec<String>,
        /// NVRTC libraries found for other major versions, with their versions.
        found: Vec<String>,
    },
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
        /// The architecture asked for.
        arch: String,
        /// NVRTC's message and log.
        log: String,
    },
}

type Program = *mut std::ffi::c_void;

/// The entry points we call, resolved from one opened library.
#[derive(Clone, Copy)]
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Program) -> c_int,
}

/// An opened NVRTC.
pub struct Nvrtc {
    api: Api,
    version: (i32, i32),
    opened_as: String,
    // Kept open for as long as the function pointers in `api` are used.
    _lib: libloading::Library,
    // NVRTC dlopens its builtins library by soname; where NVRTC was opened by path, the
    // builtins beside it are opened first, so that lookup finds them already loaded.
    _builtins: Vec<libloading::Library>,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc")
            .field("version", &self.version)
            .field("opened_as", &self.opened_as)
            .finish()
    }
}

static PROCESS_NVRTC: OnceLock<Result<Nvrtc, String>> = OnceLock::new();

/// The options [`Nvrtc::compile_cubin`] always passes besides the architecture, for cache
/// keys: IEEE division and square root, no flush-to-zero and no FMA contraction, so the
/// kernels round like the CPU ones.
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

impl Nvrtc {
    /// The process's NVRTC, chosen as the module docs say, opened once.
    pub fn get() -> Result<&'static Nvrtc, NvrtcError> {
        Self::get_with(None)
    }

    /// The process's NVRTC, chosen (on the first call in the process) for a GPU of
    /// compute capability `cc` as well as the driver: below sm_75, NVRTC 12 even on a
    /// 13.x driver.
    pub fn for_device(cc: (i32, i32)) -> Result<&'static Nvrtc, NvrtcError> {
        Self::get_with(Some(cc))
    }

    fn get_with(cc: Option<(i32, i32)>) -> Result<&'static Nvrtc, NvrtcError> {
        let opened = PROCESS_NVRTC.get_or_init(|| {
            let driver = crate::driver::version().ok();
            let override_path = std::env::var("ZERO_NVRTC_LIB")
                .ok()
                .filter(|v| !v.is_empty());
            discover(override_path.as_deref(), driver, cc, &wheel_roots())
                .map_err(|e| e.to_string())
        });
        opened.as_ref().map_err(|msg| {
            NvrtcError::NotFound(LoadError::NotFound {
                library: "NVRTC".into(),
                tried: vec![msg.clone()],
                env_override: Some("ZERO_NVRTC_LIB".into()),
            })
        })
    }

    /// Opens the NVRTC at `path` (a file path or a soname for the loader to find), with
    /// its builtins library from the same folder where there is one.
    pub fn open(path: &str) -> Result<Nvrtc, NvrtcError> {
        let mut builtins = Vec::new();
        if let Some(dir) = std::path::Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            for b in discover::builtins_in(dir) {
                // SAFETY: NVRTC's builtins library has no initialisers with preconditions.
                if let Ok(lib) = unsafe { libloading::Library::new(&b) } {
                    builtins.push(lib);
                }
            }
        }
        let loaded = crate::load_library("NVRTC", &[path], None)?;
        let lib = loaded.handle;
        // SAFETY: each symbol is NVRTC's entry point of that name, with the signature
        // declared in `Api` (nvrtc.h of CUDA 12 and 13, unchanged since CUDA 11.1 for
        // these); the pointers are used only while `lib` stays open in the returned value.
        let api = unsafe {
            macro_rules! sym {
                ($name:literal) => {
                    *lib.get(concat!($name, "\0").as_bytes())
                        .map_err(|e| NvrtcError::Call {
                            call: $name,
                            message: format!("{path} has no {}: {e}", $name),
                        })?
                };
            }
            Api {
                version: sym!("nvrtcVersion"),
                error_string: sym!("nvrtcGetErrorString"),
                create: sym!("nvrtcCreateProgram"),
                compile: sym!("nvrtcCompileProgram"),
                log_size: sym!("nvrtcGetProgramLogSize"),
                log: sym!("nvrtcGetProgramLog"),
                cubin_size: sym!("nvrtcGetCUBINSize"),
                cubin: sym!("nvrtcGetCUBIN"),
                destroy: sym!("nvrtcDestroyProgram"),
            }
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes one int through each pointer, to live locals.
        let rc = unsafe { (api.version)(&mut major, &mut minor) };
        let mut nvrtc = Nvrtc {
            api,
            version: (0, 0),
            opened_as: loaded.opened_as,
            _lib: lib,
            _builtins: builtins,
        };
        nvrtc.check("nvrtcVersion", rc)?;
        nvrtc.version = (major, minor);
        Ok(nvrtc)
    }

    /// `(major, minor)`.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The path or name it was opened as.
    pub fn opened_as(&self) -> &str {
        &self.opened_as
    }

    fn check(&self, call: &'static str, rc: c_int) -> Result<(), NvrtcError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a pointer to a static NUL-terminated string
        // for any code.
        let message = unsafe { CStr::from_ptr((self.api.error_string)(rc)) }
            .to_string_lossy()
            .into_owned();
        Err(NvrtcError::Call { call, message })
    }

    /// Compiles CUDA C `source` to a cubin for the real architecture `sm` (for example
    /// `sm_90`) with [`COMPILE_FLAGS`] and `extra` options.
    ///
    /// A cubin, not PTX: PTX must be JIT-compiled by the driver and is refused by a driver
    /// older than the NVRTC that wrote it (NVRTC 13.2 writes PTX ISA 9.2, which a CUDA 13.0
    /// driver rejects), while a cubin for the device's exact architecture loads on any
    /// driver of the same major version.
    pub fn compile_cubin(
        &self,
        source: &str,
        name: &str,
        sm: &str,
        extra: &[&str],
    ) -> Result<Cubin, NvrtcError> {
        let compile_error = |log: String| NvrtcError::Compile {
            name: name.to_string(),
            arch: sm.to_string(),
            log,
        };
        let src = CString::new(source).map_err(|e| compile_error(e.to_string()))?;
        let cname = CString::new(name).map_err(|e| compile_error(e.to_string()))?;
        let mut opts: Vec<String> = vec![format!("--gpu-architecture={sm}")];
        opts.extend(COMPILE_FLAGS.iter().map(|s| s.to_string()));
        opts.extend(extra.iter().map(|s| s.to_string()));
        let opts: Vec<CString> = opts
            .into_iter()
            .map(CString::new)
            .collect::<Result<_, _>>()
            .map_err(|e| compile_error(e.to_string()))?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: writes one program handle to a live local; the strings are NUL-terminated
        // and outlive the call; no headers are passed.
        let rc = unsafe {
            (self.api.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        self.check("nvrtcCreateProgram", rc)?;
        // SAFETY: prog is the live program created above (destroyed once, below); the
        // option pointers point into `opts`, alive for the call; the log and image buffers
        // are sized by NVRTC's own size queries before being written.
        let out = unsafe {
            let compiled = (self.api.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
            let mut log_len = 0usize;
            let log = if (self.api.log_size)(prog, &mut log_len) == 0 && log_len > 0 {
                let mut buf = vec![0u8; log_len];
                if (self.api.log)(prog, buf.as_mut_ptr().cast()) == 0 {
                    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
                    String::from_utf8_lossy(&buf[..end]).into_owned()
                } else {
                    String::new()
                }
            } else {
                String::new()
            };
            if compiled != 0 {
                let e = self.check("nvrtcCompileProgram", compiled).err();
                Err(compile_error(format!(
                    "{}: {log}",
                    e.map(|e| e.to_string()).unwrap_or_default()
                )))
            } else {
                let mut size = 0usize;
                let rc = (self.api.cubin_size)(prog, &mut size);
                self.check("nvrtcGetCUBINSize", rc).and_then(|()| {
                    if size == 0 {
                        return Err(NvrtcError::Call {
                            call: "nvrtcGetCUBINSize",
                            message: "no cubin (was a virtual architecture asked for?)".into(),
                        });
                    }
                    let mut image = vec![0u8; size];
                    let rc = (self.api.cubin)(prog, image.as_mut_ptr().cast());
                    self.check("nvrtcGetCUBIN", rc)
                        .map(|()| Cubin { image, log })
                })
            }
        };
        // SAFETY: prog is live and not used after this.
        let _ = unsafe { (self.api.destroy)(&mut prog) };
        out
    }
}

/// The process NVRTC's version as `(major, minor)`, part of the kernel cache key.
pub fn version() -> Result<(i32, i32), NvrtcError> {
    Ok(Nvrtc::get()?.version())
}

/// [`Nvrtc::compile_cubin`] with the process's NVRTC.
pub fn compile_cubin(
    source: &str,
    name: &str,
    sm: &str,
    extra: &[&str],
) -> Result<Cubin, NvrtcError> {
    Nvrtc::get()?.compile_cubin(source, name, sm, extra)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_nvrtc_is_an_error_naming_it() {
        match super::Nvrtc::open("/nonexistent/libnvrtc.so.13") {
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
