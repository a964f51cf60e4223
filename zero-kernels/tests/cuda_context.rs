//! A call into zero that binds its own CUDA context puts the caller's back (issue 30, M5):
//! `zero_sys::driver::KeepCurrentContext`, which zero-torch holds around every call into a
//! GPU engine, so torch's current device is never changed by zero's. The caller may have
//! another device's context current (the stand-in shows eight devices; on a one-GPU
//! machine that case is left out, said so), zero's own, or none (a fresh thread).

use zero_kernels::testing::gpu_or_skip;
use zero_sys::cudarc::driver::{result, sys::CUcontext, CudaContext};
use zero_sys::driver::KeepCurrentContext;

fn current() -> Option<CUcontext> {
    result::ctx::get_current().expect("current context")
}

/// With the caller's context `before` current, a call that binds `zeros` (and another)
/// leaves `before` current.
fn check(zeros: &CudaContext, other: &CudaContext) {
    let before = current();
    {
        let _keep = KeepCurrentContext::save().expect("save");
        zeros.bind_to_thread().expect("zero binds its own");
        assert_eq!(current(), Some(zeros.cu_ctx()));
        other.bind_to_thread().expect("and another");
    }
    assert_eq!(current(), before, "the caller's context is back");
}

#[test]
fn the_callers_context_is_current_again_after_the_call() {
    if gpu_or_skip("the caller's CUDA context").is_none() {
        return;
    }
    let count = CudaContext::device_count().expect("device count");
    let zeros = CudaContext::new(0).expect("device 0");
    let other = CudaContext::new(if count > 1 { 1 } else { 0 }).expect("another device");
    // Zero's own context current.
    zeros.bind_to_thread().expect("bind");
    check(&zeros, &other);
    // Another device's (torch on device 1, zero on device 0).
    if count > 1 {
        other.bind_to_thread().expect("bind");
        check(&zeros, &other);
    } else {
        println!("one GPU: the case of another device's context current needs two");
    }
    // None: a fresh thread has no context current, and keeps none.
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(current(), None, "a fresh thread has no current context");
            check(&zeros, &other);
        });
    });
}
