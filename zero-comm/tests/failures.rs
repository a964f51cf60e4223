//! Misuse and failure: every rank gets an error that names the problem, and nothing hangs.

mod common;

use common::run_ranks;
use std::time::{Duration, Instant};
use zero_comm::{
    CommError, Communicator, Completion, HostBuffer, HostComm, HostGroup, OpKind, ReduceOp,
};
use zero_kernels::DType;

const TIMEOUT: Duration = Duration::from_millis(300);

fn f32s(n: usize) -> HostBuffer {
    HostBuffer::from(vec![1.0f32; n])
}

/// Runs `f` on 4 ranks and returns each rank's error, checking every rank failed well
/// before the timeout would have fired.
fn errors_of(f: impl Fn(&HostComm) -> Result<(), CommError> + Sync) -> Vec<CommError> {
    let t0 = Instant::now();
    let errs = run_ranks(
        HostGroup::with_timeout(4, Duration::from_secs(20)).unwrap(),
        |comm| f(&comm).expect_err("every rank must get an error"),
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}: waited for a timeout",
        t0.elapsed()
    );
    errs
}

fn all_reduce(comm: &HostComm, b: HostBuffer) -> Result<(), CommError> {
    comm.all_reduce(b, ReduceOp::Sum)?.wait().map(|_| ())
}

#[test]
fn mismatched_lengths_fail_every_rank_naming_both() {
    let errs = errors_of(|c| all_reduce(c, f32s(if c.rank() == 2 { 11 } else { 10 })));
    for e in errs {
        let msg = e.to_string();
        assert!(matches!(e, CommError::Mismatch { seq: 0, .. }), "{msg}");
        assert!(
            msg.contains("rank 2 issued all_reduce(Sum) of 11 f32"),
            "{msg}"
        );
        assert!(
            msg.contains("rank 0 issued all_reduce(Sum) of 10 f32"),
            "{msg}"
        );
    }
}

#[test]
fn mismatched_dtypes_fail_every_rank() {
    let errs = errors_of(|c| {
        let b = if c.rank() == 1 {
            HostBuffer::zeros(DType::BF16, 8)
        } else {
            f32s(8)
        };
        all_reduce(c, b)
    });
    for e in errs {
        assert!(e.to_string().contains("of 8 bf16"), "{e}");
    }
}

#[test]
fn mismatched_operation_order_fails_every_rank() {
    let errs = errors_of(|c| {
        all_reduce(c, f32s(4))?;
        if c.rank() == 3 {
            c.broadcast(f32s(4), 0)?.wait().map(|_| ())
        } else {
            all_reduce(c, f32s(4))
        }
    });
    for e in errs {
        let msg = e.to_string();
        assert!(msg.contains("collective #1"), "{msg}");
        assert!(msg.contains("rank 3 issued broadcast(root 0)"), "{msg}");
    }
}

#[test]
fn mismatched_reduce_op_or_root_fails() {
    for e in errors_of(|c| {
        let op = if c.rank() == 0 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        c.all_reduce(f32s(3), op)?.wait().map(|_| ())
    }) {
        assert!(e.to_string().contains("all_reduce(Max)"), "{e}");
    }
    for e in errors_of(|c| c.broadcast(f32s(3), c.rank().min(1))?.wait().map(|_| ())) {
        assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
    }
}

#[test]
fn bad_local_arguments_fail_the_caller_and_every_other_rank_at_once() {
    let errs = errors_of(|c| {
        let out_len = if c.rank() == 1 { 5 } else { 3 };
        let (_, _) = c
            .reduce_scatter(f32s(12), f32s(out_len), ReduceOp::Sum)?
            .wait()?;
        Ok(())
    });
    for e in errs {
        let msg = e.to_string();
        assert!(
            msg.contains("rank 1: invalid reduce_scatter(Sum) of 12 f32"),
            "{msg}"
        );
        assert!(msg.contains("output has 5 elements, expected 3"), "{msg}");
    }
    for e in errors_of(|c| c.broadcast(f32s(2), 9)?.wait().map(|_| ())) {
        assert!(e.to_string().contains("root 9"), "{e}");
    }
}

#[test]
fn a_dropped_rank_makes_the_others_fail_at_once() {
    let errs = run_ranks(
        HostGroup::with_timeout(3, Duration::from_secs(20)).unwrap(),
        |comm| {
            if comm.rank() == 2 {
                drop(comm);
                return None;
            }
            let t0 = Instant::now();
            let e = all_reduce(&comm, f32s(4)).expect_err("rank 2 is gone");
            assert!(t0.elapsed() < Duration::from_secs(5));
            Some(e)
        },
    );
    for e in errs.into_iter().flatten() {
        assert_eq!(
            e,
            CommError::RankLeft {
                rank: 2,
                panicked: false
            },
            "{e}"
        );
    }
}

