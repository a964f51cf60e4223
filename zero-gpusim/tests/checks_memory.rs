//! The stand-in's memory and ordering checks, each with a clean twin that must pass:
//! copies past an allocation's end, never-written memory, use after free, double free,
//! two streams without an event between them, a free racing a use, an event waited for
//! before it was recorded (allowed), leaks at context destruction (reported, not fatal).

// The self-tests call the driver's raw entry points on purpose (the context is bound first).
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;

/// Runs the ignored test `name` of this binary in a child process (what ends a process, or
/// settings read once per process) with `set` added to and `unset` taken from its
/// environment; its exit status and its output, stdout then stderr.
fn run_child(name: &str, set: &[(&str, &str)], unset: &[&str]) -> (std::process::Output, String) {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd.envs(set.iter().copied());
    for v in unset {
        cmd.env_remove(v);
    }
    let out = cmd.output().expect("run the child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

fn filled(sim: &Sim, s: sys::CUstream, n: usize) -> sys::CUdeviceptr {
    let d = alloc(sim, n * 4);
    let host: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
    // SAFETY: `host` outlives the synchronize below.
    unsafe { result::memcpy_htod_async(d, &host, s) }.expect("upload");
    sync(s).expect("sync");
    d
}

#[test]
fn a_download_one_element_past_the_end_is_named() {
    let Some(sim) = sim("download past the end") else {
        return;
    };
    let _g = lock();
    let s = stream(sim);
    let d = filled(sim, s, 7);
    let mut host = [0f32; 8];
    // SAFETY: `host` is pageable; the call returns after the copy.
    let r = unsafe { result::memcpy_dtoh_async(&mut host[..], d, s) };
    assert!(r.is_err(), "the over-read must fail");
    let f = expect_finding(
        sim,
        &[
            "cuMemcpyDtoHAsync",
            "4 bytes past its end",
            "allocation #",
            "28 bytes",
        ],
    );
    println!("{f}");
    // The clean twin: exactly its length.
    // SAFETY: as above.
    unsafe { result::memcpy_dtoh_async(&mut host[..7], d, s) }.expect("exact download");
    sync(s).expect("sync");
    assert_eq!(host[6], 6.5);
    expect_clean(sim);
}

#[test]
fn a_read_of_never_written_memory_is_named() {
    let Some(sim) = sim("never written") else {
        return;
    };
    let _g = lock();
    let s = stream(sim);
    let d = alloc(sim, 64);
    let mut host = [0u8; 64];
    // SAFETY: pageable destination; the call returns after the copy.
    let _ = unsafe { result::memcpy_dtoh_async(&mut host[..], d, s) };
    let _ = sync(s);
    expect_finding(sim, &["never-written device memory", "offset 0"]);
    // SAFETY: a live allocation of 64 bytes.
    unsafe { result::memset_d8_async(d, 7, 64, s) }.expect("memset");
    // SAFETY: as above.
    unsafe { result::memcpy_dtoh_async(&mut host[..], d, s) }.expect("download");
    sync(s).expect("sync");
    assert!(host.iter().all(|&b| b == 7));
    expect_clean(sim);
}

#[test]
fn a_use_after_free_and_a_double_free_are_named() {
    let Some(sim) = sim("use after free") else {
        return;
    };
    let _g = lock();
    let s = stream(sim);
    let d = filled(sim, s, 16);
    // SAFETY: a live allocation, freed once here.
    unsafe { result::free_sync(d) }.expect("free");
    let host = vec![1f32; 16];
    // SAFETY: pageable source, snapshotted at the call.
    let _ = unsafe { result::memcpy_htod_async(d, &host, s) };
    let _ = sync(s);
    expect_finding(sim, &["use after free", "freed by cuMemFree"]);
    // SAFETY: the pointer was freed above: the stand-in must refuse.
    let _ = unsafe { result::free_sync(d) };
    expect_finding(sim, &["double free"]);
    // Clean twin: a fresh allocation used then freed.
    let e = filled(sim, s, 16);
    // SAFETY: live, freed once.
    unsafe { result::free_sync(e) }.expect("free");
    expect_clean(sim);
}

#[test]
fn two_streams_without_an_event_between_them_race() {
    let Some(sim) = sim("missing wait") else {
        return;
    };
    let _g = lock();
    let (a, b) = (stream(sim), stream(sim));
    let d = filled(sim, a, 1024);
    let host = vec![2f32; 1024];
    let mut out = vec![0f32; 1024];
    // Producer on a, consumer on b, nothing between: a race.
    // SAFETY: `host` outlives the synchronizes below; `out` is pageable (the call waits).
    unsafe {
        result::memcpy_htod_async(d, &host, a).expect("producer");
        let _ = result::memcpy_dtoh_async(&mut out[..], d, b);
    }
    let _ = sync(a);
    let _ = sync(b);
    expect_finding(
        sim,
        &["race on allocation", "with nothing ordering the two"],
    );
    // Clean twin: an event recorded after the producer, waited for by the consumer.
    sim.ctx.bind_to_thread().expect("bind");
    let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).expect("event");
    // SAFETY: live streams, event and buffers (synchronized below).
    unsafe {
        result::memcpy_htod_async(d, &host, a).expect("producer");
        result::event::record(ev, a).expect("record");
        result::stream::wait_event(b, ev, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            .expect("wait");
        result::memcpy_dtoh_async(&mut out[..], d, b).expect("consumer");
    }
    sync(b).expect("sync");
    assert!(out.iter().all(|&x| x == 2.0));
    expect_clean(sim);
}

#[test]
fn a_free_on_one_stream_racing_a_use_on_another_is_named() {
    let Some(sim) = sim("free racing a use") else {
        return;
    };
    let _g = lock();
    let (a, b) = (stream(sim), stream(sim));
    let src = filled(sim, a, 4096);
    let dst = alloc(sim, 4096 * 4);
    // SAFETY: live allocations; the free is ordered after nothing on `a`.
    unsafe {
        result::memcpy_dtod_async(dst, src, 4096 * 4, a).expect("copy");
        let _ = result::free_async(src, b);
    }
    let _ = sync(a);
    let _ = sync(b);
    expect_finding(sim, &["race on allocation", "cuMemFreeAsync"]);
    // Clean twin: the free waits for an event after the use.
    let src = filled(sim, a, 4096);
    sim.ctx.bind_to_thread().expect("bind");
    let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).expect("event");
    // SAFETY: as above, ordered by the event.
    unsafe {
        result::memcpy_dtod_async(dst, src, 4096 * 4, a).expect("copy");
        result::event::record(ev, a).expect("record");
        result::stream::wait_event(b, ev, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            .expect("wait");
        result::free_async(src, b).expect("free");
    }
    sync(b).expect("sync");
    expect_clean(sim);
}

#[test]
fn waiting_for_an_event_never_recorded_is_allowed() {
    let Some(sim) = sim("never-recorded event") else {
        return;
    };
    let _g = lock();
    let s = stream(sim);
    sim.ctx.bind_to_thread().expect("bind");
    let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).expect("event");
    // SAFETY: live stream and event; CUDA treats a never-recorded event as complete.
    unsafe {
        result::stream::wait_event(s, ev, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            .expect("wait");
        result::event::synchronize(ev).expect("synchronize");
        result::event::query(ev).expect("complete");
    }
    let d = filled(sim, s, 8);
    let mut out = [0f32; 8];
    // SAFETY: pageable destination.
    unsafe { result::memcpy_dtoh_async(&mut out[..], d, s) }.expect("download");
    expect_clean(sim);
}

#[test]
fn allocations_left_at_context_destruction_are_reported_not_fatal() {
    let Some(sim) = sim("leak report") else {
        return;
    };
    let _g = lock();
    let before = sim.leaks();
    // SAFETY: device 1's primary context, retained, made current, released once.
    unsafe {
        let dev = result::device::get(1).expect("device 1");
        let ctx = result::primary_ctx::retain(dev).expect("retain");
        result::ctx::set_current(ctx).expect("current");
        let _leaked = result::malloc_sync(400).expect("alloc");
        result::primary_ctx::release(dev).expect("release");
    }
    assert_eq!(sim.leaks(), before + 1, "the leaked allocation is reported");
    // Not fatal: device 0 goes on.
    let s0 = stream(sim);
    filled(sim, s0, 4);
    expect_clean(sim);
}

unsafe extern "C" fn sleep_300ms(_: *mut std::ffi::c_void) {
    std::thread::sleep(std::time::Duration::from_millis(300));
}

/// The child of the pinned-buffer test (run by it, in its own process: the finding ends
/// the process, as a host store cannot return an error).
#[test]
#[ignore = "run by a_host_write_to_a_pinned_buffer_during_its_copy_is_named"]
fn pinned_child() {
    let Ok(mode) = std::env::var("GPUSIM_PINNED_MODE") else {
        return;
    };
    let sim = sim("pinned child").expect("the stand-in");
    let s = stream(sim);
    let n = 4096usize;
    let d = alloc(sim, n * 4);
    // SAFETY: pinned memory of n f32, written by the host before any copy, freed at the end.
    unsafe {
        let p = result::malloc_host(n * 4, 0).expect("pinned") as *mut f32;
        let host = std::slice::from_raw_parts_mut(p, n);
        host.fill(3.0);
        // Keep the stream busy so the copy is still pending when the host writes.
        sys::cuLaunchHostFunc(s, Some(sleep_300ms), std::ptr::null_mut())
            .result()
            .expect("host fn");
        result::memcpy_htod_async(d, &host[..], s).expect("upload");
        if mode == "after" {
            sync(s).expect("sync");
        }
        // The write the stand-in must catch while the copy is pending.
        std::ptr::write_volatile(p.add(10), 1.0);
        sync(s).expect("sync");
        result::free_host(p.cast()).expect("free");
    }
    println!("PINNED CHILD DONE {mode}");
}

#[test]
fn a_host_write_to_a_pinned_buffer_during_its_copy_is_named() {
    let Some(_sim) = sim("pinned host write") else {
        return;
    };
    let _g = lock();
    for mode in ["during", "after"] {
        let (out, text) = run_child("pinned_child", &[("GPUSIM_PINNED_MODE", mode)], &[]);
        if mode == "during" {
            assert!(
                !out.status.success(),
                "the write during the copy must end the child:\n{text}"
            );
            for part in [
                "the host wrote pinned allocation #",
                "at offset 40",
                "cuMemcpyHtoDAsync",
                "still pending",
            ] {
                assert!(
                    text.contains(part),
                    "the finding should name `{part}`:\n{text}"
                );
            }
            println!(
                "{}",
                text.lines()
                    .find(|l| l.contains("zero-gpusim memory error"))
                    .unwrap_or("")
            );
        } else {
            assert!(
                out.status.success() && text.contains("PINNED CHILD DONE after"),
                "the write after the copy is fine:\n{text}"
            );
        }
    }
}

/// CUDA_REVIEW2.md §1, re-created: the pinned download as `TransferStaging::download` was
/// written before the second reading's fix passed the whole 16 MiB pinned buffer as the
/// destination of a shorter piece, and `cudarc` copies as many bytes as the destination
/// holds. The stand-in names the over-read; the fixed form (an exact sub-slice, as
/// zero-kernels' `copy_dtoh` does now) is clean.
#[test]
fn the_reviews_16_mib_download_over_read_is_named() {
    let Some(sim) = sim("16 MiB over-read") else {
        return;
    };
    let _g = lock();
    let stream = sim.ctx.new_stream().expect("stream");
    let src = stream
        .clone_htod(&[1f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
        .expect("upload");
    stream.synchronize().expect("sync");
    // SAFETY: every element is written by the copy before it is read.
    let mut pinned = unsafe { sim.ctx.alloc_pinned::<f32>((16 << 20) / 4) }.expect("pinned");
    let piece = src.slice(0..8);
    let r = stream.memcpy_dtoh(&piece, &mut pinned);
    let _ = stream.synchronize();
    println!("the old download returned {r:?}");
    expect_finding(
        sim,
        &[
            "cuMemcpyDtoHAsync",
            "16777216 bytes at offset 0",
            "32 bytes",
            "16777184 bytes past its end",
        ],
    );
    // The fixed form: exactly the piece's length.
    let host = pinned.as_mut_slice().expect("host view");
    stream
        .memcpy_dtoh(&piece, &mut host[..8])
        .expect("exact download");
    stream.synchronize().expect("sync");
    assert_eq!(host[..8], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    expect_clean(sim);
}

/// A device of `ZERO_GPUSIM_MEMORY_MIB` MiB refuses what does not fit, and reports the
/// default pool's high mark as the driver does (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`, reset by
/// setting it to 0) and every allocation's peak (`zero_gpusim_peak_bytes`); a cap that is
/// not a whole number of MiB fails `cuInit` naming the variable, never a silent 80 GiB.
#[test]
fn a_memory_cap_in_mib_is_kept_and_its_peak_reported() {
    let Some(_sim) = sim("memory cap") else {
        return;
    };
    let _g = lock();
    let child = |mode: &str, mib: &str| {
        let (out, text) = run_child(
            "memory_cap_child",
            &[("GPUSIM_CAP_MODE", mode), ("ZERO_GPUSIM_MEMORY_MIB", mib)],
            &["ZERO_GPUSIM_MEMORY_GB"],
        );
        assert!(out.status.success(), "{mode} {mib}:\n{text}");
        text
    };
    let text = child("good", "4");
    assert!(text.contains("CAP CHILD DONE"), "{text}");
    assert!(text.contains("4 MiB each"), "{text}");
    for bad in ["1.5", "4M", ""] {
        let text = child("bad", bad);
        assert!(
            text.contains("CUINIT 1") && text.contains("ZERO_GPUSIM_MEMORY_MIB"),
            "cuInit with ZERO_GPUSIM_MEMORY_MIB={bad:?} must fail with CUDA_ERROR_INVALID_VALUE \
             naming the variable:\n{text}"
        );
    }
}

/// The child of the memory-cap test (the settings are read once per process).
#[test]
#[ignore = "run by a_memory_cap_in_mib_is_kept_and_its_peak_reported"]
fn memory_cap_child() {
    use std::ffi::c_void;
    let Ok(mode) = std::env::var("GPUSIM_CAP_MODE") else {
        return;
    };
    let path = library().expect("the stand-in");
    // SAFETY: the stand-in, loaded to call its entry points by name with their C types.
    let lib = unsafe { libloading::Library::new(&path) }.expect("load the stand-in");
    if mode == "bad" {
        // SAFETY: cuInit(unsigned int) -> CUresult.
        let code = unsafe {
            let init: libloading::Symbol<unsafe extern "C" fn(u32) -> u32> =
                lib.get(b"cuInit\0").expect("cuInit");
            init(0)
        };
        println!("CUINIT {code}");
        return;
    }
    let sim = sim("memory cap child").expect("the stand-in");
    // SAFETY: zero_gpusim_peak_bytes(int) -> uint64_t.
    let peak = |dev: i32| unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn(i32) -> u64> =
            lib.get(b"zero_gpusim_peak_bytes\0").expect("peak symbol");
        f(dev)
    };
    let mib = 1usize << 20;
    let s = stream(sim);
    // SAFETY: device 0 exists; the pool handle is the device's default one.
    let (total, pool) = unsafe {
        let mut pool = std::ptr::null_mut();
        sys::cuDeviceGetDefaultMemPool(&mut pool, 0)
            .result()
            .expect("pool");
        (result::device::total_mem(0).expect("total"), pool)
    };
    assert_eq!(total, 4 * mib);
    let attr = |a: sys::CUmemPool_attribute| {
        let mut v = 0u64;
        // SAFETY: the used-bytes attributes write one cuuint64_t.
        unsafe { sys::cuMemPoolGetAttribute(pool, a, (&mut v as *mut u64).cast::<c_void>()) }
            .result()
            .expect("pool attribute");
        v as usize
    };
    use sys::CUmemPool_attribute::{
        CU_MEMPOOL_ATTR_USED_MEM_CURRENT as CURRENT, CU_MEMPOOL_ATTR_USED_MEM_HIGH as HIGH,
    };
    let before = attr(CURRENT);
    // SAFETY: stream-ordered allocations on a live stream, each freed on it, synchronized
    // before each reading.
    unsafe {
        let a = result::malloc_async(s, mib).expect("1 MiB");
        let b = result::malloc_async(s, 2 * mib).expect("2 MiB");
        result::free_async(a, s).expect("free");
        sync(s).expect("sync");
        let c = result::malloc_async(s, mib / 2).expect("0.5 MiB");
        sync(s).expect("sync");
        assert_eq!(attr(CURRENT), before + 5 * mib / 2);
        assert_eq!(attr(HIGH), before + 3 * mib);
        assert!(peak(0) >= (before + 3 * mib) as u64, "{}", peak(0));
        assert_eq!(peak(99), u64::MAX, "no device 99");
        let over = result::malloc_async(s, 2 * mib);
        assert!(over.is_err(), "2 MiB more than fits a 4 MiB device");
        let zero = 0u64;
        sys::cuMemPoolSetAttribute(pool, HIGH, (&zero as *const u64).cast_mut().cast())
            .result()
            .expect("reset the high mark");
        assert_eq!(attr(HIGH), before + 5 * mib / 2);
        let one = 1u64;
        assert!(
            sys::cuMemPoolSetAttribute(pool, HIGH, (&one as *const u64).cast_mut().cast())
                .result()
                .is_err(),
            "a high mark resets to 0 only"
        );
        result::free_async(b, s).expect("free");
        result::free_async(c, s).expect("free");
        sync(s).expect("sync");
    }
    let _ = sim.findings();
    println!("CAP CHILD DONE");
}
