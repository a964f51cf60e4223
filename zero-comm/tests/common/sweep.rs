//! One sweep of every collective for the suites that compare a group with the in-process
//! host group's bits.
#![allow(dead_code)] // not every suite uses all of it

use super::meeting::{bytes_mut, bytes_of};
use half::{bf16, f16};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use zero_comm::{even_split, Communicator, Completion, HostBuffer, ReduceOp};
use zero_kernels::DType;

/// Seeded values with the awkward ones mixed in (inf, NaN, -0, tiny).
pub fn values(rng: &mut ChaCha8Rng, dtype: DType, n: usize) -> HostBuffer {
    let v: Vec<f32> = (0..n)
        .map(|_| match rng.gen_range(0..40) {
            0 => f32::INFINITY,
            1 => f32::NAN,
            2 => -0.0,
            3 => 1e-30,
            _ => rng.gen_range(-4.0f32..4.0),
        })
        .collect();
    match dtype {
        DType::F32 => HostBuffer::F32(v.into()),
        DType::F16 => HostBuffer::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
        DType::BF16 => HostBuffer::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
    }
}

/// Every collective on `comm`, this rank's results as bytes (`inputs`: every rank's).
pub fn every_collective<C: Communicator<Buffer = HostBuffer>>(
    comm: &C,
    inputs: &[HostBuffer],
    op: ReduceOp,
) -> Vec<Vec<u8>> {
    let (r, w) = (comm.rank(), comm.world_size());
    let x = inputs[r].clone();
    let n = x.len();
    let poison = |len| {
        let mut b = HostBuffer::zeros(x.dtype(), len);
        bytes_mut(&mut b).fill(0x7f);
        b
    };
    let ar = comm.all_reduce(x.clone(), op).unwrap().wait().unwrap();
    let piece = even_split(n, w, r).len();
    let (_, rs) = comm
        .reduce_scatter(x.clone(), poison(piece), op)
        .unwrap()
        .wait()
        .unwrap();
    let (_, ag) = comm
        .all_gather(rs.clone(), poison(n))
        .unwrap()
        .wait()
        .unwrap();
    let bc = comm.broadcast(x.clone(), w - 1).unwrap().wait().unwrap();
    comm.barrier().unwrap().wait().unwrap();
    vec![bytes_of(&ar), bytes_of(&rs), bytes_of(&ag), bytes_of(&bc)]
}
