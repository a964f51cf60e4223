//! A crash never loses the last good checkpoint:
//! - a child process trains and saves every step (re-saving the same tags on each run),
//!   and is killed with SIGKILL at random moments, eight times; after each kill, `latest`
//!   loads, and its state is bit for bit the state of an uninterrupted run at the step its
//!   manifest names;
//! - a save on a full disk (a file-size limit, `prlimit --fsize`, in a child process)
//!   fails with an error naming the file, and the previous checkpoint stays `latest`.
//!
//! The children are this test binary re-run on an ignored helper test; their number and
//! time are bounded and each is killed and reaped.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zero_runtime::LoadOptions;
use zero_tests::{
    dataset, full_params, mlp_config, run_ranks, seed, test_name, train_step, MICRO_BATCH,
};

const WORLD: usize = 2;
const MAX_STEPS: usize = 400;
const SEED: u64 = 41;

fn cfg() -> String {
    mlp_config(2, "bf16", 1, 0.5, false)
}

fn data() -> Vec<(Vec<f32>, Vec<f32>)> {
    dataset(SEED, MAX_STEPS * WORLD * MICRO_BATCH)
}

type Snapshot = (Vec<u32>, Vec<zero_runtime::StatePiece>, (u64, u64, u64));

fn snapshot<C: zero_comm::Communicator, D: zero_runtime::Device<Buffer = C::Buffer>>(
    e: &mut zero_runtime::Engine<C, D>,
) -> Snapshot {
    let p = full_params(e).expect("params");
    (
        p.iter().flatten().flatten().map(|x| x.to_bits()).collect(),
        e.optimizer_state().expect("state"),
        e.step_counts(),
    )
}

