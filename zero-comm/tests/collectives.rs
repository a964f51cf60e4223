//! Every collective against a serial reference, for 1 to 8 ranks and lengths that do not
//! divide by the world size.

mod common;

use common::run_ranks;
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;
use zero_comm::{even_split, Communicator, Completion, HostBuffer, HostGroup, ReduceOp};
use zero_kernels::{DType, Element};

fn seeded(test: &str) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(zero_kernels::testing::fresh_seed(test))
}

fn to_f32(b: &HostBuffer) -> Vec<f32> {
    match b {
        HostBuffer::F32(v) => v.to_vec(),
        HostBuffer::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        HostBuffer::BF16(v) => v.iter().map(|x| Element::to_f32(*x)).collect(),
    }
}

fn from_f32(dtype: DType, v: &[f32]) -> HostBuffer {
    match dtype {
        DType::F32 => HostBuffer::from(v.to_vec()),
        DType::F16 => HostBuffer::F16(v.iter().map(|&x| <f16 as Element>::from_f32(x)).collect()),
        DType::BF16 => {
            HostBuffer::BF16(v.iter().map(|&x| <bf16 as Element>::from_f32(x)).collect())
        }
    }
}

/// Rounds through the dtype, as the buffer would store it.
fn stored(dtype: DType, v: &[f32]) -> Vec<f32> {
    to_f32(&from_f32(dtype, v))
}

/// The serial reference: ranks in order, f32 accumulation, one rounding at the end.
fn reference_reduce(dtype: DType, inputs: &[Vec<f32>], op: ReduceOp) -> Vec<f32> {
    let n = inputs[0].len();
    let acc: Vec<f32> = (0..n)
        .map(|i| {
            let mut a = inputs[0][i];
            for inp in &inputs[1..] {
                a = match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + inp[i],
                    ReduceOp::Max if a.is_nan() || inp[i].is_nan() => f32::NAN,
                    ReduceOp::Max => a.max(inp[i]),
                };
            }
            if op == ReduceOp::Avg {
                a / inputs.len() as f32
            } else {
                a
            }
        })
        .collect();
    stored(dtype, &acc)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

fn check_world(rng: &mut ChaCha8Rng, world: usize, n: usize, dtype: DType) {
    let inputs: Vec<Vec<f32>> = (0..world)
        .map(|_| {
            stored(
                dtype,
                &(0..n)
                    .map(|_| rng.gen_range(-8.0..8.0))
                    .collect::<Vec<f32>>(),
            )
        })
        .collect();
    let root = rng.gen_range(0..world);
    let ctx = format!("world={world} n={n} dtype={dtype}");
    let results = run_ranks(HostGroup::new(world).unwrap(), |comm| {
        let r = comm.rank();
        let mine = || from_f32(dtype, &inputs[r]);
        let mut out = Vec::new();
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
            out.push(to_f32(
                &comm.all_reduce(mine(), op).unwrap().wait().unwrap(),
            ));
        }
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
            let poison = from_f32(dtype, &vec![-777.0; even_split(n, world, r).len()]);
            let (back, piece) = comm
                .reduce_scatter(mine(), poison, op)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(
                back,
                mine(),
                "reduce_scatter must hand the input back unchanged"
            );
            out.push(to_f32(&piece));
        }
        let piece = from_f32(dtype, &inputs[r][even_split(n, world, r)]);
        let (_, gathered) = comm
            .all_gather(piece, from_f32(dtype, &vec![-777.0; n]))
            .unwrap()
            .wait()
            .unwrap();
        out.push(to_f32(&gathered));
        out.push(to_f32(
            &comm.broadcast(mine(), root).unwrap().wait().unwrap(),
        ));
        comm.barrier().unwrap().wait().unwrap();
        out
    });
    let ops = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max];
    let gathered_ref: Vec<f32> = (0..world)
        .flat_map(|r| inputs[r][even_split(n, world, r)].to_vec())
        .collect();
    for (r, got) in results.iter().enumerate() {
        for (k, op) in ops.iter().enumerate() {
            let want = reference_reduce(dtype, &inputs, *op);
            assert!(
                same_bits(&got[k], &want),
                "{ctx} rank {r}: all_reduce {op:?}"
            );
            assert!(
                same_bits(&got[3 + k], &want[even_split(n, world, r)]),
                "{ctx} rank {r}: reduce_scatter {op:?}"
            );
        }
        assert!(
            same_bits(&got[6], &gathered_ref),
            "{ctx} rank {r}: all_gather"
        );
        assert!(
            same_bits(&got[7], &inputs[root]),
            "{ctx} rank {r}: broadcast from {root}"
        );
    }
}

