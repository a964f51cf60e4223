//! Host collectives, in-process (`HostGroup`, ranks as threads) and across processes
//! (`ShmGroup`, one process per rank, this binary started once per rank), side by side:
//! - latency: all-reduce of 1 f32 and of 4 KiB (1024 f32) at 2 and 4 ranks;
//! - bandwidth: all-reduce, reduce-scatter and all-gather of 64 Mi bf16 elements at 2 and
//!   4 ranks (throughput is algorithm bandwidth, n × 2 bytes per second);
//! - the roofline they are compared with: a copy of 64 Mi bf16 on every core, counted as
//!   the bytes read plus the bytes written.
//!
//! On a 2-core machine the 4-rank runs have more ranks than cores.

use criterion::{BenchmarkId, Criterion, Throughput};
use rayon::prelude::*;
use std::time::{Duration, Instant};
use zero_benches::{fill, ranks};
use zero_comm::{even_split, Communicator, Completion, HostBuffer, HostGroup, ReduceOp, ShmGroup};
use zero_kernels::{DType, PAR_CHUNK};
use zero_runtime::Device;

#[derive(Clone, Copy, Debug)]
enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
        }
    }

    fn parse(s: &str) -> Op {
        match s {
            "all_reduce" => Op::AllReduce,
            "reduce_scatter" => Op::ReduceScatter,
            _ => Op::AllGather,
        }
    }
}

/// Runs `iters` collectives on `comm` after a barrier; returns the time rank 0 measured
/// (until a closing barrier, so every rank's last collective is in it).
fn rank_loop<C: Communicator<Buffer = HostBuffer>>(
    comm: &C,
    op: Op,
    dtype: DType,
    n: usize,
    iters: u64,
) -> Duration {
    let world = comm.world_size();
    let piece = even_split(n, world, comm.rank()).len();
    let mut t0 = Instant::now();
    // Inputs hold data (an untouched allocation reads as the kernel's shared zero page,
    // which would flatter the reads), and one collective before the clock faults every
    // page in.
    let filled = |len: usize| {
        let mut v = vec![0f32; len];
        fill(&mut v, comm.rank() as u64 + 1);
        let mut b = HostBuffer::zeros(dtype, len);
        zero_runtime::HostDevice
            .upload_f32(&mut b, 0, &v)
            .expect("fill");
        b
    };
    let (mut a, mut b) = match op {
        Op::AllReduce => (filled(n), HostBuffer::zeros(dtype, 0)),
        Op::ReduceScatter => (filled(n), filled(piece)),
        Op::AllGather => (filled(piece), filled(n)),
    };
    let sync = || comm.barrier().and_then(|w| w.wait()).expect("barrier");
    for i in 0..iters + 1 {
        if i == 1 {
            sync();
            t0 = Instant::now();
        }
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
    sync();
    t0.elapsed()
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    }
}

/// In-process: `world` rank threads.
fn in_process(op: Op, dtype: DType, n: usize, world: usize, iters: u64) -> Duration {
    let comms = HostGroup::new(world).expect("group");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || rank_loop(&c, op, dtype, n, iters)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .next()
            .unwrap_or_default()
    })
}

/// Across processes: `world` processes of this binary.
fn across_processes(op: Op, dtype: DType, n: usize, world: usize, iters: u64) -> Duration {
    ranks::run_job(
        world,
        &format!("{} {} {n} {iters}", op.name(), dtype_name(dtype)),
    )
}

/// A rank of an [`across_processes`] job.
fn child(task: &str) {
    let f: Vec<&str> = task.split_whitespace().collect();
    let (op, n, iters) = (
        Op::parse(f[0]),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
    );
    let dtype = if f[1] == "f32" {
        DType::F32
    } else {
        DType::BF16
    };
    let comm = ShmGroup::from_env(Duration::from_secs(120)).expect("join the group");
    let t = rank_loop(&comm, op, dtype, n, iters);
    ranks::report(comm.rank(), t);
}

fn latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("latency");
    for world in [2, 4] {
        for (what, n) in [("1 f32", 1), ("4 KiB", 1024)] {
            g.bench_function(BenchmarkId::new(format!("host {world} ranks"), what), |b| {
                b.iter_custom(|iters| in_process(Op::AllReduce, DType::F32, n, world, iters))
            });
            g.bench_function(
                BenchmarkId::new(format!("shm {world} processes"), what),
                |b| {
                    b.iter_custom(|iters| {
                        across_processes(Op::AllReduce, DType::F32, n, world, iters)
                    })
                },
            );
        }
    }
    g.finish();
}

const BIG: usize = 1 << 26;

fn bandwidth(c: &mut Criterion) {
    let mut g = c.benchmark_group("bandwidth 64Mi bf16");
    g.throughput(Throughput::Bytes((2 * BIG) as u64));
    for world in [2, 4] {
        for op in [Op::AllReduce, Op::ReduceScatter, Op::AllGather] {
            g.bench_function(
                BenchmarkId::new(format!("host {world} ranks"), op.name()),
                |b| b.iter_custom(|iters| in_process(op, DType::BF16, BIG, world, iters)),
            );
            g.bench_function(
                BenchmarkId::new(format!("shm {world} processes"), op.name()),
                |b| b.iter_custom(|iters| across_processes(op, DType::BF16, BIG, world, iters)),
            );
        }
    }
    g.finish();
}

/// The copy roofline: 64 Mi bf16 copied on every core, counted as read + write.
fn copy_roofline(c: &mut Criterion) {
    let mut g = c.benchmark_group("copy roofline");
    let src = vec![half::bf16::ONE; BIG];
    let mut dst = vec![half::bf16::ZERO; BIG];
    g.throughput(Throughput::Bytes((2 * 2 * BIG) as u64));
    g.bench_function("64Mi bf16", |b| {
        b.iter(|| {
            dst.par_chunks_mut(PAR_CHUNK)
                .zip(src.par_chunks(PAR_CHUNK))
                .for_each(|(d, s)| d.copy_from_slice(s));
            std::hint::black_box(&dst);
        })
    });
    g.finish();
}

fn main() {
    ranks::bench_main(child, &[copy_roofline, latency, bandwidth]);
}
