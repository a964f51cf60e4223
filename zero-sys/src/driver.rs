//! The CUDA driver (`libcuda`), through `cudarc`, loaded at run time.
//!
//! `cudarc` panics when the driver is missing, so callers open it with [`library`] first:
//! a machine without a GPU driver gets a [`LoadError`] naming the library and the places
//! tried. Without an override, our search is `cudarc`'s (the same names in the same
//! order), so both open the same library.
//!
//! `ZERO_CUDA_LIB` opens a library by path, but `cudarc` still opens the driver by name
//! (`libcuda.so` first): where one of its names resolves to another file (a toolkit's
//! `stubs/libcuda.so` on `LD_LIBRARY_PATH`, say), every driver call would go there and
//! the override would be silently ignored. So with an override, [`library`] checks that
//! `cudarc`'s library is the same one — the same address for `cuDriverGetVersion` — and
//! otherwise fails naming both files.

use crate::{load_library, LoadError, LoadedLibrary};
use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

static LIBRARY: OnceLock<Result<LoadedLibrary, LoadError>> = OnceLock::new();

/// The variable that overrides the driver search.
const OVERRIDE: &str = "ZERO_CUDA_LIB";

/// Opens the CUDA driver once per process (`ZERO_CUDA_LIB` overrides the search, and is
/// checked to be the library `cudarc` calls).
pub fn library() -> Result<&'static LoadedLibrary, LoadError> {
    LIBRARY
        .get_or_init(|| {
            let names = cudarc::get_lib_name_candidates("cuda");
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let ours = load_library("the CUDA driver (libcuda)", &names, Some(OVERRIDE))?;
            if std::env::var_os(OVERRIDE).is_some() {
                check_cudarc_calls(&ours, &names)?;
            }
            Ok(ours)
        })
        .as_ref()
        .map_err(Clone::clone)
}

type DriverGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;

/// The name of the entry point compared between the two handles.
const VERSION_ENTRY: &[u8] = b"cuDriverGetVersion\0";

/// The address our handle gives `cuDriverGetVersion`, if it has one.
fn our_version_entry(lib: &libloading::Library) -> Option<usize> {
    // SAFETY: cuDriverGetVersion(int*) -> CUresult (an int) in every CUDA driver; only its
    // address is taken here.
    let sym = unsafe { lib.get::<DriverGetVersion>(VERSION_ENTRY) }.ok()?;
    Some(*sym as usize)
}

/// The address `cudarc`'s handle gives `cuDriverGetVersion`. cudarc holds the library
/// through another libloading release than ours; its own `get` is called directly.
fn cudarc_version_entry() -> Option<usize> {
    // SAFETY: only called once one of cudarc's names opens (see check_cudarc_calls), so
    // culib returns its library instead of panicking.
    let theirs = unsafe { cudarc::driver::sys::culib() };
    // SAFETY: as in our_version_entry.
    let sym = unsafe { theirs.get::<DriverGetVersion>(VERSION_ENTRY) }.ok()?;
    Some(*sym as usize)
}

