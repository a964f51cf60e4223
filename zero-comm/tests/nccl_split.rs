//! `NcclComm::split` across 4 processes on 4 devices: shard groups {0,1},{2,3}
//! (`split(rank / 2, rank)`) and replica groups {0,2},{1,3} (`split(rank % 2, rank)`),
//! all-reduce, reduce-scatter and all-gather on each, with the same bits as the
//! shared-memory group split the same way from the same inputs and as a plain reference;
//! a rank that splits once more, a collective issued on the wrong sub-group, and a rank
//! that exits instead of splitting fail the others within the timeout. Runs where 4 GPUs
//! and NCCL ≥ 2.18 are present (on CI, the stand-in: .ci/gpusim); elsewhere a visible skip.

mod common;

use common::free_port;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::process::Command;
use std::time::{Duration, Instant};
use zero_comm::nccl::{LaunchEnv, NcclComm};
use zero_comm::{even_split, Communicator, Completion, HostBuffer, ReduceOp, ShmGroup};
use zero_kernels::cuda::{Gpu, GpuBuffer, GpuStream};
use zero_kernels::testing::{finish_children, gpu_or_skip, skip_gpu_test};

const WORLD: usize = 4;
/// Odd, so the 2-rank pieces are uneven (NCCL's padded staging path).
const N: usize = 1001;

fn input(seed: u64, parent_rank: usize, which: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (parent_rank as u64) << 8 ^ which << 16);
    (0..N).map(|_| rng.gen_range(-8.0f32..8.0)).collect()
}

/// The three collectives on `c` (parent rank `rank`, inputs `which`), their results as
/// f32 vectors: all-reduce, reduce-scatter, all-gather.
fn three<C: Communicator>(
    c: &C,
    rank: usize,
    seed: u64,
    which: u64,
    up: impl Fn(&[f32]) -> C::Buffer,
    down: impl Fn(&C::Buffer) -> Vec<f32>,
) -> Vec<Vec<f32>> {
    let (me, world) = (c.rank(), c.world_size());
    let x = input(seed, rank, which);
    let ar = c
        .all_reduce(up(&x), ReduceOp::Sum)
        .and_then(|w| w.wait())
        .expect("all_reduce");
    let piece = even_split(N, world, me);
    let (_, rs) = c
        .reduce_scatter(up(&x), up(&vec![f32::NAN; piece.len()]), ReduceOp::Sum)
        .and_then(|w| w.wait())
        .expect("reduce_scatter");
    let (_, ag) = c
        .all_gather(up(&x[piece]), up(&vec![f32::NAN; N]))
        .and_then(|w| w.wait())
        .expect("all_gather");
    vec![down(&ar), down(&rs), down(&ag)]
}

/// The plain reference for `members` (parent ranks in new-rank order), for the member at
/// new rank `me`.
fn reference(members: &[usize], me: usize, seed: u64, which: u64) -> Vec<Vec<f32>> {
    let ins: Vec<Vec<f32>> = members.iter().map(|&r| input(seed, r, which)).collect();
    let sum: Vec<f32> = (0..N)
        .map(|i| ins[1..].iter().fold(ins[0][i], |a, v| a + v[i]))
        .collect();
    let world = members.len();
    let gathered: Vec<f32> = (0..world)
        .flat_map(|i| ins[i][even_split(N, world, i)].to_vec())
        .collect();
    vec![
        sum.clone(),
        sum[even_split(N, world, me)].to_vec(),
        gathered,
    ]
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|x| x.iter().map(|f| f.to_bits()).collect())
        .collect()
}

fn gpu_up(st: &GpuStream) -> impl Fn(&[f32]) -> GpuBuffer + '_ {
    move |v| st.upload(v).expect("upload")
}

fn gpu_down(st: &GpuStream) -> impl Fn(&GpuBuffer) -> Vec<f32> + '_ {
    move |b| st.download::<f32>(b, 0..b.len()).expect("download")
}

fn host_up(v: &[f32]) -> HostBuffer {
    HostBuffer::from(v.to_vec())
}

fn host_down(b: &HostBuffer) -> Vec<f32> {
    b.as_slice::<f32>().expect("f32").to_vec()
}

fn env_var(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k}"))
}

