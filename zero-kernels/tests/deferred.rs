//! A driver error `cudarc` kept from a `Drop` (a free, an event record) is reported by the
//! next call as deferred, not as that call's own failure, and says where it most likely
//! came from: the last buffer free queued before it (issue 30, L3). Its own test binary:
//! the error it plants is the context's, shared by every thread of the process. Without a
//! GPU (or the stand-in) it prints a visible skip.

use zero_kernels::cuda::GpuError;
use zero_kernels::testing::gpu_or_skip;
use zero_sys::cudarc::driver::{sys::cudaError_enum, DriverError};

#[test]
fn a_deferred_error_names_the_last_free_before_it() {
    let Some(g) = gpu_or_skip("deferred errors") else {
        return;
    };
    let st = g.default_stream();
    let dropped = std::thread::Builder::new()
        .name("freeing-thread".into())
        .spawn(move || {
            let buf = st.upload(&[1.5f32; 37]).expect("upload");
            drop(buf);
        })
        .expect("thread")
        .join();
    assert!(dropped.is_ok(), "the freeing thread panicked");
    // What cudarc does with an error it cannot return from a Drop: keep it in the context.
    let st = g.default_stream();
    st.cuda()
        .context()
        .record_err::<()>(Err(DriverError(cudaError_enum::CUDA_ERROR_ILLEGAL_ADDRESS)));
    // The next call that touches a buffer finds it (here the upload's write).
    let e = st
        .upload(&[0.0f32; 4])
        .expect_err("the kept error is reported by the next call");
    let text = e.to_string();
    println!("{text}");
    assert!(matches!(e, GpuError::Deferred { .. }), "{text}");
    assert!(
        text.contains("ILLEGAL_ADDRESS")
            && text.contains("not caused by this call")
            && text.contains("f32 buffer of 37 elements")
            && text.contains("freeing-thread"),
        "{text}"
    );
}