#[test]
fn a_panicking_rank_makes_the_others_fail_and_says_it_panicked() {
    let comms = HostGroup::with_timeout(3, Duration::from_secs(20)).unwrap();
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    if comm.rank() == 0 {
                        panic!("rank 0 fails on purpose");
                    }
                    all_reduce(&comm, f32s(4))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    });
    assert!(results[0].is_err(), "rank 0 panicked");
    for r in &results[1..] {
        let e = r
            .as_ref()
            .expect("no panic")
            .as_ref()
            .expect_err("must fail");
        assert_eq!(
            *e,
            CommError::RankLeft {
                rank: 0,
                panicked: true
            }
        );
        assert!(e.to_string().contains("rank 0 panicked"), "{e}");
    }
}

#[test]
fn a_rank_that_never_arrives_times_out_every_waiting_rank() {
    let t0 = Instant::now();
    let res = run_ranks(HostGroup::with_timeout(4, TIMEOUT).unwrap(), |comm| {
        if comm.rank() == 2 {
            // Alive but stuck: issues nothing until well after the others time out.
            std::thread::sleep(TIMEOUT * 3);
            return all_reduce(&comm, f32s(4));
        }
        all_reduce(&comm, f32s(4))
    });
    assert!(t0.elapsed() < TIMEOUT * 10, "took {:?}", t0.elapsed());
    for (r, e) in res.into_iter().enumerate() {
        let e = e.expect_err("all must fail");
        match &e {
            CommError::Timeout {
                seq,
                missing,
                after,
                ..
            } => {
                assert_eq!(*seq, 0);
                assert_eq!(missing, &vec![2], "rank {r}: {e}");
                assert_eq!(*after, TIMEOUT);
            }
            other => panic!("rank {r}: expected a timeout, got {other}"),
        }
        assert!(e.to_string().contains("never issued it: [2]"), "{e}");
    }
}

#[test]
fn a_failed_group_fails_every_later_collective() {
    let res = run_ranks(
        HostGroup::with_timeout(2, Duration::from_secs(20)).unwrap(),
        |comm| {
            let first = all_reduce(&comm, f32s(if comm.rank() == 0 { 1 } else { 2 }));
            let later = all_reduce(&comm, f32s(1));
            (first.is_err(), later)
        },
    );
    for (first_failed, later) in res {
        assert!(first_failed);
        assert!(
            matches!(later, Err(CommError::Mismatch { seq: 0, .. })),
            "{later:?}"
        );
    }
}

#[test]
fn a_group_needs_a_rank() {
    assert!(HostGroup::new(0).is_err());
}

#[test]
fn counters_follow_the_ring_volumes() {
    // world 3, n = 10: pieces of 4, 3, 3 elements.
    let stats = run_ranks(HostGroup::new(3).unwrap(), |comm| {
        let r = comm.rank();
        let own = [4, 3, 3][r];
        comm.all_reduce(HostBuffer::zeros(DType::BF16, 10), ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        comm.reduce_scatter(f32s(10), f32s(own), ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        comm.all_gather(f32s(own), f32s(10))
            .unwrap()
            .wait()
            .unwrap();
        comm.broadcast(f32s(10), 1).unwrap().wait().unwrap();
        comm.barrier().unwrap().wait().unwrap();
        comm.stats()
    });
    for (r, s) in stats.iter().enumerate() {
        let others = [6u64, 7, 7][r];
        assert_eq!(s.op(OpKind::AllReduce).elements, 2 * others);
        assert_eq!(
            s.op(OpKind::AllReduce).bytes,
            4 * others,
            "bf16: 2 bytes each"
        );
        assert_eq!(s.op(OpKind::ReduceScatter).elements, others);
        assert_eq!(s.op(OpKind::ReduceScatter).bytes, 4 * others);
        assert_eq!(s.op(OpKind::AllGather).elements, others);
        // The rank before the root (rank 0) ends the broadcast chain and sends nothing.
        assert_eq!(
            s.op(OpKind::Broadcast).elements,
            if r == 0 { 0 } else { 10 }
        );
        assert_eq!(s.op(OpKind::Barrier).calls, 1);
        assert_eq!(
            s.total_elements(),
            4 * others + s.op(OpKind::Broadcast).elements
        );
    }
    // Divisible lengths give exactly 2n(N-1)/N for an all-reduce.
    let s = run_ranks(HostGroup::new(4).unwrap(), |comm| {
        comm.all_reduce(f32s(400), ReduceOp::Avg)
            .unwrap()
            .wait()
            .unwrap();
        let s = comm.stats();
        comm.reset_stats();
        (s, comm.stats())
    });
    for (s, after) in s {
        assert_eq!(s.op(OpKind::AllReduce).elements, 2 * 400 * 3 / 4);
        assert_eq!(after.total_elements(), 0);
    }
}
