//! The NVRTC tap: zero opens the stand-in as its NVRTC (`ZERO_NVRTC_LIB`); every call goes
//! to the real NVRTC, and each cubin handed out has its program's PTX filed in the PTX
//! store under the cubin's hash, for `cuModuleLoadData` to run.

use crate::driver::errors::static_cstr;
use crate::nvrtc_real::real;
use crate::ptx_store::{self, Entry};
use std::ffi::{c_char, c_int, c_void, CStr};

/// `NVRTC_ERROR_INVALID_PROGRAM`.
const INVALID_PROGRAM: c_int = 4;
/// `NVRTC_ERROR_INTERNAL_ERROR`: the tap's own failures (no real NVRTC).
const INTERNAL: c_int = 11;

/// A program as the tap hands it out.
struct Tap {
    real: *mut c_void,
    name: String,
    arch: Option<String>,
}

fn tap<'a>(p: *mut c_void) -> Option<&'a mut Tap> {
    // SAFETY: handles are the boxes `nvrtcCreateProgram` below made (a null or foreign
    // handle is the caller's breach of NVRTC's contract; null is refused).
    (!p.is_null()).then(|| unsafe { &mut *(p as *mut Tap) })
}

#[no_mangle]
unsafe extern "C" fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> c_int {
    match real() {
        // SAFETY: forwarded with the caller's pointers.
        Ok(r) => unsafe { (r.version)(major, minor) },
        Err(e) => {
            eprintln!("{e}");
            INTERNAL
        }
    }
}

#[no_mangle]
extern "C" fn nvrtcGetErrorString(code: c_int) -> *const c_char {
    match real() {
        Ok(_) if code == INTERNAL => {
            static_cstr("NVRTC_ERROR_INTERNAL_ERROR (or zero-gpusim's tap failed: see stderr)")
        }
        // SAFETY: NVRTC returns a static string for any code.
        Ok(r) => unsafe { (r.error_string)(code) },
        Err(e) => static_cstr(&e),
    }
}

