//! Initialization, devices, contexts and error strings.

use super::{entry, entry_with, no, put};
use crate::driver::config::{config, settings, CC, DRIVER_VERSION};
use crate::driver::errors::{describe, name as error_name, static_cstr, CuResult};
use crate::driver::memory::memory;
use crate::driver::state::{ctx_device, ctx_handle, current, registry, set_current};
use crate::driver::stream::wait_for;
use cudarc::driver::sys::cudaError_enum as E;
use cudarc::driver::sys::CUdevice_attribute_enum as A;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::time::Duration;

pub(crate) fn device(name: &str, dev: c_int) -> Result<usize, CuResult> {
    let n = config().visible.len();
    if dev < 0 || dev as usize >= n {
        return Err(no(
            E::CUDA_ERROR_INVALID_DEVICE,
            name,
            format!("device {dev} does not exist ({n} visible: CUDA_VISIBLE_DEVICES, ZERO_GPUSIM_DEVICES)"),
        ));
    }
    Ok(dev as usize)
}

/// The current device, or `CUDA_ERROR_INVALID_CONTEXT` naming the call.
pub(crate) fn current_device(name: &str) -> Result<usize, CuResult> {
    current().ok_or_else(|| {
        no(
            E::CUDA_ERROR_INVALID_CONTEXT,
            name,
            "no context is current on this thread (cuCtxSetCurrent)",
        )
    })
}

