//! The training example under each launcher's environment, as a user starts it (the
//! binary itself, as `torchrun --no-python`, `deepspeed --no_python`, `srun` and `mpirun`
//! would): it reads the launcher's variables, accepts the `--local_rank=N` that the
//! deepspeed launcher appends (and refuses one that disagrees), and, without a GPU, stops
//! with an error that says what is missing. No GPU is needed. The example binary is the
//! one `cargo test` builds before it runs the tests (run the whole test command: a run
//! filtered to this file alone does not rebuild the example).

mod common;

use common::{example, output_within};
use std::process::Command;

/// Runs the example with `vars` and `args`; (success, stderr).
fn run(vars: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    let exe = example().expect("the train example is built with the tests");
    let mut cmd = Command::new(exe);
    for k in zero_comm::nccl::LAUNCH_VARIABLES {
        cmd.env_remove(k);
    }
    cmd.envs(vars.iter().copied())
        .env("ZERO_CUDA_LIB", "/nonexistent/libcuda.so.1")
        .env("ZERO_NCCL_LIB", "/nonexistent/libnccl.so.2")
        .args(args);
    let out = output_within(&mut cmd, std::time::Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("the example: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const DEEPSPEED: [(&str, &str); 5] = [
    ("RANK", "1"),
    ("WORLD_SIZE", "2"),
    ("LOCAL_RANK", "1"),
    ("MASTER_ADDR", "127.0.0.1"),
    ("MASTER_PORT", "29512"),
];

#[test]
fn the_deepspeed_launchers_local_rank_flag_is_accepted_and_checked() {
    let (ok, err) = run(&DEEPSPEED, &["--local_rank=1"]);
    assert!(
        !ok && err.contains("pass --device cuda") && err.contains("rank 1 of 2"),
        "{err}"
    );
    let (ok, err) = run(&DEEPSPEED, &["--local_rank=0", "--device", "cuda"]);
    assert!(!ok && err.contains("--local_rank=0 disagrees"), "{err}");
}

#[test]
fn every_launcher_is_recognised_and_a_missing_gpu_is_named() {
    let slurm = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_JOB_NODELIST", "localhost"),
        ("MASTER_PORT", "29513"),
    ];
    let mpi = [
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "1"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29514"),
    ];
    let mut torchrun = DEEPSPEED.to_vec();
    torchrun.push(("TORCHELASTIC_RUN_ID", "none"));
    for (name, vars) in [
        ("Torchrun", torchrun.as_slice()),
        ("RankVariables", &DEEPSPEED[..]),
        ("Slurm", &slurm[..]),
        ("OpenMpi", &mpi[..]),
    ] {
        let (ok, err) = run(vars, &[]);
        assert!(
            !ok && err.contains(name) && err.contains("--device cuda"),
            "{name}: {err}"
        );
        // With --device cuda, world 1 goes as far as loading NCCL (missing here).
        if !err.contains("of 2") {
            let (ok, err) = run(vars, &["--device", "cuda", "--steps", "1"]);
            assert!(
                !ok && err.contains("NCCL") && err.contains("/nonexistent/libnccl.so.2"),
                "{name}: {err}"
            );
        }
    }
}
