//! Kernel launches: the driver's launch checks, then the PTX interpreter over checked
//! device memory. Every load and store goes through [`LaunchMemory`]: the allocation must
//! be live and hold the whole access, a load must read written bytes; the ranges touched
//! are recorded for the race check when the kernel ends, and the bytes moved are counted
//! (the traffic table of `docs/BENCHMARKS.md`).

use super::clock::VectorClock;
use super::errors::FindingKind;
use super::exec_ctx::ExecCtx;
use super::memory::{memory, Allocation, Place};
use super::module::Function;
use super::shadow::{Access, Kind};
use super::traffic;
use crate::ptx;
use cudarc::driver::sys::cudaError_enum as E;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A queued launch.
pub struct KernelWork {
    /// The kernel.
    pub function: Arc<Function>,
    /// Grid, block, dynamic shared memory.
    pub dims: ptx::LaunchDims,
    /// The packed parameters.
    pub params: Vec<u8>,
    /// The thread-order seed of this launch.
    pub seed: u64,
}

/// Shared memory a block may use without opting in (48 KiB).
pub const DEFAULT_SHARED: u32 = 48 << 10;
/// The most shared memory per block an sm_90 GPU allows with opt-in.
pub const MAX_SHARED_OPTIN: u32 = 232_448;

/// The driver's checks of a launch's shape, as `cuLaunchKernel` makes them.
pub fn check(f: &Function, dims: &ptx::LaunchDims) -> Result<(), (E, String)> {
    let k = f.kernel().ok_or_else(|| {
        (
            E::CUDA_ERROR_INVALID_HANDLE,
            format!("kernel {} vanished", f.name),
        )
    })?;
    let name = &f.name;
    let [bx, by, bz] = dims.block;
    let [gx, gy, gz] = dims.grid;
    let bad = |m: String| {
        Err((
            E::CUDA_ERROR_INVALID_VALUE,
            format!("launch of {name}: {m}"),
        ))
    };
    if bx == 0 || by == 0 || bz == 0 || gx == 0 || gy == 0 || gz == 0 {
        return bad(format!(
            "a zero dimension (grid {:?}, block {:?})",
            dims.grid, dims.block
        ));
    }
    if bx > 1024 || by > 1024 || bz > 64 {
        return bad(format!(
            "block {:?} exceeds the per-dimension limits (1024, 1024, 64)",
            dims.block
        ));
    }
    let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
    if threads > 1024 {
        return bad(format!("{threads} threads per block; the GPU allows 1024"));
    }
    if let Some(max) = k.max_threads() {
        if threads > u64::from(max) {
            return bad(format!(
                "{threads} threads per block, more than the kernel's .maxntid of {max} \
                 (CUDA_ERROR_INVALID_VALUE, as the driver refuses it)"
            ));
        }
    }
    if u64::from(gx) > 2_147_483_647 || gy > 65_535 || gz > 65_535 {
        return bad(format!(
            "grid {:?} exceeds the limits (2^31-1, 65535, 65535)",
            dims.grid
        ));
    }
    let stat = k.static_shared_bytes() as u64;
    let dynamic = u64::from(dims.dynamic_shared_bytes);
    let allowed = u64::from(f.max_dynamic_shared.load(Ordering::Relaxed));
    if dynamic > allowed || stat + dynamic > u64::from(MAX_SHARED_OPTIN) {
        return bad(format!(
            "{dynamic} bytes of dynamic shared memory (+{stat} static); the kernel allows \
             {allowed} dynamic (raise it with cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES), \
             at most {MAX_SHARED_OPTIN} in all)"
        ));
    }
    Ok(())
}

/// One allocation a kernel touched, and where.
struct Touched {
    alloc: Arc<Allocation>,
    reads: Vec<(u64, u64)>,
    writes: Vec<(u64, u64)>,
}

fn note(runs: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    if let Some(last) = runs.last_mut() {
        if last.1 == start {
            last.1 = end;
            return;
        }
    }
    runs.push((start, end));
}