/// The file a loaded function lives in (`dladdr`), or `?`.
fn file_of(addr: usize) -> String {
    // SAFETY: all-zero bits are a valid Dl_info (pointers and integers).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads `addr` as a number and fills the live local `info`.
    let found = unsafe { libc::dladdr(addr as *const c_void, &mut info) } != 0;
    if !found || info.dli_fname.is_null() {
        return "?".into();
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader, valid while the
    // library stays loaded (it is, by cudarc's handle).
    unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned()
}

/// Checks that `cudarc`'s driver library is `ours`.
fn check_cudarc_calls(ours: &LoadedLibrary, names: &[&str]) -> Result<(), LoadError> {
    // SAFETY: opening a driver library by the names cudarc itself opens (see
    // load_library); the handle is closed again at once.
    let reachable = names
        .iter()
        .any(|n| unsafe { libloading::Library::new(n) }.is_ok());
    if !reachable {
        return Err(LoadError::Unreachable {
            env_override: OVERRIDE.into(),
            wanted: ours.opened_as.clone(),
            names: names.iter().map(|n| n.to_string()).collect(),
        });
    }
    match (our_version_entry(&ours.handle), cudarc_version_entry()) {
        (Some(a), Some(b)) if a == b => Ok(()),
        (_, b) => Err(LoadError::Shadowed {
            env_override: OVERRIDE.into(),
            wanted: ours.opened_as.clone(),
            other: b.map_or_else(|| "a library without cuDriverGetVersion".into(), file_of),
        }),
    }
}

/// The CUDA version the driver supports, as `(major, minor)` (`cuDriverGetVersion`:
/// 13000 → (13, 0)). Needs no GPU, only the driver library.
pub fn version() -> Result<(i32, i32), String> {
    library().map_err(|e| e.to_string())?;
    let mut v: std::os::raw::c_int = 0;
    // SAFETY: writes one int through the pointer, to a live local; the library was opened
    // above, so cudarc's lazy symbol lookup finds it.
    let rc = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if rc != cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS {
        return Err(format!("cuDriverGetVersion failed: {rc:?}"));
    }
    Ok((v / 1000, v % 1000 / 10))
}

/// The calling thread's current CUDA context when made, made current again when dropped.
/// Every `cudarc` call binds its device's primary context to the calling thread, and the
/// CUDA runtime that PyTorch uses reads its current device from that binding: a caller
/// whose thread had another device current gets it back after zero's calls.
pub struct KeepCurrentContext {
    ctx: cudarc::driver::sys::CUcontext,
}

impl KeepCurrentContext {
    /// Saves the calling thread's current context (none is a valid state, restored as
    /// none). Open the driver with [`library`] first.
    pub fn save() -> Result<Self, String> {
        use cudarc::driver::sys;
        library().map_err(|e| e.to_string())?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: cuCtxGetCurrent(CUcontext*) writes one handle (or null) to the live local.
        let rc = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        if rc != sys::cudaError_enum::CUDA_SUCCESS {
            return Err(format!("reading the current CUDA context: {rc:?}"));
        }
        Ok(Self { ctx })
    }
}

impl Drop for KeepCurrentContext {
    fn drop(&mut self) {
        // SAFETY: the handle was this thread's current context when saved, or null (then
        // the thread is left with none). Primary contexts, the only ones zero and PyTorch
        // bind, stay alive while retained, and both keep theirs for the process's life.
        // A failure here cannot be reported from Drop; the next driver call reports it.
        let _ = unsafe { cudarc::driver::sys::cuCtxSetCurrent(self.ctx) };
    }
}

/// Borrows the CUDA stream `handle` that another library owns (PyTorch's
/// `torch.cuda.current_stream().cuda_stream`), to order work with it through events.
/// `0` is the legacy default stream. The stream must belong to `ctx` (checked with
/// `cuStreamGetCtx`: an error names both contexts otherwise), and its owner must keep it
/// alive while the returned handle is used; dropping the handle never destroys it.
pub fn borrow_stream(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    handle: u64,
) -> Result<std::sync::Arc<cudarc::driver::CudaStream>, String> {
    use cudarc::driver::sys;
    ctx.bind_to_thread()
        .map_err(|e| format!("binding the context: {e:?}"))?;
    let stream = handle as usize as sys::CUstream;
    if handle != 0 {
        let mut owner: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: cuStreamGetCtx(CUstream, CUcontext*) writes one handle to the live local
        // `owner`. The handle is non-null (checked: 0 is the legacy stream, taken below
        // without a call) and must be a stream its owner created and has not destroyed:
        // the caller's guarantee (PyTorch keeps its current stream alive while it is
        // current). The driver returns an error for a value that never was a stream, but a
        // destroyed stream's handle is undefined behaviour inside the driver, not an error.
        let rc = unsafe { sys::cuStreamGetCtx(stream, &mut owner) };
        if rc != sys::cudaError_enum::CUDA_SUCCESS {
            return Err(format!("stream {handle:#x} is not a CUDA stream: {rc:?}"));
        }
        if owner != ctx.cu_ctx() {
            return Err(format!(
                "stream {handle:#x} belongs to CUDA context {owner:?}, not to this GPU's \
                 primary context {:?} (is the tensor on another GPU?)",
                ctx.cu_ctx()
            ));
        }
    }
    // SAFETY: the stream belongs to `ctx` (checked above; 0 is the context's legacy default
    // stream), its owner keeps it alive (the documented contract), and callers order their
    // work with the owner's through events (zero-kernels' `ForeignStream`).
    Ok(unsafe { ctx.wrap_borrowed_stream(stream) })
}

/// Bytes in use in `device`'s default memory pool: the pool `cuMemAllocAsync` draws from,
/// and so every buffer zero allocates (cudarc allocates in stream order wherever the
/// device supports memory pools). Counts the whole process's users of that pool: zero's
/// buffers, and PyTorch's only under its `cudaMallocAsync` allocator backend. Open the
/// driver with [`library`] first.
pub fn default_pool_used(device: cudarc::driver::sys::CUdevice) -> Result<u64, String> {
    use cudarc::driver::sys::CUmemPool_attribute as A;
    default_pool_attribute(
        device,
        A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        "the bytes in use",
    )
}

/// The most bytes ever in use at once in `device`'s default memory pool
/// (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`, since the process began: the driver resets it only
/// to the current use): what a test reads to bound a run's peak device memory. The same
/// users as [`default_pool_used`].
pub fn default_pool_peak(device: cudarc::driver::sys::CUdevice) -> Result<u64, String> {
    use cudarc::driver::sys::CUmemPool_attribute as A;
    default_pool_attribute(
        device,
        A::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        "the peak bytes in use",
    )
}

/// Resets [`default_pool_peak`] to the bytes in use now (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`
/// set to 0, the only value the driver takes): a test measures one run's peak from there.
pub fn default_pool_reset_peak(device: cudarc::driver::sys::CUdevice) -> Result<(), String> {
    use cudarc::driver::sys;
    let pool = default_pool(device)?;
    let mut zero: u64 = 0;
    // SAFETY: USED_MEM_HIGH reads one cuuint64_t from `zero`, a live u64; the pool handle
    // is the device's default pool, which lives as long as the device's context.
    let rc = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            (&mut zero as *mut u64).cast(),
        )
    };
    if rc != sys::cudaError_enum::CUDA_SUCCESS {
        return Err(format!(
            "resetting the peak of device {device}'s default memory pool: {rc:?}"
        ));
    }
    Ok(())
}

