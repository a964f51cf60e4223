//! Non-finite check and sum of squares in one pass, for overflow detection and the global
//! gradient norm.

use crate::{Element, PAR_CHUNK};
use rayon::prelude::*;

/// Elements per partial sum. Partial sums are formed serially inside a chunk (8 lanes in
/// fixed order) and added in chunk order, so the result does not depend on thread count.
pub const STATS_CHUNK: usize = PAR_CHUNK;

const LANES: usize = 8;

/// What one pass over a gradient range found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradStats {
    /// Σ x² accumulated in `f64` (each square is exact; only the additions round).
    pub sum_sq: f64,
    /// Whether any element is ±inf or NaN.
    pub non_finite: bool,
}

impl GradStats {
    /// Stats of an empty range.
    pub const EMPTY: GradStats = GradStats {
        sum_sq: 0.0,
        non_finite: false,
    };

    /// Combines the stats of two ranges (left then right: the order is part of the result).
    pub fn merge(self, right: GradStats) -> GradStats {
        GradStats {
            sum_sq: self.sum_sq + right.sum_sq,
            non_finite: self.non_finite | right.non_finite,
        }
    }
}

/// Finds non-finite elements and sums squares of `x`, on all threads, deterministically.
pub fn grad_stats<T: Element>(x: &[T]) -> GradStats {
    let partials: Vec<GradStats> = x.par_chunks(STATS_CHUNK).map(chunk_stats).collect();
    partials
        .into_iter()
        .fold(GradStats::EMPTY, GradStats::merge)
}

// Compiled for several target sets, picked at run time; no FMA, so all give the same bits.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
fn chunk_stats<T: Element>(x: &[T]) -> GradStats {
    let mut acc = [0f64; LANES];
    let mut bad = false;
    let blocks = x.chunks_exact(LANES);
    let tail = blocks.remainder();
    for b in blocks {
        for j in 0..LANES {
            let f = b[j].to_f32() as f64;
            acc[j] += f * f;
            bad |= !b[j].is_finite();
        }
    }
    for (j, e) in tail.iter().enumerate() {
        let f = e.to_f32() as f64;
        acc[j] += f * f;
        bad |= !e.is_finite();
    }
    // Fixed pairwise combination of the lanes.
    let sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    GradStats {
        sum_sq: sum,
        non_finite: bad,
    }
}
