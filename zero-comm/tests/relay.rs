//! `RelayComm` over a test double of a byte transport (threads meeting at a post table):
//! the in-process host group's bits for every collective, dtype and odd length; a rank
//! that issues something else, or bad arguments, fails every rank; splits by colour and
//! key. zero_torch's relay over gloo (docs/GLOO_TIER.md) is not built yet.

mod common;

use common::run_ranks;
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use zero_comm::{
    even_split, CommError, Communicator, Completion, HostBuffer, HostGroup, ReduceOp, Relay,
    RelayComm,
};
use zero_kernels::DType;

/// Where a group's ranks meet: each posts its bytes, waits for all, reads, waits again.
struct Post {
    slots: Mutex<Vec<Vec<u8>>>,
    barrier: Barrier,
}

/// The subgroups made so far, by (parent, split number, members), shared by every rank.
type Registry = Arc<Mutex<HashMap<(String, u64, Vec<usize>), Arc<Post>>>>;

struct MeetingRelay {
    rank: usize,
    /// The members, as world ranks (names the group in the registry).
    members: Vec<usize>,
    post: Arc<Post>,
    registry: Registry,
    splits: std::cell::Cell<u64>,
}

fn new_post(world: usize) -> Arc<Post> {
    Arc::new(Post {
        slots: Mutex::new(vec![Vec::new(); world]),
        barrier: Barrier::new(world),
    })
}

fn meeting(world: usize) -> Vec<RelayComm> {
    let post = new_post(world);
    let registry: Registry = Arc::default();
    (0..world)
        .map(|rank| {
            RelayComm::new(Box::new(MeetingRelay {
                rank,
                members: (0..world).collect(),
                post: post.clone(),
                registry: registry.clone(),
                splits: std::cell::Cell::new(0),
            }))
        })
        .collect()
}

fn bytes_of(b: &HostBuffer) -> Vec<u8> {
    match b.dtype() {
        DType::F32 => bytemuck::cast_slice(b.as_slice::<f32>().unwrap()).to_vec(),
        DType::F16 => bytemuck::cast_slice(b.as_slice::<f16>().unwrap()).to_vec(),
        DType::BF16 => bytemuck::cast_slice(b.as_slice::<bf16>().unwrap()).to_vec(),
    }
}

fn bytes_mut(b: &mut HostBuffer) -> &mut [u8] {
    match b.dtype() {
        DType::F32 => bytemuck::cast_slice_mut(b.as_mut_slice::<f32>().unwrap()),
        DType::F16 => bytemuck::cast_slice_mut(b.as_mut_slice::<f16>().unwrap()),
        DType::BF16 => bytemuck::cast_slice_mut(b.as_mut_slice::<bf16>().unwrap()),
    }
}

impl MeetingRelay {
    fn meet(&self, mine: Vec<u8>) -> Vec<Vec<u8>> {
        self.post.slots.lock().unwrap()[self.rank] = mine;
        self.post.barrier.wait();
        let all = self.post.slots.lock().unwrap().clone();
        self.post.barrier.wait();
        all
    }
}

impl Relay for MeetingRelay {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.members.len()
    }
    fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        Ok(self.meet(mine.to_vec()))
    }
    fn all_to_all(
        &self,
        send: &HostBuffer,
        send_counts: &[usize],
        recv: &mut HostBuffer,
        recv_counts: &[usize],
    ) -> Result<(), String> {
        let size = send.dtype().size_of();
        // Posted: this rank's counts (u64 each), then its whole buffer.
        let mut mine: Vec<u8> = send_counts
            .iter()
            .flat_map(|&c| (c as u64).to_le_bytes())
            .collect();
        mine.extend(bytes_of(send));
        let all = self.meet(mine);
        let world = self.members.len();
        let out = bytes_mut(recv);
        let mut at = 0;
        for (j, theirs) in all.iter().enumerate() {
            let count = |k: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&theirs[8 * k..8 * k + 8]);
                u64::from_le_bytes(w) as usize
            };
            let offset: usize = (0..self.rank).map(count).sum();
            if count(self.rank) != recv_counts[j] {
                return Err(format!("rank {j} sends {} elements", count(self.rank)));
            }
            let data = &theirs[8 * world..];
            let piece = &data[offset * size..(offset + recv_counts[j]) * size];
            out[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
        Ok(())
    }
    fn all_gather(
        &self,
        send: &HostBuffer,
        recv: &mut HostBuffer,
        counts: &[usize],
    ) -> Result<(), String> {
        let all = self.meet(bytes_of(send));
        let size = send.dtype().size_of();
        let out = bytes_mut(recv);
        let mut at = 0;
        for (j, theirs) in all.iter().enumerate() {
            if theirs.len() != counts[j] * size {
                return Err(format!("rank {j} gave {} bytes", theirs.len()));
            }
            out[at..at + theirs.len()].copy_from_slice(theirs);
            at += theirs.len();
        }
        Ok(())
    }
    fn broadcast(&self, buf: &mut HostBuffer, root: usize) -> Result<(), String> {
        let mine = if self.rank == root {
            bytes_of(buf)
        } else {
            Vec::new()
        };
        let all = self.meet(mine);
        bytes_mut(buf).copy_from_slice(&all[root]);
        Ok(())
    }
    fn barrier(&self) -> Result<(), String> {
        self.meet(Vec::new());
        Ok(())
    }
    fn subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Relay>, String> {
        let n = self.splits.get();
        self.splits.set(n + 1);
        let members: Vec<usize> = ranks.iter().map(|&r| self.members[r]).collect();
        let key = (format!("{:?}", self.members), n, members.clone());
        let post = self
            .registry
            .lock()
            .unwrap()
            .entry(key)
            .or_insert_with(|| new_post(ranks.len()))
            .clone();
        let rank = ranks
            .iter()
            .position(|&r| r == self.rank)
            .ok_or("not a member")?;
        Ok(Box::new(MeetingRelay {
            rank,
            members,
            post,
            registry: self.registry.clone(),
            splits: std::cell::Cell::new(0),
        }))
    }
}

/// Seeded values with the awkward ones mixed in (inf, NaN, -0, tiny).
fn values(rng: &mut ChaCha8Rng, dtype: DType, n: usize) -> HostBuffer {
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

/// Every collective on both groups, each rank's results as bytes.
fn every_collective<C: Communicator<Buffer = HostBuffer>>(
    comm: C,
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
                        every_collective(c, &inputs, op)
                    });
                    let got = run_ranks(meeting(world), |c| every_collective(c, &inputs, op));
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
