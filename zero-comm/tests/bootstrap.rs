//! The launcher environment and the TCP rendezvous: every launcher's variables are read
//! (torchrun, deepspeed, SLURM, Open MPI) with their precedence and conflicts; every rank
//! gets rank 0's id — across threads, and across real processes started with each
//! launcher's environment — and a missing or mismatched rank makes every rank fail with a
//! message naming it, before the deadline (none hangs).

mod common;

use common::free_port;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zero_comm::nccl::{rendezvous, BootstrapError, LaunchEnv, Launcher, LAUNCH_VARIABLES};

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

const BASE: [(&str, &str); 5] = [
    ("RANK", "1"),
    ("WORLD_SIZE", "4"),
    ("LOCAL_RANK", "1"),
    ("MASTER_ADDR", "127.0.0.1"),
    ("MASTER_PORT", "29500"),
];

#[test]
fn the_launcher_environment_is_read_and_checked() {
    let env = LaunchEnv::from_vars(vars(&BASE)).unwrap();
    assert_eq!(
        (env.rank, env.world_size, env.local_rank, env.port),
        (1, 4, 1, 29500)
    );

    // Under torchrun the agent's store holds MASTER_PORT: the rendezvous takes the next.
    let mut torchrun = BASE.to_vec();
    torchrun.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
    assert_eq!(LaunchEnv::from_vars(vars(&torchrun)).unwrap().port, 29501);
    torchrun.push(("ZERO_RENDEZVOUS_PORT", "4000"));
    assert_eq!(LaunchEnv::from_vars(vars(&torchrun)).unwrap().port, 4000);

    for (drop, name) in [
        (0, "RANK"),
        (1, "WORLD_SIZE"),
        (2, "LOCAL_RANK"),
        (3, "MASTER_ADDR"),
        (4, "MASTER_PORT"),
    ] {
        let mut v = BASE.to_vec();
        v.remove(drop);
        let err = LaunchEnv::from_vars(vars(&v)).unwrap_err();
        assert_eq!(err, BootstrapError::Missing(name));
        assert!(err.to_string().contains("torchrun --no-python"), "{err}");
    }
    let err = LaunchEnv::from_vars(vars(&[])).unwrap_err();
    assert_eq!(err, BootstrapError::Missing("RANK"));
    assert!(err.to_string().contains("srun") && err.to_string().contains("mpirun"));
    let bad = |k: &'static str, val: &'static str| {
        let mut v = BASE.to_vec();
        v.retain(|(n, _)| *n != k);
        v.push((k, val));
        LaunchEnv::from_vars(vars(&v)).unwrap_err().to_string()
    };
    assert!(bad("RANK", "4").contains("below WORLD_SIZE=4"));
    assert!(bad("RANK", "one").contains("RANK=one"));
    assert!(bad("WORLD_SIZE", "0").contains("at least one rank"));
    assert!(bad("MASTER_PORT", "70000").contains("not a TCP port"));
}

#[test]
fn each_launchers_variables_are_read() {
    let env = |pairs: &[(&str, &str)]| LaunchEnv::from_vars(vars(pairs));
    // The deepspeed launcher (and anyone by hand): RANK & co., no torchrun agent.
    let ds = env(&BASE).unwrap();
    assert_eq!(ds.launcher, Launcher::RankVariables);
    // torchrun: its agent's variables.
    let mut tr = BASE.to_vec();
    tr.push(("TORCHELASTIC_RUN_ID", "none"));
    assert_eq!(env(&tr).unwrap().launcher, Launcher::Torchrun);
    // SLURM: rank, size and local id; rank 0's host from the node list; port 29500.
    let slurm = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_JOB_NODELIST", "gpu[07-10],cpu1"),
    ];
    let s = env(&slurm).unwrap();
    assert_eq!(
        (
            s.rank,
            s.world_size,
            s.local_rank,
            s.master_addr.as_str(),
            s.port,
            s.launcher
        ),
        (5, 8, 1, "gpu07", 29500, Launcher::Slurm)
    );
    let mut given = slurm.to_vec();
    given.extend([("MASTER_ADDR", "head"), ("MASTER_PORT", "1234")]);
    let s = env(&given).unwrap();
    assert_eq!((s.master_addr.as_str(), s.port), ("head", 1234));
    let e = env(&slurm[..3]).unwrap_err();
    assert_eq!(e, BootstrapError::Missing("MASTER_ADDR"));
    // Open MPI: rank, size, local rank; the master address must be given.
    let mpi = [
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
    ];
    let e = env(&mpi).unwrap_err().to_string();
    assert!(e.contains("MASTER_ADDR") && e.contains("mpirun"), "{e}");
    let mut m = mpi.to_vec();
    m.push(("MASTER_ADDR", "10.0.0.1"));
    let o = env(&m).unwrap();
    assert_eq!(
        (o.rank, o.world_size, o.local_rank, o.port, o.launcher),
        (3, 4, 3, 29500, Launcher::OpenMpi)
    );
    // A launcher's variable out of range or missing names the variable.
    let mut bad = slurm.to_vec();
    bad[0] = ("SLURM_PROCID", "8");
    assert!(env(&bad)
        .unwrap_err()
        .to_string()
        .contains("below SLURM_NTASKS=8"));
    assert_eq!(
        env(&slurm[..1]).unwrap_err(),
        BootstrapError::Missing("SLURM_NTASKS")
    );
}

