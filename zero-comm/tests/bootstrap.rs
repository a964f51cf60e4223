//! The launcher environment and the TCP rendezvous: every rank gets rank 0's id, and a
//! missing or mismatched rank makes every rank fail with a message naming it, before the
//! deadline (none hangs).

use std::collections::HashMap;
use std::time::{Duration, Instant};
use zero_comm::nccl::{rendezvous, BootstrapError, LaunchEnv};

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

    for (drop, name) in [(0, "RANK"), (1, "WORLD_SIZE"), (3, "MASTER_ADDR")] {
        let mut v = BASE.to_vec();
        v.remove(drop);
        let err = LaunchEnv::from_vars(vars(&v)).unwrap_err();
        assert_eq!(err, BootstrapError::Missing(name));
        assert!(err.to_string().contains("torchrun"), "{err}");
    }
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn env(rank: usize, world: usize, port: u16) -> LaunchEnv {
    LaunchEnv {
        rank,
        world_size: world,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        port,
    }
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
