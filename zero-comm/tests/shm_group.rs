//! The shared-memory group with real processes: every collective at 1 to 4 processes,
//! lengths that do not divide by the world size and that span many windows, in f32, f16
//! and bf16 with non-finite values — the same bits as `HostGroup` at the same world size —
//! and its failures: a rank killed with SIGKILL mid-collective, a mismatch, a bad argument,
//! a rank that leaves, a rank that stops, and start-ups with another world size or another
//! job; and the segment handed out by an id exchange of the caller's instead of zero's
//! rendezvous (`ShmGroup::init_with`, as zero_torch does through torch's store). Each
//! rank is this test binary again (`shm_rank`), launched with the variables torchrun
//! sets; every wait is bounded and every child is killed on overrun.

mod common;

use common::{free_port, line, spawn_shm_rank};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};
use zero_comm::launch::rendezvous::ID_BYTES;
use zero_comm::launch::{BootstrapError, IdExchange, LaunchEnv};
use zero_comm::{even_split, Communicator, Completion, HostBuffer, HostGroup, ReduceOp, ShmGroup};
use zero_kernels::testing::finish_children;
use zero_kernels::{DType, Element};

/// An id exchange that is not zero's rendezvous, as a framework's store is: rank 0 writes
/// the id to a file in a folder, the others wait for it until the timeout. A rank 0 run
/// with `ZERO_SHM_WITHHOLD=1` never writes it.
struct FileExchange(std::path::PathBuf);

