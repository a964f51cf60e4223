//! Launches: limits, the block loop, warp scheduling between barriers, min-pc
//! reconvergence, and the execution of each decoded instruction over a warp's lanes.

use super::decode::{BoolOp, Op, PSrc, Space, Src, Sreg, SINK};
use super::ops::{mask, W};
use super::shared::{describe, LocalMem, MemFault, Pending, SharedMem};
use super::{
    ExecError, ExecOptions, GlobalMemory, Kernel, LaunchDims, LaunchStats, DEFAULT_SHARED_LIMIT,
    MAX_BLOCK_THREADS, MAX_SHARED_LIMIT,
};

mod access;

use access::access;

const FULL: u32 = u32::MAX;
/// SMs reported by `%nsmid` (an H100 SXM).
const NSM: u64 = 132;

/// The set lanes of a mask, lowest first.
#[inline(always)]
fn lanes(mut m: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if m == 0 {
            None
        } else {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(l)
        }
    })
}

fn limit(kernel: &Kernel, what: &str, value: u64, max: u64) -> Result<(), ExecError> {
    if value > max {
        return Err(ExecError::LaunchLimit {
            kernel: kernel.name.clone(),
            limit: what.to_string(),
            value,
            max,
        });
    }
    Ok(())
}

/// Runs the grid; see [`super::launch`].
pub(crate) fn launch(
    kernel: &Kernel,
    dims: &LaunchDims,
    params: &[u8],
    mem: &mut dyn GlobalMemory,
    opts: &ExecOptions,
) -> Result<LaunchStats, ExecError> {
    if params.len() != kernel.param_bytes {
        return Err(ExecError::ParamSize {
            kernel: kernel.name.clone(),
            expected: kernel.param_bytes,
            actual: params.len(),
        });
    }
    if dims.grid.contains(&0) || dims.block.contains(&0) {
        return Err(ExecError::BadLaunch {
            kernel: kernel.name.clone(),
            message: format!(
                "a zero dimension (grid {:?}, block {:?})",
                dims.grid, dims.block
            ),
        });
    }
    let threads = dims.block.iter().map(|&d| d as u64).product::<u64>();
    limit(kernel, "block x dimension", dims.block[0] as u64, 1024)?;
    limit(kernel, "block y dimension", dims.block[1] as u64, 1024)?;
    limit(kernel, "block z dimension", dims.block[2] as u64, 64)?;
    limit(
        kernel,
        "threads per block",
        threads,
        MAX_BLOCK_THREADS as u64,
    )?;
    if let Some(r) = kernel.reqntid {
        if r != dims.block {
            return Err(ExecError::BadLaunch {
                kernel: kernel.name.clone(),
                message: format!(
                    "the block is {:?} but the kernel requires .reqntid {:?}",
                    dims.block, r
                ),
            });
        }
    }
    if let Some(m) = kernel.maxntid {
        let max = m.iter().map(|&d| d.max(1) as u64).product::<u64>();
        limit(
            kernel,
            &format!("threads per block (.maxntid {}, {}, {})", m[0], m[1], m[2]),
            threads,
            max,
        )?;
    }
    limit(
        kernel,
        "grid x dimension",
        dims.grid[0] as u64,
        i32::MAX as u64,
    )?;
    limit(kernel, "grid y dimension", dims.grid[1] as u64, 65_535)?;
    limit(kernel, "grid z dimension", dims.grid[2] as u64, 65_535)?;
    let dyn_start = kernel
        .static_shared
        .next_multiple_of(kernel.dynamic_shared_align.max(1));
    let shared_bytes = if dims.dynamic_shared_bytes > 0 {
        dyn_start + dims.dynamic_shared_bytes as usize
    } else {
        kernel.static_shared
    };
    let allowed = opts
        .max_shared_bytes
        .clamp(DEFAULT_SHARED_LIMIT, MAX_SHARED_LIMIT);
    limit(
        kernel,
        "shared memory per block (static + dynamic bytes)",
        shared_bytes as u64,
        allowed as u64,
    )?;
    limit(
        kernel,
        "local memory per thread (bytes)",
        kernel.local_bytes as u64,
        512 * 1024,
    )?;

    let mut block = Block::new(kernel, dims, params, opts, shared_bytes, dyn_start);
    let mut stats = LaunchStats::default();
    for z in 0..dims.grid[2] {
        for y in 0..dims.grid[1] {
            for x in 0..dims.grid[0] {
                mem.begin_block([x, y, z]);
                block.run([x, y, z], mem, &mut stats)?;
                stats.blocks += 1;
            }
        }
    }
    Ok(stats)
}

