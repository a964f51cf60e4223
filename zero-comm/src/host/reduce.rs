//! The data movement of each collective, over every rank's buffers at once.
//!
//! Reductions read ranks in order 0, 1, …, N−1 and accumulate in `f32`, then round once to
//! the element type: every rank gets the same bits, whatever the thread count.

use crate::buffer::{HostBuffer, HostElement};
use crate::op::{even_split, OpDesc, OpKind};
use crate::ReduceOp;
use half::{bf16, f16};
use rayon::prelude::*;
use zero_kernels::{DType, PAR_CHUNK};

/// Elements reduced at a time per thread: an `f32` accumulator this long stays in L1.
const TILE: usize = 2048;

/// Runs `desc` over `buffers[rank]` (the buffers each rank posted, already checked to
/// match).
pub(super) fn execute(desc: &OpDesc, buffers: &mut [Vec<HostBuffer>]) {
    match desc.dtype {
        Some(DType::F32) => typed::<f32>(desc, buffers),
        Some(DType::F16) => typed::<f16>(desc, buffers),
        Some(DType::BF16) => typed::<bf16>(desc, buffers),
        None => {} // barrier: nothing moves
    }
}

fn typed<T: HostElement>(desc: &OpDesc, buffers: &mut [Vec<HostBuffer>]) {
    let world = buffers.len();
    let op = desc.reduce.unwrap_or(ReduceOp::Sum);
    match desc.kind {
        OpKind::AllReduce => {
            // Chunk c of every rank's buffer goes to one task, which reads all of them and
            // writes the result back to all of them: one read and one write per element.
            let mut per_chunk: Vec<Vec<&mut [T]>> = Vec::new();
            for b in buffers.iter_mut().filter_map(|b| T::slice_mut(&mut b[0])) {
                for (c, chunk) in b.chunks_mut(PAR_CHUNK).enumerate() {
                    if per_chunk.len() <= c {
                        per_chunk.push(Vec::with_capacity(world));
                    }
                    per_chunk[c].push(chunk);
                }
            }
            per_chunk
                .into_par_iter()
                .for_each(|mut chunks| all_reduce_chunk(&mut chunks, op, world));
        }
        OpKind::ReduceScatter => {
            let (inputs, mut outputs) = split_pairs::<T>(buffers);
            outputs.par_iter_mut().enumerate().for_each(|(rank, out)| {
                let piece = even_split(desc.count, world, rank);
                out.par_chunks_mut(PAR_CHUNK)
                    .enumerate()
                    .for_each(|(c, out)| {
                        let start = piece.start + c * PAR_CHUNK;
                        let ins: Vec<&[T]> = inputs
                            .iter()
                            .map(|b| &b[start..start + out.len()])
                            .collect();
                        reduce_chunk(out, &ins, op, world);
                    });
            });
        }
        OpKind::AllGather => {
            let (inputs, mut outputs) = split_pairs::<T>(buffers);
            outputs.par_iter_mut().for_each(|out| {
                for (rank, input) in inputs.iter().enumerate() {
                    out[even_split(desc.count, world, rank)].copy_from_slice(input);
                }
            });
        }
        OpKind::Broadcast => {
            let root = desc.root.unwrap_or(0);
            let mut bufs: Vec<&mut [T]> = buffers
                .iter_mut()
                .filter_map(|b| T::slice_mut(&mut b[0]))
                .collect();
            let src: Vec<T> = bufs[root].to_vec();
            bufs.par_iter_mut()
                .enumerate()
                .filter(|(r, _)| *r != root)
                .for_each(|(_, b)| b.copy_from_slice(&src));
        }
        OpKind::Barrier => {}
    }
}

/// Splits each rank's `[input, output]` into the inputs (read) and outputs (written).
fn split_pairs<T: HostElement>(buffers: &mut [Vec<HostBuffer>]) -> (Vec<&[T]>, Vec<&mut [T]>) {
    buffers
        .iter_mut()
        .filter_map(|b| match b.as_mut_slice() {
            [input, output] => Some((T::slice(input)?, T::slice_mut(output)?)),
            _ => None,
        })
        .unzip()
}

/// `out[i] = op(inputs[0][i], inputs[1][i], …)` in that order, in `f32`, rounded once; for
/// `Avg` the sum is divided by `world`.
fn reduce_chunk<T: HostElement>(out: &mut [T], inputs: &[&[T]], op: ReduceOp, world: usize) {
    let mut acc = [0f32; TILE];
    for (t, out) in out.chunks_mut(TILE).enumerate() {
        let acc = &mut acc[..out.len()];
        let tile = t * TILE..t * TILE + out.len();
        load(acc, &inputs[0][tile.clone()]);
        for input in &inputs[1..] {
            fold(acc, &input[tile.clone()], op);
        }
        finish(acc, op, world);
        store(out, acc);
    }
}

/// All-reduce of one chunk held by every rank: reads each rank's chunk once, then writes
/// the result to each.
fn all_reduce_chunk<T: HostElement>(chunks: &mut [&mut [T]], op: ReduceOp, world: usize) {
    let mut acc = [0f32; TILE];
    let len = chunks[0].len();
    for start in (0..len).step_by(TILE) {
        let tile = start..(start + TILE).min(len);
        let acc = &mut acc[..tile.len()];
        load(acc, &chunks[0][tile.clone()]);
        for c in &chunks[1..] {
            fold(acc, &c[tile.clone()], op);
        }
        finish(acc, op, world);
        for c in chunks.iter_mut() {
            store(&mut c[tile.clone()], acc);
        }
    }
}

// The per-element loops are compiled for several target sets and picked at run time. No
// FMA, so every version gives the same bits.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
fn load<T: HostElement>(acc: &mut [f32], x: &[T]) {
    for (a, x) in acc.iter_mut().zip(x) {
        *a = x.to_f32();
    }
}

#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
fn fold<T: HostElement>(acc: &mut [f32], x: &[T], op: ReduceOp) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc.iter_mut().zip(x).for_each(|(a, x)| *a += x.to_f32()),
        ReduceOp::Max => acc
            .iter_mut()
            .zip(x)
            .for_each(|(a, x)| *a = nan_max(*a, x.to_f32())),
    }
}

fn finish(acc: &mut [f32], op: ReduceOp, world: usize) {
    if op == ReduceOp::Avg {
        let n = world as f32;
        acc.iter_mut().for_each(|a| *a /= n);
    }
}

#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
    "x86_64+avx2+avx+sse4.2+sse4.1+ssse3+sse3",
))]
fn store<T: HostElement>(out: &mut [T], acc: &[f32]) {
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
