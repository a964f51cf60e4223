//! What operations do when their stream runs them: copies, fills, frees, kernels, host
//! functions, collectives. Every device access is checked (live, in bounds, written
//! before read) and recorded for the race check.

use super::errors::{finding, sticky, FindingKind};
use super::host::PinnedAlloc;
use super::memory::{memory, Allocation};
use super::shadow::{Access, Kind};
use super::stream::{Op, Stream};
use std::ops::Range;
use std::sync::Arc;

/// The host end of a copy to the device.
pub enum HostSrc {
    /// Pageable memory, copied when the call was made (CUDA stages it then).
    Snapshot(Vec<u8>),
    /// A pinned range, read when the copy runs; `ticket` marks it pending.
    Pinned {
        /// The allocation.
        alloc: Arc<PinnedAlloc>,
        /// Offset in it.
        off: usize,
        /// Its pending-copy ticket.
        ticket: u64,
    },
}

/// The host end of a copy to the host.
pub enum HostDst {
    /// Pageable memory: the call waits until the copy ran, so the pointer stays valid.
    Pageable(usize),
    /// A pinned range, written when the copy runs.
    Pinned {
        /// The allocation.
        alloc: Arc<PinnedAlloc>,
        /// Offset in it.
        off: usize,
        /// Its pending-copy ticket.
        ticket: u64,
    },
}

/// A device range: an allocation and a byte range in it.
#[derive(Clone)]
pub struct DevRange {
    /// The allocation.
    pub alloc: Arc<Allocation>,
    /// Offset of the first byte.
    pub off: u64,
    /// Bytes.
    pub len: u64,
}

impl DevRange {
    fn span(&self) -> Range<u64> {
        self.off..self.off + self.len
    }
}

/// A function run on the stream's thread (collectives): it gets the operation to check
/// and record its device accesses.
pub type Custom = Box<dyn FnOnce(&ExecCtx<'_>) -> Result<(), (FindingKind, String)> + Send>;

/// What an operation does.
pub enum Work {
    /// Host to device.
    HtoD {
        /// Destination.
        dst: DevRange,
        /// Source.
        src: HostSrc,
    },
    /// Device to host.
    DtoH {
        /// Source.
        src: DevRange,
        /// Destination.
        dst: HostDst,
    },
    /// Device to device.
    DtoD {
        /// Source.
        src: DevRange,
        /// Destination.
        dst: DevRange,
    },
    /// Fills a range with a repeated 1-, 2- or 4-byte pattern.
    Memset {
        /// Destination.
        dst: DevRange,
        /// The pattern.
        pattern: Vec<u8>,
    },
    /// A stream-ordered allocation comes into being (`cuMemAllocAsync`).
    Birth(Arc<Allocation>),
    /// A stream-ordered free (`cuMemFreeAsync`).
    Free(Arc<Allocation>),
    /// A kernel launch.
    Kernel(Box<super::launch::KernelWork>),
    /// `cuLaunchHostFunc`.
    HostFn {
        /// The function.
        f: unsafe extern "C" fn(*mut std::ffi::c_void),
        /// Its argument.
        data: usize,
    },
    /// Only ordering: an event record, or a wait for another stream.
    Marker,
    /// A collective or other custom work.
    Custom(Custom),
}

/// What an operation's code needs to touch device memory.
pub struct ExecCtx<'a> {
    /// The stream running it.
    pub stream: &'a Stream,
    /// The operation.
    pub op: &'a Op,
}

impl ExecCtx<'_> {
    /// The access record of this operation.
    pub fn who(&self) -> Access {
        Access {
            agent: self.stream.agent,
            tick: self.op.tick,
            op: self.op.label.clone(),
        }
    }

    /// Records an access of `kind` to `span` of `a`: a race with an unordered operation is
    /// a finding message.
    pub fn record(&self, a: &Allocation, span: Range<u64>, kind: Kind) -> Result<(), String> {
        a.shadow()
            .access(span, kind, &self.who(), &self.op.vc)
            .map_err(|c| format!("race on {a}: {c}"))
    }

    fn live(&self, r: &DevRange) -> Result<(), String> {
        match r.alloc.freed() {
            Some(by) => Err(format!(
                "{}: use after free: offset {} of {} (freed by {by})",
                self.op.label, r.off, r.alloc
            )),
            None => Ok(()),
        }
    }

    /// Reads a device range (written bytes only, unless `any` is set).
    pub fn read(&self, r: &DevRange, any: bool) -> Result<Vec<u8>, (FindingKind, String)> {
        // The race check first: a free on another stream that nothing ordered is named as
        // the race it is, whichever ran first.
        self.record(&r.alloc, r.span(), Kind::Read).map_err(race)?;
        self.live(r).map_err(mem)?;
        let body = r.alloc.body();
        let span = r.off as usize..(r.off + r.len) as usize;
        if !any {
            if let Some(at) = body.first_uninit(span.clone()) {
                return Err(mem(format!(
                    "{} reads never-written device memory: offset {at} of {} (the read \
                     covers [{}, {}))",
                    self.op.label, r.alloc, span.start, span.end
                )));
            }
        }
        Ok(body.data[span].to_vec())
    }

    /// Writes `data` into a device range (marking it written).
    pub fn write(&self, r: &DevRange, data: &[u8]) -> Result<(), (FindingKind, String)> {
        self.record(&r.alloc, r.span(), Kind::Write).map_err(race)?;
        self.live(r).map_err(mem)?;
        let mut body = r.alloc.body();
        let span = r.off as usize..r.off as usize + data.len();
        body.data[span.clone()].copy_from_slice(data);
        body.set_init(span);
        Ok(())
    }
}

