//! zero-torch's Python tests (zero-torch/tests/python), run as part of the workspace's test
//! command: the abi3 wheel is built with maturin, installed into a temporary folder, and
//! pytest runs against PyTorch, transformers and DeepSpeed from `ZERO_TORCH_SITE` (the
//! folder `.ci/run` installs them into from PyPI). Without that folder the test prints a
//! visible skip, unless `ZERO_REQUIRE_TORCH=1` (CI) makes it a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The folder holding torch, transformers, deepspeed, pytest, maturin and Lightning, if usable.
fn site() -> Option<PathBuf> {
    let site = PathBuf::from(std::env::var_os("ZERO_TORCH_SITE")?);
    let needed = [
        "torch",
        "transformers",
        "deepspeed",
        "pytest",
        "bin/maturin",
        "lightning",
    ];
    needed.iter().all(|n| site.join(n).exists()).then_some(site)
}

/// Runs `cmd`, echoing its output, killing it after `limit`; whether it succeeded.
fn run(cmd: &mut Command, limit: Duration) -> bool {
    let mut child = cmd
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return status.success();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `zero-ckpt` binary `cargo test --workspace` built beside this test (zero-runtime's
/// integration tests need it), for the export test.
fn zero_ckpt() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("zero-ckpt");
    if bin.exists() {
        return Some(bin);
    }
    let msg = format!("SKIPPED zero-ckpt's export into transformers: {} is not built (cargo test --workspace builds it)", bin.display());
    assert!(!required(), "{msg}");
    println!("{msg}");
    None
}

/// Whether a missing dependency is a failure (CI) rather than a visible skip.
fn required() -> bool {
    std::env::var("ZERO_REQUIRE_TORCH").is_ok_and(|v| v == "1")
}

#[test]
fn zero_torch_passes_its_python_tests() {
    let Some(site) = site() else {
        let msg = "SKIPPED zero-torch's Python tests: ZERO_TORCH_SITE does not hold torch, \
                   transformers, deepspeed, pytest, maturin and lightning (.ci/run installs them)";
        assert!(!required(), "{msg}");
        println!("{msg}");
        return;
    };
    let root = root();
    let tmp = tempfile::Builder::new()
        .prefix("zero-torch-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary folder");
    let wheels = tmp.path().join("wheels");
    let installed = tmp.path().join("site");
    // The wheel, as a user gets it (release build, abi3).
    let built = run(
        Command::new(site.join("bin/maturin"))
            .args(["build", "--release", "--quiet", "-m"])
            .arg(root.join("zero-torch/Cargo.toml"))
            .arg("--out")
            .arg(&wheels),
        Duration::from_secs(1800),
    );
    assert!(built, "maturin could not build the zero-torch wheel");
    let wheel = std::fs::read_dir(&wheels)
        .expect("the wheel folder")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a wheel");
    println!("built {}", wheel.display());
    let name = wheel.file_name().unwrap_or_default().to_string_lossy();
    assert!(
        name.contains("-cp310-abi3-"),
        "not one abi3 wheel for Python >= 3.10: {name}"
    );
    let pip = run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
            ])
            .arg(&installed)
            .arg(&wheel),
        Duration::from_secs(300),
    );
    assert!(pip, "pip could not install the wheel");
    let path = std::env::join_paths([installed.as_path(), site.as_path()]).expect("PYTHONPATH");
    let ok = run(
        Command::new("python3")
            .args([
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                "--durations=15",
                "-x",
            ])
            .arg(root.join("zero-torch/tests/python"))
            .env("PYTHONPATH", path)
            .env("ZERO_TORCH_WHEEL", &wheel)
            .env("TORCH_EXTENSIONS_DIR", root.join("target/torch-extensions"))
            .envs(zero_ckpt().map(|p| ("ZERO_CKPT", p)))
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    site.join("bin").display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("TMPDIR", tmp.path()),
        Duration::from_secs(3600),
    );
    assert!(ok, "zero-torch's Python tests failed (output above)");
}
