//! Noticing that a peer's process is gone, even when it was killed with `SIGKILL` and
//! nobody has reaped it yet.
//!
//! Each peer is watched through a `pidfd` (`pidfd_open`, Linux 5.3+), opened while the
//! peer is known to be alive (it has just published its pid), so a later reuse of the pid
//! cannot fool the check. A pidfd polls readable once its process has exited, zombie or
//! not. Where `pidfd_open` is refused, the check falls back to `kill(pid, 0)` (gone:
//! `ESRCH`) and `/proc/<pid>/stat` (state `Z` or `X`: exited, not yet reaped). A peer in
//! another pid namespace (its pid means nothing here) is not watched: a wait on it ends at
//! the timeout instead.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The inode of this process's pid namespace (0 if unknown).
pub(crate) fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m))
}

/// One watched peer process.
#[derive(Debug)]
pub(crate) struct Peer {
    pid: u32,
    how: How,
}

#[derive(Debug)]
enum How {
    Pidfd(OwnedFd),
    Pid,
    /// Another pid namespace (or no pid): never reported dead.
    Unwatched,
    /// Already found dead.
    Dead,
}

impl Peer {
    /// Starts watching `pid`, whose pid namespace inode is `ns` (0: unknown).
    pub fn new(pid: u32, ns: u64) -> Peer {
        let mine = pid_namespace();
        let Ok(raw) = libc::pid_t::try_from(pid) else {
            return Peer {
                pid,
                how: How::Unwatched,
            };
        };
        if pid == 0 || (ns != 0 && mine != 0 && ns != mine) {
            return Peer {
                pid,
                how: How::Unwatched,
            };
        }
        // SAFETY: pidfd_open takes a pid and flags by value and returns a new descriptor
        // or -1; no memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
        let how = if fd >= 0 {
            // SAFETY: `fd` is a descriptor the kernel just opened for us and nothing else
            // owns; it fits a c_int since descriptors do.
            How::Pidfd(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
        } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            How::Dead
        } else {
            How::Pid
        };
        Peer { pid, how }
    }

    /// The process id watched.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has exited (however it ended).
    pub fn is_dead(&mut self) -> bool {
        let dead = match &self.how {
            How::Dead => return true,
            How::Unwatched => false,
            How::Pidfd(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: `p` is one valid pollfd on the stack for the call; timeout 0
                // makes the call return at once.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0
            }
            How::Pid => pid_gone(self.pid),
        };
        if dead {
            self.how = How::Dead;
        }
        dead
    }
}

/// `pid` no longer runs: no such process, or a zombie.
fn pid_gone(pid: u32) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let r = unsafe { libc::kill(raw, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|at| stat[at + 1..].split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    #[test]
    fn a_killed_child_is_dead_before_it_is_reaped() {
        let Ok(mut child) = Command::new("sleep").arg("30").spawn() else {
            eprintln!("no `sleep` here: skipped");
            return;
        };
        let mut by_fd = Peer::new(child.id(), pid_namespace());
        assert!(!by_fd.is_dead());
        assert!(!pid_gone(child.id()));
        assert!(child.kill().is_ok());
        // Not reaped yet: a zombie.
        let t0 = Instant::now();
        while !(by_fd.is_dead() && pid_gone(child.id())) {
            assert!(t0.elapsed() < Duration::from_secs(5), "never seen dead");
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.wait();
        let mut me = Peer::new(std::process::id(), 0);
        assert!(!me.is_dead());
        let mut other_ns = Peer::new(std::process::id(), pid_namespace().wrapping_add(1));
        assert!(!other_ns.is_dead());
        assert_eq!(me.pid(), std::process::id());
    }
}