#[test]
fn explicit_variables_win_and_disagreeing_launchers_are_an_error() {
    // torchrun started by srun: RANK & co. describe the process, SLURM's the srun task.
    let mut both = BASE.to_vec();
    both.extend([
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_JOB_NODELIST", "n1"),
    ]);
    let e = LaunchEnv::from_vars(vars(&both)).unwrap();
    assert_eq!(
        (e.rank, e.world_size, e.master_addr.as_str()),
        (1, 4, "127.0.0.1")
    );
    // mpirun inside an salloc: SLURM's and Open MPI's ranks disagree.
    let clash = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
        ("SLURM_LOCALID", "0"),
        ("OMPI_COMM_WORLD_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
        ("MASTER_ADDR", "h"),
    ];
    let err = LaunchEnv::from_vars(vars(&clash)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, BootstrapError::Conflict { .. }), "{msg}");
    assert!(
        msg.contains("SLURM_PROCID=0") && msg.contains("OMPI_COMM_WORLD_RANK=2"),
        "{msg}"
    );
    // When they agree, they are one job.
    let mut agree = clash.to_vec();
    agree.retain(|(k, _)| !k.starts_with("SLURM"));
    agree.extend([
        ("SLURM_PROCID", "2"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "2"),
    ]);
    assert_eq!(LaunchEnv::from_vars(vars(&agree)).unwrap().rank, 2);
}

fn env(rank: usize, world: usize, port: u16) -> LaunchEnv {
    LaunchEnv::local(rank, world, port)
}