fn mem(m: String) -> (FindingKind, String) {
    (FindingKind::Memory, m)
}

fn race(m: String) -> (FindingKind, String) {
    (FindingKind::Race, m)
}

/// Runs `op` on `stream`'s thread. A finding stops the operation (and, being sticky, the
/// device's later work).
pub fn execute(stream: &Stream, mut op: Op) {
    let work = std::mem::replace(&mut op.work, Work::Marker);
    let op = &op;
    let cx = ExecCtx { stream, op };
    let skip = sticky().is_some();
    let outcome = match &work {
        Work::Marker => Ok(()),
        Work::HtoD { dst, src } => {
            let bytes = match src {
                HostSrc::Snapshot(v) => Some(v.clone()),
                HostSrc::Pinned { alloc, off, ticket } => {
                    let v = alloc.read_alias(*off, dst.len as usize);
                    alloc.end(*ticket);
                    Some(v)
                }
            };
            match bytes {
                Some(b) if !skip => cx.write(dst, &b),
                _ => Ok(()),
            }
        }
        Work::DtoH { src, dst } => {
            let got = if skip {
                Ok(Vec::new())
            } else {
                cx.read(src, false)
            };
            let out = match (&got, dst) {
                (Ok(b), HostDst::Pageable(ptr)) if !b.is_empty() => {
                    // SAFETY: the caller of this copy waits until it ran (pageable copies
                    // to the host are synchronous), keeping `len` bytes at `ptr` alive and
                    // writable, as the driver API requires of its arguments.
                    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), *ptr as *mut u8, b.len()) };
                    Ok(())
                }
                (Ok(b), HostDst::Pinned { alloc, off, .. }) if !b.is_empty() => {
                    alloc.write_alias(*off, b);
                    Ok(())
                }
                _ => Ok(()),
            };
            if let HostDst::Pinned { alloc, ticket, .. } = dst {
                alloc.end(*ticket);
            }
            got.and(out)
        }
        Work::DtoD { src, dst } if !skip => copy_dtod(&cx, src, dst),
        Work::Memset { dst, pattern } if !skip => {
            let data: Vec<u8> = pattern
                .iter()
                .copied()
                .cycle()
                .take(dst.len as usize)
                .collect();
            cx.write(dst, &data)
        }
        Work::Birth(a) => cx.record(a, 0..a.size, Kind::Write).map_err(race),
        Work::Free(a) => {
            let r = cx.record(a, 0..a.size.max(1), Kind::Write).map_err(race);
            memory().release(a, format!("{}", op.label));
            r
        }
        Work::Kernel(k) if !skip => super::launch::execute(&cx, k),
        Work::HostFn { f, data } => {
            // SAFETY: cuLaunchHostFunc's contract: the function takes its user data; the
            // caller keeps both valid until it ran.
            unsafe { f(*data as *mut std::ffi::c_void) };
            Ok(())
        }
        Work::Custom(_) | Work::DtoD { .. } | Work::Memset { .. } | Work::Kernel(_) => Ok(()),
    };
    let outcome = match (outcome, work) {
        (Ok(()), Work::Custom(f)) if !skip => f(&cx),
        (other, _) => other,
    };
    if let Err((kind, message)) = outcome {
        finding(kind, format!("{message} [on {}]", stream.name()));
    }
}

fn copy_dtod(
    cx: &ExecCtx<'_>,
    src: &DevRange,
    dst: &DevRange,
) -> Result<(), (FindingKind, String)> {
    cx.record(&src.alloc, src.span(), Kind::Read)
        .map_err(race)?;
    cx.record(&dst.alloc, dst.span(), Kind::Write)
        .map_err(race)?;
    cx.live(src).map_err(mem)?;
    cx.live(dst).map_err(mem)?;
    // Bytes and their initialized bits move together (a copy of never-written bytes is
    // no defect; reading them later is).
    let len = src.len as usize;
    let (bytes, bits): (Vec<u8>, Option<Vec<bool>>) = {
        let body = src.alloc.body();
        let s = src.off as usize;
        let bytes = body.data[s..s + len].to_vec();
        let bits = body
            .first_uninit(s..s + len)
            .map(|_| (s..s + len).map(|i| body.is_init(i)).collect());
        (bytes, bits)
    };
    let mut body = dst.alloc.body();
    let d = dst.off as usize;
    body.data[d..d + len].copy_from_slice(&bytes);
    let Some(bits) = bits else {
        body.set_init(d..d + len);
        return Ok(());
    };
    let mut i = 0;
    while i < len {
        if bits[i] {
            let start = i;
            while i < len && bits[i] {
                i += 1;
            }
            body.set_init(d + start..d + i);
        } else {
            i += 1;
        }
    }
    Ok(())
}
