//! The data movement of each collective, over every rank's buffers at once.
//!
//! Reductions read ranks in order 0, 1, …, N−1 and accumulate in `f32`, then round once to
//! the element type: every rank gets the same bits, whatever the thread count.

use crate::buffer::{HostBuffer, HostElement};
use crate::op::{even_split, OpDesc, OpKind};
use crate::reduce::{reduce_into, reduce_into_streaming, STREAM_MIN_BYTES, TILE};
use crate::ReduceOp;
use half::{bf16, f16};
use rayon::prelude::*;
use zero_kernels::{DType, PAR_CHUNK};

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

/// Below this many elements moved in all, a collective runs in the calling thread: waking
/// rayon's pool and waiting for it costs more than the copies (tens of µs).
const PARALLEL_MIN: usize = 1 << 15;

/// Runs `f` on every item, on rayon's pool when `parallel`.
fn each<I: Send>(parallel: bool, items: Vec<I>, f: impl Fn(I) + Sync + Send) {
    if parallel {
        items.into_par_iter().for_each(f);
    } else {
        items.into_iter().for_each(f);
    }
}

fn typed<T: HostElement + bytemuck::Pod>(desc: &OpDesc, buffers: &mut [Vec<HostBuffer>]) {
    let world = buffers.len();
    let op = desc.reduce.unwrap_or(ReduceOp::Sum);
    let parallel = desc.count * world >= PARALLEL_MIN;
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
            each(parallel, per_chunk, |mut chunks| {
                all_reduce_chunk(&mut chunks, op, world)
            });
        }
        OpKind::ReduceScatter => {
            let (inputs, outputs) = split_pairs::<T>(buffers);
            // Every chunk of every rank's output is one task: it reads that range of every
            // input, in rank order.
            let mut tasks: Vec<(usize, &mut [T])> = Vec::new();
            for (rank, out) in outputs.into_iter().enumerate() {
                let piece = even_split(desc.count, world, rank);
                for (c, chunk) in out.chunks_mut(PAR_CHUNK).enumerate() {
                    tasks.push((piece.start + c * PAR_CHUNK, chunk));
                }
            }
            // A large output is streamed out (see STREAM_MIN_BYTES).
            let cold = desc.count / world * std::mem::size_of::<T>() >= STREAM_MIN_BYTES;
            each(parallel, tasks, |(start, out)| {
                let ins: Vec<&[T]> = inputs
                    .iter()
                    .map(|b| &b[start..start + out.len()])
                    .collect();
                if cold {
                    reduce_into_streaming(out, &ins, op, world);
                } else {
                    reduce_chunk(out, &ins, op, world);
                }
            });
        }
        OpKind::AllGather => {
            let (inputs, outputs) = split_pairs::<T>(buffers);
            each(parallel, outputs, |out| {
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
            let others: Vec<&mut [T]> = bufs
                .drain(..)
                .enumerate()
                .filter(|(r, _)| *r != root)
                .map(|(_, b)| b)
                .collect();
            each(parallel, others, |b| b.copy_from_slice(&src));
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
    reduce_into(out, inputs, op, world);
}

/// All-reduce of one chunk held by every rank: reads each rank's chunk once, then writes
/// the result to each.
fn all_reduce_chunk<T: HostElement>(chunks: &mut [&mut [T]], op: ReduceOp, world: usize) {
    let mut tile = [T::from_f32(0.0); TILE];
    let len = chunks[0].len();
    for start in (0..len).step_by(TILE) {
        let range = start..(start + TILE).min(len);
        let out = &mut tile[..range.len()];
        {
            let ins: Vec<&[T]> = chunks.iter().map(|c| &c[range.clone()]).collect();
            reduce_into(out, &ins, op, world);
        }
        for c in chunks.iter_mut() {
            c[range.clone()].copy_from_slice(out);
        }
    }
}
