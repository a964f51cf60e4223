//! The non-blocking NCCL protocol of [`PolledComm`], against a fake `libnccl.so.2` that
//! behaves as NCCL does on a `blocking = 0` communicator (tests/fake_nccl/fake_nccl.c):
//! every call answers `ncclInProgress` for a while, a call made before the previous one
//! completed is refused, and a collective's output appears only when it completes.
//!
//! The fake is compiled here with the C compiler Rust already links with (`cc`, or `CC`).
//! No GPU and no real NCCL are needed: ranks are threads, "device" buffers are host
//! memory. What only a GPU can show — that the CUDA event recorded after a settled call
//! covers NCCL's kernel — is left to the GPU run.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use zero_sys::nccl::bindings as b;
use zero_sys::nccl::{Nccl, NcclError, NcclOp, NcclType, PolledComm, UNIQUE_ID_BYTES};

/// The fake's counters (`enum stat` in fake_nccl.c).
#[derive(Debug, Default, PartialEq, Eq)]
struct Stats {
    refused: i64,
    completed: i64,
    aborts: i64,
    destroys: i64,
    destroy_refused: i64,
    finalizes: i64,
    blocking_inits: i64,
}

struct Fake {
    nccl: &'static Nccl,
    stats: libloading::Symbol<'static, unsafe extern "C" fn(*const u8, *mut i64, i32) -> i32>,
}

/// Compiles the fake once per test process and opens it through zero-sys' loader.
fn fake() -> &'static Fake {
    static FAKE: OnceLock<Fake> = OnceLock::new();
    FAKE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("zero-fake-nccl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let lib = dir.join("libnccl.so.2");
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nccl/fake_nccl.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = std::process::Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-pthread", "-Wall", "-o"])
            .arg(&lib)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("running the C compiler `{cc}`: {e}"));
        assert!(
            out.status.success(),
            "compiling the fake NCCL failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = lib.to_string_lossy().into_owned();
        let nccl: &'static Nccl = Box::leak(Box::new(
            Nccl::load(&[path.as_str()], None).expect("the fake NCCL loads"),
        ));
        let handle: &'static libloading::Library = Box::leak(Box::new(
            // SAFETY: the fake has no initialisers; it is already open, so this only takes
            // another reference to it.
            unsafe { libloading::Library::new(&lib) }.expect("reopen the fake"),
        ));
        // SAFETY: fakeNcclGroupStats(const char*, long*, int) -> int, as declared in the C
        // file; `long` is 64 bits on every Linux target this project supports.
        let stats = unsafe { handle.get(b"fakeNcclGroupStats\0") }.expect("stats symbol");
        let _ = std::fs::remove_dir_all(&dir); // the library stays mapped
        Fake { nccl, stats }
    })
}

/// A scenario, encoded in the unique id as fake_nccl.c reads it.
#[derive(Clone, Copy)]
struct Scenario {
    polls: i32,
    fail_at: i32,
    fail_rank: i32,
    hang_at: i32,
    hang_rank: i32,
    init_polls: i32,
}

impl Scenario {
    fn polls(polls: i32) -> Self {
        Scenario {
            polls,
            fail_at: -1,
            fail_rank: 0,
            hang_at: -1,
            hang_rank: 0,
            init_polls: polls,
        }
    }

