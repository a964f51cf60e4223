//! Helpers shared by the tests that run the training example as a user does.

use std::path::PathBuf;

/// The example binary `cargo test` built beside the running test (run the whole test
/// command: a run filtered to one test file does not rebuild the example).
#[allow(dead_code)] // not every test file that includes this runs the train example
pub fn example() -> Option<PathBuf> {
    example_named("train")
}

/// The example binary `name` that `cargo test` built beside the running test.
pub fn example_named(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    let path = dir.join("examples").join(name);
    path.is_file().then_some(path)
}

/// Runs `cmd` to completion, killing it after `limit` (a hung example must fail the test,
/// not hang it); its output, or an error saying it was killed.
pub fn output_within(
    cmd: &mut std::process::Command,
    limit: std::time::Duration,
) -> Result<std::process::Output, String> {
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning: {e}"))?;
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().ok_or("no stdout")?;
    let mut err = child.stderr.take().ok_or("no stderr")?;
    let o = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut v);
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut v);
        v
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("killed after {limit:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Ok(std::process::Output {
        status,
        stdout: o.join().unwrap_or_default(),
        stderr: e.join().unwrap_or_default(),
    })
}

/// A TCP port free right now on the loopback interface, for a rendezvous.
#[allow(dead_code)] // not every test file that includes this starts ranks
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Runs one command per rank (each already given its launcher's variables) at once and
/// waits for all, killing any still running after `limit`; each rank's stdout and stderr.
/// Panics naming the rank that failed.
#[allow(dead_code)]
pub fn run_ranks(commands: Vec<std::process::Command>, limit: std::time::Duration) -> Vec<String> {
    let handles: Vec<_> = commands
        .into_iter()
        .map(|mut c| std::thread::spawn(move || output_within(&mut c, limit)))
        .collect();
    handles
        .into_iter()
        .enumerate()
        .map(|(r, h)| {
            let out = h
                .join()
                .expect("rank thread")
                .unwrap_or_else(|e| panic!("rank {r}: {e}"));
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "rank {r} failed:\n{text}");
            text
        })
        .collect()
}

/// A run's `final loss bits` line (what equal runs print equally).
#[allow(dead_code)]
pub fn bits_line(text: &str) -> String {
    text.lines()
        .find(|l| l.starts_with("final loss bits"))
        .unwrap_or_else(|| panic!("no final loss bits in:\n{text}"))
        .to_string()
}