/// One warp: registers (structure of arrays), predicates (one bit per lane), and where
/// each lane is.
struct Warp {
    regs: Vec<W>,
    preds: Vec<u32>,
    /// Each lane's pc (for lanes outside the running group; the group's is `gpc`).
    pcs: [u32; 32],
    /// Lanes that exist and have not exited.
    live: u32,
    /// Lanes waiting at a barrier.
    waiting: u32,
    bar_id: [u32; 32],
    bar_inst: [u32; 32],
    /// The lanes running now (all at `gpc`, the smallest pc of the runnable lanes).
    group: u32,
    gpc: u32,
    /// The smallest pc of the other runnable lanes (`u32::MAX`: none).
    other_min: u32,
    /// Linear index (in the block) of lane 0.
    base: u32,
    /// Lanes that exist.
    exists: u32,
    tid: [W; 3],
    /// `bar.warp.sync` executed so far in this block.
    wsync: u32,
}

impl Warp {
    fn sync_pcs(&mut self) {
        for l in lanes(self.group) {
            self.pcs[l] = self.gpc;
        }
    }

    /// Picks the lanes at the smallest pc among those that can run.
    fn recompute(&mut self) {
        let run = self.live & !self.waiting;
        if run == 0 {
            self.group = 0;
            return;
        }
        let mut min = u32::MAX;
        for l in lanes(run) {
            min = min.min(self.pcs[l]);
        }
        let mut g = 0;
        let mut other = u32::MAX;
        for l in lanes(run) {
            if self.pcs[l] == min {
                g |= 1 << l;
            } else {
                other = other.min(self.pcs[l]);
            }
        }
        self.group = g;
        self.gpc = min;
        self.other_min = other;
    }
}

/// What the instructions of a block need besides the warp.
struct Ctx<'a> {
    k: &'a Kernel,
    dims: LaunchDims,
    ctaid: [u32; 3],
    params: &'a [u8],
    nwarps: u32,
    nthreads: u32,
    shared_bytes: usize,
    dyn_start: usize,
    clock: u64,
    /// `ExecOptions::max_warp_instructions`.
    budget: u64,
}