fn child(mode: &str, dir: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args(["--ignored", "--exact"])
        .arg(test_name(module_path!(), "crash_child"))
        .args(["--nocapture", "--test-threads=1"])
        .env("ZERO_CRASH_MODE", mode)
        .env("ZERO_CRASH_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The child: `save` trains and saves every step until killed; `full` loads `latest`,
/// trains a step and tries to save (under a file-size limit), printing the error.
#[test]
#[ignore = "run by the crash tests in child processes"]
fn crash_child() {
    let (Ok(mode), Some(dir)) = (
        std::env::var("ZERO_CRASH_MODE"),
        std::env::var_os("ZERO_CRASH_DIR"),
    ) else {
        return;
    };
    let dir = Path::new(&dir);
    let data = data();
    run_ranks(WORLD, &cfg(), SEED, |e| {
        if mode == "full" {
            e.load_checkpoint(dir, None, LoadOptions::default())
                .expect("load");
            let (_, _, step) = e.step_counts();
            train_step(e, &data, step as usize, None).expect("step");
            // A client state that makes the manifest larger than the file-size limit.
            let big = json!({"notes": "x".repeat(10_000)});
            let err = e
                .save_checkpoint(dir, None, big)
                .expect_err("the disk is full");
            if e.rank() == 0 {
                println!("SAVE FAILED: {err}");
            }
            return;
        }
        for s in 0..MAX_STEPS {
            train_step(e, &data, s, None).expect("step");
            e.save_checkpoint(dir, None, json!({"step": s + 1}))
                .expect("save");
        }
    });
}

fn kill(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// The step `latest` names, read from its manifest (`None` before the first save).
fn latest_step(dir: &Path) -> Option<u64> {
    let tag = std::fs::read_to_string(dir.join("latest")).ok()?;
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(tag.trim()).join("manifest.json")).ok()?)
            .ok()?;
    m["steps"]["global"].as_u64()
}

/// Loads `latest` into fresh engines.
fn load_latest(dir: &Path) -> (Snapshot, serde_json::Value) {
    let out = run_ranks(WORLD, &cfg(), SEED ^ 1, |e| {
        let client = e
            .load_checkpoint(dir, None, LoadOptions::default())
            .expect("latest loads");
        (snapshot(e), client)
    });
    let client = out[0].1.clone();
    let snaps: Vec<Snapshot> = out.into_iter().map(|o| o.0).collect();
    (merge(snaps), client)
}

/// One snapshot of all ranks: parameters (equal on every rank), every rank's state.
fn merge(snaps: Vec<Snapshot>) -> Snapshot {
    let mut it = snaps.into_iter();
    let (p, mut state, counts) = it.next().expect("a rank");
    for (q, s, c) in it {
        assert!(q == p && c == counts, "ranks disagree");
        state.extend(s);
    }
    (p, state, counts)
}

/// The uninterrupted run's snapshot after each step in `wanted`.
fn reference(wanted: &[u64]) -> Vec<(u64, Snapshot)> {
    let last = wanted.iter().copied().max().unwrap_or(0) as usize;
    let data = data();
    let per_rank = run_ranks(WORLD, &cfg(), SEED, |e| {
        let mut out = Vec::new();
        for s in 0..last {
            train_step(e, &data, s, None).expect("step");
            if wanted.contains(&(s as u64 + 1)) {
                out.push((s as u64 + 1, snapshot(e)));
            }
        }
        out
    });
    let mut merged = Vec::new();
    for i in 0..per_rank[0].len() {
        let step = per_rank[0][i].0;
        merged.push((
            step,
            merge(per_rank.iter().map(|r| r[i].1.clone()).collect()),
        ));
    }
    merged
}

#[test]
fn kill_9_at_random_moments_never_loses_latest() {
    let seed = seed("checkpoint crash");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let started = Instant::now();
    let mut checks: Vec<(u64, Snapshot)> = Vec::new();
    for round in 0..8 {
        let c = child("save", &dir).spawn().expect("spawn");
        // Let the first run save at least once, then kill at a random moment.
        let deadline = Instant::now() + Duration::from_secs(60);
        while round == 0 && latest_step(&dir).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(5..700)));
        kill(c);
        let step = latest_step(&dir).expect("latest names a complete checkpoint");
        let (snap, client) = load_latest(&dir);
        assert_eq!(client, json!({"step": step}), "round {round}");
        assert_eq!(snap.2 .2, step, "round {round}");
        println!("round {round}: killed; latest = step {step}, loads");
        checks.push((step, snap));
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the crash test took too long"
        );
    }
    let wanted: Vec<u64> = checks.iter().map(|c| c.0).collect();
    for (step, want) in reference(&wanted) {
        for (s, got) in checks.iter().filter(|c| c.0 == step) {
            assert!(
                *got == want,
                "latest at step {s} is not the uninterrupted run's state (seed {seed})"
            );
        }
    }
    // Nothing half-written is left to be mistaken for data: temporary files only.
    let tags = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .count();
    println!("{tags} tags on disk after 8 kills");
}

#[test]
fn a_full_disk_fails_the_save_and_keeps_latest() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        println!("SKIPPED full-disk test: prlimit (util-linux) is not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    // One good checkpoint, at step 2.
    let data = data();
    run_ranks(WORLD, &cfg(), SEED, |e| {
        for s in 0..2 {
            train_step(e, &data, s, None).expect("step");
        }
        e.save_checkpoint(&dir, None, json!({"step": 2}))
            .expect("save");
    });
    let exe = std::env::current_exe().unwrap();
    // Files cannot grow past 4096 bytes (the manifest will be larger: the child saves a
    // 10 kB client state); SIGXFSZ is ignored, so
    // the write comes up short or fails rather
    // than killing the process.
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(format!(
            "trap '' XFSZ; exec prlimit --fsize=4096 {} --ignored --exact {} --nocapture --test-threads=1",
            exe.display(),
            test_name(module_path!(), "crash_child")
        ))
        .env("ZERO_CRASH_MODE", "full")
        .env("ZERO_CRASH_DIR", &dir);
    let out = c.output().expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains("SAVE FAILED"))
        .expect("the child's error");
    println!("{line}");
    assert!(
        line.contains(&dir.join("global_step3").display().to_string())
            && (line.contains("disk is full") || line.contains("too large")),
        "{line}"
    );
    assert_eq!(latest_step(&dir), Some(2));
    let (snap, client) = load_latest(&dir);
    assert_eq!(client, json!({"step": 2}));
    let want = reference(&[2]).remove(0).1;
    assert!(
        snap == want,
        "the previous checkpoint does not load as it was saved"
    );
}
