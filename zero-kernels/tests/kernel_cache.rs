//! The kernel cache: compiled once per process, read back from disk in a new process
//! (simulated with a second directory), and recompiled when an entry is damaged.
//!
//! Needs NVRTC, as `cuda_compile` does; `ZERO_REQUIRE_CUDA_COMPILE=1` makes its absence a
//! failure instead of a visible skip.

use zero_kernels::cuda::kernel_cache::{cache_file_name, compiled_cubin, CacheKey, CacheOrigin};
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
    let key = CacheKey {
        sm: "sm_80",
        nvrtc,
        driver: Some((13, 0)),
    };
    let name = cache_file_name(&src, &key);

    let (image, origin) = compiled_cubin(&src, &key, Some(&first)).expect("compile");
    assert_eq!(origin, CacheOrigin::Compiled);
    assert_eq!(&image[..4], b"\x7fELF", "not a cubin");
    assert!(
        image.windows(12).any(|w| w == b"cast_f32_f16"),
        "no entry point in the cubin"
    );
    assert!(first.join(&name).is_file(), "{name} was not written");

    let (again, origin) = compiled_cubin(&src, &key, Some(&first)).expect("memory");
    assert_eq!((origin, &*again), (CacheOrigin::Memory, &*image));

    // Another process would find the file: copy it where this process has no entry.
    std::fs::create_dir_all(&second).expect("mkdir");
    std::fs::copy(first.join(&name), second.join(&name)).expect("copy");
    let (disk, origin) = compiled_cubin(&src, &key, Some(&second)).expect("disk");
    assert_eq!((origin, &*disk), (CacheOrigin::Disk, &*image));

    // A damaged entry is compiled again and replaced.
    std::fs::create_dir_all(&third).expect("mkdir");
    let mut bytes = std::fs::read(first.join(&name)).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(third.join(&name), &bytes).expect("w");
    let (fresh, origin) = compiled_cubin(&src, &key, Some(&third)).expect("recompile");
    assert_eq!((origin, &*fresh), (CacheOrigin::Compiled, &*image));
    let rewritten = std::fs::read(third.join(&name)).expect("read");
    assert!(
        rewritten.ends_with(&image),
        "the damaged entry was not replaced"
    );

    let _ = std::fs::remove_dir_all(&root);
}
