//! The stand-in's NCCL, through its C entry points, across real processes (this test
//! binary re-run once per rank): ranks that disagree on a collective's count, dtype or op
//! fail on every rank naming both calls; a rank that never arrives makes the others time
//! out naming it; two ranks on one device are refused on both; each with a clean twin.

// The self-tests call the driver's raw entry points on purpose.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type Comm = *mut c_void;
#[repr(C)]
#[derive(Clone, Copy)]
struct Id([u8; 128]);

struct Nccl {
    get_id: unsafe extern "C" fn(*mut Id) -> u32,
    init: unsafe extern "C" fn(*mut Comm, c_int, Id, c_int) -> u32,
    all_reduce: unsafe extern "C" fn(u64, u64, usize, c_int, c_int, Comm, *mut c_void) -> u32,
    async_error: unsafe extern "C" fn(Comm, *mut u32) -> u32,
    last_error: unsafe extern "C" fn(Comm) -> *const c_char,
    destroy: unsafe extern "C" fn(Comm) -> u32,
    abort: unsafe extern "C" fn(Comm) -> u32,
}

fn nccl(sim: &Sim) -> Nccl {
    let lib = unsafe { libloading::Library::new(&sim.path) }.expect("the stand-in");
    // SAFETY: the stand-in's NCCL entry points, with nccl.h's signatures; the library
    // stays loaded (leaked below).
    let n = unsafe {
        Nccl {
            get_id: *lib.get(b"ncclGetUniqueId\0").expect("symbol"),
            init: *lib.get(b"ncclCommInitRank\0").expect("symbol"),
            all_reduce: *lib.get(b"ncclAllReduce\0").expect("symbol"),
            async_error: *lib.get(b"ncclCommGetAsyncError\0").expect("symbol"),
            last_error: *lib.get(b"ncclGetLastError\0").expect("symbol"),
            destroy: *lib.get(b"ncclCommDestroy\0").expect("symbol"),
            abort: *lib.get(b"ncclCommAbort\0").expect("symbol"),
        }
    };
    std::mem::forget(lib);
    n
}

fn hex(id: &Id) -> String {
    id.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Id {
    let mut id = Id([0; 128]);
    for (i, b) in id.0.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex id");
    }
    id
}

