//! Streams, events and host functions.

use super::cuda_device::current_device;
use super::{entry, no, put};
use crate::driver::errors::CuResult;
use crate::driver::event::{Event, Recorded};
use crate::driver::state::{ctx_handle, registry, untag, EVENT_TAG, STREAM_TAG};
use crate::driver::stream::wait_for;
use crate::driver::work::Work;
use cudarc::driver::sys::cudaError_enum as E;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const FOREVER: Duration = Duration::from_secs(u64::MAX / 4);

#[no_mangle]
unsafe extern "C" fn cuStreamCreate(out: *mut *mut c_void, flags: c_uint) -> CuResult {
    entry("cuStreamCreate", || {
        let dev = current_device("cuStreamCreate")?;
        if flags & !1 != 0 {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                "cuStreamCreate",
                format!("unknown flags {flags:#x}"),
            ));
        }
        let s = registry().new_stream(dev, flags & 1 != 0);
        // SAFETY: the caller passes a writable CUstream.
        unsafe {
            put(
                "cuStreamCreate",
                out,
                (STREAM_TAG | u64::from(s.agent)) as *mut c_void,
            )
        }
    })
}

#[no_mangle]
unsafe extern "C" fn cuStreamCreateWithPriority(
    out: *mut *mut c_void,
    flags: c_uint,
    _priority: c_int,
) -> CuResult {
    // SAFETY: same contract.
    unsafe { cuStreamCreate(out, flags) }
}

#[no_mangle]
extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> CuResult {
    entry("cuStreamDestroy", || {
        let mut reg = registry();
        let s = reg
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy", m))?;
        if s.legacy {
            return Err(no(
                E::CUDA_ERROR_INVALID_HANDLE,
                "cuStreamDestroy",
                "the legacy default stream cannot be destroyed",
            ));
        }
        s.destroyed.store(true, Ordering::Relaxed);
        // Its queued work still runs (as the driver does), then its thread ends.
        s.close();
        Ok(())
    })
}

#[no_mangle]
extern "C" fn cuStreamSynchronize(stream: *mut c_void) -> CuResult {
    entry("cuStreamSynchronize", || {
        let (s, tick, vc) = {
            let mut reg = registry();
            let s = reg
                .stream(stream as u64)
                .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuStreamSynchronize", m))?;
            let (t, vc) = reg.tail_of(&s);
            (s, t, vc)
        };
        wait_for(&s, tick, FOREVER);
        registry().host_vc.join(&vc);
        crate::driver::errors::sticky().map_or(Ok(()), Err)
    })
}

#[no_mangle]
extern "C" fn cuStreamQuery(stream: *mut c_void) -> CuResult {
    entry("cuStreamQuery", || {
        let mut reg = registry();
        let s = reg
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuStreamQuery", m))?;
        let (t, vc) = reg.tail_of(&s);
        if s.completed() >= t {
            reg.host_vc.join(&vc);
            Ok(())
        } else {
            Err(E::CUDA_ERROR_NOT_READY as u32)
        }
    })
}

fn event_of(name: &str, e: *mut c_void) -> Result<Arc<Event>, CuResult> {
    let reg = registry();
    untag(e as u64, EVENT_TAG)
        .and_then(|id| reg.events.get(&id).cloned())
        .ok_or_else(|| {
            no(
                E::CUDA_ERROR_INVALID_HANDLE,
                name,
                format!("{e:?} is not a live event of this driver (destroyed?)"),
            )
        })
}