/// `device`'s default memory pool (the driver opened first).
fn default_pool(
    device: cudarc::driver::sys::CUdevice,
) -> Result<cudarc::driver::sys::CUmemoryPool, String> {
    use cudarc::driver::sys;
    library().map_err(|e| e.to_string())?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: cuDeviceGetDefaultMemPool(CUmemoryPool*, CUdevice) writes one handle to the
    // live local; the device handle came from the driver.
    let rc = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, device) };
    if rc != sys::cudaError_enum::CUDA_SUCCESS {
        return Err(format!(
            "reading device {device}'s default memory pool: {rc:?}"
        ));
    }
    Ok(pool)
}

/// One 64-bit attribute of `device`'s default memory pool.
fn default_pool_attribute(
    device: cudarc::driver::sys::CUdevice,
    attribute: cudarc::driver::sys::CUmemPool_attribute,
    what: &str,
) -> Result<u64, String> {
    use cudarc::driver::sys;
    let pool = default_pool(device)?;
    let mut value: u64 = 0;
    // SAFETY: the USED_MEM_CURRENT and USED_MEM_HIGH attributes (the only ones callers
    // pass) write one cuuint64_t to `value`, here a live u64; the pool handle is the
    // device's default pool, which lives as long as the device's context.
    let rc =
        unsafe { sys::cuMemPoolGetAttribute(pool, attribute, (&mut value as *mut u64).cast()) };
    if rc != sys::cudaError_enum::CUDA_SUCCESS {
        return Err(format!(
            "reading {what} in device {device}'s default memory pool: {rc:?}"
        ));
    }
    Ok(value)
}
