//! Waiting for other ranks without taking the core they need.
//!
//! A waiter first polls its condition in a spin loop for a short budget
//! ([`spin_budget`]): the fastest hand-off when every rank has a core. Then it sleeps on
//! a futex word in the segment (the [`Bell`]), which every rank rings after it changes
//! the shared state (arrives at a barrier, joins, leaves, aborts). The futex is the
//! shared (not `PRIVATE`) kind, since the word is in memory shared between processes.
//!
//! No wake-up is lost: the waiter reads the bell word before it checks its condition, and
//! the kernel sleeps only while the word still holds that value. Sleeps are cut into
//! slices of at most the caller's `slice`, after each of which the condition is checked
//! again "thoroughly" (the caller then also looks for dead peers and abort flags, which
//! ring no bell), so a deadline, a death or a local abort flag is noticed within a slice.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a waiter spins before it sleeps, for `ranks` ranks on this machine:
/// `ZERO_GPUSIM_SPIN_US` if set; else 50 µs when every rank can have a core, 0 otherwise
/// (a spinning waiter would hold the core the rank it waits for needs).
pub(crate) fn spin_budget(ranks: usize) -> Duration {
    if let Some(us) = std::env::var("ZERO_GPUSIM_SPIN_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        return Duration::from_micros(us);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if ranks <= cores {
        Duration::from_micros(50)
    } else {
        Duration::ZERO
    }
}

/// A futex word that state changes ring, and the number of waiters asleep on it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bell<'a> {
    pub word: &'a AtomicU32,
    pub sleepers: &'a AtomicU32,
}

impl Bell<'_> {
    /// Tells every waiter (in every process) that the state changed. Call it after
    /// publishing the change.
    pub fn ring(&self) {
        self.word.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake_all(self.word);
        }
    }

    /// Polls `ready` until it returns `Some` (returned) or `deadline` passes (`None`).
    /// `ready(thorough)` is called with `thorough = false` while spinning and `true` after
    /// each sleep; the sleeps last at most `slice`.
    pub fn wait<R>(
        &self,
        spin: Duration,
        slice: Duration,
        deadline: Instant,
        mut ready: impl FnMut(bool) -> Option<R>,
    ) -> Option<R> {
        if let Some(r) = ready(true) {
            return Some(r);
        }
        if spin.is_zero() {
            for _ in 0..4 {
                std::thread::yield_now();
                if let Some(r) = ready(false) {
                    return Some(r);
                }
            }
        } else {
            let start = Instant::now();
            while start.elapsed() < spin {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                if let Some(r) = ready(false) {
                    return Some(r);
                }
            }
        }
        loop {
            let seen = self.word.load(Ordering::SeqCst);
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let now = Instant::now();
            let r = ready(true);
            if r.is_some() || now >= deadline {
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                return r;
            }
            futex_wait(self.word, seen, (deadline - now).min(slice));
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Sleeps while `word` holds `expected`, for at most `timeout`, or until woken. Returns
/// early on any wake-up, signal or error: callers re-check their condition.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, 4-byte-aligned `AtomicU32` (in the mapped segment or, in
    // tests, on the heap) for the whole call; `ts` lives on the stack across the call. The
    // shared FUTEX_WAIT (no FUTEX_PRIVATE_FLAG) keys the wait on the physical page, so a
    // waker in another process that maps the same segment finds it. The kernel only reads
    // the word and the timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter sleeping on `word`, in any process.
fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned `AtomicU32` for the call; FUTEX_WAKE only uses its
    // address as the key and touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn a_ring_wakes_a_sleeper_and_the_deadline_ends_a_wait() {
        let (word, sleepers, flag) = (
            Arc::new(AtomicU32::new(0)),
            Arc::new(AtomicU32::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let bell = Bell {
            word: &word,
            sleepers: &sleepers,
        };
        let t0 = Instant::now();
        let none: Option<()> = bell.wait(
            Duration::ZERO,
            Duration::from_millis(10),
            t0 + Duration::from_millis(30),
            |_| None,
        );
        assert!(none.is_none() && t0.elapsed() >= Duration::from_millis(30));
        let (w, s, f) = (word.clone(), sleepers.clone(), flag.clone());
        let h = std::thread::spawn(move || {
            let bell = Bell {
                word: &w,
                sleepers: &s,
            };
            let far = Instant::now() + Duration::from_secs(30);
            // A long slice: only the ring can end this wait early.
            bell.wait(Duration::ZERO, Duration::from_secs(30), far, |_| {
                f.load(Ordering::SeqCst).then_some(())
            })
        });
        std::thread::sleep(Duration::from_millis(50));
        flag.store(true, Ordering::SeqCst);
        let t1 = Instant::now();
        bell.ring();
        assert_eq!(h.join().ok().flatten(), Some(()));
        assert!(t1.elapsed() < Duration::from_secs(5), "{:?}", t1.elapsed());
        assert_eq!(sleepers.load(Ordering::SeqCst), 0);
    }
}
