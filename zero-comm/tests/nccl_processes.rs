//! NCCL across real processes, one rank per process and GPU, as a launcher starts them:
//! every collective, dtype and reduce op gives the host group's bits at world size 2
//! (NCCL does not promise that order; zero's stand-in reduces in rank order like the host
//! groups, so on it the bits must match), and ranks that disagree on a collective fail on
//! every rank with an error naming both calls. Runs where a GPU per rank and NCCL are
//! present (on CI, the stand-in: .ci/gpusim); elsewhere a visible skip.

mod common;

use common::{free_port, run_ranks};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::process::Command;
use std::time::{Duration, Instant};
use zero_comm::nccl::{LaunchEnv, NcclComm};
use zero_comm::{even_split, Communicator, Completion, HostBuffer, HostGroup, ReduceOp};
use zero_kernels::cuda::{Gpu, GpuBuffer};
use zero_kernels::testing::{canonical_bits, finish_children, gpu_or_skip, skip_gpu_test};
use zero_kernels::{with_gpu_type, DType, Element};

const WORLD: usize = 2;

#[derive(Debug, Clone, Copy)]
enum Op {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
    Broadcast(usize),
}

const OPS: [Op; 8] = [
    Op::AllReduce(ReduceOp::Sum),
    Op::AllReduce(ReduceOp::Avg),
    Op::AllReduce(ReduceOp::Max),
    Op::ReduceScatter(ReduceOp::Sum),
    Op::ReduceScatter(ReduceOp::Avg),
    Op::AllGather,
    Op::Broadcast(0),
    Op::Broadcast(1),
];
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const LENGTHS: [usize; 4] = [1, 7, 1000, 65_537];

/// Every rank's inputs for case `case` (the same in every process).
fn inputs(seed: u64, case: usize, n: usize) -> Vec<Vec<f32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (case as u64).wrapping_mul(0x9e37_79b9));
    let mut v: Vec<Vec<f32>> = (0..WORLD)
        .map(|_| (0..n).map(|_| rng.gen_range(-60.0f32..60.0)).collect())
        .collect();
    v[WORLD - 1][n / 2] = f32::INFINITY;
    v
}

