//! The one-device group gives the host group's bits for every collective, dtype and
//! reduce op at 1 to 4 ranks, on lengths that do not divide by the world size. Without a
//! GPU it prints a visible skip.

mod common;

use common::run_ranks;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zero_comm::{
    even_split, Communicator, Completion, DeviceGroup, HostBuffer, HostGroup, ReduceOp,
};
use zero_kernels::cuda::Gpu;
use zero_kernels::testing::{canonical_bits, gpu_or_skip};
use zero_kernels::{with_gpu_type, DType, Element};

#[derive(Debug, Clone, Copy)]
enum Op {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
    Broadcast(usize),
}

fn host_vec<T: Element>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// Runs `op` on host ranks: the outputs, as bits widened to f32 per rank (any NaN equal
/// to any NaN).
fn on_host(op: Op, dtype: DType, inputs: &[Vec<f32>], n: usize) -> Vec<Vec<u32>> {
    let world = inputs.len();
    let buf = |v: &[f32]| -> HostBuffer {
        with_gpu_type!(dtype, T => HostBuffer::from(host_vec::<T>(v)))
    };
    run_ranks(HostGroup::new(world).unwrap(), |c| {
        let r = c.rank();
        let out = match op {
            Op::AllReduce(o) => c.all_reduce(buf(&inputs[r]), o).unwrap().wait().unwrap(),
            Op::ReduceScatter(o) => {
                let len = even_split(n, world, r).len();
                let w = c
                    .reduce_scatter(buf(&inputs[r]), buf(&vec![0.0; len]), o)
                    .unwrap();
                w.wait().unwrap().1
            }
            Op::AllGather => {
                let len = even_split(n, world, r).len();
                let w = c
                    .all_gather(buf(&inputs[r][..len]), buf(&vec![0.0; n]))
                    .unwrap();
                w.wait().unwrap().1
            }
            Op::Broadcast(root) => c.broadcast(buf(&inputs[r]), root).unwrap().wait().unwrap(),
        };
        with_gpu_type!(dtype, T => canonical_bits(out.as_slice::<T>().unwrap()))
    })
}

/// The same on one-device ranks, each issuing from its own stream.
fn on_device(
    g: &'static Gpu,
    op: Op,
    dtype: DType,
    inputs: &[Vec<f32>],
    n: usize,
) -> Vec<Vec<u32>> {
    let world = inputs.len();
    run_ranks(DeviceGroup::new(world).unwrap(), |c| {
        let st = g.new_stream().unwrap();
        let r = c.rank();
        let buf = |v: &[f32]| with_gpu_type!(dtype, T => st.upload(&host_vec::<T>(v)).unwrap());
        let out = match op {
            Op::AllReduce(o) => c.all_reduce(buf(&inputs[r]), o).unwrap().wait().unwrap(),
            Op::ReduceScatter(o) => {
                let len = even_split(n, world, r).len();
                let w = c
                    .reduce_scatter(buf(&inputs[r]), buf(&vec![f32::NAN; len]), o)
                    .unwrap();
                w.wait().unwrap().1
            }
            Op::AllGather => {
                let len = even_split(n, world, r).len();
                let w = c
                    .all_gather(buf(&inputs[r][..len]), buf(&vec![f32::NAN; n]))
                    .unwrap();
                w.wait().unwrap().1
            }
            Op::Broadcast(root) => c.broadcast(buf(&inputs[r]), root).unwrap().wait().unwrap(),
        };
        let len = out.len();
        with_gpu_type!(dtype, T => canonical_bits(&st.download::<T>(&out, 0..len).unwrap()))
    })
}

#[test]
fn one_device_collectives_give_the_host_groups_bits() {
    let Some(g) = gpu_or_skip("one-device collectives") else {
        return;
    };
    let seed = zero_kernels::testing::fresh_seed("one-device collectives");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for world in 1..=4 {
        for n in [0, 1, 7, 1000, 65_537] {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let mut inputs: Vec<Vec<f32>> = (0..world)
                    .map(|_| (0..n).map(|_| rng.gen_range(-60.0f32..60.0)).collect())
                    .collect();
                if n > 0 {
                    inputs[world - 1][n / 2] = f32::INFINITY;
                }
                let root = rng.gen_range(0..world);
                for op in [
                    Op::AllReduce(ReduceOp::Sum),
                    Op::AllReduce(ReduceOp::Avg),
                    Op::AllReduce(ReduceOp::Max),
                    Op::ReduceScatter(ReduceOp::Sum),
                    Op::ReduceScatter(ReduceOp::Avg),
                    Op::AllGather,
                    Op::Broadcast(root),
                ] {
                    let host = on_host(op, dtype, &inputs, n);
                    let dev = on_device(g, op, dtype, &inputs, n);
                    assert!(
                        host == dev,
                        "{op:?} {dtype} world={world} n={n} (seed {seed})"
                    );
                }
            }
        }
    }
}

/// Shard (`rank / 2`) and replica (`rank % 2`, keys reversed) groups of 4 ranks: every
/// collective's bits on a sub-group of the one-device group, as `f32`, per parent rank.
fn split_results<C: Communicator>(
    comms: Vec<C>,
    inputs: &[Vec<f32>],
    up: impl Fn(&[f32]) -> C::Buffer + Sync,
    down: impl Fn(&C::Buffer) -> Vec<u32> + Sync,
) -> Vec<Vec<Vec<u32>>>
where
    C::Buffer: Send,
{
    let n = inputs[0].len();
    run_ranks(comms, |c| {
        let r = c.rank();
        let shard = c.split(r / 2, r).unwrap();
        let replica = c.split(r % 2, 4 - r).unwrap();
        let mut out = Vec::new();
        for sub in [&shard, &replica] {
            let (me, world) = (sub.rank(), sub.world_size());
            let x = &inputs[r];
            let ar = sub
                .all_reduce(up(x), ReduceOp::Sum)
                .unwrap()
                .wait()
                .unwrap();
            let piece = even_split(n, world, me);
            let (_, rs) = sub
                .reduce_scatter(up(x), up(&vec![f32::NAN; piece.len()]), ReduceOp::Avg)
                .unwrap()
                .wait()
                .unwrap();
            let (_, ag) = sub
                .all_gather(up(&x[piece]), up(&vec![f32::NAN; n]))
                .unwrap()
                .wait()
                .unwrap();
            out.extend([
                down(&ar),
                down(&rs),
                down(&ag),
                vec![me as u32, world as u32],
            ]);
        }
        out
    })
}

#[test]
fn one_device_sub_groups_give_the_host_groups_bits() {
    let Some(g) = gpu_or_skip("one-device split") else {
        return;
    };
    let seed = zero_kernels::testing::fresh_seed("one-device split");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = 1001;
    let inputs: Vec<Vec<f32>> = (0..4)
        .map(|_| (0..n).map(|_| rng.gen_range(-60.0f32..60.0)).collect())
        .collect();
    let host = split_results(
        HostGroup::new(4).unwrap(),
        &inputs,
        |v| HostBuffer::from(v.to_vec()),
        |b| canonical_bits(b.as_slice::<f32>().unwrap()),
    );
    let st = g.new_stream().unwrap();
    let dev = split_results(
        DeviceGroup::new(4).unwrap(),
        &inputs,
        |v| st.upload(v).unwrap(),
        |b| canonical_bits(&st.download::<f32>(b, 0..b.len()).unwrap()),
    );
    assert!(
        host == dev,
        "sub-groups differ from the host group's (seed {seed})"
    );
}
