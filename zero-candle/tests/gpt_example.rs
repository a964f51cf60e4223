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
