//! Pinned host memory (`cuMemHostAlloc`), and the check that the host leaves it alone
//! while an asynchronous copy uses it.
//!
//! A pinned buffer is a `memfd` mapped twice: the mapping the application gets, and an
//! alias only the stand-in's stream threads use to run the copies (the "DMA"). While a
//! copy *to* the host is pending on a range, the application's pages holding it are
//! mapped with no access; while a copy *from* the host is pending, read-only. A host
//! access that faults inside a pending copy's exact range is a finding: the message names
//! the allocation, the offset, the copy and its stream, and the process exits (a host
//! load or store cannot return an error). A fault on such a page outside any pending
//! range is no defect (CUDA allows touching other bytes): the page is opened until its
//! copies are done, and the access goes on.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

/// What a pending copy does to the host bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The copy reads them (host → device): the host must not write.
    DeviceReads,
    /// The copy writes them (device → host): the host must not touch them.
    DeviceWrites,
}

/// A copy pending on a pinned range.
#[derive(Debug, Clone)]
struct Pending {
    id: u64,
    range: Range<usize>,
    what: Use,
    label: String,
}

#[derive(Debug, Default)]
struct PendingSet {
    list: Vec<Pending>,
    /// Pages opened after a fault outside every pending range (until their copies end).
    opened: Vec<usize>,
}

/// One pinned allocation.
#[derive(Debug)]
pub struct PinnedAlloc {
    /// Its number, for messages.
    pub id: u64,
    /// The address the application uses.
    pub user: usize,
    /// Bytes asked for.
    pub len: usize,
    /// Bytes mapped (whole pages).
    pub mapped: usize,
    /// The stand-in's own mapping of the same memory.
    pub alias: usize,
    /// `cuMemHostAlloc` flags.
    pub flags: u32,
    pending: Mutex<PendingSet>,
}

fn page() -> usize {
    static P: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *P.get_or_init(|| unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize)
}

impl PinnedAlloc {
    fn pending(&self) -> MutexGuard<'_, PendingSet> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `range` (offsets) as used by a pending copy; returns its ticket.
    pub fn begin(&self, range: Range<usize>, what: Use, label: String) -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut p = self.pending();
        p.list.push(Pending {
            id,
            range: range.clone(),
            what,
            label,
        });
        self.protect(&mut p, range);
        id
    }

    /// The copy with `ticket` is done.
    pub fn end(&self, ticket: u64) {
        let mut p = self.pending();
        let Some(i) = p.list.iter().position(|x| x.id == ticket) else {
            return;
        };
        let done = p.list.remove(i);
        self.protect(&mut p, done.range);
    }

    /// The pending copies, as text (for a free while one is pending).
    pub fn pending_copies(&self) -> Vec<String> {
        self.pending()
            .list
            .iter()
            .map(|x| x.label.clone())
            .collect()
    }

    /// Resets the protection of the pages holding `range` from the pending copies.
    fn protect(&self, p: &mut PendingSet, range: Range<usize>) {
        if range.is_empty() {
            return;
        }
        let pg = page();
        let first = range.start / pg;
        let last = (range.end - 1) / pg;
        for pno in first..=last {
            let span = pno * pg..(pno + 1) * pg;
            let mut prot = libc::PROT_READ | libc::PROT_WRITE;
            let mut any = false;
            for x in &p.list {
                if x.range.start < span.end && span.start < x.range.end {
                    any = true;
                    prot = match (prot, x.what) {
                        (_, Use::DeviceWrites) => libc::PROT_NONE,
                        (libc::PROT_NONE, _) => libc::PROT_NONE,
                        (_, Use::DeviceReads) => libc::PROT_READ,
                    };
                }
            }
            if !any {
                p.opened.retain(|&o| o != pno);
            } else if p.opened.contains(&pno) {
                prot = libc::PROT_READ | libc::PROT_WRITE;
            }
            // SAFETY: the page lies inside this allocation's own mapping (made in
            // `allocate`, unmapped only by `free`, which holds the registry lock).
            unsafe {
                libc::mprotect((self.user + pno * pg) as *mut libc::c_void, pg, prot);
            }
        }
    }

    /// Copies `data` into offset `at` through the alias (a pending copy to the host).
    pub fn write_alias(&self, at: usize, data: &[u8]) {
        assert!(
            at + data.len() <= self.len,
            "checked when the copy was queued"
        );
        // SAFETY: the alias maps `mapped >= len` bytes, read-write, for the allocation's
        // life; the range is inside it (checked when queued, asserted above).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (self.alias + at) as *mut u8, data.len())
        }
    }

    /// Reads `len` bytes at offset `at` through the alias (a pending copy from the host).
    pub fn read_alias(&self, at: usize, len: usize) -> Vec<u8> {
        assert!(at + len <= self.len, "checked when the copy was queued");
        let mut out = vec![0u8; len];
        // SAFETY: as in write_alias.
        unsafe {
            std::ptr::copy_nonoverlapping((self.alias + at) as *const u8, out.as_mut_ptr(), len)
        }
        out
    }
}