#[no_mangle]
extern "C" fn cuInit(flags: c_uint) -> CuResult {
    entry_with("cuInit", false, || {
        if flags != 0 {
            return Err(no(E::CUDA_ERROR_INVALID_VALUE, "cuInit", "flags must be 0"));
        }
        if let Err(e) = settings() {
            return Err(no(E::CUDA_ERROR_INVALID_VALUE, "cuInit", e));
        }
        registry().initialized = true;
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CuResult {
    // SAFETY: the caller passes a writable int.
    entry_with("cuDriverGetVersion", false, || unsafe {
        put("cuDriverGetVersion", v, DRIVER_VERSION)
    })
}

#[no_mangle]
unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CuResult {
    // SAFETY: the caller passes a writable int.
    entry("cuDeviceGetCount", || unsafe {
        put("cuDeviceGetCount", n, config().visible.len() as c_int)
    })
}

#[no_mangle]
unsafe extern "C" fn cuDeviceGet(d: *mut c_int, ordinal: c_int) -> CuResult {
    entry("cuDeviceGet", || {
        let dev = device("cuDeviceGet", ordinal)?;
        // SAFETY: the caller passes a writable CUdevice.
        unsafe { put("cuDeviceGet", d, dev as c_int) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuDeviceGetName(out: *mut c_char, len: c_int, dev: c_int) -> CuResult {
    entry("cuDeviceGetName", || {
        let dev = device("cuDeviceGetName", dev)?;
        let name = format!(
            "NVIDIA H100 80GB HBM3 (zero-gpusim {})",
            config().visible[dev]
        );
        if out.is_null() || len <= 0 {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                "cuDeviceGetName",
                "no room for the name",
            ));
        }
        let n = name.len().min(len as usize - 1);
        // SAFETY: the caller passes `len` writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), out.cast(), n);
            *out.add(n) = 0;
        }
        Ok(())
    })
}

fn uuid(dev: usize) -> [u8; 16] {
    let phys = config().visible[dev] as u8;
    [
        0x5a, 0x47, 0x50, 0x55, 0x53, 0x49, 0x4d, 0, 0, 0, 0, 0, 0, 0, 0x90, phys,
    ]
}

/// The identity of a visible device across processes (for NCCL's one-rank-per-GPU rule).
pub(crate) fn device_key(dev: usize) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}/GPU-{}", host.trim(), config().visible[dev])
}

#[no_mangle]
unsafe extern "C" fn cuDeviceGetUuid(out: *mut [u8; 16], dev: c_int) -> CuResult {
    entry("cuDeviceGetUuid", || {
        let dev = device("cuDeviceGetUuid", dev)?;
        // SAFETY: the caller passes a writable CUuuid.
        unsafe { put("cuDeviceGetUuid", out, uuid(dev)) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuDeviceGetUuid_v2(out: *mut [u8; 16], dev: c_int) -> CuResult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid(out, dev) }
}

#[no_mangle]
unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CuResult {
    entry("cuDeviceTotalMem", || {
        device("cuDeviceTotalMem", dev)?;
        // SAFETY: the caller passes a writable size_t.
        unsafe { put("cuDeviceTotalMem", bytes, config().memory_bytes as usize) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: c_int,
) -> CuResult {
    entry("cuDeviceComputeCapability", || {
        device("cuDeviceComputeCapability", dev)?;
        // SAFETY: the caller passes two writable ints.
        unsafe {
            put("cuDeviceComputeCapability", major, CC.0)?;
            put("cuDeviceComputeCapability", minor, CC.1)
        }
    })
}

/// An H100 SXM's answer to each attribute zero, cudarc or a launcher may ask.
fn attribute(a: c_int, dev: usize) -> Option<c_int> {
    let phys = config().visible[dev] as c_int;
    let is = |x: A| x as c_int == a;
    let table: &[(A, c_int)] = &[
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2_147_483_647),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65_535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65_535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49_152),
        (A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65_536),
        (A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32),
        (A::CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2_147_483_647),
        (A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65_536),
        (A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1_980_000),
        (A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512),
        (A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132),
        (A::CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0),
        (A::CU_DEVICE_ATTRIBUTE_INTEGRATED, 0),
        (A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, 0),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1),
        (A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1),
        (A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0x18 + phys),
        (A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0),
        (A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0),
        (A::CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2_619_000),
        (A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120),
        (A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52_428_800),
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048),
        (A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 3),
        (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CC.0),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CC.1),
        (A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            233_472,
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
            65_536,
        ),
        (A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1),
        (A::CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1),
        (A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            232_448,
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
            1,
        ),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32),
        (A::CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1),
    ];
    table.iter().find(|(k, _)| is(*k)).map(|&(_, v)| v)
}

#[no_mangle]
unsafe extern "C" fn cuDeviceGetAttribute(out: *mut c_int, attrib: c_int, dev: c_int) -> CuResult {
    entry("cuDeviceGetAttribute", || {
        let dev = device("cuDeviceGetAttribute", dev)?;
        let Some(v) = attribute(attrib, dev) else {
            return Err(no(
                E::CUDA_ERROR_NOT_SUPPORTED,
                "cuDeviceGetAttribute",
                format!("zero-gpusim does not implement device attribute {attrib}"),
            ));
        };
        // SAFETY: the caller passes a writable int.
        unsafe { put("cuDeviceGetAttribute", out, v) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuDeviceCanAccessPeer(out: *mut c_int, dev: c_int, peer: c_int) -> CuResult {
    entry("cuDeviceCanAccessPeer", || {
        device("cuDeviceCanAccessPeer", dev)?;
        device("cuDeviceCanAccessPeer", peer)?;
        // SAFETY: the caller passes a writable int.
        unsafe { put("cuDeviceCanAccessPeer", out, 0) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuDeviceGetPCIBusId(out: *mut c_char, len: c_int, dev: c_int) -> CuResult {
    entry("cuDeviceGetPCIBusId", || {
        let dev = device("cuDeviceGetPCIBusId", dev)?;
        let id = format!("00000000:{:02X}:00.0", 0x18 + config().visible[dev]);
        if out.is_null() || len < 13 {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                "cuDeviceGetPCIBusId",
                "buffer too small",
            ));
        }
        let n = id.len().min(len as usize - 1);
        // SAFETY: the caller passes `len` writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(id.as_ptr(), out.cast(), n);
            *out.add(n) = 0;
        }
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut *mut c_void, dev: c_int) -> CuResult {
    entry("cuDevicePrimaryCtxRetain", || {
        let dev = device("cuDevicePrimaryCtxRetain", dev)?;
        let mut reg = registry();
        reg.contexts[dev].retains += 1;
        reg.legacy(dev);
        drop(reg);
        // SAFETY: the caller passes a writable CUcontext.
        unsafe {
            put(
                "cuDevicePrimaryCtxRetain",
                pctx,
                ctx_handle(dev) as *mut c_void,
            )
        }
    })
}

/// Destroys `dev`'s primary context: waits for its streams, reports allocations still
/// live (a leak: reported, not fatal) and frees them.
fn destroy_context(dev: usize) {
    device_synchronize(dev);
    let live = memory().live(dev);
    if !live.is_empty() {
        let bytes: u64 = live.iter().map(|a| a.size).sum();
        let list: Vec<String> = live.iter().take(8).map(|a| a.to_string()).collect();
        eprintln!(
            "zero-gpusim: device {dev}'s context was destroyed with {} allocations ({bytes} \
             bytes) still live (a leak, reported, not fatal): {}{}",
            live.len(),
            list.join("; "),
            if live.len() > 8 { "; …" } else { "" }
        );
        crate::driver::errors::note_leak(live.len(), bytes);
        for a in live {
            memory().release(
                &a,
                format!("the destruction of device {dev}'s primary context"),
            );
        }
    }
}

#[no_mangle]
extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CuResult {
    entry("cuDevicePrimaryCtxRelease", || {
        let dev = device("cuDevicePrimaryCtxRelease", dev)?;
        let last = {
            let mut reg = registry();
            let c = &mut reg.contexts[dev];
            if c.retains == 0 {
                return Err(no(
                    E::CUDA_ERROR_INVALID_CONTEXT,
                    "cuDevicePrimaryCtxRelease",
                    format!("device {dev}'s primary context is not retained"),
                ));
            }
            c.retains -= 1;
            c.retains == 0
        };
        if last {
            destroy_context(dev);
        }
        Ok(())
    })
}

#[no_mangle]
extern "C" fn cuDevicePrimaryCtxReset_v2(dev: c_int) -> CuResult {
    entry("cuDevicePrimaryCtxReset", || {
        let dev = device("cuDevicePrimaryCtxReset", dev)?;
        destroy_context(dev);
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: c_int,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CuResult {
    entry("cuDevicePrimaryCtxGetState", || {
        let dev = device("cuDevicePrimaryCtxGetState", dev)?;
        let on = registry().contexts[dev].retains > 0;
        // SAFETY: the caller passes writable outputs.
        unsafe {
            put("cuDevicePrimaryCtxGetState", flags, 0)?;
            put("cuDevicePrimaryCtxGetState", active, c_int::from(on))
        }
    })
}

#[no_mangle]
extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: c_int, _flags: c_uint) -> CuResult {
    entry("cuDevicePrimaryCtxSetFlags", || {
        device("cuDevicePrimaryCtxSetFlags", dev).map(|_| ())
    })
}

fn context_of(name: &str, ctx: *mut c_void) -> Result<Option<usize>, CuResult> {
    if ctx.is_null() {
        return Ok(None);
    }
    let Some(dev) = ctx_device(ctx as u64).filter(|&d| d < config().visible.len()) else {
        return Err(no(
            E::CUDA_ERROR_INVALID_CONTEXT,
            name,
            format!("{ctx:?} is not a context of this driver"),
        ));
    };
    if registry().contexts[dev].retains == 0 {
        return Err(no(
            E::CUDA_ERROR_INVALID_CONTEXT,
            name,
            format!(
                "device {dev}'s primary context was released (use after cuDevicePrimaryCtxRelease)"
            ),
        ));
    }
    Ok(Some(dev))
}

#[no_mangle]
extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CuResult {
    entry("cuCtxSetCurrent", || {
        set_current(context_of("cuCtxSetCurrent", ctx)?);
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut *mut c_void) -> CuResult {
    entry("cuCtxGetCurrent", || {
        let h = current().map_or(std::ptr::null_mut(), |d| ctx_handle(d) as *mut c_void);
        // SAFETY: the caller passes a writable CUcontext.
        unsafe { put("cuCtxGetCurrent", pctx, h) }
    })
}

thread_local! {
    static STACK: RefCell<Vec<Option<usize>>> = const { RefCell::new(Vec::new()) };
}

#[no_mangle]
extern "C" fn cuCtxPushCurrent_v2(ctx: *mut c_void) -> CuResult {
    entry("cuCtxPushCurrent", || {
        let dev = context_of("cuCtxPushCurrent", ctx)?;
        STACK.with(|s| s.borrow_mut().push(current()));
        set_current(dev);
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut *mut c_void) -> CuResult {
    entry("cuCtxPopCurrent", || {
        let was = current();
        let prev = STACK.with(|s| s.borrow_mut().pop()).flatten();
        set_current(prev);
        if !pctx.is_null() {
            let h = was.map_or(std::ptr::null_mut(), |d| ctx_handle(d) as *mut c_void);
            // SAFETY: non-null output pointer.
            unsafe { put("cuCtxPopCurrent", pctx, h)? };
        }
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuCtxGetDevice(out: *mut c_int) -> CuResult {
    entry("cuCtxGetDevice", || {
        let dev = current_device("cuCtxGetDevice")?;
        // SAFETY: the caller passes a writable CUdevice.
        unsafe { put("cuCtxGetDevice", out, dev as c_int) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuCtxGetApiVersion(_ctx: *mut c_void, v: *mut c_uint) -> CuResult {
    // SAFETY: the caller passes a writable uint.
    entry("cuCtxGetApiVersion", || unsafe {
        put("cuCtxGetApiVersion", v, 13000)
    })
}

#[no_mangle]
unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CuResult {
    // SAFETY: the caller passes a writable uint.
    entry("cuCtxGetFlags", || unsafe {
        put("cuCtxGetFlags", flags, 0)
    })
}

#[no_mangle]
unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CuResult {
    entry("cuCtxGetStreamPriorityRange", || {
        // SAFETY: the caller passes writable ints (either may be null).
        unsafe {
            if !least.is_null() {
                put("cuCtxGetStreamPriorityRange", least, 0)?;
            }
            if !greatest.is_null() {
                put("cuCtxGetStreamPriorityRange", greatest, -5)?;
            }
        }
        Ok(())
    })
}

/// Waits until every stream of `dev` has run what was queued on it, and joins their
/// clocks into the host's.
pub(crate) fn device_synchronize(dev: usize) {
    let tails: Vec<_> = {
        let reg = registry();
        reg.streams
            .values()
            .filter(|s| s.device == dev)
            .map(|s| (s.clone(), reg.tail_of(s)))
            .collect()
    };
    for (s, (tick, _)) in &tails {
        wait_for(s, *tick, Duration::from_secs(u64::MAX / 4));
    }
    let mut reg = registry();
    for (_, (_, vc)) in &tails {
        reg.host_vc.join(vc);
    }
}

#[no_mangle]
extern "C" fn cuCtxSynchronize() -> CuResult {
    entry("cuCtxSynchronize", || {
        let dev = current_device("cuCtxSynchronize")?;
        device_synchronize(dev);
        crate::driver::errors::sticky().map_or(Ok(()), Err)
    })
}

#[no_mangle]
unsafe extern "C" fn cuGetErrorName(code: c_uint, out: *mut *const c_char) -> CuResult {
    entry_with("cuGetErrorName", false, || {
        let Some(n) = error_name(code) else {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                "cuGetErrorName",
                format!("unknown code {code}"),
            ));
        };
        // SAFETY: the caller passes a writable const char*.
        unsafe { put("cuGetErrorName", out, static_cstr(n)) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuGetErrorString(code: c_uint, out: *mut *const c_char) -> CuResult {
    entry_with("cuGetErrorString", false, || {
        let text = describe(code);
        // SAFETY: the caller passes a writable const char*.
        unsafe { put("cuGetErrorString", out, static_cstr(&text)) }
    })
}