/// Runs ranks `envs` concurrently; returns each result and how long it took.
fn run(
    envs: Vec<LaunchEnv>,
    timeout: Duration,
) -> Vec<(Result<[u8; 128], BootstrapError>, Duration)> {
    let mut id = [0u8; 128];
    for (i, b) in id.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = envs
            .into_iter()
            .map(|e| {
                s.spawn(move || {
                    let t = Instant::now();
                    let r = rendezvous(&e, (e.rank == 0).then_some(id), timeout);
                    (r, t.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn every_rank_receives_rank_zeros_id() {
    let port = free_port();
    let results = run(
        (0..4).map(|r| env(r, 4, port)).collect(),
        Duration::from_secs(20),
    );
    let want = results[0].0.clone().unwrap();
    for (r, (res, _)) in results.iter().enumerate() {
        assert_eq!(res.as_ref().unwrap(), &want, "rank {r}");
    }
    assert_eq!(want[1], 10);
}

#[test]
fn a_rank_with_another_world_size_fails_every_rank() {
    let port = free_port();
    let envs = vec![env(0, 3, port), env(1, 3, port), env(2, 4, port)];
    let timeout = Duration::from_secs(10);
    for (r, (res, took)) in run(envs, timeout).into_iter().enumerate() {
        let msg = res.unwrap_err().to_string();
        assert!(msg.contains("WORLD_SIZE=4"), "rank {r}: {msg}");
        assert!(
            took < timeout + Duration::from_secs(2),
            "rank {r} took {took:?}"
        );
    }
}

#[test]
fn a_missing_rank_fails_the_others_within_the_timeout() {
    let port = free_port();
    let timeout = Duration::from_secs(2);
    let results = run(vec![env(0, 3, port), env(1, 3, port)], timeout);
    for (r, (res, took)) in results.into_iter().enumerate() {
        let msg = res.unwrap_err().to_string();
        assert!(
            msg.contains("[2]"),
            "rank {r} should name the missing rank: {msg}"
        );
        assert!(
            took < timeout + Duration::from_secs(2),
            "rank {r} took {took:?}"
        );
    }
}

#[test]
fn a_rank_without_rank_zero_gives_up_at_the_deadline() {
    let port = free_port();
    let timeout = Duration::from_millis(500);
    let (res, took) = run(vec![env(2, 3, port)], timeout).remove(0);
    let msg = res.unwrap_err().to_string();
    assert!(msg.contains("rank 0 never answered"), "{msg}");
    assert!(took < timeout + Duration::from_secs(2), "took {took:?}");
}

#[test]
fn nccl_init_without_a_gpu_or_nccl_is_an_error_naming_what_is_missing() {
    if zero_kernels::cuda::Gpu::get().is_ok() && zero_sys::nccl::Nccl::get().is_ok() {
        println!("SKIPPED: this machine has a GPU and NCCL (the GPU tests cover init)");
        return;
    }
    let err = zero_comm::nccl::NcclComm::init(&env(0, 1, free_port()), Duration::from_secs(5))
        .unwrap_err()
        .to_string();
    assert!(err.contains("NCCL") || err.contains("CUDA driver"), "{err}");
    println!("as expected: {err}");
}

/// One rank's variables for `launcher`, with rank 0 at 127.0.0.1 and the rendezvous at
/// `port`.
fn launcher_vars(
    launcher: Launcher,
    rank: usize,
    world: usize,
    port: u16,
) -> Vec<(String, String)> {
    let (r, w) = (rank.to_string(), world.to_string());
    let pairs: Vec<(&str, String)> = match launcher {
        Launcher::Torchrun => vec![
            ("RANK", r.clone()),
            ("WORLD_SIZE", w),
            ("LOCAL_RANK", r),
            ("MASTER_ADDR", "127.0.0.1".into()),
            // The agent's store would hold MASTER_PORT; the rendezvous takes the next.
            ("MASTER_PORT", (port - 1).to_string()),
            ("TORCHELASTIC_RUN_ID", "zero-test".into()),
            ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
        ],
        Launcher::RankVariables => vec![
            ("RANK", r.clone()),
            ("WORLD_SIZE", w),
            ("LOCAL_RANK", r),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
        ],
        Launcher::Slurm => vec![
            ("SLURM_PROCID", r.clone()),
            ("SLURM_NTASKS", w),
            ("SLURM_LOCALID", r),
            ("SLURM_JOB_NODELIST", "localhost,node[2-3]".into()),
            ("MASTER_PORT", port.to_string()),
        ],
        Launcher::OpenMpi => vec![
            ("OMPI_COMM_WORLD_RANK", r.clone()),
            ("OMPI_COMM_WORLD_SIZE", w),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
        ],
    };
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Waits for `child` until `deadline`, killing it past that; its stdout, or why not.
fn finish(mut child: Child, deadline: Instant) -> Result<String, String> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let out = child.wait_with_output().map_err(|e| e.to_string())?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                return if status.success() {
                    Ok(text)
                } else {
                    Err(format!(
                        "exited with {status}: {text}{}",
                        String::from_utf8_lossy(&out.stderr)
                    ))
                };
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("did not finish in time; killed".into());
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[test]
fn the_rendezvous_works_across_processes_under_every_launchers_environment() {
    let exe = std::env::current_exe().expect("test binary");
    let world = 3;
    for launcher in [
        Launcher::Torchrun,
        Launcher::RankVariables,
        Launcher::Slurm,
        Launcher::OpenMpi,
    ] {
        let port = free_port();
        let deadline = Instant::now() + Duration::from_secs(30);
        let children: Vec<Child> = (0..world)
            .map(|rank| {
                let mut cmd = Command::new(&exe);
                cmd.args([
                    "--ignored",
                    "--exact",
                    "rendezvous_child",
                    "--nocapture",
                    "--test-threads=1",
                ]);
                for k in LAUNCH_VARIABLES {
                    cmd.env_remove(k);
                }
                cmd.envs(launcher_vars(launcher, rank, world, port))
                    .env("ZERO_RENDEZVOUS_CHILD", "1")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                cmd.spawn().expect("spawn a rank")
            })
            .collect();
        let outputs: Vec<Result<String, String>> =
            children.into_iter().map(|c| finish(c, deadline)).collect();
        let mut ids = Vec::new();
        for (rank, out) in outputs.iter().enumerate() {
            let out = out
                .as_ref()
                .unwrap_or_else(|e| panic!("{launcher:?} rank {rank}: {e}"));
            // libtest may print "test rendezvous_child ... " before it on the same line.
            let line = out
                .lines()
                .find_map(|l| l.find("ZERO-RDV ").map(|i| &l[i..]))
                .unwrap_or_else(|| panic!("{launcher:?} rank {rank} printed no result: {out}"));
            assert!(
                line.contains(&format!("rank={rank} world={world} local={rank}"))
                    && line.contains(&format!("launcher={launcher:?}")),
                "{line}"
            );
            ids.push(line.rsplit("id=").next().unwrap_or("").to_string());
        }
        assert!(
            ids[0].len() == 256 && ids.iter().all(|i| *i == ids[0]),
            "{launcher:?}: {ids:?}"
        );
        println!("{launcher:?}: {world} processes agreed on rank 0's id");
    }
}

/// One rank of the test above, run in a child process; does nothing when run directly.
#[test]
#[ignore = "run by the_rendezvous_works_across_processes_under_every_launchers_environment in child processes"]
fn rendezvous_child() {
    if std::env::var_os("ZERO_RENDEZVOUS_CHILD").is_none() {
        return;
    }
    let env = LaunchEnv::from_env().expect("the launcher's environment");
    let mine = (env.rank == 0).then(|| {
        let mut id = [0u8; 128];
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(1);
        for (i, b) in id.iter_mut().enumerate() {
            *b = (t >> (i % 16 * 8)) as u8 ^ i as u8;
        }
        id
    });
    let id = rendezvous(&env, mine, Duration::from_secs(20)).expect("rendezvous");
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    println!(
        "ZERO-RDV rank={} world={} local={} launcher={:?} id={hex}",
        env.rank, env.world_size, env.local_rank, env.launcher
    );
}
