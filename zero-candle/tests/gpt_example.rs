//! The main job, run as a user runs it (small and short): it trains, prints its tables,
//! and the stages agree to the bit.

#[path = "../../zero-runtime/tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Duration;

fn run(args: &[&str]) -> String {
    let exe = common::example_named("gpt").expect("the gpt example is built with the tests");
    let out = common::output_within(Command::new(exe).args(args), Duration::from_secs(240))
        .unwrap_or_else(|e| panic!("gpt {args:?}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gpt {args:?} failed:\n{text}");
    text
}

#[test]
fn the_gpt_example_trains_and_reports() {
    let text = run(&["--steps", "4", "--ranks", "2", "--dim", "16"]);
    for expected in [
        "== stage 3, 2 ranks, bf16",
        "paper 16Ψ/N",
        "vs theory 3Ψ(N-1)/N",
        "time on rank 0",
        "final loss",
        "parameters in candle storage on rank 0: peak",
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
    assert!(!text.contains("warning: "), "{text}");
}

#[test]
fn the_gpt_example_compares_stages() {
    let text = run(&[
        "--steps",
        "3",
        "--ranks",
        "2",
        "--dim",
        "16",
        "--compare-stages",
        "--precision",
        "fp32",
    ]);
    assert!(
        text.contains("final losses agree to the bit across stages"),
        "{text}"
    );
}

#[test]
fn the_gpt_example_refuses_bad_flags() {
    let exe = common::example_named("gpt").expect("the gpt example is built with the tests");
    let out = common::output_within(
        Command::new(exe).args(["--ranks", "0"]),
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ranks must be at least 1"));
}

#[test]
fn two_processes_under_torchrun_train_with_the_bits_of_two_ranks_in_one_process() {
    let args = ["--steps", "3", "--dim", "16", "--precision", "bf16"];
    let mut threads = args.to_vec();
    threads.extend(["--ranks", "2"]);
    let want = common::bits_line(&run(&threads));
    let exe = common::example_named("gpt").expect("the gpt example is built with the tests");
    let port = common::free_port();
    // The variables torchrun --no-python --nproc-per-node 2 sets.
    let commands = (0..2)
        .map(|r| {
            let mut c = Command::new(&exe);
            for k in zero_comm::launch::LAUNCH_VARIABLES {
                c.env_remove(k);
            }
            c.envs(zero_comm::launch::LaunchEnv::local(r, 2, port).vars())
                .env("TORCHELASTIC_RUN_ID", "zero-gpt-test")
                .args(args);
            c
        })
        .collect();
    let outs = common::run_ranks(commands, Duration::from_secs(240));
    assert!(
        outs[0].contains("2 ranks one process each (Torchrun)"),
        "{}",
        outs[0]
    );
    assert_eq!(
        common::bits_line(&outs[0]),
        want,
        "rank 0 of 2 processes differs from --ranks 2"
    );
    println!("2 processes under torchrun's variables: {want}");
}