/// Every pinned allocation, by user address.
fn registry() -> &'static RwLock<BTreeMap<usize, Arc<PinnedAlloc>>> {
    static R: OnceLock<RwLock<BTreeMap<usize, Arc<PinnedAlloc>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Allocates `len` pinned bytes (at least one page), filled with a poison pattern.
pub fn allocate(len: usize, flags: u32) -> Result<Arc<PinnedAlloc>, String> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    install_fault_handler();
    let pg = page();
    let mapped = len.max(1).div_ceil(pg) * pg;
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is closed below.
    let fd = unsafe { libc::memfd_create(c"zero-gpusim-pinned".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    let map = || {
        // SAFETY: a fresh shared mapping of the memfd; failure is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(p as usize)
    };
    // SAFETY: fd is the live memfd; ftruncate sizes it.
    let sized = unsafe { libc::ftruncate(fd, mapped as libc::off_t) } == 0;
    let (user, alias) = if sized { (map(), map()) } else { (None, None) };
    // SAFETY: the mappings keep the memory; the descriptor is no longer needed.
    unsafe { libc::close(fd) };
    let (Some(user), Some(alias)) = (user, alias) else {
        return Err(format!(
            "mapping {mapped} pinned bytes: {}",
            std::io::Error::last_os_error()
        ));
    };
    // SAFETY: the alias maps `mapped` writable bytes.
    unsafe { std::ptr::write_bytes(alias as *mut u8, 0xcd, mapped) };
    let a = Arc::new(PinnedAlloc {
        id: NEXT.fetch_add(1, Ordering::Relaxed),
        user,
        len,
        mapped,
        alias,
        flags,
        pending: Mutex::new(PendingSet::default()),
    });
    registry()
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(user, a.clone());
    Ok(a)
}

/// The pinned allocation starting at `ptr`.
pub fn at_base(ptr: usize) -> Option<Arc<PinnedAlloc>> {
    registry()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&ptr)
        .cloned()
}

/// Where a host range lies: wholly in pinned allocation `a` at an offset, in pageable
/// memory, or straddling a pinned allocation's end (an error naming it).
pub fn classify(ptr: usize, len: usize) -> Result<Option<(Arc<PinnedAlloc>, usize)>, String> {
    let reg = registry().read().unwrap_or_else(|p| p.into_inner());
    if let Some((_, a)) = reg.range(..=ptr).next_back() {
        if ptr < a.user + a.mapped {
            let off = ptr - a.user;
            if off + len > a.len {
                return Err(format!(
                    "{len} host bytes at offset {off} of pinned allocation #{} ({} bytes) run \
                     {} bytes past its end",
                    a.id,
                    a.len,
                    off + len - a.len
                ));
            }
            return Ok(Some((a.clone(), off)));
        }
    }
    if let Some((_, a)) = reg.range(ptr..).next() {
        if a.user < ptr + len {
            return Err(format!(
                "{len} host bytes at {ptr:#x} run into pinned allocation #{} at {:#x}",
                a.id, a.user
            ));
        }
    }
    Ok(None)
}

/// Frees the pinned allocation at `ptr`. Pending copies on it are an error naming them.
pub fn free(ptr: usize) -> Result<(), String> {
    let mut reg = registry().write().unwrap_or_else(|p| p.into_inner());
    let Some(a) = reg.get(&ptr).cloned() else {
        return Err(format!(
            "{ptr:#x} is not a pinned allocation of this stand-in (freed twice, or not from \
             cuMemHostAlloc)"
        ));
    };
    let pending = a.pending_copies();
    if !pending.is_empty() {
        return Err(format!(
            "cuMemFreeHost of pinned allocation #{} ({} bytes) while copies on it are still \
             pending: {}",
            a.id,
            a.len,
            pending.join("; ")
        ));
    }
    reg.remove(&ptr);
    // SAFETY: both mappings were made by `allocate` and are unmapped once (the allocation
    // left the registry above, so no copy can be queued on it).
    unsafe {
        libc::munmap(a.user as *mut libc::c_void, a.mapped);
        libc::munmap(a.alias as *mut libc::c_void, a.mapped);
    }
    Ok(())
}

