//! Loads and stores of a warp: alignment, the state space of each lane's address, and
//! the memory that serves it (the caller's global memory, shared, local, parameters).

use super::super::decode::Space;
use super::super::ops::W;
use super::super::shared::{LocalMem, SharedMem};
use super::super::{GlobalMemory, LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW, WINDOW_BYTES};
use super::ExecError;
use super::{lanes, Ctx, Warp};

/// Where a generic address points.
fn classify(a: u64) -> (Space, u64) {
    for (base, space) in [
        (SHARED_WINDOW, Space::Shared),
        (LOCAL_WINDOW, Space::Local),
        (PARAM_WINDOW, Space::Param),
    ] {
        if a >= base && a - base < WINDOW_BYTES {
            return (space, a - base);
        }
    }
    (Space::Global, a)
}

/// A load (into `vals`) or store (from `vals`) of `size` bytes per active lane.
#[allow(clippy::too_many_arguments)]
pub(super) fn access(
    ctx: &Ctx<'_>,
    warp: &Warp,
    shared: &mut SharedMem,
    local: &mut LocalMem,
    mem: &mut dyn GlobalMemory,
    pc: u32,
    space: Space,
    size: u32,
    m: u32,
    base: &W,
    off: i64,
    vals: &mut [u128; 32],
    store: bool,
) -> Result<(), ExecError> {
    let kind = if store { "store" } else { "load" };
    let mut addrs = [0u64; 32];
    let mut generic_mix = false;
    for l in lanes(m) {
        let a = base[l].wrapping_add(off as u64);
        if a % size as u64 != 0 {
            return Err(ctx.fault(
                warp.base + l as u32,
                pc,
                format!("misaligned address: {} {kind} of {size} bytes at 0x{a:x} (must be a multiple of {size})", space.name()),
            ));
        }
        addrs[l] = a;
        if space == Space::Generic && classify(a).0 != Space::Global {
            generic_mix = true;
        }
    }
    // Global lanes: one call for the warp.
    let mut g_addr = [0u64; 32];
    let mut g_thr = [0u32; 32];
    let mut g_val = [0u128; 32];
    let mut g_lane = [0usize; 32];
    let mut ng = 0;
    for l in lanes(m) {
        let (sp, a) = match space {
            Space::Generic if generic_mix => classify(addrs[l]),
            Space::Generic => (Space::Global, addrs[l]),
            s => (s, addrs[l]),
        };
        let thr = warp.base + l as u32;
        match sp {
            Space::Global | Space::Generic => {
                g_addr[ng] = a;
                g_thr[ng] = thr;
                g_val[ng] = vals[l];
                g_lane[ng] = l;
                ng += 1;
            }
            Space::Shared => {
                let r = if store {
                    shared.store(a, size, vals[l], thr, warp.wsync, pc)
                } else {
                    shared
                        .load(a, size, thr, warp.wsync, pc)
                        .map(|v| vals[l] = v)
                };
                r.map_err(|f| ctx.mem_fault(Space::Shared, thr, pc, f, store))?;
            }
            Space::Local => {
                let r = if store {
                    local.store(thr, a, size, vals[l])
                } else {
                    local.load(thr, a, size).map(|v| vals[l] = v)
                };
                r.map_err(|f| ctx.mem_fault(Space::Local, thr, pc, f, store))?;
            }
            Space::Param => {
                if store {
                    return Err(ctx.fault(thr, pc, format!("write to kernel parameter memory (offset {a}): parameters are read-only")));
                }
                let end = a
                    .checked_add(size as u64)
                    .filter(|&e| e <= ctx.params.len() as u64);
                let Some(end) = end else {
                    return Err(ctx.fault(
                        thr,
                        pc,
                        format!("parameter read of {size} bytes at offset {a} is outside the {}-byte parameter buffer", ctx.params.len()),
                    ));
                };
                let mut v = 0u128;
                for (i, &b) in ctx.params[a as usize..end as usize].iter().enumerate() {
                    v |= (b as u128) << (8 * i);
                }
                vals[l] = v;
            }
        }
    }
    if ng == 0 {
        return Ok(());
    }
    let r = if store {
        mem.store(size, &g_addr[..ng], &g_thr[..ng], &g_val[..ng])
    } else {
        mem.load(size, &g_addr[..ng], &g_thr[..ng], &mut g_val[..ng])
    };
    match r {
        Ok(()) => {
            if !store {
                for i in 0..ng {
                    vals[g_lane[i]] = g_val[i];
                }
            }
            Ok(())
        }
        Err(msg) => {
            // Find the lane: the first whose access alone fails (the launch is aborted,
            // so repeating accesses does no harm).
            let mut culprit = g_thr[0];
            let mut culprit_addr = g_addr[0];
            for i in 0..ng {
                let mut one = [g_val[i]];
                let r = if store {
                    mem.store(size, &g_addr[i..=i], &g_thr[i..=i], &one)
                } else {
                    mem.load(size, &g_addr[i..=i], &g_thr[i..=i], &mut one)
                };
                if r.is_err() {
                    culprit = g_thr[i];
                    culprit_addr = g_addr[i];
                    break;
                }
            }
            Err(ctx.fault(
                culprit,
                pc,
                format!("global {kind} of {size} bytes at 0x{culprit_addr:x}: {msg}"),
            ))
        }
    }
}
