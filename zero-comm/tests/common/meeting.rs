//! A test double of a byte transport for `RelayComm`: threads meeting at a post table
//! (each rank posts its bytes, waits for all, reads, waits again), with subgroups made by
//! their members only, as torch's `new_group(..., use_local_synchronization=True)` is.
#![allow(dead_code)] // not every suite uses all of it

use half::{bf16, f16};
use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use zero_comm::{HostBuffer, Relay, RelayComm};
use zero_kernels::DType;

/// Where a group's ranks meet: each posts its bytes, waits for all, reads, waits again.
struct Post {
    slots: Mutex<Vec<Vec<u8>>>,
    barrier: Barrier,
}

/// The subgroups made so far, by (the set of members, how many groups over that set each
/// of them made before), shared by every rank: torch names a group made with
/// `use_local_synchronization=True` by its sorted ranks and how many groups over the same
/// ranks this process made before, so only the members need agree.
type Registry = Arc<Mutex<HashMap<(Vec<usize>, u64), Arc<Post>>>>;

/// How many groups over each set of members this rank made.
type Made = Arc<Mutex<HashMap<Vec<usize>, u64>>>;

/// One rank of a group meeting at a post table.
pub struct MeetingRelay {
    rank: usize,
    /// The members, as world ranks (names the group in the registry).
    members: Vec<usize>,
    post: Arc<Post>,
    registry: Registry,
    made: Made,
}

fn new_post(world: usize) -> Arc<Post> {
    Arc::new(Post {
        slots: Mutex::new(vec![Vec::new(); world]),
        barrier: Barrier::new(world),
    })
}

/// `world` ranks over one post table.
pub fn meeting(world: usize) -> Vec<RelayComm> {
    meeting_relays(world)
        .into_iter()
        .map(|r| RelayComm::new(Box::new(r)))
        .collect()
}

/// The relays of `world` ranks over one post table.
pub fn meeting_relays(world: usize) -> Vec<MeetingRelay> {
    let post = new_post(world);
    let registry: Registry = Arc::default();
    (0..world)
        .map(|rank| MeetingRelay {
            rank,
            members: (0..world).collect(),
            post: post.clone(),
            registry: registry.clone(),
            made: Made::default(),
        })
        .collect()
}

/// A host buffer's bytes.
pub fn bytes_of(b: &HostBuffer) -> Vec<u8> {
    match b.dtype() {
        DType::F32 => bytemuck::cast_slice(b.as_slice::<f32>().unwrap()).to_vec(),
        DType::F16 => bytemuck::cast_slice(b.as_slice::<f16>().unwrap()).to_vec(),
        DType::BF16 => bytemuck::cast_slice(b.as_slice::<bf16>().unwrap()).to_vec(),
    }
}

/// A host buffer's bytes, to write.
pub fn bytes_mut(b: &mut HostBuffer) -> &mut [u8] {
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
        let members: Vec<usize> = ranks.iter().map(|&r| self.members[r]).collect();
        let mut set = members.clone();
        set.sort_unstable();
        let n = {
            let mut made = self.made.lock().unwrap();
            let n = made.entry(set.clone()).or_insert(0);
            *n += 1;
            *n - 1
        };
        let post = self
            .registry
            .lock()
            .unwrap()
            .entry((set, n))
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
            made: self.made.clone(),
        }))
    }
}
