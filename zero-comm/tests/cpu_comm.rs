//! `CpuComm` over several machines, in one process: each "machine" a shared-memory group
//! of its threads, the relay the meeting double of tests/relay.rs. Splits whose groups lie
//! on one machine run over shared memory, the others over the relay, and every group
//! gives the in-process host group's bits for every collective, whatever the machines'
//! layout (consecutive, interleaved, uneven), with groups of both kinds in one split and
//! a split of a group that spans machines.

mod common;

use common::meeting::meeting_relays;
use common::run_ranks;
use common::sweep::{every_collective, values};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use zero_comm::launch::rendezvous::ID_BYTES;
use zero_comm::launch::{BootstrapError, IdExchange, LaunchEnv};
use zero_comm::{
    CommError, Communicator, CpuComm, HostBuffer, HostGroup, ReduceOp, RelayComm, ShmGroup,
};
use zero_kernels::DType;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Rank 0's id handed to a machine's other threads through a slot.
#[derive(Default, Clone)]
struct SlotExchange(Arc<(Mutex<Option<[u8; ID_BYTES]>>, Condvar)>);

impl IdExchange for SlotExchange {
    fn exchange(
        &mut self,
        env: &LaunchEnv,
        id: Option<[u8; ID_BYTES]>,
        timeout: Duration,
    ) -> Result<[u8; ID_BYTES], BootstrapError> {
        let (slot, ready) = &*self.0;
        let mut got = slot.lock().unwrap();
        if let Some(id) = id {
            *got = Some(id);
            ready.notify_all();
            return Ok(id);
        }
        let deadline = Instant::now() + timeout;
        while got.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(env.exchange_error("a slot", "no id"));
            }
            got = ready.wait_timeout(got, left).unwrap().0;
        }
        Ok(got.unwrap())
    }
}

/// Runs `f` on every rank of a world whose rank `r` sits on machine `machines[r]`: each
/// machine's ranks join their shared-memory group, and `CpuComm::spanning` puts it beside
/// the relay.
fn on_machines<R: Send>(machines: &[usize], f: impl Fn(CpuComm) -> R + Sync) -> Vec<R> {
    let count = machines.iter().max().map_or(0, |m| m + 1);
    let slots: Vec<SlotExchange> = (0..count).map(|_| Default::default()).collect();
    run_ranks(meeting_relays(machines.len()), |relay| {
        use zero_comm::Relay;
        let r = relay.rank();
        let here: Vec<usize> = (0..machines.len())
            .filter(|&q| machines[q] == machines[r])
            .collect();
        let at = here.iter().position(|&q| q == r).unwrap();
        let env = LaunchEnv::local(at, here.len(), 0);
        let mut via = slots[machines[r]].clone();
        let shm = ShmGroup::init_with(&env, TIMEOUT, &mut via).expect("the machine's group");
        let comm = CpuComm::spanning(RelayComm::new(Box::new(relay)), shm, machines.to_vec())
            .expect("a group over machines");
        f(comm)
    })
}

/// Colours and keys of the splits each world makes (rank `r`, world `w`): shard groups of
/// 2 ranks, replica groups (keys reversed), a split whose groups are `[0, 1, 3]` and `[2]`.
fn splits(r: usize, w: usize) -> [(usize, usize); 3] {
    [(r / 2, r), (r % 2, w - r), ([0, 0, 1, 0][r], 10 - r)]
}

/// The members of rank `r`'s group in split `s`.
fn members(s: usize, r: usize, w: usize) -> Vec<usize> {
    let colour = splits(r, w)[s].0;
    (0..w).filter(|&q| splits(q, w)[s].0 == colour).collect()
}

