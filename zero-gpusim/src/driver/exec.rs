//! Running an operation on its stream's thread: copies, fills, frees, kernels, host
//! functions, collectives. Every device access is checked (live, in bounds, written
//! before read) and recorded for the race check ([`ExecCtx`]).

use super::errors::{finding, sticky, FindingKind};
use super::exec_ctx::{mem, race, ExecCtx};
use super::launch;
use super::memory::memory;
use super::shadow::Kind;
use super::work::{DevRange, HostDst, HostSrc, Work};

/// Runs `work` on its stream's thread (`stream`: the stream's name in findings). A finding
/// stops the operation (and, being sticky, the device's later work).
pub fn execute(work: Work, cx: ExecCtx<'_>, stream: &str) {
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
            memory().release(a, format!("{}", cx.label));
            r
        }
        Work::Kernel(k) if !skip => launch::execute(&cx, k),
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
        finding(kind, format!("{message} [on {stream}]"));
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
