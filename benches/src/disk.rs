//! The I/O benches' yardsticks: our own `O_DIRECT` probe of the disk (the roofline), and
//! the process's memory (RSS sampled while an operation runs, and `VmHWM`).

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use zero_runtime::io::AlignedBuf;

/// The probe's request size.
pub const BLOCK: usize = 8 << 20;

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
}

/// The process's resident memory now.
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:") * 1024
}

/// The most resident memory the process has had (`VmHWM`).
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:") * 1024
}

/// Runs `f`, sampling RSS every 2 ms; (result, seconds, peak RSS above the start).
pub fn measured<R>(f: impl FnOnce() -> R) -> (R, f64, u64) {
    let start = rss_bytes();
    let peak = AtomicU64::new(start);
    let done = AtomicBool::new(false);
    let (r, secs) = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_bytes(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let t = Instant::now();
        let r = f();
        let secs = t.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        (r, secs)
    });
    let peak = peak.load(Ordering::Relaxed).max(rss_bytes());
    (r, secs, peak.saturating_sub(start))
}

/// The roofline: `bytes` written (then `fsync`ed) and read back with `O_DIRECT` in
/// [`BLOCK`] requests, `threads` at a time over disjoint stripes; (write, read) bytes/s.
pub fn probe(dir: &Path, bytes: u64, threads: usize) -> (f64, f64) {
    let threads = threads.max(1) as u64;
    let blocks = (bytes / BLOCK as u64).max(threads);
    let bytes = blocks * BLOCK as u64;
    let path = dir.join("probe.bin");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .expect("O_DIRECT (this folder's file system must support it)");
    let run = |write: bool| {
        let t = Instant::now();
        std::thread::scope(|s| {
            for k in 0..threads {
                let f = &f;
                s.spawn(move || {
                    let mut buf = AlignedBuf::new(BLOCK);
                    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
                        *b = (i * 7 % 251) as u8;
                    }
                    let mut i = k;
                    while i < blocks {
                        let at = i * BLOCK as u64;
                        if write {
                            f.write_all_at(buf.as_slice(), at).expect("write");
                        } else {
                            f.read_exact_at(buf.as_mut_slice(), at).expect("read");
                        }
                        i += threads;
                    }
                });
            }
        });
        if write {
            f.sync_all().expect("fsync");
        }
        bytes as f64 / t.elapsed().as_secs_f64()
    };
    let write = run(true);
    let read = run(false);
    drop(f);
    let _ = std::fs::remove_file(&path);
    (write, read)
}

/// The roofline of a read-and-write pattern (the NVMe step reads block i+1 while block
/// i−1 is written): `bytes` written first, then its first half read by `threads` threads
/// while as many others rewrite its second half, all with `O_DIRECT` in [`BLOCK`]
/// requests; the bytes moved per second, reads and writes together.
pub fn probe_mixed(dir: &Path, bytes: u64, threads: usize) -> f64 {
    let threads = threads.max(1) as u64;
    let half = (bytes / 2 / BLOCK as u64).max(threads);
    let path = dir.join("probe-mixed.bin");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .expect("O_DIRECT (this folder's file system must support it)");
    let pass = |write_all: bool| {
        std::thread::scope(|s| {
            for k in 0..threads {
                for writer in [false, true] {
                    let f = &f;
                    s.spawn(move || {
                        let mut buf = AlignedBuf::new(BLOCK);
                        buf.as_mut_slice().fill(k as u8 + 1);
                        let (write, base) = match (write_all, writer) {
                            (true, w) => (true, if w { half } else { 0 }),
                            (false, w) => (w, if w { half } else { 0 }),
                        };
                        let mut i = k;
                        while i < half {
                            let at = (base + i) * BLOCK as u64;
                            if write {
                                f.write_all_at(buf.as_slice(), at).expect("write");
                            } else {
                                f.read_exact_at(buf.as_mut_slice(), at).expect("read");
                            }
                            i += threads;
                        }
                    });
                }
            }
        });
    };
    pass(true);
    f.sync_all().expect("fsync");
    let t = Instant::now();
    pass(false);
    f.sync_all().expect("fsync");
    let bw = (2 * half * BLOCK as u64) as f64 / t.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&path);
    bw
}

/// `bytes/s` as GB/s.
pub fn gbs(bytes_per_s: f64) -> String {
    format!("{:.2} GB/s", bytes_per_s / 1e9)
}
