//! The shared segment: creating, opening, mapping and unlinking it, and its layout.
//!
//! ```text
//! 0        header: magic, layout version, nranks, window bytes, creator rank; the bell
//!          (futex word) and its sleeper count; the smallest nranks any visitor was
//!          given; the abort record (see `record`)
//! 4 KiB    one 1 KiB block per rank: state (free, claimed, ready, left, failed), pid, pid
//!          namespace, barriers arrived at, whether a process joining as it visited, two
//!          descriptor slots (by barrier parity), device key
//! data     per rank, two windows (halves) of `window` bytes: data written for barrier b
//!          goes in half b % 2, and is read only between barriers b and b + 1
//! ```
//!
//! The file is `/dev/shm/zero-gpusim-nccl-<hex>`. Its creator sizes it with
//! `posix_fallocate` (so a full `/dev/shm` is an error now, not a `SIGBUS` later), maps it,
//! writes the header and stores the magic last; an opener maps it once it has its size and
//! reads the header once the magic is there.

use super::desc::{Desc, DESC_WORDS};
use super::wait::Bell;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const MAGIC: u64 = 0x7a67_7075_6e63_636c; // "zgpunccl"
const LAYOUT_VERSION: u32 = 1;
pub(crate) const HEADER: usize = 4096;
const BLOCK: usize = 1024;
const PAGE: usize = 4096;
/// The most ranks a segment holds.
pub(crate) const MAX_RANKS: usize = 4096;
/// The longest device key, in bytes.
pub(crate) const MAX_KEY: usize = 512;

// Header offsets.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_NRANKS: usize = 12;
const H_WINDOW: usize = 16;
const H_CREATOR: usize = 24;
const H_BELL: usize = 32;
const H_SLEEPERS: usize = 36;
const H_MIN_NRANKS: usize = 40;
/// Where the abort record starts (its layout is `record`'s).
pub(crate) const H_RECORD: usize = 64;

// Block offsets.
const B_STATE: usize = 0;
const B_PID: usize = 4;
const B_PIDNS: usize = 8;
const B_ARRIVE: usize = 16;
const B_VISITED: usize = 24;
const B_DESC: usize = 64;
const DESC_SLOT: usize = 64;
const B_KEY_LEN: usize = 192;
const B_KEY: usize = 256;

// The block's fields do not overlap and fit.
const _: () = assert!(B_VISITED + 4 <= B_DESC);
const _: () = assert!(8 + 8 * DESC_WORDS <= DESC_SLOT);
const _: () = assert!(B_DESC + 2 * DESC_SLOT <= B_KEY_LEN);
const _: () = assert!(B_KEY + MAX_KEY <= BLOCK);
const _: () = assert!(H_MIN_NRANKS + 4 <= H_RECORD);

/// A rank's block state.
pub(crate) mod state {
    /// Nobody has claimed the rank.
    pub const FREE: u32 = 0;
    /// A process claimed it and is writing its block.
    pub const CLAIMED: u32 = 1;
    /// The rank has joined.
    pub const READY: u32 = 2;
    /// The rank destroyed its communicator.
    pub const LEFT: u32 = 3;
    /// The rank's join failed after it claimed the rank.
    pub const FAILED: u32 = 4;
}

/// The path of the segment called `name`.
pub(crate) fn path_of(name: &str) -> String {
    format!("/dev/shm/{name}")
}

/// Where the data windows start for `nranks` ranks.
fn data_start(nranks: usize) -> usize {
    (HEADER + nranks * BLOCK).div_ceil(PAGE) * PAGE
}

/// The bytes a segment of `nranks` ranks with `window`-byte windows takes.
pub(crate) fn segment_bytes(nranks: usize, window: usize) -> usize {
    data_start(nranks) + nranks * 2 * window
}

