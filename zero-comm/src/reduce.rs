//! The one reduction core of every host collective, in-process or across processes: an
//! `f32` accumulator tile loaded from the first rank's values, folded with each next
//! rank's in rank order, finished (`Avg` divides by the world size) and rounded once to the
//! element type. Every rank — and every backend — therefore gets the same bits for the
//! same inputs, whatever thread or process computes a piece.

use crate::buffer::HostElement;
use crate::ReduceOp;

/// Elements reduced at a time: an `f32` accumulator this long stays in L1.
pub(crate) const TILE: usize = 2048;

// The per-element loops are compiled for several target sets and picked at run time. No
// FMA, so every version gives the same bits.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
pub(crate) fn load<T: HostElement>(acc: &mut [f32], x: &[T]) {
    for (a, x) in acc.iter_mut().zip(x) {
        *a = x.to_f32();
    }
}

#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
pub(crate) fn fold<T: HostElement>(acc: &mut [f32], x: &[T], op: ReduceOp) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc.iter_mut().zip(x).for_each(|(a, x)| *a += x.to_f32()),
        ReduceOp::Max => acc
            .iter_mut()
            .zip(x)
            .for_each(|(a, x)| *a = nan_max(*a, x.to_f32())),
    }
}

pub(crate) fn finish(acc: &mut [f32], op: ReduceOp, world: usize) {
    if op == ReduceOp::Avg {
        let n = world as f32;
        acc.iter_mut().for_each(|a| *a /= n);
    }
}

#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
pub(crate) fn store<T: HostElement>(out: &mut [T], acc: &[f32]) {
    for (o, a) in out.iter_mut().zip(acc) {
        *o = T::from_f32(*a);
    }
}

/// Maximum in which NaN wins, so a non-finite flag is never reduced away.
#[inline(always)]
pub(crate) fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}
