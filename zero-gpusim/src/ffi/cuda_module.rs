//! Modules, functions and kernel launches.

use super::cuda_device::current_device;
use super::{entry, no, put};
use crate::driver::config::config;
use crate::driver::errors::CuResult;
use crate::driver::launch::{check, KernelWork, DEFAULT_SHARED, MAX_SHARED_OPTIN};
use crate::driver::module::{self, Function, LoadedModule};
use crate::driver::state::{registry, untag, FUNCTION_TAG, MODULE_TAG};
use crate::driver::work::Work;
use crate::ptx::LaunchDims;
use cudarc::driver::sys::cudaError_enum as E;
use cudarc::driver::sys::CUfunction_attribute_enum as FA;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

unsafe fn load(name: &'static str, out: *mut *mut c_void, image: *const c_void) -> CuResult {
    entry(name, || {
        let dev = current_device(name)?;
        // SAFETY: the caller passes a complete cubin or NUL-terminated PTX.
        let (ptx, origin) =
            unsafe { module::load(image.cast()) }.map_err(|(code, m)| no(code, name, m))?;
        let mut reg = registry();
        let id = reg.next_id();
        reg.modules.insert(
            id,
            Arc::new(LoadedModule {
                id,
                device: dev,
                ptx,
                origin,
            }),
        );
        drop(reg);
        // SAFETY: the caller passes a writable CUmodule.
        unsafe { put(name, out, (MODULE_TAG | id) as *mut c_void) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuModuleLoadData(out: *mut *mut c_void, image: *const c_void) -> CuResult {
    // SAFETY: the driver API's contract, passed on.
    unsafe { load("cuModuleLoadData", out, image) }
}

#[no_mangle]
unsafe extern "C" fn cuModuleLoadDataEx(
    out: *mut *mut c_void,
    image: *const c_void,
    _n: c_uint,
    _opts: *mut c_void,
    _vals: *mut *mut c_void,
) -> CuResult {
    // SAFETY: the driver API's contract, passed on (JIT options do not apply).
    unsafe { load("cuModuleLoadDataEx", out, image) }
}

#[no_mangle]
extern "C" fn cuModuleUnload(m: *mut c_void) -> CuResult {
    entry("cuModuleUnload", || {
        let mut reg = registry();
        let id = untag(m as u64, MODULE_TAG).filter(|id| reg.modules.contains_key(id));
        let Some(id) = id else {
            return Err(no(
                E::CUDA_ERROR_INVALID_HANDLE,
                "cuModuleUnload",
                format!("{m:?} is not a loaded module"),
            ));
        };
        reg.modules.remove(&id);
        reg.functions.retain(|_, f| f.module.id != id);
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuModuleGetFunction(
    out: *mut *mut c_void,
    m: *mut c_void,
    name: *const c_char,
) -> CuResult {
    entry("cuModuleGetFunction", || {
        let call = "cuModuleGetFunction";
        if name.is_null() {
            return Err(no(E::CUDA_ERROR_INVALID_VALUE, call, "the name is null"));
        }
        // SAFETY: a NUL-terminated name (the driver API's contract).
        let fname = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let mut reg = registry();
        let module = untag(m as u64, MODULE_TAG)
            .and_then(|id| reg.modules.get(&id).cloned())
            .ok_or_else(|| {
                no(
                    E::CUDA_ERROR_INVALID_HANDLE,
                    call,
                    format!("{m:?} is not a loaded module"),
                )
            })?;
        let Some(k) = module.ptx.kernel(&fname) else {
            return Err(no(
                E::CUDA_ERROR_NOT_FOUND,
                call,
                format!(
                    "no kernel `{fname}` in {} (it has: {})",
                    module.origin,
                    module.ptx.kernel_names().join(", ")
                ),
            ));
        };
        let default_dynamic = DEFAULT_SHARED.saturating_sub(k.static_shared_bytes() as u32);
        let id = reg.next_id();
        reg.functions.insert(
            id,
            Arc::new(Function {
                id,
                module,
                name: fname,
                max_dynamic_shared: AtomicU32::new(default_dynamic),
            }),
        );
        drop(reg);
        // SAFETY: the caller passes a writable CUfunction.
        unsafe { put(call, out, (FUNCTION_TAG | id) as *mut c_void) }
    })
}

fn function(name: &str, f: *mut c_void) -> Result<Arc<Function>, CuResult> {
    let reg = registry();
    untag(f as u64, FUNCTION_TAG)
        .and_then(|id| reg.functions.get(&id).cloned())
        .ok_or_else(|| {
            no(
                E::CUDA_ERROR_INVALID_HANDLE,
                name,
                format!("{f:?} is not a function of a loaded module"),
            )
        })
}

#[no_mangle]
unsafe extern "C" fn cuFuncGetAttribute(
    out: *mut c_int,
    attrib: c_int,
    f: *mut c_void,
) -> CuResult {
    entry("cuFuncGetAttribute", || {
        let call = "cuFuncGetAttribute";
        let func = function(call, f)?;
        let k = func
            .kernel()
            .ok_or_else(|| no(E::CUDA_ERROR_INVALID_HANDLE, call, "kernel vanished"))?;
        let is = |a: FA| a as c_int == attrib;
        let v = if is(FA::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) {
            k.max_threads().unwrap_or(1024).min(1024) as c_int
        } else if is(FA::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES) {
            k.static_shared_bytes() as c_int
        } else if is(FA::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES) {
            0
        } else if is(FA::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES) {
            k.local_bytes() as c_int
        } else if is(FA::CU_FUNC_ATTRIBUTE_NUM_REGS) {
            k.registers().min(255) as c_int
        } else if is(FA::CU_FUNC_ATTRIBUTE_PTX_VERSION) {
            let (a, b) = func.module.ptx.version();
            (a * 10 + b) as c_int
        } else if is(FA::CU_FUNC_ATTRIBUTE_BINARY_VERSION) {
            90
        } else if is(FA::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
            func.max_dynamic_shared.load(Ordering::Relaxed) as c_int
        } else {
            return Err(no(
                E::CUDA_ERROR_NOT_SUPPORTED,
                call,
                format!("zero-gpusim does not implement function attribute {attrib}"),
            ));
        };
        // SAFETY: the caller passes a writable int.
        unsafe { put(call, out, v) }
    })
}

#[no_mangle]
extern "C" fn cuFuncSetAttribute(f: *mut c_void, attrib: c_int, value: c_int) -> CuResult {
    entry("cuFuncSetAttribute", || {
        let call = "cuFuncSetAttribute";
        let func = function(call, f)?;
        if attrib == FA::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as c_int {
            let stat = func.kernel().map_or(0, |k| k.static_shared_bytes() as i64);
            if value < 0 || i64::from(value) + stat > i64::from(MAX_SHARED_OPTIN) {
                return Err(no(
                    E::CUDA_ERROR_INVALID_VALUE,
                    call,
                    format!("{value} bytes of dynamic shared memory (+{stat} static) exceed the GPU's {MAX_SHARED_OPTIN}"),
                ));
            }
            func.max_dynamic_shared
                .store(value as u32, Ordering::Relaxed);
        }
        Ok(())
    })
}

#[no_mangle]
extern "C" fn cuFuncSetCacheConfig(f: *mut c_void, _config: c_uint) -> CuResult {
    entry("cuFuncSetCacheConfig", || {
        function("cuFuncSetCacheConfig", f).map(|_| ())
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    entry("cuLaunchKernel", || {
        let call = "cuLaunchKernel";
        let func = function(call, f)?;
        if !extra.is_null() {
            return Err(no(E::CUDA_ERROR_NOT_SUPPORTED, call, "the `extra` parameter buffer is not implemented by zero-gpusim (pass kernelParams)"));
        }
        let dims = LaunchDims {
            grid: [gx, gy, gz],
            block: [bx, by, bz],
            dynamic_shared_bytes: shared,
        };
        check(&func, &dims).map_err(|(code, m)| no(code, call, m))?;
        let k = func
            .kernel()
            .ok_or_else(|| no(E::CUDA_ERROR_INVALID_HANDLE, call, "kernel vanished"))?;
        let mut bytes = vec![0u8; k.param_bytes()];
        if !k.params().is_empty() && params.is_null() {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                call,
                format!(
                    "{} takes {} parameters and kernelParams is null",
                    func.name,
                    k.params().len()
                ),
            ));
        }
        for (i, slot) in k.params().iter().enumerate() {
            // SAFETY: kernelParams holds one pointer per kernel parameter, each to a value
            // of that parameter's size (the driver API's contract).
            let p = unsafe { *params.add(i) } as *const u8;
            if p.is_null() {
                return Err(no(
                    E::CUDA_ERROR_INVALID_VALUE,
                    call,
                    format!("kernelParams[{i}] of {} is null", func.name),
                ));
            }
            // SAFETY: as above.
            let v = unsafe { std::slice::from_raw_parts(p, slot.size) };
            bytes[slot.offset..slot.offset + slot.size].copy_from_slice(v);
        }
        static LAUNCHES: AtomicU64 = AtomicU64::new(0);
        let seed = config().seed
            ^ LAUNCHES
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut reg = registry();
        let s = reg
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, call, m))?;
        if s.device != func.module.device {
            return Err(no(
                E::CUDA_ERROR_INVALID_HANDLE,
                call,
                format!(
                    "{} was loaded on device {} and launched on {} of device {}",
                    func.name,
                    func.module.device,
                    s.name(),
                    s.device
                ),
            ));
        }
        let what = format!(
            "kernel {} <<<{:?}, {:?}>>>",
            func.name, dims.grid, dims.block
        );
        let work = KernelWork {
            function: func,
            dims,
            params: bytes,
            seed,
        };
        reg.enqueue(&s, Work::Kernel(Box::new(work)), &what, None);
        Ok(())
    })
}