static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

fn install_fault_handler() {
    PREVIOUS.get_or_init(|| {
        // SAFETY: installs a SIGSEGV handler with SA_SIGINFO; the previous action is kept
        // (zeroed sigaction is a valid "default") to chain faults that are not ours.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_fault as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGSEGV, &new, &mut old);
            old
        }
    });
}

/// Writes `parts` to stderr without allocating.
fn say(parts: &[&[u8]]) {
    for p in parts {
        // SAFETY: writes a live byte slice to fd 2.
        unsafe { libc::write(2, p.as_ptr() as *const libc::c_void, p.len()) };
    }
}

fn decimal(mut v: usize, buf: &mut [u8; 24]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Whether the faulting access was a write (x86-64: bit 1 of the page-fault error code).
///
/// # Safety
/// `ctx` is the `ucontext_t` the kernel passed to the handler.
unsafe fn was_write(ctx: *mut libc::c_void) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let uc = ctx as *const libc::ucontext_t;
        // SAFETY: the caller passes the handler's ucontext.
        unsafe { (*uc).uc_mcontext.gregs[libc::REG_ERR as usize] & 2 != 0 }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ctx;
        false
    }
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SIGSEGV.
    let addr = unsafe { (*info).si_addr() } as usize;
    if handle_pinned_fault(addr, ctx) {
        return;
    }
    // Not ours: hand it to the previous handler (Rust's stack-overflow check), or restore
    // the default action and let the access fault again.
    if let Some(prev) = PREVIOUS.get() {
        if prev.sa_flags & libc::SA_SIGINFO != 0 && prev.sa_sigaction > 1 {
            // SAFETY: the previous handler was installed for this signal with SA_SIGINFO.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig, info, ctx);
            return;
        }
        // SAFETY: restores the previous (non-SA_SIGINFO or default) action.
        unsafe { libc::sigaction(libc::SIGSEGV, prev, std::ptr::null_mut()) };
    }
}

/// Handles a fault at `addr` if it is on a protected pinned page: a finding (the process
/// exits) inside a pending copy's range, else the page is opened. Whether it was ours.
fn handle_pinned_fault(addr: usize, ctx: *mut libc::c_void) -> bool {
    // The registry may be held for a moment by another thread: retry briefly.
    let mut reg = None;
    for _ in 0..100_000 {
        if let Ok(r) = registry().try_read() {
            reg = Some(r);
            break;
        }
        std::hint::spin_loop();
    }
    let Some(reg) = reg else { return false };
    let Some((_, a)) = reg.range(..=addr).next_back() else {
        return false;
    };
    if addr >= a.user + a.mapped {
        return false;
    }
    let Ok(mut p) = a.pending.try_lock() else {
        return false;
    };
    let off = addr - a.user;
    // SAFETY: ctx is the handler's ucontext.
    let write = unsafe { was_write(ctx) };
    let hit = p
        .list
        .iter()
        .find(|x| x.range.contains(&off) && (x.what == Use::DeviceWrites || write));
    if let Some(x) = hit {
        let mut b1 = [0u8; 24];
        let mut b2 = [0u8; 24];
        let mut b3 = [0u8; 24];
        say(&[
            b"zero-gpusim memory error: the host ",
            if write { b"wrote" } else { b"read" },
            b" pinned allocation #",
            decimal(a.id as usize, &mut b1),
            b" (",
            decimal(a.len, &mut b2),
            b" bytes) at offset ",
            decimal(off, &mut b3),
            b" while ",
            x.label.as_bytes(),
            b" was still pending on it (",
            match x.what {
                Use::DeviceWrites => b"it writes those bytes" as &[u8],
                Use::DeviceReads => b"it reads those bytes",
            },
            b"): wait for the copy (an event recorded after it, or the stream) before the \
              host touches the buffer\n",
        ]);
        // SAFETY: ends the process at once; nothing else is safe to do in a handler.
        unsafe { libc::_exit(134) };
    }
    // A fault on a protected page outside every pending range: open the page.
    let pg = page();
    let pno = off / pg;
    p.opened.push(pno);
    // SAFETY: the page is inside this allocation's mapping.
    unsafe {
        libc::mprotect(
            (a.user + pno * pg) as *mut libc::c_void,
            pg,
            libc::PROT_READ | libc::PROT_WRITE,
        );
    }
    true
}
