//! Watching other processes: `pidfd_open` (readable once the process has exited), `poll`,
//! and an `eventfd` to wake a poller.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// A descriptor that becomes readable when process `pid` exits (Linux 5.3 and later).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(pid, flags) takes two integers and returns a new descriptor.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as libc::c_int) })
}

/// Waits until one of `fds` is readable (or has hung up), or `timeout` passes (`None`:
/// forever). Returns, for each, whether it is.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
    loop {
        // SAFETY: `pfds` is a live array of `pfds.len()` pollfds.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if rc >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

/// An `eventfd`: [`signal`](Self::signal) makes it readable, which ends a
/// [`poll_readable`] that includes it.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new, unsignalled one.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd(initval, flags) returns a new descriptor.
        let rc = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor this process owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(rc) }))
    }

    /// Makes it readable.
    pub fn signal(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of a live local to the descriptor.
        let rc = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if rc == 8 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The descriptor, for [`poll_readable`].
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_pidfd_turns_readable_when_its_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let fd = pidfd_open(child.id()).unwrap();
        let ev = EventFd::new().unwrap();
        let r = poll_readable(&[fd.as_fd(), ev.as_fd()], Some(Duration::from_millis(1))).unwrap();
        assert_eq!(r, [false, false]);
        let r = poll_readable(&[fd.as_fd(), ev.as_fd()], Some(Duration::from_secs(10))).unwrap();
        assert_eq!(r, [true, false]);
        child.wait().unwrap();
        ev.signal().unwrap();
        let r = poll_readable(&[ev.as_fd()], Some(Duration::from_secs(1))).unwrap();
        assert_eq!(r, [true]);
    }
}
