//! `ZERO_CUDA_LIB` names the driver library, and `cudarc` — which opens the driver by its
//! usual names (`libcuda.so` first) — must call that same library, or zero must refuse
//! with an error naming both. Two fake drivers (tests/fake_cuda/fake_cuda.c, compiled here
//! with the C compiler Rust links with) answer `cuDriverGetVersion` with different
//! versions, so the version a process reads says which copy answered:
//! - copy A, 12.4, soname `libcuda.so.1`, is named by `ZERO_CUDA_LIB`;
//! - copy B, 13.0, is `libcuda.so` in a folder on `LD_LIBRARY_PATH`.
//!
//! The loader reads `LD_LIBRARY_PATH` when a process starts, so each case runs in a child
//! process (this test binary again, running `driver_child`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles the fake with `version` into `dir/file`, with soname `soname`.
fn build_fake(dir: &Path, file: &str, soname: &str, version: i32) -> PathBuf {
    std::fs::create_dir_all(dir).expect("folder");
    let out_path = dir.join(file);
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cuda/fake_cuda.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall"])
        .arg(format!("-DFAKE_CUDA_VERSION={version}"))
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(&out_path)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}`: {e}"));
    assert!(
        out.status.success(),
        "compiling the fake driver failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out_path
}

/// Runs `driver_child` with `env` set (and `ZERO_CUDA_LIB` / `LD_LIBRARY_PATH` unset
/// unless given); returns the line it printed.
fn child(env: &[(&str, &Path)]) -> String {
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args([
        "--ignored",
        "--exact",
        "driver_child",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_remove("ZERO_CUDA_LIB")
    .env_remove("LD_LIBRARY_PATH")
    .env("ZERO_DRIVER_CHILD", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the child failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // libtest prints "test driver_child ... " before the child's own output.
    text.lines()
        .find_map(|l| l.find("DRIVER ").map(|at| l[at..].to_string()))
        .unwrap_or_else(|| panic!("no DRIVER line from the child:\n{text}"))
}

#[test]
#[ignore = "run by the driver override tests in child processes"]
fn driver_child() {
    if std::env::var_os("ZERO_DRIVER_CHILD").is_none() {
        return;
    }
    match zero_sys::driver::version() {
        Ok((a, b)) => println!("DRIVER {a}.{b}"),
        Err(e) => println!("DRIVER ERROR {e}"),
    }
}

#[test]
fn the_driver_override_is_the_library_cudarc_calls() {
    let tmp = tempfile::tempdir().expect("temporary folder");
    let a = build_fake(&tmp.path().join("a"), "libcuda.so.1", "libcuda.so.1", 12040);
    let b_dir = tmp.path().join("b");
    let b = build_fake(&b_dir, "libcuda.so", "libcuda.so", 13000);

    // The override and another libcuda.so on the library path: cudarc would open B, so
    // zero refuses, naming the override, A and B (it used to return B's 13.0 silently).
    let line = child(&[("ZERO_CUDA_LIB", &a), ("LD_LIBRARY_PATH", &b_dir)]);
    println!("override A, B on the path: {line}");
    assert!(
        line.starts_with("DRIVER ERROR")
            && line.contains("ZERO_CUDA_LIB")
            && line.contains(&a.display().to_string())
            && line.contains(&b.display().to_string()),
        "{line}"
    );

    // No override, B on the path: both searches find B.
    let line = child(&[("LD_LIBRARY_PATH", &b_dir)]);
    println!("no override, B on the path: {line}");
    assert_eq!(line, "DRIVER 13.0");

    // The override alone: cudarc reaches A by its soname, so A answers — unless this
    // machine has a libcuda.so of its own that cudarc would find first, which must then be
    // refused in the same way.
    let line = child(&[("ZERO_CUDA_LIB", &a)]);
    println!("override A alone: {line}");
    // SAFETY: probing whether this machine's loader resolves the name; closed at once.
    let system_has_one = unsafe { libloading::Library::new("libcuda.so") }.is_ok();
    if system_has_one {
        assert!(
            line.starts_with("DRIVER ERROR") && line.contains(&a.display().to_string()),
            "{line}"
        );
    } else {
        assert_eq!(line, "DRIVER 12.4");
    }
}