impl Ctx<'_> {
    fn thread(&self, linear: u32) -> [u32; 3] {
        let [bx, by, _] = self.dims.block;
        [linear % bx, (linear / bx) % by, linear / (bx * by)]
    }

    fn fault(&self, thread: u32, inst: u32, message: String) -> ExecError {
        let i = self.k.code.get(inst as usize);
        ExecError::Fault {
            kernel: self.k.name.clone(),
            block: self.ctaid,
            thread: self.thread(thread),
            line: i.map_or(0, |i| i.line),
            text: i.map_or_else(String::new, |i| i.text.to_string()),
            message,
        }
    }

    fn where_is(&self, inst: u32) -> String {
        match self.k.code.get(inst as usize) {
            Some(i) => format!("line {} `{}`", i.line, i.text),
            None => format!("instruction {inst}"),
        }
    }

    fn shared_name(&self, off: u64) -> String {
        describe(&self.k.shared_vars, Some(self.dyn_start), off)
    }

    fn mem_fault(&self, space: Space, thr: u32, inst: u32, f: MemFault, write: bool) -> ExecError {
        let acc = if write { "write" } else { "read" };
        let t = |x: u32| {
            let c = self.thread(x);
            format!("thread ({}, {}, {})", c[0], c[1], c[2])
        };
        let msg = match (space, f) {
            (Space::Shared, MemFault::Race { byte, first, first_write, second_write }) => format!(
                "shared-memory race on {}: {} {} it at {} and {} {} it at {}, with no bar.sync between them",
                self.shared_name(byte),
                t(first.thr),
                if first_write { "wrote" } else { "read" },
                self.where_is(first.inst),
                t(thr),
                if second_write { "writes" } else { "reads" },
                self.where_is(inst),
            ),
            (Space::Shared, MemFault::OutOfBounds { off, size, limit }) => format!(
                "shared-memory {acc} of {size} bytes at offset {off} is out of bounds: the block has {limit} bytes of shared memory{}",
                if off < limit { format!(" (starts in {})", self.shared_name(off)) } else { String::new() }
            ),
            (Space::Local, MemFault::OutOfBounds { off, size, limit }) => format!(
                "local-memory {acc} of {size} bytes at offset {off} is out of bounds: each thread has {limit} bytes of local memory"
            ),
            (Space::Local, MemFault::Uninit { byte }) => format!(
                "read of uninitialized local memory {} (never written by this thread)",
                describe(&self.k.local_vars, None, byte)
            ),
            (_, other) => format!("{acc} fault: {other:?}"),
        };
        self.fault(thr, inst, msg)
    }
}

struct Block<'a> {
    ctx: Ctx<'a>,
    warps: Vec<Warp>,
    shared: SharedMem,
    local: LocalMem,
    seed: u64,
}

