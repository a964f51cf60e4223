//! The stand-in as its own tests use it: the built `libzero_gpusim.so` is loaded as the
//! CUDA driver (soname `libcuda.so.1`, so `cudarc` finds it), kernels are compiled through
//! its NVRTC tap, and its findings are read back through `zero_gpusim_take_findings`.
//!
//! Without the library or a real NVRTC each test prints a visible skip, unless
//! `ZERO_REQUIRE_GPU=1` (the stand-in pass of CI), where a skip fails.
#![allow(dead_code)]

use std::ffi::{c_char, CStr};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub use cudarc::driver::{result, sys, CudaContext};

/// The stand-in library: `ZERO_CUDA_LIB` when it names one, else the one beside this test.
pub fn library() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ZERO_CUDA_LIB").map(PathBuf::from) {
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().contains("zero_gpusim"))
            && p.is_file()
        {
            return Some(p);
        }
    }
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [
        deps.join("libzero_gpusim.so"),
        deps.parent()?.join("libzero_gpusim.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// A real NVRTC for the tap: `ZERO_GPUSIM_NVRTC`, else the 13.0 wheel `.ci/run` installs.
pub fn real_nvrtc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ZERO_GPUSIM_NVRTC").map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let p = root.join("target/cuda-pip/nvrtc-13.0/nvidia/cu13/lib/libnvrtc.so.13");
    p.is_file().then_some(p)
}

/// One launch's global-memory traffic.
#[derive(Debug, Clone, Default)]
pub struct Traffic {
    /// The kernel.
    pub kernel: String,
    /// Bytes its threads loaded.
    pub loaded: u64,
    /// Bytes its threads stored.
    pub stored: u64,
    /// Bytes moved for the loads (32-byte sectors per warp instruction).
    pub moved_in: u64,
    /// Bytes moved for the stores.
    pub moved_out: u64,
    /// Distinct bytes loaded.
    pub distinct_in: u64,
    /// Distinct bytes stored.
    pub distinct_out: u64,
}

/// The loaded stand-in.
pub struct Sim {
    lib: libloading::Library,
    /// Its path.
    pub path: PathBuf,
    /// Device 0's context.
    pub ctx: Arc<CudaContext>,
}

fn required() -> bool {
    std::env::var("ZERO_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The stand-in, loaded once; `None` after a visible skip.
pub fn sim(test: &str) -> Option<&'static Sim> {
    static SIM: OnceLock<Result<Sim, String>> = OnceLock::new();
    let got = SIM.get_or_init(|| {
        let path = library().ok_or("libzero_gpusim.so is not built beside this test")?;
        let nvrtc = real_nvrtc().ok_or("no real NVRTC (ZERO_GPUSIM_NVRTC, or .ci/run's wheels)")?;
        if std::env::var_os("ZERO_GPUSIM_NVRTC").is_none() {
            // SAFETY (set_var): done once, before the stand-in reads it, inside this
            // OnceLock initializer.
            std::env::set_var("ZERO_GPUSIM_NVRTC", &nvrtc);
        }
        // zero's own crates (the traffic test) load the stand-in as driver and NVRTC too
        // (whatever the rest of the test run selected: .ci/run points ZERO_NVRTC_LIB at
        // the real NVRTC); without a PTX store and kernel cache of their own (.ci/gpusim
        // sets both), cubins are compiled in the process, through the tap.
        std::env::set_var("ZERO_CUDA_LIB", &path);
        std::env::set_var("ZERO_NVRTC_LIB", &path);
        if std::env::var_os("ZERO_GPUSIM_PTX_DIR").is_none() {
            let dir = std::env::temp_dir().join("zero-gpusim-selftest-ptx");
            std::env::set_var("ZERO_GPUSIM_PTX_DIR", dir);
            std::env::set_var("ZERO_KERNEL_CACHE", "off");
        }
        // SAFETY: the stand-in's initialisers have no preconditions.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| e.to_string())?;
        let ctx = CudaContext::new(0).map_err(|e| format!("CudaContext::new: {e:?}"))?;
        Ok(Sim { lib, path, ctx })
    });
    match got {
        Ok(s) => Some(s),
        Err(e) if required() => {
            panic!("{test}: the stand-in is required (ZERO_REQUIRE_GPU=1): {e}")
        }
        Err(e) => {
            println!("SKIPPED {test}: {e}");
            None
        }
    }
}

impl Sim {
    fn text(&self, f: &[u8]) -> String {
        // SAFETY: the stand-in's query functions return a CString it allocated; it is
        // read once and handed back to zero_gpusim_free.
        unsafe {
            let get: libloading::Symbol<unsafe extern "C" fn() -> *mut c_char> =
                self.lib.get(f).expect("query symbol");
            let free: libloading::Symbol<unsafe extern "C" fn(*mut c_char)> =
                self.lib.get(b"zero_gpusim_free\0").expect("free symbol");
            let p = get();
            let s = CStr::from_ptr(p).to_string_lossy().into_owned();
            free(p);
            s
        }
    }

    /// The findings so far (and clears them, so later calls work again).
    pub fn findings(&self) -> Vec<String> {
        let t = self.text(b"zero_gpusim_take_findings\0");
        t.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Kernel launches since the last call: the kernel, the bytes its threads loaded and
    /// stored, and the bytes moved for them (32-byte sectors per warp instruction).
    pub fn traffic(&self) -> Vec<Traffic> {
        let t = self.text(b"zero_gpusim_take_traffic\0");
        t.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                let n = |i: usize| f.get(i).and_then(|x| x.parse().ok());
                Some(Traffic {
                    kernel: f.first()?.to_string(),
                    loaded: n(3)?,
                    stored: n(4)?,
                    moved_in: n(6)?,
                    moved_out: n(7)?,
                    distinct_in: n(8)?,
                    distinct_out: n(9)?,
                })
            })
            .collect()
    }

    /// Allocations reported leaked so far.
    pub fn leaks(&self) -> usize {
        // SAFETY: zero_gpusim_leaks(uint64_t*) -> size_t.
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(*mut u64) -> usize> =
                self.lib.get(b"zero_gpusim_leaks\0").expect("leaks symbol");
            f(std::ptr::null_mut())
        }
    }

    /// Compiles `src` for `arch` through the stand-in's NVRTC tap.
    pub fn compile(&self, src: &str, name: &str, arch: &str) -> Vec<u8> {
        let nvrtc = zero_sys::nvrtc::Nvrtc::open(&self.path.display().to_string())
            .expect("the tap opens as NVRTC");
        nvrtc
            .compile_cubin(src, name, arch, &[])
            .expect("the test kernel compiles")
            .image
    }

    /// Loads a cubin and returns its function `name`.
    pub fn function(
        &self,
        cubin: &[u8],
        name: &str,
    ) -> Result<sys::CUfunction, result::DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: a complete cubin image.
        let m = unsafe { result::module::load_data(cubin.as_ptr().cast()) }?;
        // SAFETY: a live module and a NUL-terminated name.
        unsafe { result::module::get_function(m, std::ffi::CString::new(name).expect("name")) }
    }
}

