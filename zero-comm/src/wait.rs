//! Waiting for other ranks without taking a core another rank needs.
//!
//! A waiter first polls its condition in a spin loop, for at most [`spin_budget`]: the
//! fastest hand-off when every rank has a core of its own. Then it sleeps on a futex
//! (`bell`), which every rank that changes the state rings. When there are more ranks
//! than cores the budget is zero: a spinning waiter would hold the core the rank it waits
//! for needs (the scheduler's slice is over a millisecond), so waiters yield the core a
//! few times and then sleep. The bell word is read before the condition is checked, so a
//! ring between the check and the sleep makes the sleep return at once: no wake-up is
//! lost. Sleeps are cut into slices of at most [`SLICE`] so the deadline is kept even if a
//! wake-up were missed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use zero_sys::ipc::{futex_wait, futex_wake};

/// The longest single sleep.
pub(crate) const SLICE: Duration = Duration::from_millis(100);

/// How long a waiter spins before it sleeps, for `ranks` ranks on this machine:
/// `ZERO_SPIN_US` if set; else 50 µs when every rank can have a core, 0 otherwise.
pub(crate) fn spin_budget(ranks: usize) -> Duration {
    if let Some(us) = std::env::var("ZERO_SPIN_US")
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

/// A futex word that state changes ring, and the count of ranks asleep on it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bell<'a> {
    pub word: &'a AtomicU32,
    pub sleepers: &'a AtomicU32,
}

impl Bell<'_> {
    /// Tells every waiter the state changed (call after publishing the change).
    pub fn ring(&self) {
        self.word.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake(self.word, i32::MAX);
        }
    }

    /// Polls `ready` until it returns `Some` (its value is returned) or `deadline` passes
    /// (`None`), spinning for `spin` first.
    pub fn wait<R>(
        &self,
        spin: Duration,
        deadline: Instant,
        mut ready: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        if let Some(r) = ready() {
            return Some(r);
        }
        if !spin.is_zero() {
            let start = Instant::now();
            loop {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
                if let Some(r) = ready() {
                    return Some(r);
                }
                if start.elapsed() >= spin {
                    break;
                }
            }
        } else {
            for _ in 0..4 {
                std::thread::yield_now();
                if let Some(r) = ready() {
                    return Some(r);
                }
            }
        }
        loop {
            let seen = self.word.load(Ordering::SeqCst);
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let now = Instant::now();
            let r = ready();
            if r.is_some() || now >= deadline {
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                return r;
            }
            // An error here (none is documented for these arguments) only shortens the
            // sleep: the loop re-checks.
            let _ = futex_wait(self.word, seen, Some((deadline - now).min(SLICE)));
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
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
        let none: Option<()> = bell.wait(Duration::ZERO, t0 + Duration::from_millis(30), || None);
        assert!(none.is_none() && t0.elapsed() >= Duration::from_millis(30));
        let (w, s, f) = (word.clone(), sleepers.clone(), flag.clone());
        let h = std::thread::spawn(move || {
            let bell = Bell {
                word: &w,
                sleepers: &s,
            };
            let far = Instant::now() + Duration::from_secs(30);
            bell.wait(Duration::ZERO, far, || {
                f.load(Ordering::SeqCst).then_some(())
            })
        });
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, Ordering::SeqCst);
        bell.ring();
        let t1 = Instant::now();
        assert_eq!(h.join().unwrap(), Some(()));
        assert!(t1.elapsed() < Duration::from_secs(5));
    }
}