impl IdExchange for FileExchange {
    fn exchange(
        &mut self,
        env: &LaunchEnv,
        id: Option<[u8; ID_BYTES]>,
        timeout: Duration,
    ) -> Result<[u8; ID_BYTES], BootstrapError> {
        let error = |reason: String| env.exchange_error("a file", reason);
        let path = self.0.join("id");
        if let Some(id) = id {
            if std::env::var("ZERO_SHM_WITHHOLD").is_err() {
                let part = self.0.join("id.part");
                std::fs::write(&part, id)
                    .and_then(|_| std::fs::rename(&part, &path))
                    .map_err(|e| error(e.to_string()))?;
            }
            return Ok(id);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(b) = std::fs::read(&path) {
                return b
                    .try_into()
                    .map_err(|b: Vec<u8>| error(format!("{} bytes, not {ID_BYTES}", b.len())));
            }
            if Instant::now() >= deadline {
                return Err(error(format!("rank 0 wrote no id in {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// One collective of the equivalence sweep.
#[derive(Debug, Clone, Copy)]
enum Kind {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
    Broadcast(usize),
    Barrier,
}

/// The sweep, the same in every process: every kind × dtype × length.
fn cases(world: usize) -> Vec<(Kind, DType, usize)> {
    let mut out = Vec::new();
    let kinds = [
        Kind::AllReduce(ReduceOp::Sum),
        Kind::AllReduce(ReduceOp::Avg),
        Kind::AllReduce(ReduceOp::Max),
        Kind::ReduceScatter(ReduceOp::Sum),
        Kind::ReduceScatter(ReduceOp::Avg),
        Kind::ReduceScatter(ReduceOp::Max),
        Kind::AllGather,
        Kind::Broadcast(world - 1),
        Kind::Barrier,
    ];
    // 0, 1, odd, not divisible by the world size, and (with the tests' 1 KiB windows)
    // many chunks; 20,011 bf16 elements is 39 windows.
    for kind in kinds {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for n in [0, 1, 7, 33, 257, 1001, 20_011] {
                if matches!(kind, Kind::Barrier) && (n > 0 || dtype != DType::F32) {
                    continue;
                }
                out.push((kind, dtype, n));
            }
        }
    }
    // Outputs of 8 MiB and more per rank are written with streaming stores (zero-comm's
    // STREAM_MIN_BYTES); uneven, so the last piece is off the 16-byte grid.
    for (dtype, per_rank) in [(DType::F32, 2 << 20), (DType::BF16, 4 << 20)] {
        out.push((
            Kind::ReduceScatter(ReduceOp::Avg),
            dtype,
            world * per_rank + world - 1,
        ));
    }
    out
}

/// Rank `rank`'s input for case `i`: seeded values of both signs and magnitudes, with an
/// inf and a NaN planted in longer inputs.
fn input(seed: u64, i: usize, rank: usize, dtype: DType, n: usize) -> HostBuffer {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((i as u64) << 20) ^ rank as u64);
    let mut v: Vec<f32> = (0..n)
        .map(|_| rng.gen_range(-4.0f32..4.0) * 10f32.powi(rng.gen_range(-3..3)))
        .collect();
    if n > 30 {
        v[rng.gen_range(0..n)] = f32::INFINITY;
        v[rng.gen_range(0..n)] = f32::NAN;
    }
    match dtype {
        DType::F32 => HostBuffer::F32(v.into()),
        DType::F16 => HostBuffer::F16(v.iter().map(|&x| Element::from_f32(x)).collect()),
        DType::BF16 => HostBuffer::BF16(v.iter().map(|&x| Element::from_f32(x)).collect()),
    }
}

fn bits(b: &HostBuffer) -> Vec<u32> {
    match b {
        HostBuffer::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostBuffer::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
        HostBuffer::BF16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
    }
}

/// Runs the sweep on `comm`; returns each case's output bits.
fn sweep<C: Communicator<Buffer = HostBuffer>>(comm: &C, seed: u64) -> Vec<Vec<u32>> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let mut out = Vec::new();
    for (i, (kind, dtype, n)) in cases(world).into_iter().enumerate() {
        let x = input(seed, i, rank, dtype, n);
        let piece = even_split(n, world, rank);
        let got = match kind {
            Kind::AllReduce(op) => bits(&comm.all_reduce(x, op).and_then(|w| w.wait()).unwrap()),
            Kind::ReduceScatter(op) => {
                let o = HostBuffer::zeros(dtype, piece.len());
                bits(
                    &comm
                        .reduce_scatter(x, o, op)
                        .and_then(|w| w.wait())
                        .unwrap()
                        .1,
                )
            }
            Kind::AllGather => {
                let mine = match &x {
                    HostBuffer::F32(v) => HostBuffer::F32(v[piece].to_vec().into()),
                    HostBuffer::F16(v) => HostBuffer::F16(v[piece].to_vec().into()),
                    HostBuffer::BF16(v) => HostBuffer::BF16(v[piece].to_vec().into()),
                };
                let o = HostBuffer::zeros(dtype, n);
                bits(&comm.all_gather(mine, o).and_then(|w| w.wait()).unwrap().1)
            }
            Kind::Broadcast(root) => bits(&comm.broadcast(x, root).and_then(|w| w.wait()).unwrap()),
            Kind::Barrier => {
                comm.barrier().and_then(|w| w.wait()).unwrap();
                Vec::new()
            }
        };
        out.push(got);
    }
    out
}

fn encode(results: &[Vec<u32>]) -> Vec<u8> {
    let mut b = Vec::new();
    for r in results {
        b.extend_from_slice(&(r.len() as u32).to_le_bytes());
        for x in r {
            b.extend_from_slice(&x.to_le_bytes());
        }
    }
    b
}

/// Starts rank `rank` of `world` running `case`; `extra` adds or overrides variables.
fn spawn(case: &str, rank: usize, world: usize, port: u16, extra: &[(&str, String)]) -> Child {
    spawn_shm_rank("shm_rank", case, rank, world, port, extra)
}

/// One rank's side of each scenario, run in a child process.
#[test]
#[ignore = "run by the shared-memory group tests in child processes"]
fn shm_rank() {
    let Ok(case) = std::env::var("ZERO_SHM_CASE") else {
        return;
    };
    let timeout = Duration::from_secs(
        std::env::var("ZERO_SHM_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    );
    let joined = match std::env::var("ZERO_SHM_EXCHANGE_DIR") {
        Ok(dir) => LaunchEnv::from_env()
            .map_err(|e| e.to_string())
            .and_then(|env| {
                let mut via = FileExchange(dir.into());
                ShmGroup::init_with(&env, timeout, &mut via).map_err(|e| e.to_string())
            }),
        Err(_) => ShmGroup::from_env(timeout).map_err(|e| e.to_string()),
    };
    let comm = match joined {
        Ok(c) => c,
        Err(e) => {
            println!("START ERROR {e}");
            return;
        }
    };
    let rank = comm.rank();
    println!("READY");
    let t0 = Instant::now();
    let report = |r: Result<HostBuffer, zero_comm::CommError>| match r {
        Ok(_) => println!("RESULT ok"),
        Err(e) => println!("RESULT ERROR {e} AFTER {:?}", t0.elapsed()),
    };
    match case.as_str() {
        "sweep" => {
            let seed: u64 = std::env::var("ZERO_SHM_SEED").unwrap().parse().unwrap();
            let out = std::env::var("ZERO_SHM_OUT").unwrap();
            let results = sweep(&comm, seed);
            std::fs::write(
                Path::new(&out).join(format!("rank{rank}")),
                encode(&results),
            )
            .unwrap();
            println!("RESULT ok");
        }
        "stall" if rank == 1 => std::thread::sleep(Duration::from_secs(600)),
        "stall" | "kill" => {
            if case == "kill" && rank == 1 {
                std::thread::sleep(Duration::from_secs(600));
            }
            let buf = HostBuffer::zeros(DType::F32, 100_000);
            report(comm.all_reduce(buf, ReduceOp::Sum).and_then(|w| w.wait()));
        }
        "mismatch" => {
            let which = std::env::var("ZERO_SHM_MISMATCH").unwrap();
            let (dtype, n, op, root) = match (which.as_str(), rank) {
                ("length", 1) => (DType::F32, 11, ReduceOp::Sum, 0),
                ("dtype", 1) => (DType::BF16, 10, ReduceOp::Sum, 0),
                ("op", 1) => (DType::F32, 10, ReduceOp::Max, 0),
                ("root", 1) => (DType::F32, 10, ReduceOp::Sum, 1),
                _ => (DType::F32, 10, ReduceOp::Sum, 0),
            };
            let buf = HostBuffer::zeros(dtype, n);
            if which == "root" {
                report(comm.broadcast(buf, root).and_then(|w| w.wait()));
            } else {
                report(comm.all_reduce(buf, op).and_then(|w| w.wait()));
            }
        }
        "invalid" => {
            let (i, o) = (
                HostBuffer::zeros(DType::F32, 10),
                HostBuffer::zeros(DType::F32, if rank == 1 { 9 } else { 5 }),
            );
            match comm
                .reduce_scatter(i, o, ReduceOp::Sum)
                .and_then(|w| w.wait())
            {
                Ok(_) => println!("RESULT ok"),
                Err(e) => println!("RESULT ERROR {e} AFTER {:?}", t0.elapsed()),
            }
        }
        "leave" => {
            if rank == 1 {
                drop(comm);
                std::thread::sleep(Duration::from_secs(600));
                return;
            }
            report(
                comm.all_reduce(HostBuffer::zeros(DType::F32, 4), ReduceOp::Sum)
                    .and_then(|w| w.wait()),
            );
        }
        _ => report(
            comm.all_reduce(HostBuffer::zeros(DType::F32, 4), ReduceOp::Sum)
                .and_then(|w| w.wait()),
        ),
    }
}

/// `HostGroup`'s results for the sweep, per rank.
fn host_reference(world: usize, seed: u64) -> Vec<Vec<Vec<u32>>> {
    let comms = HostGroup::with_timeout(world, Duration::from_secs(60)).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || sweep(&c, seed)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn every_collective_gives_host_groups_bits_at_one_to_four_processes() {
    let seed = zero_kernels::testing::fresh_seed("shm sweep");
    for world in 1..=4 {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let extra = [
            ("ZERO_SHM_SEED", seed.to_string()),
            ("ZERO_SHM_OUT", dir.path().display().to_string()),
        ];
        let children: Vec<Child> = (0..world)
            .map(|r| spawn("sweep", r, world, port, &extra))
            .collect();
        let outs = finish_children(children, Instant::now() + Duration::from_secs(120));
        for (r, (text, ok)) in outs.iter().enumerate() {
            assert!(
                *ok && line(text, "RESULT").is_some(),
                "world {world} rank {r}:\n{text}"
            );
        }
        let want = host_reference(world, seed);
        for (r, want) in want.iter().enumerate() {
            let got = std::fs::read(dir.path().join(format!("rank{r}"))).unwrap();
            assert!(
                got == encode(want),
                "world {world} rank {r}: bits differ from HostGroup's"
            );
        }
        println!(
            "world {world}: {} collectives, bits equal HostGroup's",
            cases(world).len()
        );
    }
}

fn shm_entries() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_rank_killed_mid_collective_fails_every_other_rank_naming_it() {
    let before = shm_entries();
    let world = 3;
    let port = free_port();
    let mut children: Vec<Child> = (0..world)
        .map(|r| spawn("kill", r, world, port, &[]))
        .collect();
    // Wait until rank 1 is in the group (the others are then inside their all-reduce,
    // waiting for it), then kill it.
    let mut rank1 = BufReader::new(children[1].stdout.take().unwrap());
    let mut l = String::new();
    while rank1.read_line(&mut l).unwrap_or(0) > 0 && !l.contains("READY") {
        l.clear();
    }
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    children[1].kill().unwrap();
    let outs = finish_children(children, Instant::now() + Duration::from_secs(60));
    for r in [0, 2] {
        let (text, _) = &outs[r];
        let msg = line(text, "RESULT ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        println!("rank {r}: {msg}");
        assert!(
            msg.contains("rank 1") && msg.contains("died"),
            "rank {r}: {msg}"
        );
    }
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "took {:?}",
        killed.elapsed()
    );
    let after = shm_entries();
    // (The stand-in's NCCL segments are another program's: `.ci/run` runs the stand-in
    // pass beside the test command.)
    let new: Vec<&String> = after
        .iter()
        .filter(|e| !before.contains(e) && !e.starts_with("zero-gpusim-"))
        .collect();
    assert!(new.is_empty(), "left in /dev/shm: {new:?}");
}

#[test]
fn a_rank_that_stops_fails_the_others_at_the_timeout_naming_it() {
    let world = 2;
    let port = free_port();
    let extra = [("ZERO_SHM_TIMEOUT", "2".to_string())];
    let mut children: Vec<Child> = (0..world)
        .map(|r| spawn("stall", r, world, port, &extra))
        .collect();
    let stopped = children.remove(1);
    let outs = finish_children(children, Instant::now() + Duration::from_secs(30));
    let _ = finish_children(vec![stopped], Instant::now());
    let msg = line(&outs[0].0, "RESULT ERROR").unwrap_or_else(|| panic!("{}", outs[0].0));
    println!("rank 0: {msg}");
    assert!(msg.contains("timed out") && msg.contains("[1]"), "{msg}");
}

#[test]
fn mismatched_collectives_fail_every_rank_naming_what_each_issued() {
    for (which, want) in [
        ("length", "of 11 f32"),
        ("dtype", "bf16"),
        ("op", "Max"),
        ("root", "root 1"),
    ] {
        let world = 2;
        let port = free_port();
        let extra = [("ZERO_SHM_MISMATCH", which.to_string())];
        let children: Vec<Child> = (0..world)
            .map(|r| spawn("mismatch", r, world, port, &extra))
            .collect();
        for (r, (text, _)) in finish_children(children, Instant::now() + Duration::from_secs(60))
            .iter()
            .enumerate()
        {
            let msg =
                line(text, "RESULT ERROR").unwrap_or_else(|| panic!("{which} rank {r}:\n{text}"));
            assert!(
                msg.contains("does not match") && msg.contains(want),
                "{which} rank {r}: {msg}"
            );
        }
    }
}

#[test]
fn a_bad_argument_on_one_rank_fails_the_others_at_once() {
    let world = 2;
    let port = free_port();
    let children: Vec<Child> = (0..world)
        .map(|r| spawn("invalid", r, world, port, &[]))
        .collect();
    let outs = finish_children(children, Instant::now() + Duration::from_secs(60));
    for (r, (text, _)) in outs.iter().enumerate() {
        let msg = line(text, "RESULT ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        assert!(
            msg.contains("rank 1: invalid reduce_scatter") && msg.contains("9 elements"),
            "rank {r}: {msg}"
        );
    }
}

#[test]
fn a_rank_that_leaves_fails_the_others_naming_it() {
    let world = 2;
    let port = free_port();
    let mut children: Vec<Child> = (0..world)
        .map(|r| spawn("leave", r, world, port, &[]))
        .collect();
    let rank1 = children.remove(1);
    let outs = finish_children(children, Instant::now() + Duration::from_secs(60));
    let _ = finish_children(vec![rank1], Instant::now());
    let msg = line(&outs[0].0, "RESULT ERROR").unwrap_or_else(|| panic!("{}", outs[0].0));
    assert!(msg.contains("rank 1 left"), "{msg}");
}

#[test]
fn start_up_refuses_another_world_size_or_another_job_naming_both() {
    let port = free_port();
    let children = vec![
        spawn("plain", 0, 2, port, &[]),
        spawn(
            "plain",
            1,
            2,
            port,
            &[("WORLD_SIZE", "3".into()), ("LOCAL_WORLD_SIZE", "3".into())],
        ),
    ];
    for (r, (text, _)) in finish_children(children, Instant::now() + Duration::from_secs(60))
        .iter()
        .enumerate()
    {
        let msg = line(text, "START ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        assert!(
            msg.contains("WORLD_SIZE=3") && msg.contains("with 2"),
            "rank {r}: {msg}"
        );
    }
    let port = free_port();
    let children = vec![
        spawn("plain", 0, 2, port, &[("ZERO_JOB_ID", "alpha".into())]),
        spawn("plain", 1, 2, port, &[("ZERO_JOB_ID", "beta".into())]),
    ];
    for (r, (text, _)) in finish_children(children, Instant::now() + Duration::from_secs(60))
        .iter()
        .enumerate()
    {
        let msg = line(text, "START ERROR").unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        assert!(
            msg.contains("ZERO_JOB_ID=alpha") && msg.contains("ZERO_JOB_ID=beta"),
            "rank {r}: {msg}"
        );
    }
}

#[test]
fn an_id_exchange_of_the_callers_replaces_the_rendezvous_and_its_port() {
    // The rendezvous port is held here, so zero's own rendezvous could not listen on it:
    // the group starts through the file exchange alone.
    let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let world = 3;
    let dir = tempfile::tempdir().unwrap();
    let extra = [("ZERO_SHM_EXCHANGE_DIR", dir.path().display().to_string())];
    let children: Vec<Child> = (0..world)
        .map(|r| spawn("plain", r, world, port, &extra))
        .collect();
    for (r, (text, ok)) in finish_children(children, Instant::now() + Duration::from_secs(60))
        .iter()
        .enumerate()
    {
        assert!(
            *ok && line(text, "RESULT").is_some_and(|l| l == "ok"),
            "rank {r}:\n{text}"
        );
    }
    // Rank 0 withholds the id: every other rank fails at its timeout, naming the exchange.
    let dir = tempfile::tempdir().unwrap();
    let mut extra = vec![
        ("ZERO_SHM_EXCHANGE_DIR", dir.path().display().to_string()),
        ("ZERO_SHM_TIMEOUT", "2".to_string()),
    ];
    let rank1 = spawn("plain", 1, 2, port, &extra);
    extra.push(("ZERO_SHM_WITHHOLD", "1".to_string()));
    let rank0 = spawn("plain", 0, 2, port, &extra);
    let outs = finish_children(vec![rank0, rank1], Instant::now() + Duration::from_secs(60));
    let msg = line(&outs[1].0, "START ERROR").unwrap_or_else(|| panic!("{}", outs[1].0));
    assert!(
        msg.contains("through a file (rank 1 of 2)") && msg.contains("rank 0 wrote no id"),
        "{msg}"
    );
    drop(held);
}
