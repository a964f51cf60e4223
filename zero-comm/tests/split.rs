//! `Communicator::split` on the in-process host group: sub-groups by color, ranked by key
//! (ties by parent rank), whose collectives equal a plain reference over their members;
//! nested splits, parents and children outliving each other; and mismatched splits — a
//! rank that splits once more than the others, a rank that leaves, a rank that never
//! splits — failing every other rank within the timeout. `Tiered`'s reduction in two
//! halves (the shard group's reduce-scatter, later the replicas' all-reduce) against the
//! chained one.

mod common;

use common::run_ranks;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::{Duration, Instant};
use zero_comm::{
    even_split, CommError, Communicator, Completion, HostBuffer, HostComm, HostGroup, ReduceOp,
    Tiered,
};

fn input(seed: u64, parent_rank: usize, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (parent_rank as u64) << 8);
    (0..n).map(|_| rng.gen_range(-8.0f32..8.0)).collect()
}

fn f32s(b: &HostBuffer) -> Vec<f32> {
    b.as_slice::<f32>().expect("f32").to_vec()
}

/// Sum in member order, f32 accumulation (what every backend computes).
fn reference_sum(members: &[usize], seed: u64, n: usize) -> Vec<f32> {
    let inputs: Vec<Vec<f32>> = members.iter().map(|&r| input(seed, r, n)).collect();
    (0..n)
        .map(|i| {
            let mut a = inputs[0][i];
            for v in &inputs[1..] {
                a += v[i];
            }
            a
        })
        .collect()
}

/// The members of `rank`'s color in new-rank order: by (key, parent rank).
fn members(
    world: usize,
    color: impl Fn(usize) -> usize,
    key: impl Fn(usize) -> usize,
    rank: usize,
) -> Vec<usize> {
    let mut m: Vec<usize> = (0..world).filter(|&r| color(r) == color(rank)).collect();
    m.sort_by_key(|&r| (key(r), r));
    m
}

/// Runs all-reduce, reduce-scatter and all-gather on `sub` (this is parent rank `rank`)
/// and checks them against the reference over `members`.
fn check_collectives<C: Communicator<Buffer = HostBuffer>>(
    sub: &C,
    members: &[usize],
    rank: usize,
    seed: u64,
) {
    let n = 37;
    let world = members.len();
    let me = sub.rank();
    assert_eq!(sub.world_size(), world);
    assert_eq!(members[me], rank, "new rank follows (key, rank)");
    let want = reference_sum(members, seed, n);

    let got = sub
        .all_reduce(HostBuffer::from(input(seed, rank, n)), ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(f32s(&got), want, "all_reduce on parent rank {rank}");

    let piece = even_split(n, world, me);
    let (_, out) = sub
        .reduce_scatter(
            HostBuffer::from(input(seed, rank, n)),
            HostBuffer::from(vec![0f32; piece.len()]),
            ReduceOp::Sum,
        )
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        f32s(&out),
        want[piece.clone()],
        "reduce_scatter on parent rank {rank}"
    );

    // Every member gives its piece of its own input; the gather is those pieces in order.
    let mine = input(seed, rank, n)[piece].to_vec();
    let (_, all) = sub
        .all_gather(HostBuffer::from(mine), HostBuffer::from(vec![0f32; n]))
        .unwrap()
        .wait()
        .unwrap();
    let gathered: Vec<f32> = members
        .iter()
        .enumerate()
        .flat_map(|(i, &r)| input(seed, r, n)[even_split(n, world, i)].to_vec())
        .collect();
    assert_eq!(f32s(&all), gathered, "all_gather on parent rank {rank}");
}

fn seed(test: &str) -> u64 {
    zero_kernels::testing::fresh_seed(test)
}

#[test]
fn sub_groups_by_color_ranked_by_key_match_the_reference() {
    let seed = seed("split_host_reference");
    for world in [1, 2, 4, 6] {
        run_ranks(HostGroup::new(world).unwrap(), |comm: HostComm| {
            let rank = comm.rank();
            // Shard groups (rank / 2), keys reversed; replica groups (rank % 2), all keys
            // equal so ties go by parent rank.
            let shard = comm.split(rank / 2, world - rank).unwrap();
            let replica = comm.split(rank % 2, 0).unwrap();
            check_collectives(
                &shard,
                &members(world, |r| r / 2, |r| world - r, rank),
                rank,
                seed,
            );
            check_collectives(
                &replica,
                &members(world, |r| r % 2, |_| 0, rank),
                rank,
                seed ^ 1,
            );
            // The parent still works, and counts no split.
            check_collectives(&comm, &(0..world).collect::<Vec<_>>(), rank, seed ^ 2);
            assert_eq!(comm.stats().per_op.iter().map(|s| s.calls).sum::<u64>(), 3);
            assert_eq!(shard.stats().per_op.iter().map(|s| s.calls).sum::<u64>(), 3);
        });
    }
}

