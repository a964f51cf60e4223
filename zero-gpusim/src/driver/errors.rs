//! How the stand-in reports what it finds.
//!
//! Two kinds of failure:
//! - a call refused at once (bad argument, a limit, something not implemented): the call
//!   returns its `CUresult`, and `cuGetErrorString` of that code on the same thread
//!   returns the detailed message ([`refuse`]);
//! - a **finding** of the checker (out-of-bounds, use after free, never-written memory, a
//!   race between streams, a host access to pinned memory during a copy): printed to
//!   stderr at once, kept in the process's list ([`take_findings`]), and made *sticky*
//!   like a real device fault: every later call fails with it until the list is taken
//!   ([`finding`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys::cudaError_enum as E;

/// A raw `CUresult`.
pub type CuResult = u32;

/// `CUDA_SUCCESS`.
pub const OK: CuResult = E::CUDA_SUCCESS as u32;

/// What kind of defect a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindingKind {
    /// Out of bounds, after free, never written, misaligned, double free.
    Memory,
    /// Two streams (or a stream and the host) touching the same bytes without ordering.
    Race,
    /// A kernel fault other than memory (a barrier that cannot complete, a bad op).
    Kernel,
}

impl FindingKind {
    /// The `CUresult` the finding makes calls return.
    pub fn code(self) -> CuResult {
        match self {
            FindingKind::Memory => E::CUDA_ERROR_ILLEGAL_ADDRESS as u32,
            FindingKind::Race => E::CUDA_ERROR_ILLEGAL_STATE as u32,
            FindingKind::Kernel => E::CUDA_ERROR_LAUNCH_FAILED as u32,
        }
    }

    fn label(self) -> &'static str {
        match self {
            FindingKind::Memory => "memory error",
            FindingKind::Race => "ordering error",
            FindingKind::Kernel => "kernel error",
        }
    }
}

/// One finding of the checker.
#[derive(Debug, Clone)]
pub struct Finding {
    /// Its kind.
    pub kind: FindingKind,
    /// The full message: call, allocation, offset, stream.
    pub message: String,
}

#[derive(Default)]
struct Findings {
    list: Vec<Finding>,
    /// The first finding not yet taken: every call fails with it.
    sticky: Option<Finding>,
}

fn findings() -> &'static Mutex<Findings> {
    static F: OnceLock<Mutex<Findings>> = OnceLock::new();
    F.get_or_init(Default::default)
}

thread_local! {
    /// The detailed message of the last refusal per code on this thread.
    static LAST: RefCell<HashMap<CuResult, String>> = RefCell::new(HashMap::new());
}

/// Refuses a call: `code`, with `message` as its text for this thread's next
/// `cuGetErrorString(code)`.
pub fn refuse(code: E, message: impl Into<String>) -> CuResult {
    let message = message.into();
    let c = code as u32;
    LAST.with(|l| l.borrow_mut().insert(c, message));
    c
}

/// Records a finding: printed to stderr, kept, and sticky. Returns its code.
pub fn finding(kind: FindingKind, message: impl Into<String>) -> CuResult {
    let message = format!("zero-gpusim {}: {}", kind.label(), message.into());
    eprintln!("{message}");
    let f = Finding { kind, message };
    let mut all = findings().lock().unwrap_or_else(|p| p.into_inner());
    if all.sticky.is_none() {
        all.sticky = Some(f.clone());
    }
    all.list.push(f);
    kind.code()
}

/// The sticky finding's code, if any: every API call but the error queries returns it.
pub fn sticky() -> Option<CuResult> {
    let all = findings().lock().unwrap_or_else(|p| p.into_inner());
    all.sticky.as_ref().map(|f| {
        let code = f.kind.code();
        LAST.with(|l| l.borrow_mut().insert(code, f.message.clone()));
        code
    })
}

/// Every finding so far, and clears them (the sticky one too).
pub fn take_findings() -> Vec<Finding> {
    let mut all = findings().lock().unwrap_or_else(|p| p.into_inner());
    all.sticky = None;
    std::mem::take(&mut all.list)
}

/// A `'static` C string holding `text` (interned: each distinct text is leaked once).
pub fn static_cstr(text: &str) -> *const c_char {
    static INTERNED: OnceLock<Mutex<HashMap<String, &'static CStr>>> = OnceLock::new();
    let mut map = INTERNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(s) = map.get(text) {
        return s.as_ptr();
    }
    let owned = CString::new(text.replace('\0', " ")).unwrap_or_default();
    let leaked: &'static CStr = Box::leak(owned.into_boxed_c_str());
    map.insert(text.to_string(), leaked);
    leaked.as_ptr()
}

/// The text `cuGetErrorString` gives for `code`: this thread's detailed message for it,
/// else the sticky finding's (if it has this code), else the driver's usual text.
pub fn describe(code: CuResult) -> String {
    if let Some(m) = LAST.with(|l| l.borrow().get(&code).cloned()) {
        return m;
    }
    let all = findings().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(f) = all.sticky.as_ref().filter(|f| f.kind.code() == code) {
        return f.message.clone();
    }
    drop(all);
    default_text(code).to_string()
}

/// `cuGetErrorName` of `code`.
pub fn name(code: CuResult) -> Option<&'static str> {
    Some(match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        200 => "CUDA_ERROR_INVALID_IMAGE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        209 => "CUDA_ERROR_NO_BINARY_FOR_GPU",
        218 => "CUDA_ERROR_INVALID_PTX",
        222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        401 => "CUDA_ERROR_ILLEGAL_STATE",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        701 => "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        716 => "CUDA_ERROR_MISALIGNED_ADDRESS",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => return None,
    })
}

fn default_text(code: CuResult) -> &'static str {
    match code {
        0 => "no error",
        1 => "invalid argument",
        2 => "out of memory",
        3 => "initialization error",
        100 => "no CUDA-capable device is detected",
        101 => "invalid device ordinal",
        200 => "device kernel image is invalid",
        201 => "invalid device context",
        209 => "no kernel image is available for execution on the device",
        222 => "the provided PTX was compiled with an unsupported toolchain.",
        400 => "invalid resource handle",
        401 => "the operation cannot be performed in the present state",
        500 => "named symbol not found",
        600 => "device not ready",
        700 => "an illegal memory access was encountered",
        716 => "misaligned address",
        719 => "unspecified launch failure",
        801 => "operation not supported",
        _ => "unknown error",
    }
}

/// Leaks reported at context destruction: (allocations, bytes), summed.
fn leaks() -> &'static Mutex<(usize, u64)> {
    static L: OnceLock<Mutex<(usize, u64)>> = OnceLock::new();
    L.get_or_init(Default::default)
}

/// Notes `count` allocations (`bytes`) left live when a context was destroyed.
pub fn note_leak(count: usize, bytes: u64) {
    let mut l = leaks().lock().unwrap_or_else(|p| p.into_inner());
    l.0 += count;
    l.1 += bytes;
}

/// Leaks reported so far, as (allocations, bytes).
pub fn leaked() -> (usize, u64) {
    *leaks().lock().unwrap_or_else(|p| p.into_inner())
}