/// One rank's process.
#[test]
#[ignore = "run by the NCCL split tests, one process per rank"]
fn nccl_split_child() {
    let Ok(rank) = std::env::var("SPLIT_RANK").map(|r| r.parse::<usize>().expect("rank")) else {
        return;
    };
    let port: u16 = env_var("SPLIT_PORT").parse().unwrap();
    let case = env_var("SPLIT_CASE");
    let timeout = Duration::from_secs(env_var("SPLIT_TIMEOUT").parse().unwrap());
    let comm = NcclComm::init(&LaunchEnv::local(rank, WORLD, port), timeout).expect("NCCL init");
    let st = Gpu::get().expect("GPU").new_stream().expect("stream");
    let t0 = Instant::now();
    let said = |what: &str, r: Result<(), zero_comm::CommError>| match r {
        Ok(()) => println!("RANK {rank} {what} OK"),
        Err(e) => println!("RANK {rank} {what} FAILED after {:?}: {e}", t0.elapsed()),
    };
    let small = |c: &NcclComm| -> Result<(), zero_comm::CommError> {
        c.all_reduce(st.upload(&[1f32; 8]).expect("upload"), ReduceOp::Sum)?
            .wait()
            .map(|_| ())
    };
    match case.as_str() {
        "values" => {
            let seed: u64 = env_var("SPLIT_SEED").parse().unwrap();
            let shm_port: u16 = env_var("SPLIT_SHM_PORT").parse().unwrap();
            let shm = ShmGroup::init(&LaunchEnv::local(rank, WORLD, shm_port), timeout)
                .expect("shared-memory group");
            let shard = comm.split(rank / 2, rank).expect("shard split");
            let replica = comm.split(rank % 2, rank).expect("replica split");
            let shm_shard = shm.split(rank / 2, rank).expect("shm shard split");
            let shm_replica = shm.split(rank % 2, rank).expect("shm replica split");
            let groups: [(&str, &NcclComm, &zero_comm::ShmComm, Vec<usize>); 2] = [
                (
                    "shard",
                    &shard,
                    &shm_shard,
                    vec![rank / 2 * 2, rank / 2 * 2 + 1],
                ),
                (
                    "replica",
                    &replica,
                    &shm_replica,
                    vec![rank % 2, rank % 2 + 2],
                ),
            ];
            for (which, (name, nccl, shm, members)) in groups.iter().enumerate() {
                let which = which as u64;
                assert_eq!(nccl.world_size(), 2, "{name}");
                assert_eq!(members[nccl.rank()], rank, "{name}: rank by key");
                let got = three(*nccl, rank, seed, which, gpu_up(&st), gpu_down(&st));
                let shm_got = three(*shm, rank, seed, which, host_up, host_down);
                let want = reference(members, nccl.rank(), seed, which);
                let same = bits(&got) == bits(&shm_got) && bits(&got) == bits(&want);
                println!("RANK {rank} {name} SAME {same}");
            }
        }
        "extra_split" => {
            let _shard = comm.split(rank / 2, rank).expect("shard split");
            if rank == 0 {
                said("second split", comm.split(0, rank).map(|_| ()));
            } else {
                said("all_reduce", small(&comm));
            }
        }
        "wrong_group" => {
            let shard = comm.split(rank / 2, rank).expect("shard split");
            let replica = comm.split(rank % 2, rank).expect("replica split");
            // Every rank: an all-reduce of 8, then an all-gather, on its shard group; rank 3
            // issues its all-reduce on its replica group instead.
            let first = if rank == 3 { &replica } else { &shard };
            let ar = first.all_reduce(st.upload(&[1f32; 8]).expect("upload"), ReduceOp::Sum);
            let ag = shard.all_gather(
                st.upload(&[1f32; 4]).expect("upload"),
                st.upload(&[0f32; 8]).expect("upload"),
            );
            said("all_reduce", ar.and_then(|w| w.wait()).map(|_| ()));
            said("all_gather", ag.and_then(|w| w.wait()).map(|_| ()));
        }
        "exit" => {
            if rank == 3 {
                std::process::exit(0);
            }
            said("split", comm.split(rank / 2, rank).map(|_| ()));
        }
        other => panic!("unknown case {other}"),
    }
}