#[test]
fn nested_splits_and_either_side_may_be_dropped_first() {
    let seed = seed("split_host_nested");
    run_ranks(HostGroup::new(8).unwrap(), |comm: HostComm| {
        let rank = comm.rank();
        let half = comm.split(rank / 4, rank).unwrap();
        // The parent leaves first: the halves keep working.
        drop(comm);
        let quarter = half.split(half.rank() / 2, half.rank()).unwrap();
        check_collectives(&half, &members(8, |r| r / 4, |r| r, rank), rank, seed);
        // A child leaves first: its parent keeps working.
        let members_q = members(8, |r| r / 2, |r| r, rank);
        check_collectives(&quarter, &members_q, rank, seed ^ 3);
        drop(quarter);
        check_collectives(&half, &members(8, |r| r / 4, |r| r, rank), rank, seed ^ 4);
    });
}

const SHORT: Duration = Duration::from_millis(800);

#[test]
fn a_rank_that_splits_once_more_fails_every_rank_with_a_mismatch() {
    let results = run_ranks(
        HostGroup::with_timeout(4, SHORT).unwrap(),
        |comm: HostComm| {
            let start = Instant::now();
            let rank = comm.rank();
            let _sub = comm.split(rank % 2, rank).unwrap();
            let second = if rank == 0 {
                comm.split(0, rank).map(|_| ())
            } else {
                comm.all_reduce(HostBuffer::from(vec![1f32; 4]), ReduceOp::Sum)
                    .and_then(|w| w.wait())
                    .map(|_| ())
            };
            (second, start.elapsed())
        },
    );
    for (rank, (r, took)) in results.into_iter().enumerate() {
        match r {
            Err(CommError::Mismatch { seq: 1, detail }) => {
                assert!(detail.contains("rank 0 issued split"), "{detail}");
                assert!(detail.contains("rank 1 issued all_reduce"), "{detail}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
        assert!(took < SHORT, "rank {rank} took {took:?}");
    }
}

#[test]
fn a_rank_that_leaves_instead_of_splitting_fails_the_others_at_once() {
    let results = run_ranks(
        HostGroup::with_timeout(4, Duration::from_secs(30)).unwrap(),
        |comm| {
            let start = Instant::now();
            if comm.rank() == 3 {
                drop(comm);
                return None;
            }
            let r = comm.split(0, 0).map(|_| ());
            Some((r, start.elapsed()))
        },
    );
    for (rank, r) in results.into_iter().enumerate().take(3) {
        let (r, took) = r.unwrap();
        assert_eq!(
            r,
            Err(CommError::RankLeft {
                rank: 3,
                panicked: false
            }),
            "rank {rank}"
        );
        assert!(took < Duration::from_secs(5), "rank {rank} took {took:?}");
    }
}

#[test]
fn a_rank_that_never_splits_fails_the_others_at_the_timeout_naming_it() {
    let results = run_ranks(HostGroup::with_timeout(3, SHORT).unwrap(), |comm| {
        let start = Instant::now();
        if comm.rank() == 1 {
            // Alive, holding the communicator, but never splitting.
            std::thread::sleep(SHORT * 3);
            return None;
        }
        let r = comm.split(comm.rank(), 0).map(|_| ());
        Some((r, start.elapsed()))
    });
    for rank in [0, 2] {
        let (r, took) = results[rank].clone().unwrap();
        match r {
            Err(CommError::Timeout {
                seq: 0,
                op,
                missing,
                ..
            }) => {
                assert_eq!(op, "split");
                assert_eq!(missing, vec![1], "rank {rank}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
        assert!(took < SHORT * 3, "rank {rank} took {took:?}");
    }
}

#[test]
fn a_tiered_reduction_in_two_halves_is_the_chained_one() {
    // Four ranks on two nodes of two, shard groups of 2: the shard group's reduce-scatter
    // and then the replicas' all-reduce give the chained reduce-scatter's bits and book
    // the same elements on the same tiers; two reductions summed before the replicas see
    // them are the sum of the chained ones (up to rounding: checked against the f64 sum).
    let seed = seed("tiered_two_halves");
    let n = 41;
    run_ranks(HostGroup::new(4).unwrap(), |comm: HostComm| {
        let rank = comm.rank();
        let tiered = Tiered::split(comm, 2, 2, 1, false).unwrap();
        assert!(tiered.has_replicas());
        let piece = even_split(n, 2, tiered.rank());
        let zeros = || HostBuffer::from(vec![0f32; piece.len()]);
        let mine = |round: u64| HostBuffer::from(input(seed ^ round, rank, n));
        let before = tiered.tier_stats();
        let (_, chained) = tiered
            .reduce_scatter(mine(0), zeros(), ReduceOp::Avg)
            .unwrap()
            .wait()
            .unwrap();
        let chained_stats = tiered.tier_stats();
        let (_, half) = tiered
            .shard_reduce_scatter(mine(0), zeros(), ReduceOp::Avg)
            .unwrap()
            .wait()
            .unwrap();
        let whole = tiered
            .replicas_all_reduce(half, ReduceOp::Avg)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(
            f32s(&whole),
            f32s(&chained),
            "rank {rank}: two halves, chained"
        );
        let after = tiered.tier_stats();
        for (tier, a, b, c) in [
            (
                "intra",
                before.intra_node,
                chained_stats.intra_node,
                after.intra_node,
            ),
            (
                "inter",
                before.inter_node,
                chained_stats.inter_node,
                after.inter_node,
            ),
        ] {
            assert_eq!(
                c.total_elements() - b.total_elements(),
                b.total_elements() - a.total_elements(),
                "rank {rank}: {tier}-node elements booked"
            );
        }
        // Two reductions summed on the shard, then one all-reduce across the replicas.
        let mut sum = vec![0f32; piece.len()];
        for round in 0..2u64 {
            let (_, part) = tiered
                .shard_reduce_scatter(mine(round), zeros(), ReduceOp::Avg)
                .unwrap()
                .wait()
                .unwrap();
            for (s, x) in sum.iter_mut().zip(f32s(&part)) {
                *s += x;
            }
        }
        let got = tiered
            .replicas_all_reduce(HostBuffer::from(sum), ReduceOp::Avg)
            .unwrap()
            .wait()
            .unwrap();
        for (i, g) in f32s(&got).into_iter().enumerate() {
            let want: f64 = (0..2u64)
                .flat_map(|round| {
                    (0..4).map(move |r| input(seed ^ round, r, n)[piece.start + i] as f64)
                })
                .sum::<f64>()
                / 4.0;
            assert!(
                (g as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "rank {rank} element {i}: {g} against {want} (seed {seed})"
            );
        }
    });
    // Without replicas the all-reduce is nothing to do.
    run_ranks(HostGroup::new(2).unwrap(), |comm: HostComm| {
        let flat = Tiered::split(comm, 2, 2, 1, false).unwrap();
        assert!(!flat.has_replicas());
        let buf = flat
            .replicas_all_reduce(HostBuffer::from(vec![1.5f32, -2.0]), ReduceOp::Avg)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(f32s(&buf), vec![1.5, -2.0]);
        assert_eq!(flat.tier_stats(), Default::default());
    });
}

#[test]
fn a_hierarchical_gather_goes_across_the_nodes_first_into_the_one_step_order() {
    // Eight ranks on four nodes of two. Shard groups of 8 (k = 4 nodes) and of 4 (k = 2,
    // two replicas), and the world on nodes of 4 (k = 2, G = 4): the shard group's ranks
    // are ordered place-major (place g of node j is shard rank g·k + j), a gather across
    // the nodes first and then inside the node puts every partition where the one-step
    // gather of the same shard group does, and books n/G − n/S across the nodes and
    // n − n/G inside per rank. Odd lengths come through as whole blocks of n/G.
    let seed = seed("tiered_hierarchical");
    for (per_node, shard) in [(2usize, 8usize), (2, 4), (4, 8)] {
        let k = shard / per_node;
        let n = shard * 5;
        let got = run_ranks(HostGroup::new(8).unwrap(), |comm: HostComm| {
            let rank = comm.rank();
            let tiered = Tiered::split(comm, per_node, shard, 1, true).unwrap();
            let at = rank % shard;
            let want_key = (at % per_node) * k + at / per_node;
            assert_eq!(tiered.rank(), want_key, "rank {rank}: shard rank");
            assert_eq!(tiered.hierarchical_nodes(), Some(k));
            let part = even_split(n, shard, tiered.rank());
            let mine = HostBuffer::from(input(seed, rank, part.len()));
            let block_len = tiered.gather_block_len(n).unwrap();
            assert_eq!(block_len, n / per_node);
            let before = tiered.tier_stats();
            let (_, two_steps) = tiered
                .hierarchical_all_gather(
                    mine.clone(),
                    HostBuffer::from(vec![f32::NAN; block_len]),
                    HostBuffer::from(vec![f32::NAN; n]),
                )
                .unwrap()
                .wait()
                .unwrap();
            let booked = tiered.tier_stats();
            let (_, one_step) = tiered
                .all_gather(mine, HostBuffer::from(vec![f32::NAN; n]))
                .unwrap()
                .wait()
                .unwrap();
            let to_bits = |b: &HostBuffer| f32s(b).iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                to_bits(&two_steps),
                to_bits(&one_step),
                "rank {rank}, S = {shard}"
            );
            let inter = booked.inter_node.total_elements() - before.inter_node.total_elements();
            let intra = booked.intra_node.total_elements() - before.intra_node.total_elements();
            assert_eq!(
                inter as usize,
                n / per_node - n / shard,
                "rank {rank}, S = {shard}"
            );
            assert_eq!(intra as usize, n - n / per_node, "rank {rank}, S = {shard}");
            (rank, tiered.rank(), f32s(&two_steps))
        });
        // Partition q of the gathered output is the input of the rank whose shard rank is q.
        for (rank, _, out) in &got {
            let first = rank / shard * shard;
            for (r, q, _) in got
                .iter()
                .filter(|(r, _, _)| (first..first + shard).contains(r))
            {
                let part = even_split(n, shard, *q);
                assert_eq!(
                    out[part.clone()],
                    input(seed, *r, part.len())[..],
                    "rank {rank}: partition {q}"
                );
            }
        }
    }
}
