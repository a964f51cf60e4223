//! Futexes on words that may be shared between processes (no `FUTEX_PRIVATE_FLAG`: the
//! kernel keys a shared futex by the page, so two mappings of one memfd wait on one word).

use std::io;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, until woken or `timeout` passes. Returns at once when
/// the word already differs; spurious returns are possible, so callers re-check.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> io::Result<()> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT reads the aligned u32 at `word` (an AtomicU32, alive for the
    // call) and the optional relative timeout; the other arguments are unused.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ETIMEDOUT) => Ok(()),
        _ => Err(e),
    }
}

/// Wakes up to `n` sleepers on `word`; returns how many woke.
pub fn futex_wake(word: &AtomicU32, n: i32) -> usize {
    // SAFETY: FUTEX_WAKE only uses the address as a key; the word is alive.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    rc.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_sleeper_wakes_on_a_change_and_times_out_without_one() {
        let w = Arc::new(AtomicU32::new(0));
        let t0 = Instant::now();
        futex_wait(&w, 0, Some(Duration::from_millis(20))).unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(15));
        // A stale expectation returns at once.
        futex_wait(&w, 5, Some(Duration::from_secs(10))).unwrap();
        let w2 = w.clone();
        let h = std::thread::spawn(move || {
            while w2.load(Ordering::SeqCst) == 0 {
                futex_wait(&w2, 0, Some(Duration::from_secs(10))).unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(10));
        w.store(1, Ordering::SeqCst);
        futex_wake(&w, i32::MAX);
        h.join().unwrap();
    }
}
