//! Offload's start-up checks stop a run before its first step, with an error that names
//! the path or the key and the numbers: a file system that refuses `O_DIRECT` (tmpfs), a
//! `nvme_path` that cannot be created, a `buffer_size` smaller than the largest parameter
//! partition, a host-memory budget too small for the state.

use serde_json::json;
use zero_comm::HostGroup;
use zero_runtime::{Engine, EngineError, HostDevice, ZeroConfig};
use zero_tests::{init_values, mlp_config, mlp_modules, with_offload};

/// Starts one engine per rank on `config`; every rank's error.
fn start_errors(world: usize, config: &str) -> Vec<String> {
    let cfg = ZeroConfig::from_json_str(config, world).expect("valid config");
    let comms = HostGroup::with_timeout(world, std::time::Duration::from_secs(10)).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let cfg = cfg.clone();
                s.spawn(move || {
                    let r: Result<Engine<_, _>, EngineError> =
                        Engine::new(cfg, mlp_modules(), comm, HostDevice, |id, _, v| {
                            init_values(1, id, v)
                        });
                    r.err().map(|e| e.to_string()).unwrap_or_default()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn tmpfs_folder() -> Option<std::path::PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"tmpfs")).then(|| std::path::PathBuf::from(f[1]))
        })
        .find(|p| {
            let probe = p.join(format!(".zero-probe-{}", std::process::id()));
            let ok = std::fs::create_dir(&probe).is_ok();
            let _ = std::fs::remove_dir(&probe);
            ok
        })
}

#[test]
fn a_file_system_without_o_direct_is_named() {
    let Some(tmpfs) = tmpfs_folder() else {
        println!("SKIPPED: no writable tmpfs on this machine to show the O_DIRECT refusal");
        return;
    };
    if zero_runtime::io::check_direct(&tmpfs).is_ok() {
        // Linux 6.6 and later give tmpfs O_DIRECT: there is nothing to refuse here.
        println!(
            "SKIPPED: {} (tmpfs) takes O_DIRECT on this kernel, so no refusal to show",
            tmpfs.display()
        );
        return;
    }

    let dir = tmpfs.join(format!("zero-nvme-{}", std::process::id()));
    for key in ["offload_optimizer", "offload_param"] {
        let cfg = with_offload(
            &mlp_config(3, "bf16", 1, 0.0, false),
            key,
            &json!({"device": "nvme", "nvme_path": dir}),
            None,
        );
        for e in start_errors(2, &cfg) {
            assert!(
                e.contains("O_DIRECT") && e.contains(&dir.display().to_string()),
                "{key}: {e}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_nvme_path_that_cannot_be_a_folder_is_named() {
    let tmp = tempfile::Builder::new()
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    let cfg = with_offload(
        &mlp_config(2, "bf16", 1, 0.0, false),
        "offload_optimizer",
        &json!({"device": "nvme", "nvme_path": file}),
        None,
    );
    for e in start_errors(2, &cfg) {
        assert!(e.contains(&file.display().to_string()), "{e}");
    }
}

#[test]
fn a_parameter_buffer_smaller_than_a_partition_is_named() {
    let tmp = tempfile::Builder::new()
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let cfg = with_offload(
        &mlp_config(3, "bf16", 1, 0.0, false),
        "offload_param",
        &json!({"device": "nvme", "nvme_path": tmp.path(), "buffer_size": 2}),
        None,
    );
    for e in start_errors(2, &cfg) {
        assert!(
            e.contains("buffer_size is 2 elements") && e.contains("largest parameter partition"),
            "{e}"
        );
    }
}
