//! File-system calls the standard library does not offer, behind safe functions: space
//! preallocation, free space, and the locked-memory limit (for pinned buffers).

use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Reserves `len` bytes for `file` on disk (`posix_fallocate`), so later writes cannot
/// fail for lack of space and the blocks are allocated up front.
pub fn preallocate(file: &std::fs::File, len: u64) -> std::io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "length too large"))?;
    // SAFETY: the descriptor belongs to `file`, which outlives the call; posix_fallocate
    // only takes integers.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// Bytes available to an unprivileged user on the file system holding `path`
/// (`statvfs`: `f_bavail × f_frsize`).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: all-zero bits are a valid statvfs (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path alive for the call; `st` is a live local the
    // call fills.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// The process's locked-memory limit (`RLIMIT_MEMLOCK`, soft), in bytes; `None` when
/// unlimited.
pub fn memlock_limit() -> std::io::Result<Option<u64>> {
    // SAFETY: all-zero bits are a valid rlimit (two integers).
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a live local the call fills.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preallocation_free_space_and_the_memlock_limit() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("zero-fs-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        preallocate(&f, 1 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
        let _ = std::fs::remove_file(&path);
        assert!(free_bytes(&dir).unwrap() > 0);
        assert!(free_bytes(Path::new("/nonexistent-zero")).is_err());
        let _ = memlock_limit().unwrap();
    }
}
