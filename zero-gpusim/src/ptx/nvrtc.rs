//! Test support: CUDA C to PTX with NVIDIA's NVRTC, opened with `libloading` (the only
//! `unsafe` of this module, and only in tests: foreign calls cannot be made otherwise).
//!
//! The library is `ZERO_GPUSIM_NVRTC` (a path to `libnvrtc.so.*`) or else NVRTC 13.0 from
//! the workspace's `target/cuda-pip`. Its `libnvrtc-builtins.so.*` (not the `.alt.` one)
//! from the same folder is opened first, globally, so NVRTC finds it.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The options zero compiles its kernels with (see zero-sys's `COMPILE_FLAGS`).
pub(crate) const OPTIONS: [&str; 5] = [
    "--gpu-architecture=sm_90",
    "-ftz=false",
    "-prec-sqrt=true",
    "-prec-div=true",
    "-fmad=false",
];

fn pip_root() -> PathBuf {
    // ptx/ -> src/ -> zero-gpusim/ -> the workspace.
    let here = Path::new(file!());
    let ws = if here.is_absolute() {
        here.ancestors().nth(4).map(Path::to_path_buf)
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
    };
    ws.unwrap_or_else(|| PathBuf::from("/work/main"))
        .join("target/cuda-pip")
}

/// The library of an NVRTC wheel version ("12.2", "12.9", "13.0", "13.5"), if present.
pub(crate) fn wheel(version: &str) -> Option<PathBuf> {
    let root = pip_root().join(format!("nvrtc-{version}/nvidia"));
    let cands = [
        root.join("cu13/lib/libnvrtc.so.13"),
        root.join("cuda_nvrtc/lib/libnvrtc.so.12"),
    ];
    cands.into_iter().find(|p| p.exists())
}

/// The NVRTC the tests use, or why there is none.
pub(crate) fn default_lib() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("ZERO_GPUSIM_NVRTC").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        return if p.exists() {
            Ok(p)
        } else {
            Err(format!("ZERO_GPUSIM_NVRTC={} does not exist", p.display()))
        };
    }
    wheel("13.0").ok_or_else(|| {
        format!(
            "no {}/nvrtc-13.0 and no ZERO_GPUSIM_NVRTC",
            pip_root().display()
        )
    })
}

type Prog = *mut c_void;

struct Lib {
    _builtins: Vec<libloading::os::unix::Library>,
    lib: libloading::Library,
    lock: Mutex<()>,
}

fn open(path: &Path) -> Result<Arc<Lib>, String> {
    static LIBS: OnceLock<Mutex<HashMap<PathBuf, Arc<Lib>>>> = OnceLock::new();
    let mut libs = LIBS
        .get_or_init(Default::default)
        .lock()
        .map_err(|e| e.to_string())?;
    if let Some(l) = libs.get(path) {
        return Ok(l.clone());
    }
    let mut builtins = Vec::new();
    if let Some(dir) = path.parent() {
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt.")
            })
            .collect();
        names.sort();
        for b in names {
            // SAFETY: NVRTC's builtins library has no initialisers with preconditions.
            let l = unsafe {
                libloading::os::unix::Library::open(
                    Some(&b),
                    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                )
            }
            .map_err(|e| format!("{}: {e}", b.display()))?;
            builtins.push(l);
        }
    }
    // SAFETY: libnvrtc has no initialisers with preconditions.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let l = Arc::new(Lib {
        _builtins: builtins,
        lib,
        lock: Mutex::new(()),
    });
    libs.insert(path.to_path_buf(), l.clone());
    Ok(l)
}