/// Expects exactly one finding, whose text holds every one of `parts`; returns it.
pub fn expect_finding(sim: &Sim, parts: &[&str]) -> String {
    let f = sim.findings();
    assert!(
        !f.is_empty(),
        "expected a finding naming {parts:?}, got none"
    );
    let all = f.join("\n");
    for p in parts {
        assert!(all.contains(p), "the finding should name `{p}`:\n{all}");
    }
    all
}

/// Expects no finding.
pub fn expect_clean(sim: &Sim) {
    let f = sim.findings();
    assert!(f.is_empty(), "expected no finding, got:\n{}", f.join("\n"));
}

/// Serializes the tests of one binary: findings are per process.
pub fn lock() -> std::sync::MutexGuard<'static, ()> {
    static L: std::sync::Mutex<()> = std::sync::Mutex::new(());
    L.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new non-blocking stream of the test context.
pub fn stream(sim: &Sim) -> sys::CUstream {
    sim.ctx.bind_to_thread().expect("bind");
    result::stream::create(result::stream::StreamKind::NonBlocking).expect("stream")
}

/// `n` bytes of device memory (cuMemAlloc).
pub fn alloc(sim: &Sim, n: usize) -> sys::CUdeviceptr {
    sim.ctx.bind_to_thread().expect("bind");
    // SAFETY: a plain allocation.
    unsafe { result::malloc_sync(n) }.expect("alloc")
}

/// Waits for a stream.
pub fn sync(s: sys::CUstream) -> Result<(), result::DriverError> {
    // SAFETY: a live stream.
    unsafe { result::stream::synchronize(s) }
}

/// Launches `f` on `s` with `params` (each a pointer to one argument's value).
pub fn launch(
    f: sys::CUfunction,
    grid: u32,
    block: u32,
    s: sys::CUstream,
    params: &mut [*mut std::ffi::c_void],
) -> Result<(), result::DriverError> {
    // SAFETY: each parameter points to a live value of the kernel's parameter type.
    unsafe { result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, s, params) }
}

/// A pointer to `v` as a kernel parameter.
pub fn arg<T>(v: &mut T) -> *mut std::ffi::c_void {
    (v as *mut T).cast()
}