/// Runs the 4 rank processes of `case`; their outputs.
fn ranks(case: &str, timeout_s: u64, extra: &[(&str, String)]) -> Vec<String> {
    let port = free_port();
    let children: Vec<_> = (0..WORLD)
        .map(|rank| {
            let mut c = Command::new(std::env::current_exe().expect("test binary"));
            c.args([
                "--exact",
                "nccl_split_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SPLIT_RANK", rank.to_string())
            .env("SPLIT_PORT", port.to_string())
            .env("SPLIT_CASE", case)
            .env("SPLIT_TIMEOUT", timeout_s.to_string())
            .env("ZERO_GPUSIM_NCCL_TIMEOUT_S", timeout_s.to_string());
            for (k, v) in extra {
                c.env(k, v);
            }
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            c.spawn().expect("spawn a rank")
        })
        .collect();
    finish_children(children, Instant::now() + Duration::from_secs(300))
        .into_iter()
        .map(|(text, _)| text)
        .collect()
}

fn usable(test: &str) -> bool {
    if gpu_or_skip(test).is_none() {
        return false;
    }
    let nccl = match zero_sys::nccl::Nccl::get() {
        Ok(n) => n,
        Err(e) => {
            skip_gpu_test(test, &format!("no NCCL ({e})"));
            return false;
        }
    };
    if nccl.raw().ncclCommSplit.is_err() {
        skip_gpu_test(test, "this NCCL has no ncclCommSplit (2.18+)");
        return false;
    }
    let gpus = zero_sys::cudarc::driver::CudaContext::device_count().unwrap_or(0);
    if gpus < WORLD as i32 {
        skip_gpu_test(test, &format!("{gpus} GPU(s); one per rank takes {WORLD}"));
        return false;
    }
    true
}

fn failed_line<'a>(text: &'a str, rank: usize, what: &str) -> Option<&'a str> {
    let tag = format!("RANK {rank} {what} FAILED");
    text.lines().find(|l| l.contains(&tag))
}

#[test]
fn shard_and_replica_groups_equal_the_shared_memory_groups_bits() {
    if !usable("NCCL split across 4 processes") {
        return;
    }
    let seed = zero_kernels::testing::fresh_seed("NCCL split");
    let extra = [
        ("SPLIT_SEED", seed.to_string()),
        ("SPLIT_SHM_PORT", free_port().to_string()),
    ];
    let outs = ranks("values", 60, &extra);
    for (rank, text) in outs.iter().enumerate() {
        for name in ["shard", "replica"] {
            assert!(
                text.contains(&format!("RANK {rank} {name} SAME true")),
                "rank {rank} {name} (seed {seed}):\n{text}"
            );
        }
    }
}

#[test]
fn a_rank_that_splits_once_more_fails_every_rank() {
    if !usable("NCCL split mismatch") {
        return;
    }
    let outs = ranks("extra_split", 10, &[]);
    let what = ["second split", "all_reduce", "all_reduce", "all_reduce"];
    for (rank, text) in outs.iter().enumerate() {
        let line = failed_line(text, rank, what[rank])
            .unwrap_or_else(|| panic!("rank {rank} must fail:\n{text}"));
        println!("{line}");
    }
}

#[test]
fn a_collective_on_the_wrong_sub_group_fails_its_peers() {
    if !usable("NCCL split wrong group") {
        return;
    }
    let outs = ranks("wrong_group", 10, &[]);
    for rank in [0, 1] {
        for what in ["all_reduce", "all_gather"] {
            let ok = format!("RANK {rank} {what} OK");
            assert!(outs[rank].contains(&ok), "rank {rank}:\n{}", outs[rank]);
        }
    }
    // Shard group {2,3}: rank 2's all-reduce meets rank 3's all-gather.
    let line = failed_line(&outs[2], 2, "all_reduce")
        .unwrap_or_else(|| panic!("rank 2 must fail:\n{}", outs[2]));
    assert!(
        line.contains("all_gather") || line.contains("AllGather"),
        "{line}"
    );
    for what in ["all_reduce", "all_gather"] {
        let line = failed_line(&outs[3], 3, what)
            .unwrap_or_else(|| panic!("rank 3 {what} must fail:\n{}", outs[3]));
        println!("{line}");
    }
}

#[test]
fn a_rank_that_exits_instead_of_splitting_fails_the_others() {
    if !usable("NCCL split exit") {
        return;
    }
    let outs = ranks("exit", 10, &[]);
    for (rank, text) in outs.iter().enumerate().take(3) {
        let line = failed_line(text, rank, "split")
            .unwrap_or_else(|| panic!("rank {rank} must fail:\n{text}"));
        println!("{line}");
    }
}