/// splitmix64.
fn next_rand(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl<'a> Block<'a> {
    fn new(
        k: &'a Kernel,
        dims: &LaunchDims,
        params: &'a [u8],
        opts: &ExecOptions,
        shared_bytes: usize,
        dyn_start: usize,
    ) -> Block<'a> {
        let nthreads = dims.block.iter().product::<u32>();
        let nwarps = nthreads.div_ceil(32);
        let ctx = Ctx {
            k,
            dims: *dims,
            ctaid: [0; 3],
            params,
            nwarps,
            nthreads,
            shared_bytes,
            dyn_start,
            clock: 0,
            budget: opts.max_warp_instructions,
        };
        let warps = (0..nwarps)
            .map(|w| {
                let base = w * 32;
                let n = (nthreads - base).min(32);
                let exists = if n == 32 { FULL } else { (1u32 << n) - 1 };
                let mut tid = [[0u64; 32]; 3];
                for l in 0..n as usize {
                    let c = ctx.thread(base + l as u32);
                    for (row, &v) in tid.iter_mut().zip(&c) {
                        row[l] = v as u64;
                    }
                }
                Warp {
                    regs: vec![[0u64; 32]; k.data_regs as usize],
                    preds: vec![0u32; k.pred_regs as usize],
                    pcs: [0; 32],
                    live: exists,
                    waiting: 0,
                    bar_id: [0; 32],
                    bar_inst: [0; 32],
                    group: exists,
                    gpc: 0,
                    other_min: u32::MAX,
                    base,
                    exists,
                    tid,
                    wsync: 0,
                }
            })
            .collect();
        Block {
            ctx,
            warps,
            shared: SharedMem::default(),
            local: LocalMem::default(),
            seed: opts.seed,
        }
    }

    fn uninit_fault(&self, p: Pending) -> ExecError {
        self.ctx.fault(
            p.thr,
            p.inst,
            format!(
                "read of shared memory {} that no thread of this block has written (uninitialized shared memory)",
                self.ctx.shared_name(p.byte)
            ),
        )
    }

    fn run(
        &mut self,
        ctaid: [u32; 3],
        mem: &mut dyn GlobalMemory,
        stats: &mut LaunchStats,
    ) -> Result<(), ExecError> {
        self.ctx.ctaid = ctaid;
        for w in &mut self.warps {
            w.pcs = [0; 32];
            w.live = w.exists;
            w.waiting = 0;
            w.group = w.exists;
            w.gpc = 0;
            w.other_min = u32::MAX;
            w.wsync = 0;
        }
        self.shared.begin_block(self.ctx.shared_bytes);
        self.local
            .begin_block(self.ctx.nthreads as usize, self.ctx.k.local_bytes);
        let linear = ctaid[0] as u64
            + ctaid[1] as u64 * self.ctx.dims.grid[0] as u64
            + ctaid[2] as u64 * self.ctx.dims.grid[0] as u64 * self.ctx.dims.grid[1] as u64;
        let mut rng = self.seed ^ linear.wrapping_mul(0xd134_2543_de82_ef95);
        let mut order: Vec<usize> = (0..self.warps.len()).collect();
        loop {
            // Fisher-Yates.
            for i in (1..order.len()).rev() {
                let j = (next_rand(&mut rng) % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
            for &w in &order {
                if self.warps[w].group != 0 {
                    let r = run_warp(
                        &mut self.ctx,
                        &mut self.warps[w],
                        w as u32,
                        &mut self.shared,
                        &mut self.local,
                        mem,
                        stats,
                    );
                    if let Err(e) = r {
                        // A fault after an uninitialized shared read (say, of an index
                        // read from it) is reported as that read, unless it is a race.
                        return Err(match self.shared.take_pending() {
                            Some(p) if !self.shared.raced() => self.uninit_fault(p),
                            _ => e,
                        });
                    }
                }
            }
            if let Some(p) = self.shared.take_pending() {
                return Err(self.uninit_fault(p));
            }
            if self.warps.iter().all(|w| w.live == 0) {
                return Ok(());
            }
            // Every live thread waits at a barrier: the same one, or never released.
            let mut first: Option<(u32, u32, u32)> = None;
            for w in &self.warps {
                for l in lanes(w.waiting & w.live) {
                    let here = (w.bar_id[l], w.base + l as u32, w.bar_inst[l]);
                    match first {
                        None => first = Some(here),
                        Some((id, thr, inst)) if id != here.0 => {
                            let c = self.ctx.thread(thr);
                            return Err(self.ctx.fault(
                                here.1,
                                here.2,
                                format!(
                                    "barrier deadlock: this thread waits at barrier {} while thread ({}, {}, {}) waits at barrier {} ({}); the block's threads can never all be released",
                                    here.0, c[0], c[1], c[2], id, self.ctx.where_is(inst)
                                ),
                            ));
                        }
                        Some(_) => {}
                    }
                }
            }
            for w in &mut self.warps {
                w.waiting = 0;
                w.recompute();
            }
            self.shared.barrier();
        }
    }
}

#[inline(always)]
fn pval(preds: &[u32], p: PSrc) -> u32 {
    match p {
        PSrc::Reg(r, neg) => preds[r as usize] ^ if neg { FULL } else { 0 },
        PSrc::Imm(b) => {
            if b {
                FULL
            } else {
                0
            }
        }
    }
}

#[inline(always)]
fn merge_pred(p: &mut u32, val: u32, m: u32) {
    *p = (*p & !m) | (val & m);
}

#[inline(always)]
fn write(regs: &mut [W], d: u32, val: &W, m: u32) {
    if d == SINK {
        return;
    }
    let dst = &mut regs[d as usize];
    if m == FULL {
        *dst = *val;
    } else {
        for l in lanes(m) {
            dst[l] = val[l];
        }
    }
}

fn sreg(ctx: &Ctx<'_>, warp: &Warp, widx: u32, s: Sreg, out: &mut W) {
    let fill = |out: &mut W, v: u64| *out = [v; 32];
    match s {
        Sreg::Tid(d) => *out = warp.tid[d as usize],
        Sreg::Ntid(d) => fill(out, ctx.dims.block[d as usize] as u64),
        Sreg::Ctaid(d) => fill(out, ctx.ctaid[d as usize] as u64),
        Sreg::Nctaid(d) => fill(out, ctx.dims.grid[d as usize] as u64),
        Sreg::LaneId => {
            for (l, o) in out.iter_mut().enumerate() {
                *o = l as u64;
            }
        }
        Sreg::WarpId => fill(out, widx as u64),
        Sreg::NWarpId => fill(out, ctx.nwarps as u64),
        Sreg::SmId => fill(out, 0),
        Sreg::NSmId => fill(out, NSM),
        Sreg::GridId => fill(out, 1),
        Sreg::Clock => fill(out, ctx.clock & 0xffff_ffff),
        Sreg::Clock64 => fill(out, ctx.clock),
        Sreg::LaneMask(k) => {
            for (l, o) in out.iter_mut().enumerate() {
                let eq = 1u64 << l;
                let lt = eq - 1;
                *o = match k {
                    0 => eq,
                    1 => lt,
                    2 => lt | eq,
                    3 => !(lt | eq) & 0xffff_ffff,
                    _ => !lt & 0xffff_ffff,
                };
            }
        }
        Sreg::DynSmem => fill(out, ctx.dims.dynamic_shared_bytes as u64),
        Sreg::TotalSmem => fill(out, ctx.shared_bytes as u64),
    }
}

/// The operand's lanes: a register's row, or `tmp` filled with the value.
#[inline(always)]
fn val<'r>(ctx: &Ctx<'_>, warp: &'r Warp, widx: u32, s: &Src, tmp: &'r mut W) -> &'r W {
    match *s {
        Src::Reg(r) => &warp.regs[r as usize],
        Src::Imm(v) => {
            *tmp = [v; 32];
            tmp
        }
        Src::Sreg(sr) => {
            sreg(ctx, warp, widx, sr, tmp);
            tmp
        }
    }
}

