//! `RelayComm` over a test double of a byte transport (threads meeting at a post table):
//! the in-process host group's bits for every collective, dtype and odd length; a rank
//! that issues something else, or bad arguments, fails every rank; splits by colour and
//! key. zero_torch's relay is torch's gloo group (docs/GLOO_TIER.md).

mod common;

use common::meeting::meeting;
use common::run_ranks;
use common::sweep::{every_collective, values};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use zero_comm::{CommError, Communicator, Completion, HostBuffer, HostGroup, ReduceOp};
use zero_kernels::DType;

#[test]
fn relay_collectives_give_the_host_groups_bits() {
    let seed = zero_kernels::testing::fresh_seed("relay collectives");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for world in 1..=4 {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for n in [0, 1, 3, 7, 33, 1027] {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                    let inputs: Vec<HostBuffer> =
                        (0..world).map(|_| values(&mut rng, dtype, n)).collect();
                    let want = run_ranks(HostGroup::new(world).unwrap(), |c| {
                        every_collective(&c, &inputs, op)
                    });
                    let got = run_ranks(meeting(world), |c| every_collective(&c, &inputs, op));
                    assert_eq!(
                        got, want,
                        "seed {seed}: world {world}, {dtype}, {n} elements, {op:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_rank_that_issues_another_collective_fails_every_rank() {
    let errs = run_ranks(meeting(3), |c| {
        let b = HostBuffer::zeros(DType::F32, 8);
        let first = if c.rank() == 1 {
            c.broadcast(b, 0).map(|_| ())
        } else {
            c.all_reduce(b, ReduceOp::Sum).map(|_| ())
        };
        // The group stays broken.
        let then = c.barrier().map(|_| ());
        (first, then)
    });
    for (r, (first, then)) in errs.into_iter().enumerate() {
        match first {
            Err(CommError::Mismatch { seq: 0, detail }) => {
                assert!(
                    detail.contains("rank 1: broadcast") && detail.contains("rank 0: all_reduce"),
                    "rank {r}: {detail}"
                )
            }
            other => panic!("rank {r}: {other:?}"),
        }
        assert!(
            matches!(then, Err(CommError::Mismatch { .. })),
            "rank {r}: {then:?}"
        );
    }
}

#[test]
fn one_ranks_bad_arguments_fail_every_rank_naming_it() {
    let errs = run_ranks(meeting(2), |c| {
        // Rank 0 hands a reduce-scatter an output of the wrong length.
        let out = if c.rank() == 0 { 5 } else { 3 };
        c.reduce_scatter(
            HostBuffer::zeros(DType::F32, 6),
            HostBuffer::zeros(DType::F32, out),
            ReduceOp::Sum,
        )
        .map(|_| ())
    });
    for (r, e) in errs.into_iter().enumerate() {
        match e {
            Err(CommError::InvalidArgument {
                rank: 0, reason, ..
            }) => {
                if r == 0 {
                    assert!(reason.contains("output has 5 elements"), "{reason}");
                }
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn splits_by_colour_ranked_by_key() {
    // Colour r % 2, key descending: {0, 2} ranked 2, 0; {1, 3} ranked 3, 1.
    let got = run_ranks(meeting(4), |c| {
        let r = c.rank();
        let sub = c.split(r % 2, 10 - r).unwrap();
        let b = HostBuffer::F32(vec![r as f32; 2].into());
        let sum = sub.all_reduce(b, ReduceOp::Sum).unwrap().wait().unwrap();
        (
            sub.rank(),
            sub.world_size(),
            sum.as_slice::<f32>().unwrap()[0],
        )
    });
    assert_eq!(
        got,
        vec![(1, 2, 2.0), (1, 2, 4.0), (0, 2, 2.0), (0, 2, 4.0)]
    );
}
