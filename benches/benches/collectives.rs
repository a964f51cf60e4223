//! Host collectives of an in-process group of 4 ranks on bf16 buffers, 1M to 64M
//! elements. Throughput is algorithm bandwidth: the collective's length `n` × 2 bytes per
//! unit of time (nccl-tests' "algbw"). Bus bandwidth is algbw × 2(N−1)/N for all-reduce and
//! × (N−1)/N for reduce-scatter and all-gather.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::{Duration, Instant};
use zero_benches::{config, label, SIZES};
use zero_comm::{even_split, Communicator, Completion, HostBuffer, HostComm, HostGroup, ReduceOp};
use zero_kernels::DType;

const WORLD: usize = 4;

#[derive(Clone, Copy)]
enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
}

/// Runs `iters` collectives on every rank; returns rank 0's elapsed time.
fn run(op: Op, n: usize, iters: u64) -> Duration {
    let comms = HostGroup::new(WORLD).expect("group");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || rank_loop(&c, op, n, iters)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .next()
            .unwrap_or_default()
    })
}

fn rank_loop(comm: &HostComm, op: Op, n: usize, iters: u64) -> Duration {
    let piece = even_split(n, WORLD, comm.rank()).len();
    let (mut a, mut b) = match op {
        Op::AllReduce => (
            HostBuffer::zeros(DType::BF16, n),
            HostBuffer::zeros(DType::BF16, 0),
        ),
        Op::ReduceScatter => (
            HostBuffer::zeros(DType::BF16, n),
            HostBuffer::zeros(DType::BF16, piece),
        ),
        Op::AllGather => (
            HostBuffer::zeros(DType::BF16, piece),
            HostBuffer::zeros(DType::BF16, n),
        ),
    };
    // Line the ranks up so the clock starts together.
    comm.barrier().and_then(|w| w.wait()).expect("barrier");
    let t0 = Instant::now();
    for _ in 0..iters {
        match op {
            Op::AllReduce => {
                a = comm
                    .all_reduce(a, ReduceOp::Sum)
                    .and_then(|w| w.wait())
                    .expect("all_reduce")
            }
            Op::ReduceScatter => {
                (a, b) = comm
                    .reduce_scatter(a, b, ReduceOp::Sum)
                    .and_then(|w| w.wait())
                    .expect("reduce_scatter")
            }
            Op::AllGather => {
                (a, b) = comm
                    .all_gather(a, b)
                    .and_then(|w| w.wait())
                    .expect("all_gather")
            }
        }
    }
    t0.elapsed()
}

fn collectives(c: &mut Criterion) {
    for (name, op) in [
        ("host_all_reduce_bf16_4ranks", Op::AllReduce),
        ("host_reduce_scatter_bf16_4ranks", Op::ReduceScatter),
        ("host_all_gather_bf16_4ranks", Op::AllGather),
    ] {
        let mut g = c.benchmark_group(name);
        for &n in &SIZES {
            g.throughput(Throughput::Bytes((2 * n) as u64));
            g.bench_with_input(BenchmarkId::from_parameter(label(n)), &n, |b, &n| {
                b.iter_custom(|iters| run(op, n, iters))
            });
        }
        g.finish();
    }
}

criterion_group! { name = benches; config = config(); targets = collectives }
criterion_main!(benches);