#[no_mangle]
extern "C" fn cuStreamWaitEvent(
    stream: *mut c_void,
    event: *mut c_void,
    _flags: c_uint,
) -> CuResult {
    entry("cuStreamWaitEvent", || {
        let e = event_of("cuStreamWaitEvent", event)?;
        let rec = e.recorded().clone();
        let mut reg = registry();
        let s = reg
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent", m))?;
        // An event never recorded is complete: waiting for it does nothing (CUDA allows it).
        if let Some(r) = rec {
            let what = format!(
                "cuStreamWaitEvent for event {} recorded on {}",
                e.id,
                r.stream.name()
            );
            reg.enqueue(&s, Work::Marker, &what, Some(&r));
        }
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuStreamGetCtx(stream: *mut c_void, out: *mut *mut c_void) -> CuResult {
    entry("cuStreamGetCtx", || {
        let s = registry()
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuStreamGetCtx", m))?;
        // SAFETY: the caller passes a writable CUcontext.
        unsafe { put("cuStreamGetCtx", out, ctx_handle(s.device) as *mut c_void) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuStreamGetFlags(stream: *mut c_void, out: *mut c_uint) -> CuResult {
    entry("cuStreamGetFlags", || {
        let s = registry()
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuStreamGetFlags", m))?;
        // SAFETY: the caller passes a writable uint.
        unsafe { put("cuStreamGetFlags", out, c_uint::from(s.non_blocking)) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuStreamGetPriority(stream: *mut c_void, out: *mut c_int) -> CuResult {
    entry("cuStreamGetPriority", || {
        registry()
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuStreamGetPriority", m))?;
        // SAFETY: the caller passes a writable int.
        unsafe { put("cuStreamGetPriority", out, 0) }
    })
}

#[no_mangle]
extern "C" fn cuLaunchHostFunc(
    stream: *mut c_void,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
) -> CuResult {
    entry("cuLaunchHostFunc", || {
        let Some(f) = f else {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                "cuLaunchHostFunc",
                "the function is null",
            ));
        };
        let mut reg = registry();
        let s = reg
            .stream(stream as u64)
            .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, "cuLaunchHostFunc", m))?;
        reg.enqueue(
            &s,
            Work::HostFn {
                f,
                data: data as usize,
            },
            "cuLaunchHostFunc",
            None,
        );
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuEventCreate(out: *mut *mut c_void, flags: c_uint) -> CuResult {
    entry("cuEventCreate", || {
        let dev = current_device("cuEventCreate")?;
        if flags & !0xf != 0 {
            return Err(no(
                E::CUDA_ERROR_INVALID_VALUE,
                "cuEventCreate",
                format!("unknown flags {flags:#x}"),
            ));
        }
        let mut reg = registry();
        let id = reg.next_id();
        reg.events.insert(id, Arc::new(Event::new(id, flags, dev)));
        drop(reg);
        // SAFETY: the caller passes a writable CUevent.
        unsafe { put("cuEventCreate", out, (EVENT_TAG | id) as *mut c_void) }
    })
}

fn record(name: &str, event: *mut c_void, stream: *mut c_void) -> Result<(), CuResult> {
    let e = event_of(name, event)?;
    let mut reg = registry();
    let s = reg
        .stream(stream as u64)
        .map_err(|m| no(E::CUDA_ERROR_INVALID_HANDLE, name, m))?;
    if s.device != e.device {
        return Err(no(
            E::CUDA_ERROR_INVALID_HANDLE,
            name,
            format!(
                "event {} belongs to device {}, {} to device {}",
                e.id,
                e.device,
                s.name(),
                s.device
            ),
        ));
    }
    let what = format!("{name} of event {}", e.id);
    let tick = reg.enqueue(&s, Work::Marker, &what, None);
    let vc = Arc::new(reg.tail_of(&s).1);
    *e.recorded() = Some(Recorded {
        stream: s,
        tick,
        vc,
    });
    Ok(())
}

#[no_mangle]
extern "C" fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> CuResult {
    entry("cuEventRecord", || record("cuEventRecord", event, stream))
}

#[no_mangle]
extern "C" fn cuEventRecordWithFlags(
    event: *mut c_void,
    stream: *mut c_void,
    _flags: c_uint,
) -> CuResult {
    entry("cuEventRecordWithFlags", || {
        record("cuEventRecordWithFlags", event, stream)
    })
}

#[no_mangle]
extern "C" fn cuEventQuery(event: *mut c_void) -> CuResult {
    entry("cuEventQuery", || {
        let e = event_of("cuEventQuery", event)?;
        let rec = e.recorded().clone();
        match rec {
            None => Ok(()),
            Some(r) if r.stream.completed() >= r.tick => {
                registry().host_vc.join(&r.vc);
                Ok(())
            }
            Some(_) => Err(E::CUDA_ERROR_NOT_READY as u32),
        }
    })
}

#[no_mangle]
extern "C" fn cuEventSynchronize(event: *mut c_void) -> CuResult {
    entry("cuEventSynchronize", || {
        let e = event_of("cuEventSynchronize", event)?;
        let rec = e.recorded().clone();
        if let Some(r) = rec {
            wait_for(&r.stream, r.tick, FOREVER);
            registry().host_vc.join(&r.vc);
        }
        crate::driver::errors::sticky().map_or(Ok(()), Err)
    })
}

#[no_mangle]
extern "C" fn cuEventDestroy_v2(event: *mut c_void) -> CuResult {
    entry("cuEventDestroy", || {
        let e = event_of("cuEventDestroy", event)?;
        registry().events.remove(&e.id);
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CuResult {
    entry("cuEventElapsedTime", || {
        let (a, b) = (
            event_of("cuEventElapsedTime", start)?,
            event_of("cuEventElapsedTime", end)?,
        );
        if a.flags & 2 != 0 || b.flags & 2 != 0 {
            return Err(no(
                E::CUDA_ERROR_INVALID_HANDLE,
                "cuEventElapsedTime",
                "an event was created with CU_EVENT_DISABLE_TIMING",
            ));
        }
        if a.recorded().is_none() || b.recorded().is_none() {
            return Err(no(
                E::CUDA_ERROR_INVALID_HANDLE,
                "cuEventElapsedTime",
                "an event was never recorded",
            ));
        }
        if !a.complete() || !b.complete() {
            return Err(E::CUDA_ERROR_NOT_READY as u32);
        }
        // The stand-in measures no time.
        // SAFETY: the caller passes a writable float.
        unsafe { put("cuEventElapsedTime", ms, 0.0) }
    })
}

#[no_mangle]
unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CuResult {
    // SAFETY: same contract.
    unsafe { cuEventElapsedTime(ms, start, end) }
}
