//! Device and pinned memory, copies and fills.

use super::cuda_device::{current_device, device_synchronize};
use super::{entry, no, put, Res};
use crate::driver::config::config;
use crate::driver::errors::{finding, CuResult, FindingKind};
use crate::driver::host::{self, Use};
use crate::driver::memory::{memory, AllocError, Place};
use crate::driver::state::{ctx_handle, registry};
use crate::driver::stream::{wait_for, Stream};
use crate::driver::work::{DevRange, HostDst, HostSrc, Work};
use cudarc::driver::sys::cudaError_enum as E;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

fn allocate(
    name: &str,
    dev: usize,
    size: usize,
    origin: String,
) -> Result<Arc<crate::driver::memory::Allocation>, CuResult> {
    let c = config();
    memory()
        .allocate(dev, size as u64, c.memory_bytes, c.backing_cap, origin)
        .map_err(|e| match e {
            AllocError::DeviceFull { asked, free } => no(
                E::CUDA_ERROR_OUT_OF_MEMORY,
                name,
                format!("{asked} bytes asked, {free} free on device {dev}"),
            ),
            AllocError::BackingFull { asked, cap } => no(
                E::CUDA_ERROR_OUT_OF_MEMORY,
                name,
                format!(
                    "{asked} bytes would take the host memory backing simulated device memory \
                     past its cap of {cap} bytes (ZERO_GPUSIM_BACKING_GB)"
                ),
            ),
        })
}