#[no_mangle]
unsafe extern "C" fn nvrtcCreateProgram(
    out: *mut *mut c_void,
    src: *const c_char,
    name: *const c_char,
    n: c_int,
    headers: *const *const c_char,
    includes: *const *const c_char,
) -> c_int {
    let Ok(r) = real() else { return INTERNAL };
    let mut prog: *mut c_void = std::ptr::null_mut();
    // SAFETY: forwarded with the caller's arguments; `prog` is a live local.
    let rc = unsafe { (r.create)(&mut prog, src, name, n, headers, includes) };
    if rc != 0 {
        return rc;
    }
    let pname = if name.is_null() {
        "default_program".to_string()
    } else {
        // SAFETY: a NUL-terminated name (NVRTC's contract).
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    let t = Box::new(Tap {
        real: prog,
        name: pname,
        arch: None,
    });
    if out.is_null() {
        return 3;
    }
    // SAFETY: the caller passes a writable nvrtcProgram.
    unsafe { *out = Box::into_raw(t) as *mut c_void };
    0
}

#[no_mangle]
unsafe extern "C" fn nvrtcCompileProgram(
    p: *mut c_void,
    n: c_int,
    opts: *const *const c_char,
) -> c_int {
    let (Ok(r), Some(t)) = (real(), tap(p)) else {
        return INVALID_PROGRAM;
    };
    let mut next_is_arch = false;
    for i in 0..n.max(0) as usize {
        // SAFETY: `n` NUL-terminated options (NVRTC's contract).
        let o = unsafe { CStr::from_ptr(*opts.add(i)) }
            .to_string_lossy()
            .into_owned();
        let value = if next_is_arch {
            Some(o.as_str())
        } else {
            o.strip_prefix("--gpu-architecture=")
                .or_else(|| o.strip_prefix("-arch="))
        };
        next_is_arch = o == "-arch" || o == "--gpu-architecture";
        if let Some(v) = value {
            t.arch = Some(v.to_string());
        }
    }
    // SAFETY: forwarded.
    unsafe { (r.compile)(t.real, n, opts) }
}

#[no_mangle]
unsafe extern "C" fn nvrtcGetProgramLogSize(p: *mut c_void, n: *mut usize) -> c_int {
    let (Ok(r), Some(t)) = (real(), tap(p)) else {
        return INVALID_PROGRAM;
    };
    // SAFETY: forwarded.
    unsafe { (r.log_size)(t.real, n) }
}

#[no_mangle]
unsafe extern "C" fn nvrtcGetProgramLog(p: *mut c_void, out: *mut c_char) -> c_int {
    let (Ok(r), Some(t)) = (real(), tap(p)) else {
        return INVALID_PROGRAM;
    };
    // SAFETY: forwarded.
    unsafe { (r.log)(t.real, out) }
}

#[no_mangle]
unsafe extern "C" fn nvrtcGetPTXSize(p: *mut c_void, n: *mut usize) -> c_int {
    let (Ok(r), Some(t)) = (real(), tap(p)) else {
        return INVALID_PROGRAM;
    };
    // SAFETY: forwarded.
    unsafe { (r.ptx_size)(t.real, n) }
}

#[no_mangle]
unsafe extern "C" fn nvrtcGetPTX(p: *mut c_void, out: *mut c_char) -> c_int {
    let (Ok(r), Some(t)) = (real(), tap(p)) else {
        return INVALID_PROGRAM;
    };
    // SAFETY: forwarded.
    unsafe { (r.ptx)(t.real, out) }
}

#[no_mangle]
unsafe extern "C" fn nvrtcGetCUBINSize(p: *mut c_void, n: *mut usize) -> c_int {
    let (Ok(r), Some(t)) = (real(), tap(p)) else {
        return INVALID_PROGRAM;
    };
    // SAFETY: forwarded.
    unsafe { (r.cubin_size)(t.real, n) }
}

/// The program's PTX from the real NVRTC.
fn ptx_of(r: &crate::nvrtc_real::Real, prog: *mut c_void) -> Option<String> {
    let mut n = 0usize;
    // SAFETY: a live program; `n` is a live local; the buffer is sized by NVRTC's answer.
    unsafe {
        if (r.ptx_size)(prog, &mut n) != 0 || n == 0 {
            return None;
        }
        let mut buf = vec![0u8; n];
        if (r.ptx)(prog, buf.as_mut_ptr().cast()) != 0 {
            return None;
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(n);
        Some(String::from_utf8_lossy(&buf[..end]).into_owned())
    }
}

#[no_mangle]
unsafe extern "C" fn nvrtcGetCUBIN(p: *mut c_void, out: *mut c_char) -> c_int {
    let (Ok(r), Some(t)) = (real(), tap(p)) else {
        return INVALID_PROGRAM;
    };
    // SAFETY: forwarded.
    let rc = unsafe { (r.cubin)(t.real, out) };
    if rc != 0 {
        return rc;
    }
    let mut n = 0usize;
    // SAFETY: a live program; `n` is a live local.
    if unsafe { (r.cubin_size)(t.real, &mut n) } != 0 {
        return rc;
    }
    // SAFETY: NVRTC just wrote `n` bytes at `out`.
    let cubin = unsafe { std::slice::from_raw_parts(out as *const u8, n) };
    match ptx_of(r, t.real) {
        Some(ptx) => {
            let arch = t.arch.clone().unwrap_or_else(|| {
                ptx.lines()
                    .find_map(|l| l.trim().strip_prefix(".target"))
                    .map(|v| v.trim().split(',').next().unwrap_or("").trim().to_string())
                    .unwrap_or_default()
            });
            ptx_store::put(
                cubin,
                Entry {
                    ptx,
                    arch,
                    nvrtc: r.v,
                    program: t.name.clone(),
                },
            );
        }
        None => eprintln!(
            "zero-gpusim's NVRTC tap: NVRTC gave no PTX for {} beside its cubin; the stand-in \
             cannot run it",
            t.name
        ),
    }
    rc
}

#[no_mangle]
unsafe extern "C" fn nvrtcDestroyProgram(p: *mut *mut c_void) -> c_int {
    if p.is_null() {
        return INVALID_PROGRAM;
    }
    // SAFETY: the caller passes the handle's address.
    let h = unsafe { *p };
    let (Ok(r), Some(_)) = (real(), tap(h)) else {
        return INVALID_PROGRAM;
    };
    // SAFETY: the handle is a box made by nvrtcCreateProgram; it is freed once here.
    let mut t = unsafe { Box::from_raw(h as *mut Tap) };
    // SAFETY: forwarded; the real program is destroyed once.
    let rc = unsafe { (r.destroy)(&mut t.real) };
    // SAFETY: the caller's handle is cleared as NVRTC does.
    unsafe { *p = std::ptr::null_mut() };
    rc
}
