//! Benchmarks across processes: the bench binary starts itself once per rank, with the
//! variables torchrun sets and a task in `ZERO_BENCH_TASK`; each rank joins the
//! shared-memory group, runs the task, and rank 0 prints the time it measured.

use std::process::{Command, Stdio};
use std::time::Duration;
use zero_comm::launch::{LaunchEnv, LAUNCH_VARIABLES};

/// The variable that holds a child's task.
pub const TASK: &str = "ZERO_BENCH_TASK";

/// The task this process was started for, if it is a rank of a bench job.
pub fn task() -> Option<String> {
    std::env::var(TASK).ok()
}

/// Runs `task` on `world` processes of this binary; returns the duration rank 0 printed
/// (`ELAPSED_NS <n>`).
pub fn run_job(world: usize, task: &str) -> Duration {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let exe = std::env::current_exe().expect("the bench binary");
    let children: Vec<_> = (0..world)
        .map(|r| {
            let mut c = Command::new(&exe);
            for k in LAUNCH_VARIABLES {
                c.env_remove(k);
            }
            c.envs(LaunchEnv::local(r, world, port).vars())
                .env(TASK, task)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let mut elapsed = None;
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().expect("a rank's output");
        assert!(
            out.status.success(),
            "rank {r} of the bench job `{task}` failed"
        );
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(ns) = text
            .lines()
            .find_map(|l| l.strip_prefix("ELAPSED_NS "))
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            elapsed = Some(Duration::from_nanos(ns));
        }
    }
    elapsed.expect("rank 0 printed no ELAPSED_NS")
}

/// Prints rank 0's measurement for [`run_job`].
pub fn report(rank: usize, elapsed: Duration) {
    if rank == 0 {
        println!("ELAPSED_NS {}", elapsed.as_nanos());
    }
}

/// The `main` of a bench that also runs as a rank: `child` runs this process's task when
/// it was started as one, else the criterion `groups` run.
pub fn bench_main(child: fn(&str), groups: &[fn(&mut criterion::Criterion)]) {
    if let Some(t) = task() {
        child(&t);
        return;
    }
    let mut c = crate::config().configure_from_args();
    for g in groups {
        g(&mut c);
    }
    c.final_summary();
}