/// The three splits of `world`, a split of the replica group, and every collective on each
/// (`inputs`: per group, every member's); this rank's results, and whether each group
/// runs over shared memory (`shm` reads that of a `CpuComm`).
fn split_and_sweep<C: Communicator<Buffer = HostBuffer>>(
    world: &C,
    inputs: &[Vec<HostBuffer>],
    shm: impl Fn(&C) -> bool,
) -> (Vec<Vec<Vec<u8>>>, Vec<bool>) {
    let (r, w) = (world.rank(), world.world_size());
    let groups: Vec<C> = splits(r, w)
        .iter()
        .map(|&(c, k)| world.split(c, k).unwrap())
        .collect();
    let nested = groups[1].split(0, r).unwrap();
    let mut results = vec![every_collective(world, &inputs[0], ReduceOp::Sum)];
    let mut kinds = vec![shm(world)];
    for (g, op, ins) in [
        (&groups[0], ReduceOp::Avg, &inputs[1]),
        (&groups[1], ReduceOp::Sum, &inputs[2]),
        (&nested, ReduceOp::Max, &inputs[3]),
        (&groups[2], ReduceOp::Sum, &inputs[4]),
    ] {
        results.push(every_collective(g, ins, op));
        kinds.push(shm(g));
    }
    (results, kinds)
}

#[test]
fn groups_on_one_machine_run_over_shared_memory_and_every_group_gives_the_host_groups_bits() {
    let seed = zero_kernels::testing::fresh_seed("cpu comm over machines");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let w = 4;
    for machines in [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1], [5, 5, 5, 5]] {
        for (dtype, n) in [(DType::F32, 1027), (DType::BF16, 33), (DType::F16, 7)] {
            // One input per rank and group, so each group's collectives read their own.
            let inputs: Vec<Vec<HostBuffer>> = (0..5)
                .map(|_| (0..w).map(|_| values(&mut rng, dtype, n)).collect())
                .collect();
            // The inputs by group rank: a group's rank i is member i (by key, then rank).
            let by_group = |r: usize| -> Vec<Vec<HostBuffer>> {
                let order = |s: usize| {
                    let mut m = members(s, r, w);
                    m.sort_by_key(|&q| (splits(q, w)[s].1, q));
                    m
                };
                let pick =
                    |g: usize, m: Vec<usize>| m.iter().map(|&q| inputs[g][q].clone()).collect();
                vec![
                    inputs[0].clone(),
                    pick(1, order(0)),
                    pick(2, order(1)),
                    // The nested split of the replica group keeps its order (key: world rank).
                    pick(3, {
                        let mut m = members(1, r, w);
                        m.sort_unstable();
                        m
                    }),
                    pick(4, order(2)),
                ]
            };
            let want = run_ranks(HostGroup::new(w).unwrap(), |c| {
                split_and_sweep(&c, &by_group(c.rank()), |_| false).0
            });
            let got = on_machines(&machines, |c| {
                split_and_sweep(&c, &by_group(c.rank()), CpuComm::over_shared_memory)
            });
            for (r, (results, kinds)) in got.into_iter().enumerate() {
                let what =
                    format!("seed {seed}: machines {machines:?}, {dtype}, {n} elements, rank {r}");
                assert_eq!(results, want[r], "{what}");
                let one_machine = |m: &[usize]| m.iter().all(|&q| machines[q] == machines[r]);
                let expect = vec![
                    // The world made by `spanning` is the relay's, even on one machine.
                    false,
                    one_machine(&members(0, r, w)),
                    one_machine(&members(1, r, w)),
                    // A split of a group over machines stays on the relay.
                    one_machine(&members(1, r, w)),
                    one_machine(&members(2, r, w)),
                ];
                assert_eq!(kinds, expect, "{what}: which groups run over shared memory");
            }
        }
    }
}

#[test]
fn machines_that_disagree_with_the_machines_group_are_refused_naming_both() {
    let mut via = SlotExchange::default();
    let shm = ShmGroup::init_with(&LaunchEnv::local(0, 1, 0), TIMEOUT, &mut via).unwrap();
    let relay = meeting_relays(1).pop().unwrap();
    let err = CpuComm::spanning(RelayComm::new(Box::new(relay)), shm, vec![0, 0]).unwrap_err();
    match err {
        CommError::InvalidArgument { reason, .. } => {
            assert!(
                reason.contains("2 machines named for a group of 1"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
}