/// One rank: joins, runs one all-reduce (its count, dtype and op from the environment, or
/// none), and prints what happened.
#[test]
#[ignore = "run by the NCCL checks, one process per rank"]
fn nccl_child() {
    let Ok(rank) = std::env::var("GPUSIM_NCCL_RANK") else {
        return;
    };
    let rank: c_int = rank.parse().expect("rank");
    let device: usize = std::env::var("GPUSIM_NCCL_DEVICE")
        .expect("device")
        .parse()
        .expect("device");
    let id = unhex(&std::env::var("GPUSIM_NCCL_ID").expect("id"));
    let call = std::env::var("GPUSIM_NCCL_CALL").expect("call");
    let sim = sim("nccl child").expect("the stand-in");
    let n = nccl(sim);
    let ctx = CudaContext::new(device).expect("device");
    ctx.bind_to_thread().expect("bind");
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: blocking init with a writable handle.
    let rc = unsafe { (n.init)(&mut comm, 2, id, rank) };
    let last = |c: Comm| {
        unsafe { CStr::from_ptr((n.last_error)(c)) }
            .to_string_lossy()
            .into_owned()
    };
    if rc != 0 {
        println!("RANK {rank} INIT FAILED {rc}: {}", last(comm));
        return;
    }
    if call == "abort" {
        std::thread::sleep(Duration::from_secs(1));
        // SAFETY: a live communicator, aborted once (the handle is dead after it).
        unsafe { (n.abort)(comm) };
        println!("RANK {rank} ABORTED");
        return;
    }
    if call == "none" {
        println!("RANK {rank} JOINED, NEVER CALLS");
        std::thread::sleep(Duration::from_secs(8));
        return;
    }
    let f: Vec<&str> = call.split(',').collect();
    let (count, dtype, op): (usize, c_int, c_int) = (
        f[0].parse().unwrap(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
    );
    let s = ctx.default_stream();
    let buf = s.clone_htod(&vec![1.5f32; 1024]).expect("upload");
    use cudarc::driver::DevicePtr;
    let (ptr, _g) = buf.device_ptr(&s);
    // SAFETY: a live device buffer of 4 KiB (the counts used fit), on a live stream.
    let rc = unsafe {
        (n.all_reduce)(
            ptr,
            ptr,
            count,
            dtype,
            op,
            comm,
            s.cu_stream() as *mut c_void,
        )
    };
    s.synchronize().expect("sync");
    let mut state = 0u32;
    // SAFETY: a live communicator.
    unsafe { (n.async_error)(comm, &mut state) };
    if rc != 0 || state != 0 {
        println!("RANK {rank} COLLECTIVE FAILED {rc}/{state}: {}", last(comm));
    } else {
        println!("RANK {rank} OK");
    }
    // SAFETY: destroyed once.
    unsafe { (n.destroy)(comm) };
}

/// Runs two ranks on `devices` with per-rank `calls`; each rank's output.
fn two_ranks(sim: &Sim, devices: [usize; 2], calls: [&str; 2], timeout_s: &str) -> [String; 2] {
    let n = nccl(sim);
    let mut id = Id([0; 128]);
    // SAFETY: a writable id.
    assert_eq!(unsafe { (n.get_id)(&mut id) }, 0);
    let kids: Vec<_> = (0..2)
        .map(|r| {
            Command::new(std::env::current_exe().expect("test binary"))
                .args([
                    "--exact",
                    "nccl_child",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("GPUSIM_NCCL_RANK", r.to_string())
                .env("GPUSIM_NCCL_DEVICE", devices[r].to_string())
                .env("GPUSIM_NCCL_ID", hex(&id))
                .env("GPUSIM_NCCL_CALL", calls[r])
                .env("ZERO_GPUSIM_NCCL_TIMEOUT_S", timeout_s)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let outs: Vec<String> = kids
        .into_iter()
        .map(|mut k| {
            while k.try_wait().expect("wait").is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = k.kill();
            let o = k.wait_with_output().expect("output");
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect();
    [outs[0].clone(), outs[1].clone()]
}

fn line(out: &str, rank: usize) -> String {
    let tag = format!("RANK {rank} ");
    out.lines()
        .find_map(|l| l.find(&tag).map(|at| l[at..].to_string()))
        .unwrap_or_default()
}

const F32: &str = "7";
const BF16: &str = "9";

#[test]
fn collectives_that_disagree_fail_on_every_rank_naming_both() {
    let Some(sim) = sim("NCCL mismatches") else {
        return;
    };
    let _g = lock();
    for (what, calls, parts) in [
        (
            "count",
            [format!("1000,{F32},0"), format!("999,{F32},0")],
            vec!["1000 x f32", "999 x f32"],
        ),
        (
            "dtype",
            [format!("512,{F32},0"), format!("512,{BF16},0")],
            vec!["512 x f32", "512 x bf16"],
        ),
        (
            "op",
            [format!("512,{F32},0"), format!("512,{F32},2")],
            vec!["sum", "max"],
        ),
    ] {
        let out = two_ranks(sim, [0, 1], [&calls[0], &calls[1]], "20");
        for (r, o) in out.iter().enumerate() {
            let l = line(o, r);
            assert!(
                l.contains("COLLECTIVE FAILED"),
                "{what}: rank {r} must fail:\n{o}"
            );
            for p in &parts {
                assert!(
                    l.contains(p),
                    "{what}: rank {r}'s error must name `{p}`: {l}"
                );
            }
            println!("{what}, rank {r}: {l}");
        }
    }
    // The clean twin.
    let c = format!("1000,{F32},0");
    let out = two_ranks(sim, [0, 1], [&c, &c], "20");
    for (r, o) in out.iter().enumerate() {
        assert!(line(o, r).ends_with("OK"), "rank {r}:\n{o}");
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_by_the_others_timeout() {
    let Some(sim) = sim("NCCL missing rank") else {
        return;
    };
    let _g = lock();
    let c = format!("256,{F32},0");
    let t = Instant::now();
    let out = two_ranks(sim, [0, 1], [&c, "none"], "3");
    let l = line(&out[0], 0);
    assert!(
        l.contains("COLLECTIVE FAILED") && l.contains("rank") && l.contains('1'),
        "rank 0 must time out naming rank 1:\n{}",
        out[0]
    );
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
    println!("{l}");
}

#[test]
fn an_abort_wakes_the_other_rank_at_once_naming_it() {
    let Some(sim) = sim("NCCL abort") else { return };
    let _g = lock();
    let c = format!("256,{F32},0");
    let t = Instant::now();
    // The waiter's own timeout is 60 s: only the abort can end its wait early.
    let out = two_ranks(sim, [0, 1], [&c, "abort"], "60");
    let l = line(&out[0], 0);
    assert!(
        l.contains("COLLECTIVE FAILED") && l.contains("rank 1") && l.contains("abort"),
        "rank 0 must fail naming rank 1's abort:\n{}",
        out[0]
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
    println!("{l} (after {:?})", t.elapsed());
}

#[test]
fn two_ranks_on_one_device_are_refused_on_both() {
    let Some(sim) = sim("NCCL two ranks on one device") else {
        return;
    };
    let _g = lock();
    let c = format!("256,{F32},0");
    let out = two_ranks(sim, [0, 0], [&c, &c], "20");
    for (r, o) in out.iter().enumerate() {
        let l = line(o, r);
        assert!(
            l.contains("INIT FAILED") && l.to_lowercase().contains("device"),
            "rank {r} must be refused naming the device:\n{o}"
        );
        println!("{l}");
    }
}
