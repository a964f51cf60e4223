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
            let mut bufs: Vec<&mut [T]> = buffers
                .iter_mut()
                .filter_map(|b| T::slice_mut(&mut b[0]))
                .collect();
            let (first, rest) = bufs.split_at_mut(1);
            let rest: Vec<&[T]> = rest.iter().map(|b| &**b).collect();
            first[0]
                .par_chunks_mut(PAR_CHUNK)
                .enumerate()
                .for_each(|(c, out)| {
                    let inputs: Vec<&[T]> = rest
                        .iter()
                        .map(|b| &b[c * PAR_CHUNK..][..out.len()])
                        .collect();
                    reduce_in_place(out, &inputs, op, world);
                });
            let (first, rest) = bufs.split_at_mut(1);
            let result: &[T] = first[0];
            rest.par_iter_mut().for_each(|b| b.copy_from_slice(result));
        }
        OpKind::ReduceScatter => {
            let (inputs, mut outputs) = split_pairs::<T>(buffers);
            outputs.par_iter_mut().enumerate().for_each(|(rank, out)| {
                let piece = even_split(desc.count, world, rank);
                out.par_chunks_mut(PAR_CHUNK)
                    .enumerate()
                    .for_each(|(c, out)| {
                        let start = piece.start + c * PAR_CHUNK;
                        out.copy_from_slice(&inputs[0][start..start + out.len()]);
                        let others: Vec<&[T]> = inputs[1..]
                            .iter()
                            .map(|b| &b[start..start + out.len()])
                            .collect();
                        reduce_in_place(out, &others, op, world);
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

/// `out[i] = op(out[i], inputs[0][i], inputs[1][i], …)` in that order, in `f32`, rounded
/// once; for `Avg` the sum is divided by `world`.
fn reduce_in_place<T: HostElement>(out: &mut [T], inputs: &[&[T]], op: ReduceOp, world: usize) {
    let mut acc = [0f32; TILE];
    for (t, out) in out.chunks_mut(TILE).enumerate() {
        let acc = &mut acc[..out.len()];
        for (a, o) in acc.iter_mut().zip(out.iter()) {
            *a = o.to_f32();
        }
        for input in inputs {
            let input = &input[t * TILE..][..out.len()];
            match op {
                ReduceOp::Sum | ReduceOp::Avg => acc
                    .iter_mut()
                    .zip(input)
                    .for_each(|(a, x)| *a += x.to_f32()),
                ReduceOp::Max => acc
                    .iter_mut()
                    .zip(input)
                    .for_each(|(a, x)| *a = nan_max(*a, x.to_f32())),
            }
        }
        if op == ReduceOp::Avg {
            let n = world as f32;
            acc.iter_mut().for_each(|a| *a /= n);
        }
        for (o, a) in out.iter_mut().zip(acc.iter()) {
            *o = T::from_f32(*a);
        }
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
