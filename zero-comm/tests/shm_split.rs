//! `Communicator::split` on the shared-memory group with real processes: 4 ranks split
//! into shard groups ({0,1},{2,3}) and replica groups ({0,2},{1,3}, keys reversed), whose
//! all-reduce, reduce-scatter and all-gather equal a plain reference over their members;
//! the parent and the children outliving each other; and mismatched splits — a rank that
//! splits once more, a rank that leaves, a rank that never splits — failing every other
//! rank within the timeout. Each rank is this test binary again (`shm_split_rank`),
//! launched with the variables torchrun sets; every child is killed on overrun.

mod common;

use common::{free_port, line, spawn_shm_rank};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::process::Child;
use std::time::{Duration, Instant};
use zero_comm::{even_split, Communicator, Completion, HostBuffer, ReduceOp, ShmGroup};
use zero_kernels::testing::finish_children;

fn input(seed: u64, parent_rank: usize, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (parent_rank as u64) << 8);
    (0..n).map(|_| rng.gen_range(-8.0f32..8.0)).collect()
}

fn f32s(b: &HostBuffer) -> Vec<f32> {
    b.as_slice::<f32>().expect("f32").to_vec()
}

/// Runs all-reduce, reduce-scatter and all-gather on `sub` (this is parent rank `rank`)
/// and checks them against a serial reference over `members` (in new-rank order).
fn check_collectives<C: Communicator<Buffer = HostBuffer>>(
    sub: &C,
    members: &[usize],
    rank: usize,
    seed: u64,
) {
    // Longer than the tests' 1 KiB windows, so the collectives take several chunks.
    let n = 1001;
    let world = members.len();
    let me = sub.rank();
    assert_eq!(sub.world_size(), world);
    assert_eq!(members[me], rank, "new rank follows (key, rank)");
    let inputs: Vec<Vec<f32>> = members.iter().map(|&r| input(seed, r, n)).collect();
    let want: Vec<f32> = (0..n)
        .map(|i| inputs[1..].iter().fold(inputs[0][i], |a, v| a + v[i]))
        .collect();
    let got = sub
        .all_reduce(HostBuffer::from(input(seed, rank, n)), ReduceOp::Sum)
        .and_then(|w| w.wait())
        .unwrap();
    assert_eq!(f32s(&got), want, "all_reduce on parent rank {rank}");
    let piece = even_split(n, world, me);
    let (_, out) = sub
        .reduce_scatter(
            HostBuffer::from(input(seed, rank, n)),
            HostBuffer::from(vec![0f32; piece.len()]),
            ReduceOp::Sum,
        )
        .and_then(|w| w.wait())
        .unwrap();
    assert_eq!(
        f32s(&out),
        want[piece.clone()],
        "reduce_scatter on parent rank {rank}"
    );
    let mine = input(seed, rank, n)[piece].to_vec();
    let (_, all) = sub
        .all_gather(HostBuffer::from(mine), HostBuffer::from(vec![0f32; n]))
        .and_then(|w| w.wait())
        .unwrap();
    let gathered: Vec<f32> = (0..world)
        .flat_map(|i| inputs[i][even_split(n, world, i)].to_vec())
        .collect();
    assert_eq!(f32s(&all), gathered, "all_gather on parent rank {rank}");
}

/// Starts rank `rank` of `world` running `case`; `extra` adds or overrides variables.
fn spawn(case: &str, rank: usize, world: usize, port: u16, extra: &[(&str, String)]) -> Child {
    spawn_shm_rank("shm_split_rank", case, rank, world, port, extra)
}