/// A shared, writable mapping of a whole file; unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with other processes anyway; every access
// goes through atomics or raw copies whose ordering the barrier protocol provides, so
// using it from several threads is no different from using it from several processes.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: `&Mapping` only offers atomics and raw copies.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize) -> std::io::Result<Mapping> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "empty file",
            ));
        }
        // SAFETY: a fresh mapping at an address the kernel picks, of a descriptor we hold
        // open for the call; the result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        NonNull::new(p.cast::<u8>())
            .map(|ptr| Mapping { ptr, len })
            .ok_or_else(|| std::io::Error::other("mmap returned null"))
    }

    fn check(&self, off: usize, len: usize, align: usize) {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.len) && off % align == 0,
            "segment access out of bounds: {len} bytes at {off} of {}",
            self.len
        );
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4, 4);
        // SAFETY: in bounds and aligned (checked; the mapping is page-aligned); the memory
        // lives as long as `self`; AtomicU32 has u32's layout, and every process touches
        // these words only atomically.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8, 8);
        // SAFETY: as in `u32_at`, for an 8-byte word at an 8-aligned offset.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len(), 1);
        // SAFETY: the destination range is in bounds (checked) and cannot overlap `src`,
        // which is local memory of this process (the segment is never handed out as a
        // slice). No one reads the range meanwhile: the barrier protocol gives a window
        // half to its owner for writing between the barriers where others don't read it.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        };
    }

    fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len(), 1);
        // SAFETY: the source range is in bounds (checked) and cannot overlap `dst` (local
        // memory); its owner does not write it until this rank arrives at the next
        // barrier (the protocol), and any byte pattern is acceptable in `dst`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are exactly what mmap returned and nothing borrowed from
        // the mapping outlives `self` (borrows of its atomics are tied to `&self`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A mapped segment.
#[derive(Debug)]
pub(crate) struct Segment {
    map: Mapping,
    nranks: usize,
    window: usize,
    creator: usize,
}

