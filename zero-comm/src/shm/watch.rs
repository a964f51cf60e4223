//! Noticing that a peer's process is gone.
//!
//! Each rank runs one watcher thread that sleeps in `poll` on a `pidfd` per peer (readable
//! once that process has exited, however it ended: `SIGKILL` included) and on an
//! `eventfd` that stops it. When a peer exits, the watcher records the abort in the
//! segment — the peer left (it dropped its communicator first) or died — and rings the
//! bell, so every rank's wait ends at once with an error naming it. It costs nothing while
//! all is well. Where `pidfd_open` is missing (Linux before 5.3) or a peer is in another
//! pid namespace, that peer is not watched and a wait on it ends at the timeout instead.

use super::segment::{Cause, Segment};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use zero_sys::ipc::{pidfd_open, poll_readable, EventFd};

/// The inode of this process's pid namespace (0 if unknown).
pub(crate) fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m))
}

/// A running watcher; dropping it stops the thread.
pub(crate) struct Watcher {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    /// Ranks that could not be watched, and why (for the group's notes).
    pub unwatched: Vec<(usize, String)>,
}

impl Watcher {
    /// Watches every peer of `me` whose pid is in the segment.
    pub fn start(seg: Arc<Segment>, me: usize, world: usize) -> std::io::Result<Watcher> {
        let stop = Arc::new(EventFd::new()?);
        let ns = pid_namespace();
        let mut fds: Vec<(usize, OwnedFd)> = Vec::new();
        let mut unwatched = Vec::new();
        for r in (0..world).filter(|&r| r != me) {
            let pid = seg.pid(r).load(Ordering::Acquire);
            if seg.pid_namespace(r).load(Ordering::Acquire) != ns || ns == 0 {
                unwatched.push((r, "another pid namespace".to_string()));
                continue;
            }
            match pidfd_open(pid) {
                Ok(fd) => fds.push((r, fd)),
                Err(e) => unwatched.push((r, format!("pidfd_open({pid}): {e}"))),
            }
        }
        let thread = if fds.is_empty() {
            None
        } else {
            let stop2 = stop.clone();
            Some(
                std::thread::Builder::new()
                    .name("zero-shm-watch".into())
                    .spawn(move || watch(&seg, &fds, &stop2))?,
            )
        };
        Ok(Watcher {
            stop,
            thread,
            unwatched,
        })
    }
}

fn watch(seg: &Segment, fds: &[(usize, OwnedFd)], stop: &EventFd) {
    let mut all: Vec<BorrowedFd<'_>> = fds.iter().map(|(_, f)| f.as_fd()).collect();
    all.push(stop.as_fd());
    let Ok(ready) = poll_readable(&all, None) else {
        return;
    };
    if ready.last() == Some(&true) {
        return;
    }
    if let Some(&(rank, _)) = fds.iter().zip(&ready).find(|(_, r)| **r).map(|(f, _)| f) {
        let left = seg.left(rank).load(Ordering::Acquire);
        let cause = if left != 0 { Cause::Left } else { Cause::Died };
        seg.abort(cause, rank, 0, "");
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.stop.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