/// One rank's side of each scenario, run in a child process.
#[test]
#[ignore = "run by the shared-memory split tests in child processes"]
fn shm_split_rank() {
    let Ok(case) = std::env::var("ZERO_SHM_CASE") else {
        return;
    };
    let timeout = Duration::from_secs(
        std::env::var("ZERO_SHM_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    );
    let comm = ShmGroup::from_env(timeout).expect("start-up");
    let (rank, world) = (comm.rank(), comm.world_size());
    let t0 = Instant::now();
    let report = |r: Result<(), zero_comm::CommError>| match r {
        Ok(()) => println!("RESULT ok"),
        Err(e) => println!("RESULT ERROR {e} AFTER {:?}", t0.elapsed()),
    };
    match case.as_str() {
        "values" => {
            let seed: u64 = std::env::var("ZERO_SHM_SEED").unwrap().parse().unwrap();
            let shard = comm.split(rank / 2, rank).unwrap();
            let replica = comm.split(rank % 2, world - rank).unwrap();
            let mut shard_members: Vec<usize> = (0..world).filter(|r| r / 2 == rank / 2).collect();
            shard_members.sort_unstable();
            let mut replica_members: Vec<usize> =
                (0..world).filter(|r| r % 2 == rank % 2).collect();
            replica_members.sort_by_key(|&r| world - r);
            check_collectives(&shard, &shard_members, rank, seed);
            check_collectives(&replica, &replica_members, rank, seed ^ 1);
            check_collectives(&comm, &(0..world).collect::<Vec<_>>(), rank, seed ^ 2);
            // Either side may go first: the parent leaves, a child splits again and
            // leaves, the other child still works.
            drop(comm);
            let single = shard.split(shard.rank(), 0).unwrap();
            assert_eq!((single.rank(), single.world_size()), (0, 1));
            check_collectives(&single, &[rank], rank, seed ^ 3);
            drop(shard);
            check_collectives(&replica, &replica_members, rank, seed ^ 4);
            println!("RESULT ok");
        }
        "mismatch" => {
            let _sub = comm.split(rank % 2, rank).unwrap();
            report(if rank == 0 {
                comm.split(0, 0).map(|_| ())
            } else {
                comm.all_reduce(HostBuffer::from(vec![1f32; 4]), ReduceOp::Sum)
                    .and_then(|w| w.wait())
                    .map(|_| ())
            });
        }
        "leave" => {
            if rank == world - 1 {
                drop(comm);
                std::thread::sleep(Duration::from_secs(600));
                return;
            }
            report(comm.split(0, rank).map(|_| ()));
        }
        "stall" => {
            if rank == 1 {
                std::thread::sleep(Duration::from_secs(600));
                return;
            }
            report(comm.split(rank % 2, rank).map(|_| ()));
        }
        other => panic!("unknown case {other}"),
    }
}

/// Runs `case` on `world` processes and returns each one's output; `stalled` (a rank that
/// never finishes) is killed once the others are done.
fn run_case(
    case: &str,
    world: usize,
    extra: &[(&str, String)],
    within: Duration,
    stalled: Option<usize>,
) -> Vec<String> {
    let port = free_port();
    let mut children: Vec<Child> = (0..world)
        .map(|r| spawn(case, r, world, port, extra))
        .collect();
    let stuck = stalled.map(|r| children.remove(r));
    let mut outs: Vec<String> = finish_children(children, Instant::now() + within)
        .into_iter()
        .map(|(text, _)| text)
        .collect();
    if let (Some(r), Some(c)) = (stalled, stuck) {
        let _ = finish_children(vec![c], Instant::now());
        outs.insert(r, String::new());
    }
    outs
}

#[test]
fn shard_and_replica_groups_match_the_reference_and_outlive_each_other() {
    let seed = zero_kernels::testing::fresh_seed("shm split values");
    let outs = run_case(
        "values",
        4,
        &[("ZERO_SHM_SEED", seed.to_string())],
        Duration::from_secs(120),
        None,
    );
    for (r, text) in outs.iter().enumerate() {
        assert_eq!(line(text, "RESULT"), Some("ok"), "rank {r}:\n{text}");
    }
}

#[test]
fn a_rank_that_splits_once_more_fails_every_rank_with_a_mismatch() {
    let outs = run_case("mismatch", 4, &[], Duration::from_secs(60), None);
    for (r, text) in outs.iter().enumerate() {
        let msg = line(text, "RESULT ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        assert!(
            msg.contains("does not match") && msg.contains("rank 0 issued split"),
            "rank {r}: {msg}"
        );
    }
}

#[test]
fn a_rank_that_leaves_instead_of_splitting_fails_the_others_naming_it() {
    let outs = run_case("leave", 4, &[], Duration::from_secs(60), Some(3));
    // Every other rank fails at once. A rank may name another that failed first and left
    // in turn (the barrier names the first absent rank that left), but some rank names 3.
    let msgs: Vec<&str> = (0..3)
        .map(|r| line(&outs[r], "RESULT ERROR").unwrap_or_else(|| panic!("rank {r}:\n{}", outs[r])))
        .collect();
    for (r, msg) in msgs.iter().enumerate() {
        assert!(msg.contains("left the group"), "rank {r}: {msg}");
    }
    assert!(msgs.iter().any(|m| m.contains("rank 3 left")), "{msgs:?}");
}

#[test]
fn a_rank_that_never_splits_fails_the_others_at_the_timeout_naming_it() {
    let outs = run_case(
        "stall",
        4,
        &[("ZERO_SHM_TIMEOUT", "2".into())],
        Duration::from_secs(30),
        Some(1),
    );
    for r in [0, 2, 3] {
        let text = &outs[r];
        let msg = line(text, "RESULT ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        assert!(
            msg.contains("timed out") && msg.contains("[1]"),
            "rank {r}: {msg}"
        );
    }
}
