//! NVMe offload starts under a container's locked-memory limit.
//!
//! Docker's default `ulimit -l` is 64 KiB. zero locks no memory itself: the NVMe
//! pipeline's buffers are ordinary heap memory, and the GPU's pinned staging comes from
//! `cuMemHostAlloc`, which NVIDIA's driver pins without charging `RLIMIT_MEMLOCK`
//! (`os_lock_user_pages` in kernel-open/nvidia/os-mlock.c takes the pages with
//! `get_user_pages`; only `mlock` counts against the limit). An earlier start-up check
//! refused NVMe offload on a GPU whenever the limit was below `buffer_count` × the
//! largest block — about 48 GB with DeepSpeed's default `sub_group_size` — so no
//! container could start. Here a child process runs under `prlimit --memlock=65536` and
//! builds NVMe-offload engines with `pin_memory` and the default `sub_group_size`, on the
//! host and, where there is one, on the GPU, and takes a step on each.

use std::process::Command;
use std::time::Duration;
use zero_comm::{Communicator, HostGroup};
use zero_runtime::{Device, Engine, ModuleSpec, ParamSpec, ZeroConfig};

const LIMIT: u64 = 64 << 10;
/// Elements of the one parameter: its sub-group's block is 12 bytes each, so the four
/// pipeline buffers take 4.8 MB, 73 times the limit.
const NUMEL: usize = 100_000;

fn config(nvme: &std::path::Path) -> String {
    serde_json::json!({
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "pin_memory": true}
        }
    })
    .to_string()
}

/// Builds the engine on `comm` and `dev`, adds a gradient and takes one step.
fn start_and_step<C: Communicator, D: Device<Buffer = C::Buffer>>(
    cfg: &str,
    comm: C,
    dev: D,
) -> Result<(), String> {
    let cfg = ZeroConfig::from_json_str(cfg, 1).map_err(|e| e.to_string())?;
    let modules = vec![ModuleSpec::new("big", vec![ParamSpec::new("w", &[NUMEL])])];
    let mut e =
        Engine::new(cfg, modules, comm, dev, |_, _, v| v.fill(0.5)).map_err(|e| e.to_string())?;
    e.add_grad_f32(0, 0, &vec![1e-3; NUMEL])
        .map_err(|e| e.to_string())?;
    e.grads_ready(0).map_err(|e| e.to_string())?;
    e.step().map_err(|e| e.to_string())?;
    Ok(())
}

#[test]
#[ignore = "run by nvme_offload_starts_under_a_64_kib_locked_memory_limit in a child process"]
fn memlock_child() {
    let Some(nvme) = std::env::var_os("ZERO_MEMLOCK_NVME") else {
        return;
    };
    let limit = zero_sys::fs::memlock_limit().expect("getrlimit");
    println!("child: RLIMIT_MEMLOCK {limit:?}");
    assert_eq!(limit, Some(LIMIT), "prlimit did not set the limit");
    let cfg = config(std::path::Path::new(&nvme));
    let comm = HostGroup::with_timeout(1, Duration::from_secs(30))
        .expect("group")
        .remove(0);
    match start_and_step(&cfg, comm, zero_runtime::HostDevice) {
        Ok(()) => println!("STARTED host"),
        Err(e) => println!("FAILED host: {e}"),
    }
    match zero_kernels::testing::gpu_or_skip("NVMe offload under a 64 KiB memlock limit") {
        None => println!("STARTED cuda (skipped: no GPU)"),
        Some(_) => {
            let comm = zero_comm::DeviceGroup::with_timeout(1, Duration::from_secs(60))
                .expect("device group")
                .remove(0);
            let dev = zero_runtime::CudaDevice::new().expect("device");
            match start_and_step(&cfg, comm, dev) {
                Ok(()) => println!("STARTED cuda"),
                Err(e) => println!("FAILED cuda: {e}"),
            }
        }
    }
}

#[test]
fn nvme_offload_starts_under_a_64_kib_locked_memory_limit() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        println!("SKIPPED memlock test: prlimit (util-linux) is not installed");
        return;
    }
    let nvme = tempfile::Builder::new()
        .prefix("zero-memlock-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary folder");
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("prlimit")
        .arg(format!("--memlock={LIMIT}"))
        .arg(&exe)
        .args([
            "--ignored",
            "--exact",
            "memlock_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ZERO_MEMLOCK_NVME", nvme.path())
        .output()
        .expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(
        out.status.success(),
        "the child failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for device in ["host", "cuda"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("STARTED {device}"))),
            "NVMe offload did not start on {device} under a {LIMIT}-byte memlock limit:\n{text}"
        );
    }
}
