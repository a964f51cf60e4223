//! The training example under each launcher's environment, as a user starts it (the
//! binary itself, as `torchrun --no-python`, `deepspeed --no_python`, `srun` and `mpirun`
//! would, with the variables each sets): one rank per process, on CPU over the
//! shared-memory group, with the bits of the same number of ranks in one process; the
//! `--local_rank=N` the deepspeed launcher appends is accepted and checked; with
//! `--device cuda` and no GPU, the error says what is missing. No GPU is needed. The
//! example binary is the one `cargo test` builds before it runs the tests (run the whole
//! test command: a run filtered to this file alone does not rebuild the example).

mod common;

use common::{bits_line, example, free_port, output_within, run_ranks};
use std::process::Command;
use std::time::Duration;

fn command(vars: &[(&str, String)], args: &[&str]) -> Command {
    let exe = example().expect("the train example is built with the tests");
    let mut cmd = Command::new(exe);
    for k in zero_comm::nccl::LAUNCH_VARIABLES {
        cmd.env_remove(k);
    }
    cmd.envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .env("ZERO_CUDA_LIB", "/nonexistent/libcuda.so.1")
        .env("ZERO_NCCL_LIB", "/nonexistent/libnccl.so.2")
        .args(args);
    cmd
}

/// Runs the example with `vars` and `args`; (success, stdout and stderr).
fn run(vars: &[(&str, String)], args: &[&str]) -> (bool, String) {
    let out = output_within(&mut command(vars, args), Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("the example: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Each launcher's variables for rank `rank` of `world` on this machine.
fn launcher_vars(
    launcher: &str,
    rank: usize,
    world: usize,
    port: u16,
) -> Vec<(&'static str, String)> {
    let (r, w, p) = (rank.to_string(), world.to_string(), port.to_string());
    let local = "127.0.0.1".to_string();
    match launcher {
        "Torchrun" => vec![
            ("RANK", r.clone()),
            ("WORLD_SIZE", w.clone()),
            ("LOCAL_RANK", r),
            ("LOCAL_WORLD_SIZE", w),
            ("MASTER_ADDR", local),
            ("MASTER_PORT", p),
            ("TORCHELASTIC_RUN_ID", "zero-test".into()),
        ],
        "RankVariables" => vec![
            ("RANK", r.clone()),
            ("WORLD_SIZE", w),
            ("LOCAL_RANK", r),
            ("MASTER_ADDR", local),
            ("MASTER_PORT", p),
        ],
        "Slurm" => vec![
            ("SLURM_PROCID", r.clone()),
            ("SLURM_NTASKS", w.clone()),
            ("SLURM_LOCALID", r),
            ("SLURM_NTASKS_PER_NODE", w),
            ("SLURM_JOB_ID", "4242".into()),
            ("SLURM_JOB_NODELIST", "localhost".into()),
            ("MASTER_PORT", p),
        ],
        _ => vec![
            ("OMPI_COMM_WORLD_RANK", r.clone()),
            ("OMPI_COMM_WORLD_SIZE", w.clone()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", w),
            ("MASTER_ADDR", local),
            ("MASTER_PORT", p),
        ],
    }
}

const LAUNCHERS: [&str; 4] = ["Torchrun", "RankVariables", "Slurm", "OpenMpi"];

const TRAIN: [&str; 8] = [
    "--steps",
    "6",
    "--stage",
    "3",
    "--precision",
    "bf16",
    "--hidden",
    "24",
];

#[test]
fn two_processes_under_every_launcher_train_with_the_bits_of_two_ranks_in_one_process() {
    let mut args = TRAIN.to_vec();
    args.extend(["--ranks", "2"]);
    let (ok, threads) = run(&[], &args);
    assert!(ok, "{threads}");
    let want = bits_line(&threads);
    for launcher in LAUNCHERS {
        let port = free_port();
        let outs = run_ranks(
            (0..2)
                .map(|r| command(&launcher_vars(launcher, r, 2, port), &TRAIN))
                .collect(),
            Duration::from_secs(120),
        );
        assert!(
            outs[0].contains(&format!("2 ranks one process each ({launcher})")),
            "{launcher}: {}",
            outs[0]
        );
        assert_eq!(
            bits_line(&outs[0]),
            want,
            "{launcher}: rank 0 differs from --ranks 2"
        );
        assert!(
            !outs[1].contains("final loss"),
            "only rank 0 prints: {}",
            outs[1]
        );
        println!("{launcher}: 2 processes, {want}");
    }
}

#[test]
fn the_deepspeed_launchers_local_rank_flag_is_accepted_and_checked() {
    let vars = launcher_vars("RankVariables", 0, 1, free_port());
    let (ok, text) = run(&vars, &["--local_rank=0", "--steps", "2"]);
    assert!(ok && text.contains("final loss bits"), "{text}");
    let vars = launcher_vars("RankVariables", 1, 2, free_port());
    let (ok, text) = run(&vars, &["--local_rank=0"]);
    assert!(!ok && text.contains("--local_rank=0 disagrees"), "{text}");
}

#[test]
fn with_device_cuda_and_no_gpu_every_launcher_names_what_is_missing() {
    for launcher in LAUNCHERS {
        let vars = launcher_vars(launcher, 0, 1, free_port());
        let (ok, text) = run(&vars, &["--device", "cuda", "--steps", "1"]);
        assert!(
            !ok && text.contains("NCCL") && text.contains("/nonexistent/libnccl.so.2"),
            "{launcher}: {text}"
        );
    }
}