fn host_vec<T: Element>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// FNV-1a of the canonical bits: what each process prints, and the parent compares.
fn digest(bits: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bits {
        for byte in b.to_le_bytes() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn cases() -> Vec<(usize, Op, DType, usize)> {
    let mut out = Vec::new();
    for &n in &LENGTHS {
        for &dtype in &DTYPES {
            for &op in &OPS {
                out.push((out.len(), op, dtype, n));
            }
        }
    }
    out
}

/// The host group's digests, per case and rank.
fn on_host(seed: u64) -> Vec<Vec<u64>> {
    cases()
        .into_iter()
        .map(|(case, op, dtype, n)| {
            let ins = inputs(seed, case, n);
            run_ranks(HostGroup::new(WORLD).expect("host group"), |c| {
                let r = c.rank();
                let buf = |v: &[f32]| -> HostBuffer { with_gpu_type!(dtype, T => HostBuffer::from(host_vec::<T>(v))) };
                let out = run(&c, op, n, r, &ins, buf);
                digest(&with_gpu_type!(dtype, T => canonical_bits(out.as_slice::<T>().expect("typed"))))
            })
        })
        .collect()
}

fn run<C: Communicator>(
    c: &C,
    op: Op,
    n: usize,
    r: usize,
    ins: &[Vec<f32>],
    buf: impl Fn(&[f32]) -> C::Buffer,
) -> C::Buffer {
    match op {
        Op::AllReduce(o) => c
            .all_reduce(buf(&ins[r]), o)
            .expect("all_reduce")
            .wait()
            .expect("wait"),
        Op::ReduceScatter(o) => {
            let len = even_split(n, WORLD, r).len();
            c.reduce_scatter(buf(&ins[r]), buf(&vec![f32::NAN; len]), o)
                .expect("reduce_scatter")
                .wait()
                .expect("wait")
                .1
        }
        Op::AllGather => {
            let len = even_split(n, WORLD, r).len();
            c.all_gather(buf(&ins[r][..len]), buf(&vec![f32::NAN; n]))
                .expect("all_gather")
                .wait()
                .expect("wait")
                .1
        }
        Op::Broadcast(root) => c
            .broadcast(buf(&ins[r]), root)
            .expect("broadcast")
            .wait()
            .expect("wait"),
    }
}

/// One rank's process: every case over NCCL, a digest line per case.
#[test]
#[ignore = "run by the NCCL process tests, one process per rank"]
fn nccl_rank_child() {
    let Ok(rank) = std::env::var("NCCL_CHILD_RANK").map(|r| r.parse::<usize>().expect("rank"))
    else {
        return;
    };
    let port: u16 = std::env::var("NCCL_CHILD_PORT")
        .expect("port")
        .parse()
        .expect("port");
    let seed: u64 = std::env::var("NCCL_CHILD_SEED")
        .expect("seed")
        .parse()
        .expect("seed");
    let mismatch = std::env::var_os("NCCL_CHILD_MISMATCH").is_some();
    let env = LaunchEnv::local(rank, WORLD, port);
    let comm = NcclComm::init(&env, Duration::from_secs(60)).expect("NCCL init");
    let g = Gpu::get().expect("the process's GPU");
    let st = g.new_stream().expect("stream");
    if mismatch {
        // Rank 1 reduces one element fewer than rank 0.
        let n = 1000 - rank;
        let b: GpuBuffer = st.upload(&vec![1f32; n]).expect("upload");
        match comm.all_reduce(b, ReduceOp::Sum).and_then(|w| w.wait()) {
            Ok(_) => println!("RANK {rank} UNEXPECTED SUCCESS"),
            Err(e) => println!("RANK {rank} FAILED: {e}"),
        }
        return;
    }
    for (case, op, dtype, n) in cases() {
        let ins = inputs(seed, case, n);
        let buf = |v: &[f32]| -> GpuBuffer {
            with_gpu_type!(dtype, T => st.upload(&host_vec::<T>(v)).expect("upload"))
        };
        let out = run(&comm, op, n, rank, &ins, buf);
        let len = out.len();
        let bits = with_gpu_type!(dtype, T => canonical_bits(&st.download::<T>(&out, 0..len).expect("download")));
        println!("CASE {case} RANK {rank} DIGEST {:016x}", digest(&bits));
    }
}

/// Runs the two rank processes; their outputs.
fn ranks(seed: u64, extra: &[(&str, &str)]) -> Vec<String> {
    let port = free_port();
    let children: Vec<_> = (0..WORLD)
        .map(|rank| {
            let mut c = Command::new(std::env::current_exe().expect("test binary"));
            c.args([
                "--exact",
                "nccl_rank_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("NCCL_CHILD_RANK", rank.to_string())
            .env("NCCL_CHILD_PORT", port.to_string())
            .env("NCCL_CHILD_SEED", seed.to_string());
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
        .map(|(text, ok)| {
            assert!(ok, "a rank process failed:\n{text}");
            text
        })
        .collect()
}

fn usable(test: &str) -> bool {
    if gpu_or_skip(test).is_none() {
        return false;
    }
    if let Err(e) = zero_sys::nccl::Nccl::get() {
        skip_gpu_test(test, &format!("no NCCL ({e})"));
        return false;
    }
    let gpus = zero_sys::cudarc::driver::CudaContext::device_count().unwrap_or(0);
    if gpus < WORLD as i32 {
        skip_gpu_test(test, &format!("{gpus} GPU(s); one per rank takes {WORLD}"));
        return false;
    }
    true
}

#[test]
fn two_processes_give_the_host_groups_bits_for_every_collective() {
    if !usable("NCCL across two processes") {
        return;
    }
    let seed = zero_kernels::testing::fresh_seed("NCCL across two processes");
    let want = on_host(seed);
    let outs = ranks(seed, &[]);
    for (case, op, dtype, n) in cases() {
        for (rank, text) in outs.iter().enumerate() {
            let line = format!("CASE {case} RANK {rank} DIGEST {:016x}", want[case][rank]);
            assert!(text.contains(&line), "{op:?} {dtype} n={n} rank {rank}: NCCL differs from the host group (seed {seed}):\n{text}");
        }
    }
    println!(
        "{} collectives x 2 ranks equal the host group's bits",
        cases().len()
    );
}

#[test]
fn ranks_that_disagree_on_a_collective_both_fail_naming_it() {
    if !usable("NCCL mismatch across processes") {
        return;
    }
    let outs = ranks(1, &[("NCCL_CHILD_MISMATCH", "1")]);
    for (rank, text) in outs.iter().enumerate() {
        assert!(
            text.contains(&format!("RANK {rank} FAILED")),
            "rank {rank} must fail:\n{text}"
        );
        let line = text.lines().find(|l| l.contains("FAILED")).unwrap_or("");
        assert!(
            line.contains("1000") && line.contains("999"),
            "rank {rank}'s error must name both counts: {line}"
        );
        println!("rank {rank}: {line}");
    }
}