impl Segment {
    /// Sizes a freshly created, empty file for `nranks` ranks with `window`-byte windows,
    /// maps it and writes the header, the magic last.
    pub fn format(
        file: &File,
        nranks: usize,
        window: usize,
        creator: usize,
    ) -> std::io::Result<Segment> {
        let len = segment_bytes(nranks, window);
        let off = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
        // SAFETY: plain syscall on a descriptor we hold; no memory is passed.
        let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, off) };
        if r != 0 {
            return Err(std::io::Error::from_raw_os_error(r));
        }
        let map = Mapping::new(file, len)?;
        map.u64_at(H_WINDOW).store(window as u64, Ordering::Relaxed);
        map.u32_at(H_NRANKS).store(nranks as u32, Ordering::Relaxed);
        map.u32_at(H_CREATOR)
            .store(creator as u32, Ordering::Relaxed);
        map.u32_at(H_MIN_NRANKS)
            .store(nranks as u32, Ordering::Relaxed);
        map.u32_at(H_VERSION)
            .store(LAYOUT_VERSION, Ordering::Relaxed);
        map.u64_at(H_MAGIC).store(MAGIC, Ordering::Release);
        Ok(Segment {
            map,
            nranks,
            window,
            creator,
        })
    }

    /// Maps a file another rank created: `Ok(None)` while its creator has not finished
    /// the header yet, `Err` (with what is wrong) if it is not a segment of this layout.
    pub fn open(file: &File) -> Result<Option<Segment>, String> {
        let len = file
            .metadata()
            .map_err(|e| format!("reading its size: {e}"))?
            .len();
        let len = usize::try_from(len).map_err(|e| format!("size {len}: {e}"))?;
        if len < HEADER {
            return Ok(None);
        }
        let map = Mapping::new(file, len).map_err(|e| format!("mapping {len} bytes: {e}"))?;
        if map.u64_at(H_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Ok(None);
        }
        let version = map.u32_at(H_VERSION).load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            return Err(format!(
                "layout version {version}, this engine has {LAYOUT_VERSION}"
            ));
        }
        let nranks = map.u32_at(H_NRANKS).load(Ordering::Relaxed) as usize;
        let window = usize::try_from(map.u64_at(H_WINDOW).load(Ordering::Relaxed))
            .map_err(|e| format!("window: {e}"))?;
        let creator = map.u32_at(H_CREATOR).load(Ordering::Relaxed) as usize;
        if nranks == 0 || nranks > MAX_RANKS || window == 0 || window % 64 != 0 {
            return Err(format!(
                "a header with nranks={nranks}, window={window} bytes"
            ));
        }
        let need = segment_bytes(nranks, window);
        if len < need {
            return Err(format!("{len} bytes, {need} needed for its header"));
        }
        Ok(Some(Segment {
            map,
            nranks,
            window,
            creator,
        }))
    }

    /// The world size the creator wrote.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Bytes per window half.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The rank that created the segment.
    pub fn creator(&self) -> usize {
        self.creator
    }

    /// The smallest `nranks` any process joining this segment was given (each lowers it
    /// to its own when it visits).
    pub fn min_nranks(&self) -> &AtomicU32 {
        self.map.u32_at(H_MIN_NRANKS)
    }

    /// The bell every state change rings.
    pub fn bell(&self) -> Bell<'_> {
        Bell {
            word: self.map.u32_at(H_BELL),
            sleepers: self.map.u32_at(H_SLEEPERS),
        }
    }

    /// A 32-bit word of the header (for the abort record).
    pub fn header_u32(&self, off: usize) -> &AtomicU32 {
        assert!(off < HEADER);
        self.map.u32_at(off)
    }

    /// A 64-bit word of the header (for the abort record).
    pub fn header_u64(&self, off: usize) -> &AtomicU64 {
        assert!(off < HEADER);
        self.map.u64_at(off)
    }

    /// Writes bytes into the header (the abort record's text).
    pub fn header_write(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= HEADER);
        self.map.write(off, src);
    }

    /// Reads bytes of the header (the abort record's text).
    pub fn header_read(&self, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= HEADER);
        self.map.read(off, dst);
    }

    fn block(&self, rank: usize) -> usize {
        assert!(rank < self.nranks, "rank {rank} of {}", self.nranks);
        HEADER + rank * BLOCK
    }

    /// `rank`'s block state (see [`state`]).
    pub fn state(&self, rank: usize) -> &AtomicU32 {
        self.map.u32_at(self.block(rank) + B_STATE)
    }

    /// `rank`'s process id (0 until it wrote it).
    pub fn pid(&self, rank: usize) -> &AtomicU32 {
        self.map.u32_at(self.block(rank) + B_PID)
    }

    /// `rank`'s pid namespace (inode; 0 if unknown).
    pub fn pid_namespace(&self, rank: usize) -> &AtomicU64 {
        self.map.u64_at(self.block(rank) + B_PIDNS)
    }

    /// Non-zero once a process joining as `rank` has mapped the segment (whether or not
    /// its join then succeeded).
    pub fn visited(&self, rank: usize) -> &AtomicU32 {
        self.map.u32_at(self.block(rank) + B_VISITED)
    }

    /// The barriers `rank` has arrived at.
    pub fn arrive(&self, rank: usize) -> &AtomicU64 {
        self.map.u64_at(self.block(rank) + B_ARRIVE)
    }

    /// Writes `rank`'s device key (at most [`MAX_KEY`] bytes; the caller checked).
    pub fn set_key(&self, rank: usize, key: &str) {
        let key = &key.as_bytes()[..key.len().min(MAX_KEY)];
        self.map.write(self.block(rank) + B_KEY, key);
        self.map
            .u32_at(self.block(rank) + B_KEY_LEN)
            .store(key.len() as u32, Ordering::Relaxed);
    }

    /// `rank`'s device key (read after it is ready).
    pub fn key(&self, rank: usize) -> String {
        let len = (self
            .map
            .u32_at(self.block(rank) + B_KEY_LEN)
            .load(Ordering::Relaxed) as usize)
            .min(MAX_KEY);
        let mut b = vec![0u8; len];
        self.map.read(self.block(rank) + B_KEY, &mut b);
        String::from_utf8_lossy(&b).into_owned()
    }

    fn desc_slot(&self, rank: usize, barrier: u64) -> usize {
        self.block(rank) + B_DESC + (barrier % 2) as usize * DESC_SLOT
    }

    /// Publishes `rank`'s descriptor of its collective `seq` for barrier `barrier`.
    pub fn put_desc(&self, rank: usize, barrier: u64, seq: u64, d: &Desc) {
        let at = self.desc_slot(rank, barrier);
        self.map.u64_at(at).store(seq, Ordering::Relaxed);
        for (i, w) in d.encode().iter().enumerate() {
            self.map.u64_at(at + 8 + 8 * i).store(*w, Ordering::Relaxed);
        }
    }

    /// `rank`'s descriptor for barrier `barrier` (read once the barrier is passed): its
    /// collective number and call, `None` if the words are no descriptor.
    pub fn desc(&self, rank: usize, barrier: u64) -> (u64, Option<Desc>) {
        let at = self.desc_slot(rank, barrier);
        let mut w = [0u64; DESC_WORDS];
        for (i, x) in w.iter_mut().enumerate() {
            *x = self.map.u64_at(at + 8 + 8 * i).load(Ordering::Relaxed);
        }
        (
            self.map.u64_at(at).load(Ordering::Relaxed),
            Desc::decode(&w),
        )
    }

    /// Byte offset of `rank`'s window half for barrier `barrier`.
    pub fn window_at(&self, rank: usize, barrier: u64) -> usize {
        assert!(rank < self.nranks);
        data_start(self.nranks) + (rank * 2 + (barrier % 2) as usize) * self.window
    }

    /// Copies `src` into the segment at `off` (inside a window).
    pub fn write(&self, off: usize, src: &[u8]) {
        self.map.write(off, src);
    }

    /// Copies the segment's bytes at `off` (inside a window) into `dst`.
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        self.map.read(off, dst);
    }
}

