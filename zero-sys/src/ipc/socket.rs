//! Unix-socket helpers: passing a file descriptor (`SCM_RIGHTS`), and the peer's
//! credentials (`SO_PEERCRED`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Who is at the other end of a Unix socket, as the kernel saw it connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Process id (in this process's pid namespace; 0 if it has none here).
    pub pid: u32,
    /// User id.
    pub uid: u32,
}

/// The credentials of `sock`'s peer.
pub fn peer_credentials(sock: &UnixStream) -> io::Result<PeerCredentials> {
    // SAFETY: all-zero bits are a valid ucred.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the live local `cred`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCredentials {
        pid: cred.pid.max(0) as u32,
        uid: cred.uid,
    })
}

/// Room for one descriptor in a control message.
const CMSG_SPACE: usize = 64;

/// Sends `data` (at least one byte) with `fd` attached.
pub fn send_with_fd(sock: &UnixStream, data: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    if data.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty message"));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut control = [0u8; CMSG_SPACE];
    // SAFETY: all-zero bits are a valid msghdr; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen =
        unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as _;
    // SAFETY: the control buffer is large enough for one int (CMSG_SPACE above is at most
    // 64 bytes); CMSG_FIRSTHDR points into it and CMSG_DATA into the header's payload.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd.as_raw_fd());
    }
    // SAFETY: msg points at live locals (iov, data, control) for the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if (n as usize) < data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and the descriptor sent with them, if any.
pub fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u8; CMSG_SPACE];
    // SAFETY: all-zero bits are a valid msghdr; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() as _;
    // SAFETY: msg points at live locals; MSG_CMSG_CLOEXEC marks received descriptors
    // close-on-exec.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: walks the control messages the kernel wrote into `control`, within
    // msg_controllen; an SCM_RIGHTS payload holds ints, each a new descriptor now owned
    // by this process.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                let owned = OwnedFd::from_raw_fd(raw);
                if fd.is_none() {
                    fd = Some(owned);
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n as usize, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_crosses_a_socket_pair_with_its_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let (map, fd) = crate::ipc::SharedMapping::create("zero-test", 4096).unwrap();
        map.write(0, b"xyz");
        send_with_fd(&a, b"hi", fd.as_fd()).unwrap();
        let mut buf = [0u8; 8];
        let (n, got) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi");
        let other = crate::ipc::SharedMapping::map(got.unwrap().as_fd(), 4096).unwrap();
        let mut x = [0u8; 3];
        other.read(0, &mut x);
        assert_eq!(&x, b"xyz");
        let me = peer_credentials(&a).unwrap();
        assert_eq!(me.pid, std::process::id());
    }
}