/// Compiles `src` (program name `name`) to PTX with `opts`.
pub(crate) fn compile(path: &Path, src: &str, name: &str, opts: &[&str]) -> Result<String, String> {
    let lib = open(path)?;
    let _guard = lib.lock.lock().map_err(|e| e.to_string())?;
    type Create = unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int;
    type Compile = unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int;
    type Size = unsafe extern "C" fn(Prog, *mut usize) -> c_int;
    type Get = unsafe extern "C" fn(Prog, *mut c_char) -> c_int;
    type Destroy = unsafe extern "C" fn(*mut Prog) -> c_int;
    let csrc = CString::new(src).map_err(|e| e.to_string())?;
    let cname = CString::new(name).map_err(|e| e.to_string())?;
    let copts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(*o))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let optp: Vec<*const c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: the symbols are NVRTC's entry points with these signatures (nvrtc.h of CUDA
    // 12 and 13); `prog` is created once and destroyed once; every buffer is sized by
    // NVRTC's own size query and outlives the call that fills it; the strings are
    // NUL-terminated and outlive the calls.
    unsafe {
        let sym = |n: &[u8]| {
            lib.lib
                .get::<*const c_void>(n)
                .map(|s| *s)
                .map_err(|e| e.to_string())
        };
        let create: Create =
            std::mem::transmute::<*const c_void, Create>(sym(b"nvrtcCreateProgram\0")?);
        let compile: Compile =
            std::mem::transmute::<*const c_void, Compile>(sym(b"nvrtcCompileProgram\0")?);
        let log_size: Size =
            std::mem::transmute::<*const c_void, Size>(sym(b"nvrtcGetProgramLogSize\0")?);
        let log: Get = std::mem::transmute::<*const c_void, Get>(sym(b"nvrtcGetProgramLog\0")?);
        let ptx_size: Size = std::mem::transmute::<*const c_void, Size>(sym(b"nvrtcGetPTXSize\0")?);
        let ptx: Get = std::mem::transmute::<*const c_void, Get>(sym(b"nvrtcGetPTX\0")?);
        let destroy: Destroy =
            std::mem::transmute::<*const c_void, Destroy>(sym(b"nvrtcDestroyProgram\0")?);
        let mut prog: Prog = std::ptr::null_mut();
        let rc = create(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if rc != 0 {
            return Err(format!("nvrtcCreateProgram: {rc}"));
        }
        let text = |size: Size, get: Get| -> String {
            let mut n = 0usize;
            if size(prog, &mut n) != 0 || n == 0 {
                return String::new();
            }
            let mut buf = vec![0u8; n];
            if get(prog, buf.as_mut_ptr().cast()) != 0 {
                return String::new();
            }
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..end]).into_owned()
        };
        let rc = compile(prog, optp.len() as c_int, optp.as_ptr());
        let out = if rc != 0 {
            Err(format!(
                "{name}: nvrtcCompileProgram failed ({rc}): {}",
                text(log_size, log)
            ))
        } else {
            Ok(text(ptx_size, ptx))
        };
        destroy(&mut prog);
        out
    }
}

/// The default NVRTC, or `None` after printing `SKIPPED <test>: no NVRTC (...)`; where
/// `ZERO_REQUIRE_GPU=1` (the stand-in pass of CI) a missing NVRTC fails the test instead.
fn skip_without_nvrtc(test: &str) -> Option<PathBuf> {
    match default_lib() {
        Ok(l) => Some(l),
        Err(why) => {
            assert!(
                std::env::var("ZERO_REQUIRE_GPU").map_or(true, |v| v != "1"),
                "{test}: ZERO_REQUIRE_GPU=1 and there is no NVRTC ({why})"
            );
            println!("SKIPPED {test}: no NVRTC ({why})");
            None
        }
    }
}

/// PTX of a zero kernel file (`adam.cu`, ...) from the default NVRTC, compiled once per
/// process; `None` (after printing a SKIPPED line for `test`) where there is no NVRTC.
pub(crate) fn zero_ptx(test: &str, file: &str) -> Option<String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Result<String, String>>>> = OnceLock::new();
    let lib = skip_without_nvrtc(test)?;
    let mut cache = CACHE.get_or_init(Default::default).lock().ok()?;
    let r = cache.entry(file.to_string()).or_insert_with(|| {
        let src = zero_kernels::cuda::SOURCES
            .iter()
            .find(|s| s.name == file)
            .ok_or_else(|| format!("no kernel file {file}"))?;
        compile(&lib, &src.program(), file, &OPTIONS)
    });
    match r {
        Ok(p) => Some(p.clone()),
        Err(e) => panic!("{test}: NVRTC failed on {file}: {e}"),
    }
}

/// PTX of `src` (a whole program) from the default NVRTC; `None` after a SKIPPED line.
pub(crate) fn program_ptx(test: &str, src: &str) -> Option<String> {
    let lib = skip_without_nvrtc(test)?;
    match compile(&lib, src, "test.cu", &OPTIONS) {
        Ok(p) => Some(p),
        Err(e) => panic!("{test}: NVRTC failed: {e}"),
    }
}