#[no_mangle]
unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> CuResult {
    entry("cuMemAlloc", || {
        let dev = current_device("cuMemAlloc")?;
        if size == 0 {
            return Err(no(E::CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", "0 bytes"));
        }
        let a = allocate("cuMemAlloc", dev, size, "cuMemAlloc".into())?;
        // SAFETY: the caller passes a writable CUdeviceptr.
        unsafe { put("cuMemAlloc", dptr, a.base) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: *mut c_void) -> CuResult {
    entry("cuMemAllocAsync", || {
        let mut reg = registry();
        let s = reg
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuMemAllocAsync", m))?;
        if size == 0 {
            drop(reg);
            // SAFETY: the caller passes a writable CUdeviceptr.
            return unsafe { put("cuMemAllocAsync", dptr, 0) };
        }
        let a = allocate(
            "cuMemAllocAsync",
            s.device,
            size,
            format!("cuMemAllocAsync on {}", s.name()),
        )?;
        let label = format!("cuMemAllocAsync of allocation #{}", a.id);
        reg.enqueue(&s, Work::Birth(a.clone()), &label, None);
        drop(reg);
        // SAFETY: the caller passes a writable CUdeviceptr.
        unsafe { put("cuMemAllocAsync", dptr, a.base) }
    })
}

/// The live allocation that starts at `dptr`, for a free.
fn freeable(name: &str, dptr: u64) -> Result<Arc<crate::driver::memory::Allocation>, CuResult> {
    match memory().place(dptr) {
        Place::Inside(a, 0) => {
            if a.free_queued.swap(true, Ordering::SeqCst) {
                let by = a.freed().unwrap_or_else(|| "a free still queued".into());
                return Err(finding(
                    FindingKind::Memory,
                    format!("{name}: double free of {a} (already freed by {by})"),
                ));
            }
            Ok(a)
        }
        Place::Inside(a, off) => Err(finding(
            FindingKind::Memory,
            format!("{name}({dptr:#x}): not the start of an allocation: offset {off} of {a}"),
        )),
        Place::Outside(text) => Err(finding(FindingKind::Memory, format!("{name}: {text}"))),
    }
}

#[no_mangle]
extern "C" fn cuMemFree_v2(dptr: u64) -> CuResult {
    entry("cuMemFree", || {
        if dptr == 0 {
            return Ok(());
        }
        let a = freeable("cuMemFree", dptr)?;
        // cuMemFree waits for the device's work before it frees.
        device_synchronize(a.device);
        memory().release(&a, "cuMemFree".into());
        Ok(())
    })
}

#[no_mangle]
extern "C" fn cuMemFreeAsync(dptr: u64, stream: *mut c_void) -> CuResult {
    entry("cuMemFreeAsync", || {
        if dptr == 0 {
            return Ok(());
        }
        let mut reg = registry();
        let s = reg
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuMemFreeAsync", m))?;
        let a = freeable("cuMemFreeAsync", dptr)?;
        let label = format!("cuMemFreeAsync of allocation #{}", a.id);
        reg.enqueue(&s, Work::Free(a), &label, None);
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    entry("cuMemGetInfo", || {
        let dev = current_device("cuMemGetInfo")?;
        let t = config().memory_bytes;
        let used = memory().used(dev);
        // SAFETY: the caller passes writable size_t's.
        unsafe {
            put("cuMemGetInfo", free, t.saturating_sub(used) as usize)?;
            put("cuMemGetInfo", total, t as usize)
        }
    })
}

#[no_mangle]
unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> CuResult {
    entry("cuMemHostAlloc", || {
        current_device("cuMemHostAlloc")?;
        if flags & !0x7 != 0 {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                "cuMemHostAlloc",
                format!("unknown flags {flags:#x}"),
            ));
        }
        let a = host::allocate(size, flags)
            .map_err(|m| no(E::CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc", m))?;
        // SAFETY: the caller passes a writable void*.
        unsafe { put("cuMemHostAlloc", pp, a.user as *mut c_void) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CuResult {
    // SAFETY: same contract.
    unsafe { cuMemHostAlloc(pp, size, 0) }
}

#[no_mangle]
extern "C" fn cuMemFreeHost(p: *mut c_void) -> CuResult {
    entry("cuMemFreeHost", || {
        let ptr = p as usize;
        // Copies still pending on it finish first (as the driver's implicit
        // synchronization would make them).
        if let Some(a) = host::at_base(ptr) {
            let deadline = std::time::Instant::now() + Duration::from_secs(300);
            while !a.pending_copies().is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        host::free(ptr).map_err(|m| finding(FindingKind::Memory, format!("cuMemFreeHost: {m}")))
    })
}

/// A device range for a copy, checked at the call (in bounds of one live allocation).
fn dev_range(
    name: &str,
    s: &Stream,
    addr: u64,
    len: usize,
    side: &str,
) -> Result<DevRange, CuResult> {
    let what = format!("{name} on {} ({side}, {len} bytes)", s.name());
    let (alloc, off) = memory()
        .range(addr, len as u64, &what)
        .map_err(|m| finding(FindingKind::Memory, m))?;
    if alloc.device != s.device {
        return Err(no(
            E::CUDA_ERROR_INVALID_VALUE,
            name,
            format!(
                "{alloc} is on device {}, the stream on device {}",
                alloc.device, s.device
            ),
        ));
    }
    Ok(DevRange {
        alloc,
        off,
        len: len as u64,
    })
}

fn host_range(
    name: &str,
    s: &Stream,
    ptr: usize,
    len: usize,
) -> Result<Option<(Arc<host::PinnedAlloc>, usize)>, CuResult> {
    if ptr == 0 && len > 0 {
        return Err(no(
            E::CUDA_ERROR_INVALID_VALUE,
            name,
            "the host pointer is null",
        ));
    }
    host::classify(ptr, len)
        .map_err(|m| finding(FindingKind::Memory, format!("{name} on {}: {m}", s.name())))
}

fn stream_of(name: &str, stream: *mut c_void) -> Result<Arc<Stream>, CuResult> {
    registry()
        .stream(stream as u64)
        .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, name, m))
}

/// Waits until `s` ran `tick`, then joins its clock into the host's.
fn host_waits(s: &Arc<Stream>, tick: u64) {
    wait_for(s, tick, Duration::from_secs(u64::MAX / 4));
    let mut reg = registry();
    let vc = reg.tail_of(s).1;
    reg.host_vc.join(&vc);
}

fn htod(name: &str, s: &Arc<Stream>, dst: u64, src: *const c_void, len: usize, sync: bool) -> Res {
    if len == 0 {
        return Ok(());
    }
    let d = dev_range(name, s, dst, len, "destination")?;
    let srcp = src as usize;
    let src = match host_range(name, s, srcp, len)? {
        Some((a, off)) => {
            let ticket = a.begin(
                off..off + len,
                Use::DeviceReads,
                format!("{name} on {}", s.name()),
            );
            HostSrc::Pinned {
                alloc: a,
                off,
                ticket,
            }
        }
        // SAFETY: pageable host memory of `len` bytes, readable now (the driver API's
        // contract); the driver stages it at the call, so a snapshot is taken here.
        None => HostSrc::Snapshot(
            unsafe { std::slice::from_raw_parts(srcp as *const u8, len) }.to_vec(),
        ),
    };
    let tick = registry().enqueue(s, Work::HtoD { dst: d, src }, name, None);
    if sync {
        host_waits(s, tick);
    }
    Ok(())
}

fn dtoh(name: &str, s: &Arc<Stream>, dst: *mut c_void, src: u64, len: usize, sync: bool) -> Res {
    if len == 0 {
        return Ok(());
    }
    let r = dev_range(name, s, src, len, "source")?;
    let dstp = dst as usize;
    let (d, wait) = match host_range(name, s, dstp, len)? {
        Some((a, off)) => {
            let ticket = a.begin(
                off..off + len,
                Use::DeviceWrites,
                format!("{name} on {}", s.name()),
            );
            (
                HostDst::Pinned {
                    alloc: a,
                    off,
                    ticket,
                },
                sync,
            )
        }
        // Pageable: the call returns once the copy ran.
        None => (HostDst::Pageable(dstp), true),
    };
    let tick = registry().enqueue(s, Work::DtoH { src: r, dst: d }, name, None);
    if wait {
        host_waits(s, tick);
    }
    Ok(())
}

fn dtod(name: &str, s: &Arc<Stream>, dst: u64, src: u64, len: usize, sync: bool) -> Res {
    if len == 0 {
        return Ok(());
    }
    let from = dev_range(name, s, src, len, "source")?;
    let to = dev_range(name, s, dst, len, "destination")?;
    let tick = registry().enqueue(s, Work::DtoD { src: from, dst: to }, name, None);
    if sync {
        host_waits(s, tick);
    }
    Ok(())
}

fn legacy(name: &str) -> Result<Arc<Stream>, CuResult> {
    let dev = current_device(name)?;
    Ok(registry().legacy(dev))
}

#[no_mangle]
extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: *mut c_void,
) -> CuResult {
    entry("cuMemcpyHtoDAsync", || {
        htod(
            "cuMemcpyHtoDAsync",
            &stream_of("cuMemcpyHtoDAsync", stream)?,
            dst,
            src,
            n,
            false,
        )
    })
}

#[no_mangle]
extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> CuResult {
    entry("cuMemcpyDtoHAsync", || {
        dtoh(
            "cuMemcpyDtoHAsync",
            &stream_of("cuMemcpyDtoHAsync", stream)?,
            dst,
            src,
            n,
            false,
        )
    })
}

#[no_mangle]
extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, stream: *mut c_void) -> CuResult {
    entry("cuMemcpyDtoDAsync", || {
        dtod(
            "cuMemcpyDtoDAsync",
            &stream_of("cuMemcpyDtoDAsync", stream)?,
            dst,
            src,
            n,
            false,
        )
    })
}

#[no_mangle]
extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> CuResult {
    entry("cuMemcpyHtoD", || {
        htod("cuMemcpyHtoD", &legacy("cuMemcpyHtoD")?, dst, src, n, true)
    })
}

#[no_mangle]
extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> CuResult {
    entry("cuMemcpyDtoH", || {
        dtoh("cuMemcpyDtoH", &legacy("cuMemcpyDtoH")?, dst, src, n, true)
    })
}

#[no_mangle]
extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) -> CuResult {
    entry("cuMemcpyDtoD", || {
        dtod("cuMemcpyDtoD", &legacy("cuMemcpyDtoD")?, dst, src, n, true)
    })
}

fn is_device(p: u64) -> bool {
    matches!(memory().place(p), Place::Inside(..))
}

fn any_copy(name: &str, s: &Arc<Stream>, dst: u64, src: u64, n: usize, sync: bool) -> Res {
    match (is_device(dst), is_device(src)) {
        (true, true) => dtod(name, s, dst, src, n, sync),
        (true, false) => htod(name, s, dst, src as *const c_void, n, sync),
        (false, true) => dtoh(name, s, dst as *mut c_void, src, n, sync),
        (false, false) => Err(no(
            E::CUDA_ERROR_NOT_SUPPORTED,
            name,
            "host-to-host copies are not implemented by zero-gpusim",
        )),
    }
}

#[no_mangle]
extern "C" fn cuMemcpyAsync(dst: u64, src: u64, n: usize, stream: *mut c_void) -> CuResult {
    entry("cuMemcpyAsync", || {
        any_copy(
            "cuMemcpyAsync",
            &stream_of("cuMemcpyAsync", stream)?,
            dst,
            src,
            n,
            false,
        )
    })
}

#[no_mangle]
extern "C" fn cuMemcpy(dst: u64, src: u64, n: usize) -> CuResult {
    entry("cuMemcpy", || {
        any_copy("cuMemcpy", &legacy("cuMemcpy")?, dst, src, n, true)
    })
}

fn memset(
    name: &str,
    s: &Arc<Stream>,
    dst: u64,
    pattern: Vec<u8>,
    count: usize,
    sync: bool,
) -> Res {
    let len = count * pattern.len();
    if len == 0 {
        return Ok(());
    }
    if dst % pattern.len() as u64 != 0 {
        return Err(no(
            E::CUDA_ERROR_INVALID_VALUE,
            name,
            format!("{dst:#x} is not aligned to {} bytes", pattern.len()),
        ));
    }
    let d = dev_range(name, s, dst, len, "destination")?;
    let tick = registry().enqueue(s, Work::Memset { dst: d, pattern }, name, None);
    if sync {
        host_waits(s, tick);
    }
    Ok(())
}

#[no_mangle]
extern "C" fn cuMemsetD8Async(dst: u64, v: u8, n: usize, stream: *mut c_void) -> CuResult {
    entry("cuMemsetD8Async", || {
        memset(
            "cuMemsetD8Async",
            &stream_of("cuMemsetD8Async", stream)?,
            dst,
            vec![v],
            n,
            false,
        )
    })
}

#[no_mangle]
extern "C" fn cuMemsetD16Async(dst: u64, v: u16, n: usize, stream: *mut c_void) -> CuResult {
    entry("cuMemsetD16Async", || {
        memset(
            "cuMemsetD16Async",
            &stream_of("cuMemsetD16Async", stream)?,
            dst,
            v.to_le_bytes().to_vec(),
            n,
            false,
        )
    })
}

#[no_mangle]
extern "C" fn cuMemsetD32Async(dst: u64, v: u32, n: usize, stream: *mut c_void) -> CuResult {
    entry("cuMemsetD32Async", || {
        memset(
            "cuMemsetD32Async",
            &stream_of("cuMemsetD32Async", stream)?,
            dst,
            v.to_le_bytes().to_vec(),
            n,
            false,
        )
    })
}

#[no_mangle]
extern "C" fn cuMemsetD8_v2(dst: u64, v: u8, n: usize) -> CuResult {
    entry("cuMemsetD8", || {
        memset("cuMemsetD8", &legacy("cuMemsetD8")?, dst, vec![v], n, true)
    })
}

#[no_mangle]
extern "C" fn cuMemsetD16_v2(dst: u64, v: u16, n: usize) -> CuResult {
    entry("cuMemsetD16", || {
        memset(
            "cuMemsetD16",
            &legacy("cuMemsetD16")?,
            dst,
            v.to_le_bytes().to_vec(),
            n,
            true,
        )
    })
}

#[no_mangle]
extern "C" fn cuMemsetD32_v2(dst: u64, v: u32, n: usize) -> CuResult {
    entry("cuMemsetD32", || {
        memset(
            "cuMemsetD32",
            &legacy("cuMemsetD32")?,
            dst,
            v.to_le_bytes().to_vec(),
            n,
            true,
        )
    })
}

#[no_mangle]
unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut u64,
    size: *mut usize,
    dptr: u64,
) -> CuResult {
    entry("cuMemGetAddressRange", || match memory().place(dptr) {
        Place::Inside(a, _) if a.freed().is_none() => {
            // SAFETY: the caller passes writable outputs (either may be null).
            unsafe {
                if !base.is_null() {
                    put("cuMemGetAddressRange", base, a.base)?;
                }
                if !size.is_null() {
                    put("cuMemGetAddressRange", size, a.size as usize)?;
                }
            }
            Ok(())
        }
        Place::Inside(a, _) => Err(no(
            E::CUDA_ERROR_INVALID_VALUE,
            "cuMemGetAddressRange",
            format!("{a} was freed"),
        )),
        Place::Outside(t) => Err(no(E::CUDA_ERROR_NOT_FOUND, "cuMemGetAddressRange", t)),
    })
}

#[no_mangle]
unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_uint,
    ptr: u64,
) -> CuResult {
    entry("cuPointerGetAttribute", || {
        let name = "cuPointerGetAttribute";
        let dev = match memory().place(ptr) {
            Place::Inside(a, _) => Some(a.device),
            Place::Outside(_) => None,
        };
        let pinned = host::classify(ptr as usize, 1).ok().flatten().is_some();
        if dev.is_none() && !pinned {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                name,
                format!("{ptr:#x} is not memory this driver allocated"),
            ));
        }
        // SAFETY: the caller passes storage of the attribute's type.
        unsafe {
            match attribute {
                1 => put(
                    name,
                    data as *mut *mut c_void,
                    dev.map_or(std::ptr::null_mut(), |d| ctx_handle(d) as *mut c_void),
                ),
                2 => put(name, data as *mut c_uint, if dev.is_some() { 2 } else { 1 }),
                3 | 4 => put(name, data as *mut u64, ptr),
                8 => put(name, data as *mut c_uint, 0),
                9 => put(name, data as *mut i32, dev.unwrap_or(0) as i32),
                _ => Err(no(
                    E::CUDA_ERROR_NOT_SUPPORTED,
                    name,
                    format!("zero-gpusim does not implement pointer attribute {attribute}"),
                )),
            }
        }
    })
}

/// Device `d`'s default memory pool is the handle `POOL_BASE + d`: the stand-in has one
/// pool per device, the one `cuMemAllocAsync` draws from, and answers two of its
/// attributes.
const POOL_BASE: u64 = 0x9001_0000;

#[no_mangle]
unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, dev: c_int) -> CuResult {
    entry("cuDeviceGetDefaultMemPool", || {
        let dev = super::cuda_device::device("cuDeviceGetDefaultMemPool", dev)?;
        // SAFETY: the caller passes a writable CUmemoryPool.
        unsafe {
            put(
                "cuDeviceGetDefaultMemPool",
                pool,
                (POOL_BASE + dev as u64) as *mut c_void,
            )
        }
    })
}

/// The device whose default memory pool `pool` is.
fn pool_device(name: &str, pool: *mut c_void) -> Result<usize, CuResult> {
    (pool as u64)
        .checked_sub(POOL_BASE)
        .filter(|d| (*d as usize) < config().visible.len())
        .map(|d| d as usize)
        .ok_or_else(|| {
            no(
                E::CUDA_ERROR_INVALID_HANDLE,
                name,
                "not a default memory pool",
            )
        })
}

/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` and `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`: the
/// bytes of the device's live stream-ordered allocations (the stand-in's pool keeps
/// nothing freed, as a real one with release threshold 0 after a synchronize);
/// `CU_MEMPOOL_ATTR_USED_MEM_HIGH` and `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`: the most of
/// them live at once since the high mark was last reset. Other attributes are not
/// supported.
#[no_mangle]
unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: *mut c_void,
    attr: c_uint,
    value: *mut c_void,
) -> CuResult {
    use cudarc::driver::sys::CUmemPool_attribute as A;
    entry("cuMemPoolGetAttribute", || {
        let name = "cuMemPoolGetAttribute";
        let usage = memory().usage(pool_device(name, pool)?);
        let bytes = if attr == A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT as c_uint
            || attr == A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT as c_uint
        {
            usage.pool_used
        } else if attr == A::CU_MEMPOOL_ATTR_USED_MEM_HIGH as c_uint
            || attr == A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH as c_uint
        {
            usage.pool_peak
        } else {
            return Err(no(
                E::CUDA_ERROR_NOT_SUPPORTED,
                name,
                format!("attribute {attr} (only the current and high used and reserved bytes)"),
            ));
        };
        // SAFETY: these attributes write one cuuint64_t to the caller's `value`.
        unsafe { put(name, value.cast::<u64>(), bytes) }
    })
}

/// `CU_MEMPOOL_ATTR_USED_MEM_HIGH` or `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` set to 0:
/// resets the high mark to the bytes live now (the driver takes no other value). Other
/// attributes are not supported.
#[no_mangle]
unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: *mut c_void,
    attr: c_uint,
    value: *mut c_void,
) -> CuResult {
    use cudarc::driver::sys::CUmemPool_attribute as A;
    entry("cuMemPoolSetAttribute", || {
        let name = "cuMemPoolSetAttribute";
        let dev = pool_device(name, pool)?;
        if attr != A::CU_MEMPOOL_ATTR_USED_MEM_HIGH as c_uint
            && attr != A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH as c_uint
        {
            return Err(no(
                E::CUDA_ERROR_NOT_SUPPORTED,
                name,
                format!("attribute {attr} (only resetting the high marks)"),
            ));
        }
        if value.is_null() {
            return Err(no(E::CUDA_ERROR_INVALID_VALUE, name, "the value is null"));
        }
        // SAFETY: the high-mark attributes read one cuuint64_t from the caller's `value`.
        let v = unsafe { *value.cast::<u64>() };
        if v != 0 {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                name,
                format!("a high mark can only be reset to 0, not {v}"),
            ));
        }
        memory().reset_pool_peak(dev);
        Ok(())
    })
}
