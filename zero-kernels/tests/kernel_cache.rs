//! The kernel cache: compiled once per process, read back from disk in a new process
//! (simulated with a second directory), and recompiled when an entry is damaged.
//!
//! Needs NVRTC, as `cuda_compile` does; `ZERO_REQUIRE_CUDA_COMPILE=1` makes its absence a
//! failure instead of a visible skip.

use zero_kernels::cuda::ptx_cache::{cache_file_name, compiled_ptx, PtxOrigin};
use zero_kernels::cuda::SOURCES;
use zero_sys::nvrtc::NvrtcError;

#[test]
fn kernels_are_cached_in_memory_and_on_disk() {
    let required = std::env::var_os("ZERO_REQUIRE_CUDA_COMPILE").is_some();
    let nvrtc = match zero_sys::nvrtc::version() {
        Ok(v) => v,
        Err(NvrtcError::NotFound(e)) => {
            assert!(
                !required,
                "ZERO_REQUIRE_CUDA_COMPILE is set but NVRTC is missing: {e}"
            );
            println!("SKIPPED: {e}; the kernel cache was not exercised");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    println!("NVRTC {}.{}", nvrtc.0, nvrtc.1);
    let root = std::env::temp_dir().join(format!("zero-kernel-cache-{}", std::process::id()));
    let (first, second, third) = (root.join("a"), root.join("b"), root.join("c"));
    let src = SOURCES[3]; // cast.cu: the smallest
    let name = cache_file_name(&src, "compute_80", nvrtc);

    let (ptx, origin) = compiled_ptx(&src, "compute_80", Some(&first)).expect("compile");
    assert_eq!(origin, PtxOrigin::Compiled);
    assert!(
        ptx.contains(".entry cast_f32_f16"),
        "no entry point in the PTX"
    );
    assert!(first.join(&name).is_file(), "{name} was not written");

    let (again, origin) = compiled_ptx(&src, "compute_80", Some(&first)).expect("memory");
    assert_eq!((origin, &*again), (PtxOrigin::Memory, &*ptx));

    // Another process would find the file: copy it where this process has no entry.
    std::fs::create_dir_all(&second).expect("mkdir");
    std::fs::copy(first.join(&name), second.join(&name)).expect("copy");
    let (disk, origin) = compiled_ptx(&src, "compute_80", Some(&second)).expect("disk");
    assert_eq!((origin, &*disk), (PtxOrigin::Disk, &*ptx));

    // A damaged entry is compiled again and replaced.
    std::fs::create_dir_all(&third).expect("mkdir");
    let text = std::fs::read_to_string(first.join(&name)).expect("read");
    std::fs::write(
        third.join(&name),
        text.replace("cast_f32_f16", "cast_f32_f61"),
    )
    .expect("w");
    let (fresh, origin) = compiled_ptx(&src, "compute_80", Some(&third)).expect("recompile");
    assert_eq!((origin, &*fresh), (PtxOrigin::Compiled, &*ptx));
    let rewritten = std::fs::read_to_string(third.join(&name)).expect("read");
    assert!(rewritten.contains("cast_f32_f16") && !rewritten.contains("cast_f32_f61"));

    let _ = std::fs::remove_dir_all(&root);
}