#[test]
fn every_collective_matches_the_serial_reference_for_1_to_8_ranks() {
    let mut rng = seeded("collectives");
    for world in 1..=8 {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for n in [0, 1, 7, 1023, 65_537 + world] {
                check_world(&mut rng, world, n, dtype);
            }
        }
    }
    // One large, uneven case exercises the parallel chunking.
    check_world(&mut rng, 3, (1 << 20) + 3, DType::BF16);
}

#[test]
fn a_reduce_scatter_of_8_mib_per_rank_streams_its_output_and_keeps_the_bits() {
    // From 8 MiB of output per rank the reduction writes with streaming stores
    // (zero-comm's STREAM_MIN_BYTES); uneven lengths put the last rank's piece, and with
    // it the streamed body, off the 16-byte grid.
    let mut rng = seeded("streamed reduce-scatter");
    check_world(&mut rng, 2, 2 * (4 << 20) + 5, DType::BF16);
    check_world(&mut rng, 3, 3 * (2 << 20) + 2, DType::F32);
}

#[test]
fn results_are_bit_identical_run_after_run() {
    let mut rng = seeded("determinism");
    let world = 5;
    let inputs: Vec<Vec<f32>> = (0..world)
        .map(|_| (0..100_003).map(|_| rng.gen_range(-1.0..1.0)).collect())
        .collect();
    let once = || {
        run_ranks(HostGroup::new(world).unwrap(), |comm| {
            let b = HostBuffer::from(inputs[comm.rank()].clone());
            to_f32(&comm.all_reduce(b, ReduceOp::Sum).unwrap().wait().unwrap())
        })
    };
    let (a, b) = (once(), once());
    for r in 0..world {
        assert!(same_bits(&a[r], &a[0]) && same_bits(&a[r], &b[r]));
    }
}

#[test]
fn nan_wins_max_and_inf_survives_sum() {
    let res = run_ranks(HostGroup::new(3).unwrap(), |comm| {
        let v = match comm.rank() {
            1 => vec![f32::NAN, 1.0, f32::INFINITY],
            _ => vec![0.0, 2.0, 1.0],
        };
        let max = comm
            .all_reduce(HostBuffer::from(v.clone()), ReduceOp::Max)
            .unwrap()
            .wait()
            .unwrap();
        let sum = comm
            .all_reduce(HostBuffer::from(v), ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        (max.into_f32().unwrap(), sum.into_f32().unwrap())
    });
    for (max, sum) in res {
        assert!(max[0].is_nan() && max[1] == 2.0);
        assert!(sum[2].is_infinite());
    }
}

#[test]
fn several_collectives_can_be_in_flight_and_complete_in_order() {
    let res = run_ranks(HostGroup::new(4).unwrap(), |comm| {
        let works: Vec<_> = (0..6)
            .map(|k| {
                comm.all_reduce(HostBuffer::from(vec![k as f32; 10]), ReduceOp::Sum)
                    .unwrap()
            })
            .collect();
        works
            .into_iter()
            .map(|w| w.wait().unwrap().into_f32().unwrap()[0])
            .collect::<Vec<_>>()
    });
    for r in res {
        assert_eq!(r, vec![0.0, 4.0, 8.0, 12.0, 16.0, 20.0]);
    }
}

#[test]
fn a_finished_collective_reports_complete() {
    let comms = HostGroup::with_timeout(1, Duration::from_secs(5)).unwrap();
    let w = comms[0].barrier().unwrap();
    let t0 = std::time::Instant::now();
    while !w.is_complete() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "a 1-rank barrier never completed"
        );
        std::thread::yield_now();
    }
    w.wait().unwrap();
}
