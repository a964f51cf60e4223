//! zero-torch's Python tests (zero-torch/tests/python), run as part of the workspace's test
//! command: the abi3 wheel is built with maturin, installed into a temporary folder, and
//! pytest runs against PyTorch, transformers and DeepSpeed from `ZERO_TORCH_SITE` (the
//! folder `.ci/run` installs them into from PyPI). Without that folder the test prints a
//! visible skip, unless `ZERO_REQUIRE_TORCH=1` (CI) makes it a failure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
    match ended_by(&mut child, Instant::now() + limit) {
        Some(ok) => ok,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish in {limit:?}");
        }
    }
}

/// Whether `child` succeeded, once it has ended; `None` if it is still running at
/// `deadline`.
fn ended_by(child: &mut Child, deadline: Instant) -> Option<bool> {
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return Some(status.success());
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The test files run in a second pytest process beside the rest of the suite: the client
/// suite and the Hugging Face Trainer's (on 2026-12-04, 2 cores, the rest took 26:44 and
/// the client suite alone 15:42 beside it; with the Trainer's file, 5:15 alone, moved
/// here: 25:11 and 22:22). Most tests start 2-process jobs whose ranks and launchers
/// spend seconds importing torch, DeepSpeed and transformers one core at a time, so one
/// pytest process kept 2 cores about 1.6 busy (2026-12-01, 2 cores). Side by side
/// the suite took 35 min against the serial one's expected 36.5 (docs/BENCHMARKS.md, CI
/// time 2026-12-02): it is mostly CPU-bound, and each shard's tests run about half as
/// fast. Nothing is shared between them but DeepSpeed's JIT-built ops
/// (`TORCH_EXTENSIONS_DIR`, which torch builds under a lock) and free ports (each job asks
/// the kernel for one). `ZERO_TORCH_SUITE_SERIAL=1` runs the whole suite in one process.
/// On 2026-12-07 (a fresh clone, 2 cores) the rest took 45:23 and this process 41:06
/// (warm, 37:05 and 32:39), and `test_hf_checkpoint.py` (123 s) moved here; once the
/// zygotes imported transformers and DeepSpeed (`zygote.py`), the rest took 32:17 and this
/// process 35:16, and it moved back.
const APART: &[&str] = &["test_clients.py", "test_hf_trainer.py"];

/// Runs `live` (output echoed) and `logged` (output into `log`, printed when both end) at
/// once, killing both after `limit`; whether both succeeded.
fn side_by_side(mut live: Command, mut logged: Command, log: &Path, limit: Duration) -> bool {
    let out = std::fs::File::create(log).expect("the log file");
    let err = out.try_clone().expect("the log file");
    let mut second = logged
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {logged:?}: {e}"));
    let mut first = live
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {live:?}: {e}"));
    let deadline = Instant::now() + limit;
    let (a, b) = (
        ended_by(&mut first, deadline),
        ended_by(&mut second, deadline),
    );
    if a.is_none() || b.is_none() {
        for c in [&mut first, &mut second] {
            let _ = c.kill();
            let _ = c.wait();
        }
        println!("{}", std::fs::read_to_string(log).unwrap_or_default());
        panic!("the Python suite did not finish in {limit:?}");
    }
    println!(
        "\n== {} (run beside the rest of the suite):\n{}",
        APART.join(", "),
        std::fs::read_to_string(log).unwrap_or_default()
    );
    a == Some(true) && b == Some(true)
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

/// Whether every cargo build of this run uses maturin's PyO3 settings (`.ci/run` exports
/// them), so that the wheel may share the test command's target folder.
fn shares_pyo3_settings() -> bool {
    std::env::var("PYO3_BUILD_EXTENSION_MODULE").is_ok_and(|v| v == "1")
        && std::env::var_os("PYO3_CONFIG_FILE").is_some()
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
    // The wheel as a user gets it (abi3), built with the dev profile, which the workspace
    // optimizes as the test profile (the root Cargo.toml). The code is the release wheel's;
    // only the optimization level (2, not 3) and debug assertions differ, neither of which
    // changes arithmetic. Where maturin's PyO3 settings are exported for every build
    // (`.ci/run` does), the wheel shares the test command's artifacts: its dependencies are
    // not compiled again. Elsewhere it builds in a folder of its own: maturin builds PyO3
    // with those settings, and in the test command's folder that would make the next
    // `cargo test` rebuild PyO3 and every zero crate and test binary above it.
    let mut maturin = Command::new(site.join("bin/maturin"));
    if !shares_pyo3_settings() {
        maturin.env("CARGO_TARGET_DIR", root.join("target/wheel"));
    }
    let built = run(
        maturin
            .args(["build", "--quiet", "-m"])
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
    let suite = root.join("zero-torch/tests/python");
    // Two pytest processes side by side (see `APART`), each with its own temporary folder;
    // the first's output is printed live, the other's when both have ended.
    let pytest = |select: &[String], tmpdir: &Path| {
        std::fs::create_dir_all(tmpdir).expect("a temporary folder for pytest");
        let mut c = Command::new("python3");
        c.args([
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "--durations=15",
            "-x",
        ])
        .args(select)
        .env("PYTHONPATH", &path)
        .env("ZERO_TORCH_WHEEL", &wheel)
        .env("TORCH_EXTENSIONS_DIR", root.join("target/torch-extensions"))
        // DeepSpeed's JIT-built CPU ops compile without `-g` (the same machine code, less
        // CPU: the script says what was measured), with the compiler a user set as the
        // real one (never the script itself, which would run itself forever).
        .env("CXX", suite.join("cxx_without_debug_info"))
        .env(
            "ZERO_JIT_CXX",
            std::env::var("CXX")
                .ok()
                .filter(|c| !c.ends_with("cxx_without_debug_info"))
                .unwrap_or_else(|| "c++".into()),
        )
        .envs(zero_ckpt().map(|p| ("ZERO_CKPT", p)))
        .env(
            "PATH",
            format!(
                "{}:{}",
                site.join("bin").display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("TMPDIR", tmpdir);
        c
    };
    let apart: Vec<String> = APART
        .iter()
        .map(|f| suite.join(f).display().to_string())
        .collect();
    let mut rest = vec![suite.display().to_string()];
    rest.extend(apart.iter().map(|f| format!("--ignore={f}")));
    let serial = std::env::var("ZERO_TORCH_SUITE_SERIAL").is_ok_and(|v| v == "1");
    let ok = if serial {
        run(
            &mut pytest(&[suite.display().to_string()], tmp.path()),
            Duration::from_secs(3600),
        )
    } else {
        side_by_side(
            pytest(&rest, &tmp.path().join("rest")),
            pytest(&apart, &tmp.path().join("apart")),
            &tmp.path().join("apart.log"),
            Duration::from_secs(3600),
        )
    };
    assert!(ok, "zero-torch's Python tests failed (output above)");
}