/// Removes the segment's name (`NotFound` is fine: another rank did it).
pub(crate) fn unlink(path: &str) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::desc::{CallKind, Desc};
    use super::super::DType;
    use super::*;

    #[test]
    fn windows_and_blocks_fit_without_overlap() {
        for nranks in [1, 2, 3, 8, 100] {
            let window = 4096;
            let total = segment_bytes(nranks, window);
            assert!(data_start(nranks) >= HEADER + nranks * BLOCK);
            assert_eq!(data_start(nranks) % PAGE, 0);
            assert_eq!(data_start(nranks) + nranks * 2 * window, total);
        }
    }

    #[test]
    fn a_formatted_segment_opens_with_its_header_and_descriptors() {
        let Ok(file) = tempfile::tempfile() else {
            return;
        };
        let seg = Segment::format(&file, 3, 8192, 1).expect("format");
        let other = Segment::open(&file).expect("open").expect("ready");
        assert_eq!(
            (other.nranks(), other.window(), other.creator()),
            (3, 8192, 1)
        );
        let d = Desc {
            kind: CallKind::Broadcast,
            count: 77,
            dtype: DType::BF16,
            op: None,
            root: Some(2),
        };
        seg.put_desc(2, 5, 9, &d);
        assert_eq!(other.desc(2, 5), (9, Some(d)));
        seg.set_key(1, "host:GPU-1234");
        assert_eq!(other.key(1), "host:GPU-1234");
        seg.write(seg.window_at(2, 1), &[1, 2, 3]);
        let mut b = [0u8; 3];
        other.read(other.window_at(2, 3), &mut b);
        assert_eq!(b, [1, 2, 3]);
        let empty = tempfile::tempfile().expect("tempfile");
        assert!(matches!(Segment::open(&empty), Ok(None)));
    }
}