    fn id(self, rng: &mut ChaCha8Rng) -> [u8; UNIQUE_ID_BYTES] {
        let mut id = [0u8; UNIQUE_ID_BYTES];
        id[..8].copy_from_slice(b"FAKENCCL");
        let fields = [
            self.polls,
            self.fail_at,
            self.fail_rank,
            self.hang_at,
            self.hang_rank,
            self.init_polls,
        ];
        for (i, v) in fields.iter().enumerate() {
            id[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        rng.fill(&mut id[64..96]); // a distinct group per test
        id
    }
}

fn stats(id: &[u8; UNIQUE_ID_BYTES]) -> Stats {
    let mut v = [0i64; 7];
    // SAFETY: the id is 128 bytes and v holds the 7 counters asked for.
    let n = unsafe { (fake().stats)(id.as_ptr(), v.as_mut_ptr(), 7) };
    assert_eq!(n, 7, "the fake knows no group with this id");
    Stats {
        refused: v[0],
        completed: v[1],
        aborts: v[2],
        destroys: v[3],
        destroy_refused: v[4],
        finalizes: v[5],
        blocking_inits: v[6],
    }
}

fn addr<T>(v: &[T]) -> u64 {
    v.as_ptr() as u64
}

/// Runs `f(rank)` on `world` threads; results in rank order.
fn ranks<R: Send>(world: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = (0..world).map(|r| s.spawn(move || f(r))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

const POISON: f32 = -1234.5;

#[test]
fn every_call_is_polled_to_completion_before_it_returns() {
    let seed = zero_kernels::testing::fresh_seed("polled to completion");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let id = Scenario::polls(7).id(&mut rng);
    let (world, rounds, n) = (2usize, 12usize, 37usize);
    // Every rank's inputs for every round, so each rank can compute the expected outputs.
    let inputs: Vec<Vec<Vec<f32>>> = (0..rounds)
        .map(|_| {
            (0..world)
                .map(|_| (0..n * world).map(|_| rng.gen_range(-9.0..9.0)).collect())
                .collect()
        })
        .collect();
    let fail = ranks(world, |rank| -> Result<(), String> {
        let mut c = PolledComm::init(fake().nccl, world, &id, rank, Duration::from_secs(20))
            .map_err(|e| e.to_string())?;
        for (k, round) in inputs.iter().enumerate() {
            let mine = &round[rank];
            let sum: Vec<f32> = (0..n * world)
                .map(|i| round.iter().map(|r| r[i]).fold(0.0, |a, x| a + x))
                .collect();
            let check = |what: &str, got: &[f32], want: &[f32]| {
                if got
                    .iter()
                    .zip(want)
                    .any(|(g, w)| g.to_bits() != w.to_bits())
                {
                    Err(format!("round {k} {what}: output not written when the call returned (rank {rank}, seed {seed})"))
                } else {
                    Ok(())
                }
            };
            let mut out = vec![POISON; n * world];
            // SAFETY: the fake reads and writes host memory: `mine` and `out` hold n·world
            // elements and outlive the call, which returns only once it completed.
            unsafe {
                c.all_reduce(
                    addr(mine),
                    addr(&out),
                    n * world,
                    NcclType::F32,
                    NcclOp::Sum,
                    std::ptr::null_mut(),
                )
            }
            .map_err(|e| e.to_string())?;
            check("all-reduce", &out, &sum)?;
            let mut part = vec![POISON; n];
            // SAFETY: as above; `part` holds n elements.
            unsafe {
                c.reduce_scatter(
                    addr(mine),
                    addr(&part),
                    n,
                    NcclType::F32,
                    NcclOp::Sum,
                    std::ptr::null_mut(),
                )
            }
            .map_err(|e| e.to_string())?;
            check("reduce-scatter", &part, &sum[rank * n..(rank + 1) * n])?;
            let gathered: Vec<f32> = round.iter().flat_map(|r| r[..n].to_vec()).collect();
            out.fill(POISON);
            // SAFETY: as above; `mine[..n]` is sent and `out` holds n·world elements.
            unsafe {
                c.all_gather(
                    addr(mine),
                    addr(&out),
                    n,
                    NcclType::F32,
                    std::ptr::null_mut(),
                )
            }
            .map_err(|e| e.to_string())?;
            check("all-gather", &out, &gathered)?;
            let root = k % world;
            let mut buf = mine.clone();
            // SAFETY: as above; `buf` holds n·world elements.
            unsafe {
                c.broadcast(
                    addr(&buf),
                    n * world,
                    NcclType::F32,
                    root,
                    std::ptr::null_mut(),
                )
            }
            .map_err(|e| e.to_string())?;
            check("broadcast", &buf, &round[root])?;
            part.fill(POISON);
            buf.truncate(n);
        }
        c.close().map_err(|e| e.to_string())
    });
    for (rank, r) in fail.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
    assert_eq!(
        stats(&id),
        Stats {
            completed: (world * rounds * 4) as i64,
            destroys: world as i64,
            finalizes: world as i64,
            ..Stats::default()
        },
        "no call may be refused for coming too early, and close must finalize then destroy"
    );
}

#[test]
fn the_fake_exports_every_entry_point_zero_calls() {
    assert_eq!(fake().nccl.missing_symbols(), Vec::<&str>::new());
}

#[test]
fn the_fake_refuses_a_call_made_while_the_previous_one_is_in_progress() {
    // The defect PolledComm fixes, shown on the raw calls: treating ncclInProgress as done
    // makes the very next call fail. This keeps the fake honest.
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let id = Scenario::polls(3).id(&mut rng);
    let raw = fake().nccl.raw();
    let mut config = zero_sys::nccl::nonblocking_config();
    let mut comm: b::ncclComm_t = std::ptr::null_mut();
    let uid = b::ncclUniqueId {
        internal: id.map(|x| x as std::os::raw::c_char),
    };
    let x = [1.0f32; 4];
    let y = [0.0f32; 4];
    // SAFETY: the fake's entry points with live locals; the buffers are host memory.
    unsafe {
        let init = raw.ncclCommInitRankConfig.as_ref().unwrap();
        let poll = raw.ncclCommGetAsyncError.as_ref().unwrap();
        let all_reduce = raw.ncclAllReduce.as_ref().unwrap();
        let destroy = raw.ncclCommDestroy.as_ref().unwrap();
        assert_eq!(
            init(&mut comm, 1, uid, 0, &mut config),
            b::ncclResult_t_ncclInProgress
        );
        let mut state = b::ncclResult_t_ncclInProgress;
        while state == b::ncclResult_t_ncclInProgress {
            poll(comm, &mut state);
        }
        assert_eq!(state, b::ncclResult_t_ncclSuccess);
        let call = || {
            all_reduce(
                x.as_ptr().cast(),
                y.as_ptr() as *mut _,
                4,
                b::ncclDataType_t_ncclFloat32,
                b::ncclRedOp_t_ncclSum,
                comm,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(call(), b::ncclResult_t_ncclInProgress);
        assert_eq!(
            y, [0.0; 4],
            "the output appears only when the call completes"
        );
        assert_eq!(
            call(),
            b::ncclResult_t_ncclInvalidArgument,
            "a second call in progress is refused"
        );
        poll(comm, &mut state);
        assert_eq!(
            state,
            b::ncclResult_t_ncclInvalidArgument,
            "and poisons the communicator"
        );
        assert_eq!(destroy(comm), b::ncclResult_t_ncclSuccess);
    }
    let s = stats(&id);
    assert_eq!((s.refused, s.destroys), (1, 1), "{s:?}");
}

#[test]
fn a_remote_error_aborts_the_communicator_and_the_peer_times_out() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let id = Scenario {
        fail_at: 3,
        fail_rank: 1,
        ..Scenario::polls(2)
    }
    .id(&mut rng);
    let timeout = Duration::from_millis(400);
    let results = ranks(2, |rank| {
        let mut c = PolledComm::init(fake().nccl, 2, &id, rank, timeout).expect("init");
        let x = vec![1.0f32; 8];
        let mut errors = Vec::new();
        for _ in 0..6 {
            let started = Instant::now();
            // SAFETY: host memory of 8 elements, alive across the settled call.
            let r = unsafe {
                c.all_reduce(
                    addr(&x),
                    addr(&x),
                    8,
                    NcclType::F32,
                    NcclOp::Sum,
                    std::ptr::null_mut(),
                )
            };
            if let Err(e) = r {
                errors.push((e, started.elapsed()));
            }
        }
        (errors, c.failure().cloned())
    });
    // Rank 1: the remote error at op 3, then every later call fails at once.
    let (errs, failure) = &results[1];
    assert_eq!(errs.len(), 3, "{errs:?}");
    assert!(
        matches!(&errs[0].0, NcclError::Call { code: 6, message, .. } if message.contains("remote")),
        "{:?}",
        errs[0]
    );
    for (e, took) in &errs[1..] {
        assert!(
            matches!(e, NcclError::Aborted(m) if m.contains("remote")),
            "{e:?}"
        );
        assert!(
            *took < Duration::from_millis(50),
            "an aborted call took {took:?}"
        );
    }
    assert!(failure.is_some());
    // Rank 0: op 4 waits for a peer that aborted; it times out instead of hanging.
    let (errs, _) = &results[0];
    assert_eq!(errs.len(), 2, "{errs:?}");
    let (e, took) = &errs[0];
    assert!(
        matches!(
            e,
            NcclError::Timeout {
                call: "ncclAllReduce",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        *took >= timeout && *took < timeout + Duration::from_secs(2),
        "{took:?}"
    );
    assert!(e.to_string().contains("aborted"), "{e}");
    let s = stats(&id);
    assert_eq!((s.aborts, s.destroys, s.refused), (2, 0, 0), "{s:?}");
}

#[test]
fn a_call_that_never_completes_times_out_and_aborts() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let id = Scenario {
        hang_at: 2,
        hang_rank: 0,
        ..Scenario::polls(1)
    }
    .id(&mut rng);
    let timeout = Duration::from_millis(300);
    let mut c = PolledComm::init(fake().nccl, 1, &id, 0, timeout).expect("init");
    let x = vec![2.0f32; 5];
    for k in 0..2 {
        // SAFETY: host memory of 5 elements, alive across the settled call.
        unsafe { c.broadcast(addr(&x), 5, NcclType::F32, 0, std::ptr::null_mut()) }
            .unwrap_or_else(|e| panic!("op {k}: {e}"));
    }
    let started = Instant::now();
    // SAFETY: as above.
    let err = unsafe { c.broadcast(addr(&x), 5, NcclType::F32, 0, std::ptr::null_mut()) }
        .expect_err("op 2 never completes");
    let took = started.elapsed();
    assert!(
        matches!(
            err,
            NcclError::Timeout {
                call: "ncclBroadcast",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "{took:?}"
    );
    let closed = c
        .close()
        .expect_err("an aborted communicator reports why on close");
    assert!(closed.to_string().contains("ncclBroadcast"), "{closed}");
    let s = stats(&id);
    assert_eq!(
        (s.aborts, s.destroys, s.destroy_refused),
        (1, 0, 0),
        "{s:?}"
    );
}

#[test]
fn an_init_that_never_completes_times_out_and_aborts() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let id = Scenario {
        init_polls: -1,
        ..Scenario::polls(1)
    }
    .id(&mut rng);
    let timeout = Duration::from_millis(200);
    let started = Instant::now();
    let err = PolledComm::init(fake().nccl, 1, &id, 0, timeout).expect_err("never ready");
    assert!(
        matches!(
            err,
            NcclError::Timeout {
                call: "ncclCommInitRankConfig",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() < timeout + Duration::from_secs(2));
    assert_eq!(stats(&id).aborts, 1);
}

#[test]
fn dropping_a_communicator_mid_use_finalizes_and_destroys_it() {
    let mut rng = ChaCha8Rng::seed_from_u64(19);
    let id = Scenario::polls(5).id(&mut rng);
    {
        let mut c = PolledComm::init(fake().nccl, 1, &id, 0, Duration::from_secs(5)).expect("init");
        let x = vec![3.0f32; 3];
        // SAFETY: host memory of 3 elements, alive across the settled call.
        unsafe { c.all_gather(addr(&x), addr(&x), 3, NcclType::F32, std::ptr::null_mut()) }
            .expect("all-gather");
    }
    let s = stats(&id);
    assert_eq!(
        (
            s.finalizes,
            s.destroys,
            s.destroy_refused,
            s.refused,
            s.blocking_inits
        ),
        (1, 1, 0, 0, 0),
        "{s:?}"
    );
}