/// Runs a warp until all its live lanes wait at a barrier or have exited.
fn run_warp(
    ctx: &mut Ctx<'_>,
    warp: &mut Warp,
    widx: u32,
    shared: &mut SharedMem,
    local: &mut LocalMem,
    mem: &mut dyn GlobalMemory,
    stats: &mut LaunchStats,
) -> Result<(), ExecError> {
    let kernel: &Kernel = ctx.k;
    let code = &kernel.code;
    let mut t1 = [0u64; 32];
    let mut t2 = [0u64; 32];
    let mut t3 = [0u64; 32];
    let mut t4 = [0u64; 32];
    let mut o = [0u64; 32];
    while warp.group != 0 {
        let pc = warp.gpc;
        let Some(inst) = code.get(pc as usize) else {
            // Running off the end of the kernel is a return.
            warp.live &= !warp.group;
            warp.recompute();
            continue;
        };
        let mut m = warp.group;
        if let Some((p, neg)) = inst.guard {
            let v = warp.preds[p as usize];
            m &= if neg { !v } else { v };
        }
        stats.warp_instructions += 1;
        stats.thread_instructions += m.count_ones() as u64;
        ctx.clock = stats.warp_instructions;
        if ctx.budget != 0 && stats.warp_instructions > ctx.budget {
            let lane = warp.group.trailing_zeros();
            return Err(ctx.fault(
                widx * 32 + lane,
                pc,
                format!(
                    "the launch ran past {} warp instructions without ending (an endless loop?)",
                    ctx.budget
                ),
            ));
        }
        match &inst.op {
            Op::Bra { target } => {
                let not_taken = warp.group & !m;
                if not_taken == 0 {
                    warp.gpc = *target;
                } else if m == 0 {
                    warp.gpc += 1;
                } else {
                    for l in lanes(m) {
                        warp.pcs[l] = *target;
                    }
                    for l in lanes(not_taken) {
                        warp.pcs[l] = pc + 1;
                    }
                    warp.recompute();
                    continue;
                }
                if warp.gpc >= warp.other_min {
                    warp.sync_pcs();
                    warp.recompute();
                }
                continue;
            }
            Op::Exit => {
                let rest = warp.group & !m;
                warp.live &= !m;
                for l in lanes(rest) {
                    warp.pcs[l] = pc + 1;
                }
                warp.recompute();
                continue;
            }
            Op::Bar { id, count } => {
                if m != 0 {
                    let ids = *val(ctx, warp, widx, id, &mut t1);
                    let counts = count.as_ref().map(|c| *val(ctx, warp, widx, c, &mut t2));
                    for l in lanes(m) {
                        let thr = warp.base + l as u32;
                        if ids[l] >= 16 {
                            return Err(ctx.fault(
                                thr,
                                pc,
                                format!("barrier id {} out of range (0..16)", ids[l]),
                            ));
                        }
                        if let Some(c) = &counts {
                            let all = ctx.nthreads.next_multiple_of(32) as u64;
                            if c[l] < all {
                                return Err(ctx.fault(
                                    thr,
                                    pc,
                                    format!("bar.sync with a thread count ({}) smaller than the block ({} threads) is not supported", c[l], ctx.nthreads),
                                ));
                            }
                        }
                        warp.bar_id[l] = ids[l] as u32;
                        warp.bar_inst[l] = pc;
                    }
                    warp.waiting |= m;
                }
                for l in lanes(warp.group) {
                    warp.pcs[l] = pc + 1;
                }
                warp.recompute();
                continue;
            }
            Op::Trap => {
                if m != 0 {
                    let l = m.trailing_zeros();
                    return Err(ctx.fault(warp.base + l, pc, "trap instruction executed".into()));
                }
            }
            Op::Nop => {}
            Op::WarpSync => {
                if m != 0 {
                    warp.wsync += 1;
                }
            }
            _ if m == 0 => {}
            Op::Mov { d, a, m: bits } => {
                let a = val(ctx, warp, widx, a, &mut t1);
                for l in 0..32 {
                    o[l] = a[l] & bits;
                }
                write(&mut warp.regs, *d, &o, m);
            }
            Op::Un { f, d, a } => {
                f(val(ctx, warp, widx, a, &mut t1), &mut o);
                write(&mut warp.regs, *d, &o, m);
            }
            Op::Bin { f, d, a, b } => {
                f(
                    val(ctx, warp, widx, a, &mut t1),
                    val(ctx, warp, widx, b, &mut t2),
                    &mut o,
                );
                write(&mut warp.regs, *d, &o, m);
            }
            Op::Tern { f, d, a, b, c } => {
                f(
                    val(ctx, warp, widx, a, &mut t1),
                    val(ctx, warp, widx, b, &mut t2),
                    val(ctx, warp, widx, c, &mut t3),
                    &mut o,
                );
                write(&mut warp.regs, *d, &o, m);
            }
            Op::Quad { f, d, a, b, c, e } => {
                f(
                    val(ctx, warp, widx, a, &mut t1),
                    val(ctx, warp, widx, b, &mut t2),
                    val(ctx, warp, widx, c, &mut t3),
                    val(ctx, warp, widx, e, &mut t4),
                    &mut o,
                );
                write(&mut warp.regs, *d, &o, m);
            }
            Op::Setp {
                f,
                p,
                q,
                a,
                b,
                comb,
            } => {
                let r = f(
                    val(ctx, warp, widx, a, &mut t1),
                    val(ctx, warp, widx, b, &mut t2),
                );
                let (r1, r2) = match comb {
                    None => (r, !r),
                    Some((op, c)) => {
                        let c = pval(&warp.preds, *c);
                        match op {
                            BoolOp::And => (r & c, !r & c),
                            BoolOp::Or => (r | c, !r | c),
                            BoolOp::Xor => (r ^ c, !r ^ c),
                        }
                    }
                };
                merge_pred(&mut warp.preds[*p as usize], r1, m);
                if *q != SINK {
                    merge_pred(&mut warp.preds[*q as usize], r2, m);
                }
            }
            Op::Selp { d, a, b, p } => {
                let pm = pval(&warp.preds, *p);
                let a = val(ctx, warp, widx, a, &mut t1);
                let b = val(ctx, warp, widx, b, &mut t2);
                for l in 0..32 {
                    o[l] = if (pm >> l) & 1 != 0 { a[l] } else { b[l] };
                }
                write(&mut warp.regs, *d, &o, m);
            }
            Op::PredMov { d, a } => {
                let v = pval(&warp.preds, *a);
                merge_pred(&mut warp.preds[*d as usize], v, m);
            }
            Op::PredBin { op, d, a, b } => {
                let (x, y) = (pval(&warp.preds, *a), pval(&warp.preds, *b));
                let v = match op {
                    BoolOp::And => x & y,
                    BoolOp::Or => x | y,
                    BoolOp::Xor => x ^ y,
                };
                merge_pred(&mut warp.preds[*d as usize], v, m);
            }
            Op::Pack { d, parts, bits } => {
                o = [0; 32];
                for (k, p) in parts.iter().enumerate() {
                    let v = val(ctx, warp, widx, p, &mut t1);
                    for l in 0..32 {
                        o[l] |= (v[l] & mask(*bits)) << (k as u32 * bits);
                    }
                }
                write(&mut warp.regs, *d, &o, m);
            }
            Op::Unpack { ds, a, bits } => {
                let a = *val(ctx, warp, widx, a, &mut t1);
                for (k, &d) in ds.iter().enumerate() {
                    for l in 0..32 {
                        o[l] = (a[l] >> (k as u32 * bits)) & mask(*bits);
                    }
                    write(&mut warp.regs, d, &o, m);
                }
            }
            Op::Ld {
                space,
                elem,
                n,
                sext,
                ds,
                dmask,
                addr,
                off,
            } => {
                let base = *val(ctx, warp, widx, addr, &mut t1);
                let mut vals = [0u128; 32];
                access(
                    ctx,
                    warp,
                    shared,
                    local,
                    mem,
                    pc,
                    *space,
                    *elem * *n,
                    m,
                    &base,
                    *off,
                    &mut vals,
                    false,
                )?;
                let bits = *elem * 8;
                for (k, &d) in ds.iter().enumerate().take(*n as usize) {
                    if d == SINK {
                        continue;
                    }
                    for l in lanes(m) {
                        let mut e = ((vals[l] >> (k as u32 * bits)) as u64) & mask(bits);
                        if *sext && bits < 64 && (e >> (bits - 1)) & 1 == 1 {
                            e |= !mask(bits);
                        }
                        warp.regs[d as usize][l] = e & dmask[k];
                    }
                }
            }
            Op::St {
                space,
                elem,
                n,
                srcs,
                addr,
                off,
            } => {
                let base = *val(ctx, warp, widx, addr, &mut t1);
                let bits = *elem * 8;
                let mut vals = [0u128; 32];
                for (k, s) in srcs.iter().enumerate().take(*n as usize) {
                    let v = val(ctx, warp, widx, s, &mut t2);
                    for l in lanes(m) {
                        vals[l] |= ((v[l] & mask(bits)) as u128) << (k as u32 * bits);
                    }
                }
                access(
                    ctx,
                    warp,
                    shared,
                    local,
                    mem,
                    pc,
                    *space,
                    *elem * *n,
                    m,
                    &base,
                    *off,
                    &mut vals,
                    true,
                )?;
            }
        }
        warp.gpc += 1;
        if warp.gpc >= warp.other_min {
            warp.sync_pcs();
            warp.recompute();
        }
    }
    Ok(())
}
