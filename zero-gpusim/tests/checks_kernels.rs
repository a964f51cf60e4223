//! The stand-in's kernel checks through the driver, each with a clean twin that must pass:
//! a kernel writing one past its buffer, a shared-memory read of another thread's write
//! with the barrier removed, a kernel reading never-written memory or freed memory, a free
//! on another stream racing a kernel, launches over the thread limits, and cubins the
//! stand-in must refuse (another architecture; never produced by its NVRTC tap).

mod common;

use common::*;

const KERNELS: &str = r#"
extern "C" __global__ void fill_one_past(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;   // the defect: <= instead of <
}
extern "C" __global__ void fill(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 1.0f;
}
extern "C" __global__ void rotate_without_barrier(const float* in, float* out) {
    __shared__ float s[128];
    s[threadIdx.x] = in[blockIdx.x * 128 + threadIdx.x];
    out[blockIdx.x * 128 + threadIdx.x] = s[(threadIdx.x + 37) % 128];  // the defect: no __syncthreads()
}
extern "C" __global__ void rotate(const float* in, float* out) {
    __shared__ float s[128];
    s[threadIdx.x] = in[blockIdx.x * 128 + threadIdx.x];
    __syncthreads();
    out[blockIdx.x * 128 + threadIdx.x] = s[(threadIdx.x + 37) % 128];
}
extern "C" __global__ void copy(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
extern "C" __global__ void __launch_bounds__(128) bounded(float* out) {
    out[threadIdx.x] = 2.0f;
}
"#;

fn module(sim: &Sim) -> Vec<u8> {
    sim.compile(KERNELS, "checks.cu", "sm_90")
}

fn upload(sim: &Sim, s: sys::CUstream, v: &[f32]) -> sys::CUdeviceptr {
    let d = alloc(sim, v.len() * 4);
    // SAFETY: `v` outlives the synchronize.
    unsafe { result::memcpy_htod_async(d, v, s) }.expect("upload");
    sync(s).expect("sync");
    d
}

fn download(s: sys::CUstream, d: sys::CUdeviceptr, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    // SAFETY: pageable destination; the call returns after the copy.
    unsafe { result::memcpy_dtoh_async(&mut out[..], d, s) }.expect("download");
    out
}

#[test]
fn a_kernel_writing_one_past_its_buffer_is_named() {
    let Some(sim) = sim("kernel one past the end") else {
        return;
    };
    let _g = lock();
    let cubin = module(sim);
    let s = stream(sim);
    let n = 1000usize;
    let mut d = alloc(sim, n * 4);
    let mut len = n as i32;
    let f = sim.function(&cubin, "fill_one_past").expect("function");
    let _ = launch(f, 4, 256, s, &mut [arg(&mut d), arg(&mut len)]);
    let _ = sync(s);
    let m = expect_finding(
        sim,
        &[
            "fill_one_past",
            "store of 4 bytes out of bounds",
            "thread",
            "allocation #",
        ],
    );
    println!("{m}");
    let f = sim.function(&cubin, "fill").expect("function");
    let mut d = alloc(sim, n * 4);
    launch(f, 4, 256, s, &mut [arg(&mut d), arg(&mut len)]).expect("launch");
    sync(s).expect("sync");
    assert!(download(s, d, n).iter().all(|&x| x == 1.0));
    expect_clean(sim);
}

#[test]
fn a_shared_memory_read_without_its_barrier_is_a_race() {
    let Some(sim) = sim("shared memory without a barrier") else {
        return;
    };
    let _g = lock();
    let cubin = module(sim);
    let s = stream(sim);
    let input: Vec<f32> = (0..512).map(|i| i as f32).collect();
    let mut din = upload(sim, s, &input);
    let mut dout = alloc(sim, 512 * 4);
    let f = sim
        .function(&cubin, "rotate_without_barrier")
        .expect("function");
    let _ = launch(f, 4, 128, s, &mut [arg(&mut din), arg(&mut dout)]);
    let _ = sync(s);
    let m = expect_finding(sim, &["rotate_without_barrier", "no bar.sync between them"]);
    println!("{m}");
    let f = sim.function(&cubin, "rotate").expect("function");
    launch(f, 4, 128, s, &mut [arg(&mut din), arg(&mut dout)]).expect("launch");
    sync(s).expect("sync");
    let out = download(s, dout, 512);
    for b in 0..4 {
        for t in 0..128 {
            assert_eq!(out[b * 128 + t], input[b * 128 + (t + 37) % 128]);
        }
    }
    expect_clean(sim);
}

#[test]
fn kernels_reading_never_written_or_freed_memory_are_named() {
    let Some(sim) = sim("kernel uninitialized and freed reads") else {
        return;
    };
    let _g = lock();
    let cubin = module(sim);
    let f = sim.function(&cubin, "copy").expect("function");
    let s = stream(sim);
    let mut n = 256i32;
    let mut fresh = alloc(sim, 1024);
    let mut out = alloc(sim, 1024);
    let _ = launch(
        f,
        1,
        256,
        s,
        &mut [arg(&mut fresh), arg(&mut out), arg(&mut n)],
    );
    let _ = sync(s);
    expect_finding(
        sim,
        &["copy", "never-written device memory", "allocation #"],
    );
    let mut gone = upload(sim, s, &[1.0; 256]);
    // SAFETY: a live allocation, freed once.
    unsafe { result::free_sync(gone) }.expect("free");
    let _ = launch(
        f,
        1,
        256,
        s,
        &mut [arg(&mut gone), arg(&mut out), arg(&mut n)],
    );
    let _ = sync(s);
    expect_finding(sim, &["copy", "after free", "freed by cuMemFree"]);
    // Clean twin.
    let mut src = upload(sim, s, &[3.0; 256]);
    launch(
        f,
        1,
        256,
        s,
        &mut [arg(&mut src), arg(&mut out), arg(&mut n)],
    )
    .expect("launch");
    sync(s).expect("sync");
    assert!(download(s, out, 256).iter().all(|&x| x == 3.0));
    expect_clean(sim);
}

/// Holds a stream for 200 ms (the host function of the race test).
unsafe extern "C" fn sleep_200ms(_: *mut std::ffi::c_void) {
    std::thread::sleep(std::time::Duration::from_millis(200));
}

#[test]
fn a_free_racing_a_kernel_on_another_stream_is_named() {
    let Some(sim) = sim("free racing a kernel") else {
        return;
    };
    let _g = lock();
    let cubin = module(sim);
    let f = sim.function(&cubin, "copy").expect("function");
    let (a, b) = (stream(sim), stream(sim));
    let mut n = 4096i32;
    let mut dst = alloc(sim, 4096 * 4);
    // The defect, in every order the streams can run it: a host function holding one
    // stream makes the other's operation run first; with none held the free may land while
    // the kernel runs (a kernel that had already touched the buffer once reported this as
    // a plain load after free).
    for held in [Some(b), Some(a), None] {
        let mut src = upload(sim, a, &vec![1.0; 4096]);
        sync(a).expect("upload");
        if let Some(held) = held {
            // SAFETY: a function with no data, as cuLaunchHostFunc takes it.
            unsafe { sys::cuLaunchHostFunc(held, Some(sleep_200ms), std::ptr::null_mut()) }
                .result()
                .expect("host fn");
        }
        launch(
            f,
            16,
            256,
            a,
            &mut [arg(&mut src), arg(&mut dst), arg(&mut n)],
        )
        .expect("launch");
        // SAFETY: the free is ordered after nothing on `a`: the defect.
        let _ = unsafe { result::free_async(src, b) };
        let _ = sync(a);
        let _ = sync(b);
        expect_finding(
            sim,
            &["race on allocation", "cuMemFreeAsync", "kernel copy"],
        );
    }
    // Clean twin: the free waits for an event after the kernel.
    let mut src = upload(sim, a, &vec![1.0; 4096]);
    sim.ctx.bind_to_thread().expect("bind");
    let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).expect("event");
    launch(
        f,
        16,
        256,
        a,
        &mut [arg(&mut src), arg(&mut dst), arg(&mut n)],
    )
    .expect("launch");
    // SAFETY: live event and streams; the free is ordered after the kernel.
    unsafe {
        result::event::record(ev, a).expect("record");
        result::stream::wait_event(b, ev, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            .expect("wait");
        result::free_async(src, b).expect("free");
    }
    sync(b).expect("sync");
    expect_clean(sim);
}

#[test]
fn launches_over_the_thread_limits_are_refused_naming_the_limit() {
    let Some(sim) = sim("launch limits") else {
        return;
    };
    let _g = lock();
    let cubin = module(sim);
    let f = sim.function(&cubin, "bounded").expect("function");
    let s = stream(sim);
    let mut d = alloc(sim, 4096 * 4);
    for (block, part) in [
        (256, ".maxntid of 128"),
        (2048, "exceeds the per-dimension limits (1024, 1024, 64)"),
    ] {
        let e = launch(f, 1, block, s, &mut [arg(&mut d)]).expect_err("over the limit");
        let text = format!("{e:?}");
        assert!(
            text.contains("CUDA_ERROR_INVALID_VALUE") && text.contains(part),
            "{text}"
        );
        println!("{text}");
    }
    launch(f, 1, 128, s, &mut [arg(&mut d)]).expect("within the limit");
    sync(s).expect("sync");
    expect_clean(sim);
}

#[test]
fn cubins_for_another_gpu_or_from_another_compiler_are_refused() {
    let Some(sim) = sim("foreign cubins") else {
        return;
    };
    let _g = lock();
    // Through the tap, but for sm_80: the driver refuses a cubin of another architecture.
    let sm80 = sim.compile(KERNELS, "checks.cu", "sm_80");
    let e = sim
        .function(&sm80, "fill")
        .expect_err("an sm_80 cubin on sm_90");
    let text = format!("{e:?}");
    assert!(
        text.contains("CUDA_ERROR_NO_BINARY_FOR_GPU") && text.contains("sm_80"),
        "{text}"
    );
    println!("{text}");
    // From the real NVRTC directly: the stand-in never saw it, so it has no PTX to run.
    let real = real_nvrtc().expect("real NVRTC");
    let nvrtc = zero_sys::nvrtc::Nvrtc::open(&real.display().to_string()).expect("NVRTC");
    let other = nvrtc
        .compile_cubin(&KERNELS.replace("2.0f", "3.0f"), "other.cu", "sm_90", &[])
        .expect("compile")
        .image;
    let e = sim
        .function(&other, "fill")
        .expect_err("a cubin the tap never produced");
    let text = format!("{e:?}");
    assert!(
        text.contains("never saw this cubin") && text.contains("SHA-256"),
        "{text}"
    );
    println!("{text}");
    // The clean twin: sm_90 through the tap loads and runs.
    let f = sim
        .function(&module(sim), "fill")
        .expect("the tap's own cubin loads");
    let s = stream(sim);
    let (mut d, mut n) = (alloc(sim, 64), 16i32);
    launch(f, 1, 32, s, &mut [arg(&mut d), arg(&mut n)]).expect("launch");
    sync(s).expect("sync");
    expect_clean(sim);
}
