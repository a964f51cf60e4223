//! Shared by the zero-comm test suites.

pub mod meeting;
pub mod sweep;

/// Runs `f` once per rank, each on its own thread; returns the results in rank order.
#[allow(dead_code)] // not every suite uses it
pub fn run_ranks<C: Send, R: Send>(comms: Vec<C>, f: impl Fn(C) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// A TCP port free right now on the loopback interface, for a rendezvous.
#[allow(dead_code)] // not every suite uses it
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Starts rank `rank` of `world` as a child process of this test binary running the
/// ignored test `entry` with `ZERO_SHM_CASE=case` (1 KiB windows); `extra` adds or
/// overrides variables.
#[allow(dead_code)] // not every suite uses it
pub fn spawn_shm_rank(
    entry: &str,
    case: &str,
    rank: usize,
    world: usize,
    port: u16,
    extra: &[(&str, String)],
) -> std::process::Child {
    use std::process::{Command, Stdio};
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args([
        "--ignored",
        "--exact",
        entry,
        "--nocapture",
        "--test-threads=1",
    ])
    .env("ZERO_SHM_CASE", case)
    .env("ZERO_SHM_WINDOW", "1024")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for k in zero_comm::launch::LAUNCH_VARIABLES {
        c.env_remove(k);
    }
    for (k, v) in zero_comm::launch::LaunchEnv::local(rank, world, port).vars() {
        c.env(k, v);
    }
    for (k, v) in extra {
        c.env(k, v);
    }
    c.spawn().expect("start a rank")
}

/// The line a child rank printed after `tag`.
#[allow(dead_code)] // not every suite uses it
pub fn line<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.find(tag).map(|at| l[at + tag.len()..].trim()))
}
