//! Anonymous shared memory: a `memfd` (no name in `/dev/shm`, freed with its last mapping
//! or descriptor), mapped `MAP_SHARED` by every process that holds the descriptor.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A shared mapping of a whole memfd.
///
/// Control words are reached as atomics ([`u32_at`](Self::u32_at),
/// [`u64_at`](Self::u64_at)); data is *copied* in and out ([`write`](Self::write),
/// [`read`](Self::read)), or read in place ([`with_slices`](Self::with_slices)) only for
/// as long as the caller's protocol keeps every writer away, so no Rust reference to
/// bytes another process is writing exists. Which process may write which bytes when is
/// the caller's protocol (zero-comm's shared-memory group orders every access with
/// release/acquire atomics on the control words).
#[derive(Debug)]
pub struct SharedMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with other processes; every access goes
// through atomics or copies (see the type's docs), which are fine from any thread.
unsafe impl Send for SharedMapping {}
// SAFETY: as for Send: `&SharedMapping` only hands out atomics and copies.
unsafe impl Sync for SharedMapping {}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl SharedMapping {
    /// A new memfd of `len` bytes (zeros, with its pages reserved so that running out of
    /// memory is an error here rather than a `SIGBUS` later), mapped; returns the mapping
    /// and the descriptor to hand to the other processes.
    pub fn create(name: &str, len: usize) -> io::Result<(SharedMapping, OwnedFd)> {
        let cname = std::ffi::CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd name has a NUL"))?;
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor.
        let raw = check(unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) })?;
        // SAFETY: `raw` is a new descriptor this process owns and nothing else closes.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mapping too large"))?;
        // SAFETY: plain calls on the descriptor just created.
        check(unsafe { libc::ftruncate(fd.as_raw_fd(), size) })?;
        // SAFETY: as above; reserves the pages (shmem supports fallocate).
        let rc = unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, size) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("reserving {len} bytes of shared memory: {e}"),
            ));
        }
        let map = Self::map(fd.as_fd(), len)?;
        Ok((map, fd))
    }

    /// Maps `len` bytes of the shared memory behind `fd` (which must be at least that long).
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<SharedMapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: all-zero bits are a valid `stat`; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a live local; fd is open.
        check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        if (st.st_size as u64) < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the shared memory holds {} bytes, {len} are needed",
                    st.st_size
                ),
            ));
        }
        // SAFETY: a new shared mapping of an open descriptor at an address the kernel
        // picks; MAP_POPULATE faults every page in now.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null address"))?;
        Ok(SharedMapping { ptr, len })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: mappings are not empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn at(&self, offset: usize, bytes: usize, align: usize) -> *mut u8 {
        assert!(
            offset % align == 0 && offset.checked_add(bytes).is_some_and(|e| e <= self.len),
            "shared mapping access of {bytes} bytes at {offset} (of {}, alignment {align})",
            self.len
        );
        // SAFETY: in bounds, checked above.
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    /// The `u32` control word at `offset` (4-byte aligned, in bounds: a caller's layout
    /// bug panics).
    pub fn u32_at(&self, offset: usize) -> &AtomicU32 {
        let p = self.at(offset, 4, 4);
        // SAFETY: aligned and in bounds; the mapping outlives the borrow, and atomics may
        // alias memory other processes access atomically.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }

    /// The `u64` control word at `offset` (8-byte aligned, in bounds).
    pub fn u64_at(&self, offset: usize) -> &AtomicU64 {
        let p = self.at(offset, 8, 8);
        // SAFETY: as in u32_at.
        unsafe { AtomicU64::from_ptr(p.cast()) }
    }

    /// Copies `src` into the mapping at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) {
        let p = self.at(offset, src.len(), 1);
        // SAFETY: the destination range is in bounds (checked) and cannot overlap `src`,
        // which is this process's own memory. Other processes do not touch these bytes
        // while the protocol gives them to this one; no reference to them is made.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) }
    }

    /// Copies bytes of the mapping at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        let p = self.at(offset, dst.len(), 1);
        // SAFETY: as in write, with the roles swapped.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) }
    }

    /// Hands `f` the bytes of `ranges` (each in bounds and aligned to `align`) as slices,
    /// read in place instead of copied out.
    ///
    /// The caller's protocol must give these bytes to readers only for the duration of
    /// `f`: no process (this one included, through [`write`](Self::write)) writes them
    /// until `f` returns. zero-comm's shared-memory group borrows another rank's window
    /// only between the barrier that published it and this rank's next arrival, before
    /// which its owner cannot write it again.
    pub fn with_slices<R>(
        &self,
        ranges: &[std::ops::Range<usize>],
        align: usize,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> R {
        let slices: Vec<&[u8]> = ranges
            .iter()
            .map(|r| {
                let bytes = r.end.saturating_sub(r.start);
                let p = self.at(r.start, bytes, align);
                // SAFETY: in bounds and aligned (checked in `at`); the mapping outlives
                // the borrow, which ends with `f`; no process writes these bytes meanwhile
                // (the caller's protocol, above).
                unsafe { std::slice::from_raw_parts(p, bytes) }
            })
            .collect();
        f(&slices)
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; no borrow of it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn two_mappings_of_one_memfd_see_each_others_writes() {
        let (a, fd) = SharedMapping::create("zero-test", 8192).unwrap();
        let b = SharedMapping::map(fd.as_fd(), 8192).unwrap();
        a.write(100, b"hello");
        let mut got = [0u8; 5];
        b.read(100, &mut got);
        assert_eq!(&got, b"hello");
        a.u64_at(8).store(7, Ordering::Release);
        assert_eq!(b.u64_at(8).load(Ordering::Acquire), 7);
        // A mapping longer than the memory behind it is refused.
        let e = SharedMapping::map(fd.as_fd(), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("8192"), "{e}");
    }

    #[test]
    fn with_slices_reads_another_mappings_writes_in_place() {
        let (a, fd) = SharedMapping::create("zero-test", 8192).unwrap();
        let b = SharedMapping::map(fd.as_fd(), 8192).unwrap();
        a.write(64, &[1, 2, 3, 4]);
        a.write(4096, &[9; 8]);
        let got = b.with_slices(&[64..68, 4096..4104, 100..100], 4, |s| {
            s.iter().map(|x| x.to_vec()).collect::<Vec<_>>()
        });
        assert_eq!(got, vec![vec![1, 2, 3, 4], vec![9; 8], vec![]]);
    }

    #[test]
    #[should_panic(expected = "shared mapping access")]
    fn with_slices_refuses_a_range_past_the_end() {
        let (a, _fd) = SharedMapping::create("zero-test", 4096).unwrap();
        a.with_slices(&[0..8, 4000..4100], 1, |_| ());
    }

    #[test]
    #[should_panic(expected = "shared mapping access")]
    fn an_access_outside_the_mapping_panics_instead_of_reading_past_it() {
        let (a, _fd) = SharedMapping::create("zero-test", 4096).unwrap();
        a.write(4090, &[0u8; 16]);
    }
}