fn merged(mut runs: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    runs.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for (s, e) in runs {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Global memory as one launch sees it.
pub struct LaunchMemory {
    /// This launch, for the race check of an access to freed memory.
    who: Access,
    /// Its clock.
    vc: Arc<VectorClock>,
    /// The fault was a race (an unordered free), not a plain memory error.
    pub race_fault: bool,
    touched: Vec<Touched>,
    /// Index in `touched` of the allocation hit last.
    last: Option<usize>,
    /// Bytes the threads loaded from global memory.
    pub read: u64,
    /// Bytes the threads stored to global memory.
    pub written: u64,
    /// 32-byte sectors loaded: per warp instruction, the distinct sectors its lanes touch
    /// (what the memory system moves: lanes reading one address share one sector).
    pub read_sectors: u64,
    /// 32-byte sectors stored, counted the same way.
    pub written_sectors: u64,
    scratch: Vec<u64>,
}

/// The distinct 32-byte sectors `addrs` (each `size` bytes) touch.
fn sectors(scratch: &mut Vec<u64>, addrs: &[u64], size: u64) -> u64 {
    scratch.clear();
    for &a in addrs {
        let (first, last) = (a >> 5, (a + size - 1) >> 5);
        scratch.extend(first..=last);
    }
    scratch.sort_unstable();
    scratch.dedup();
    scratch.len() as u64
}

impl LaunchMemory {
    fn new(who: Access, vc: Arc<VectorClock>) -> Self {
        LaunchMemory {
            who,
            vc,
            race_fault: false,
            touched: Vec::new(),
            last: None,
            read: 0,
            written: 0,
            read_sectors: 0,
            written_sectors: 0,
            scratch: Vec::with_capacity(64),
        }
    }

    /// The finding for a `verb` of `size` bytes at `off` of `a` after `a` was freed: a race
    /// when the free was unordered with this launch (whichever of the two ran first), else a
    /// plain use after free.
    fn after_free(&mut self, a: &Allocation, off: u64, size: u64, verb: &str, by: &str) -> String {
        let kind = if verb == "load" {
            Kind::Read
        } else {
            Kind::Write
        };
        let span = off..(off + size).min(a.size.max(off + 1));
        if let Err(c) = a.shadow().access(span, kind, &self.who, &self.vc) {
            self.race_fault = true;
            return format!("race on {a}: {c}");
        }
        format!("{verb} of {size} bytes after free: offset {off} of {a} (freed by {by})")
    }

    /// The touched-entry index of the allocation holding `[addr, addr + size)`.
    fn resolve(&mut self, addr: u64, size: u64, verb: &str) -> Result<(usize, u64), String> {
        if let Some(i) = self.last {
            let a = &self.touched[i].alloc;
            if addr >= a.base && addr + size <= a.base + a.size {
                return Ok((i, addr - a.base));
            }
        }
        for (i, t) in self.touched.iter().enumerate() {
            let a = &t.alloc;
            if addr >= a.base && addr + size <= a.base + a.size {
                self.last = Some(i);
                return Ok((i, addr - a.base));
            }
        }
        match memory().place(addr) {
            Place::Outside(text) => Err(format!("{verb} of {size} bytes out of bounds: {text}")),
            Place::Inside(a, off) => {
                if let Some(by) = a.freed() {
                    return Err(self.after_free(&a, off, size, verb, &by));
                }
                if off + size > a.size {
                    return Err(format!(
                        "{verb} of {size} bytes out of bounds: offset {off} of {a}, {} bytes past \
                         its end",
                        off + size - a.size
                    ));
                }
                self.touched.push(Touched {
                    alloc: a,
                    reads: Vec::new(),
                    writes: Vec::new(),
                });
                let i = self.touched.len() - 1;
                self.last = Some(i);
                Ok((i, off))
            }
        }
    }
}

impl ptx::GlobalMemory for LaunchMemory {
    fn load(
        &mut self,
        size: u32,
        addrs: &[u64],
        _threads: &[u32],
        out: &mut [u128],
    ) -> Result<(), String> {
        let n = u64::from(size);
        self.read_sectors += sectors(&mut self.scratch, addrs, n);
        let mut i = 0;
        while i < addrs.len() {
            let (t, _) = self.resolve(addrs[i], n, "load")?;
            let alloc = self.touched[t].alloc.clone();
            let body = alloc.body();
            if let Some(by) = body.freed.clone() {
                // The free may have run while this launch ran, on an unordered stream.
                drop(body);
                return Err(self.after_free(&alloc, addrs[i] - alloc.base, n, "load", &by));
            }
            // Every following lane in the same allocation, under one lock.
            while i < addrs.len() {
                let a = addrs[i];
                if a < alloc.base || a + n > alloc.base + alloc.size {
                    break;
                }
                let off = (a - alloc.base) as usize;
                if let Some(at) = body.first_uninit(off..off + size as usize) {
                    return Err(format!(
                        "load of {size} bytes reads never-written device memory: offset {at} of {alloc}"
                    ));
                }
                let mut v = [0u8; 16];
                v[..size as usize].copy_from_slice(&body.data[off..off + size as usize]);
                out[i] = u128::from_le_bytes(v);
                note(&mut self.touched[t].reads, off as u64, off as u64 + n);
                self.read += n;
                i += 1;
            }
        }
        Ok(())
    }

    fn store(
        &mut self,
        size: u32,
        addrs: &[u64],
        _threads: &[u32],
        vals: &[u128],
    ) -> Result<(), String> {
        let n = u64::from(size);
        self.written_sectors += sectors(&mut self.scratch, addrs, n);
        let mut i = 0;
        while i < addrs.len() {
            let (t, _) = self.resolve(addrs[i], n, "store")?;
            let alloc = self.touched[t].alloc.clone();
            let mut body = alloc.body();
            if let Some(by) = body.freed.clone() {
                // The free may have run while this launch ran, on an unordered stream.
                drop(body);
                return Err(self.after_free(&alloc, addrs[i] - alloc.base, n, "store", &by));
            }
            while i < addrs.len() {
                let a = addrs[i];
                if a < alloc.base || a + n > alloc.base + alloc.size {
                    break;
                }
                let off = (a - alloc.base) as usize;
                let bytes = vals[i].to_le_bytes();
                body.data[off..off + size as usize].copy_from_slice(&bytes[..size as usize]);
                body.set_init(off..off + size as usize);
                note(&mut self.touched[t].writes, off as u64, off as u64 + n);
                self.written += n;
                i += 1;
            }
        }
        Ok(())
    }
}

/// Runs a launch on the stream's thread.
pub fn execute(cx: &ExecCtx<'_>, k: &KernelWork) -> Result<(), (FindingKind, String)> {
    let Some(kernel) = k.function.kernel() else {
        return Err((
            FindingKind::Kernel,
            format!("{}: the kernel vanished", cx.label),
        ));
    };
    let mut mem = LaunchMemory::new(cx.who(), cx.vc.clone());
    let opts = ptx::ExecOptions {
        seed: k.seed,
        max_shared_bytes: MAX_SHARED_OPTIN,
        max_warp_instructions: super::config::config().max_warp_instructions,
    };
    let ran = ptx::launch(kernel, &k.dims, &k.params, &mut mem, &opts);
    // What it touched is recorded even if it faulted (the fault is reported first).
    let mut race: Option<String> = None;
    // Distinct bytes loaded and stored: what the kernel needs from memory with perfect
    // caching (a DRAM-side view of its traffic).
    let mut distinct = [0u64; 2];
    for t in std::mem::take(&mut mem.touched) {
        for (i, (kind, runs)) in [(Kind::Read, t.reads), (Kind::Write, t.writes)]
            .into_iter()
            .enumerate()
        {
            for (s, e) in merged(runs) {
                distinct[i] += e - s;
                if let Err(m) = cx.record(&t.alloc, s..e, kind) {
                    race.get_or_insert(m);
                }
            }
        }
    }
    let stats = match ran {
        Ok(stats) => stats,
        Err(e) => {
            let kind = match &e {
                _ if mem.race_fault => FindingKind::Race,
                ptx::ExecError::Fault { .. } => FindingKind::Memory,
                _ => FindingKind::Kernel,
            };
            return Err((kind, format!("{}: {e}", cx.label)));
        }
    };
    traffic::record(
        &k.function.name,
        &k.dims,
        [
            mem.read,
            mem.written,
            32 * mem.read_sectors,
            32 * mem.written_sectors,
            distinct[0],
            distinct[1],
        ],
        stats.thread_instructions,
    );
    match race {
        Some(m) => Err((FindingKind::Race, format!("{}: {m}", cx.label))),
        None => Ok(()),
    }
}
