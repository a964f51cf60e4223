//! `zero_gpusim_*`: what the stand-in's own tests ask it (not part of any NVIDIA API).

use crate::driver::config::settings;
use crate::driver::errors::{leaked, take_findings};
use crate::driver::memory::memory;
use crate::driver::traffic;
use std::ffi::{c_char, c_int, CString};

fn give(text: String) -> *mut c_char {
    CString::new(text.replace('\0', " "))
        .unwrap_or_default()
        .into_raw()
}

/// The findings so far, one per line (`kind<TAB>message`), and clears them (the sticky
/// one too). Free the string with [`zero_gpusim_free`].
#[no_mangle]
pub extern "C" fn zero_gpusim_take_findings() -> *mut c_char {
    let lines: Vec<String> = take_findings()
        .into_iter()
        .map(|f| format!("{:?}\t{}", f.kind, f.message.replace('\n', " ")))
        .collect();
    give(lines.join("\n"))
}

/// The kernel launches since the last call, one per line:
/// `kernel<TAB>grid<TAB>block<TAB>bytes read<TAB>bytes written<TAB>instructions<TAB>bytes
/// moved reading<TAB>bytes moved writing<TAB>distinct bytes read<TAB>distinct bytes
/// written` (moved: 32 per distinct sector per warp instruction).
#[no_mangle]
pub extern "C" fn zero_gpusim_take_traffic() -> *mut c_char {
    let lines: Vec<String> = traffic::take()
        .into_iter()
        .map(|l| {
            format!(
                "{}\t{:?}\t{:?}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                l.kernel,
                l.grid,
                l.block,
                l.read,
                l.written,
                l.instructions,
                l.read_moved,
                l.written_moved,
                l.read_distinct,
                l.written_distinct
            )
        })
        .collect();
    give(lines.join("\n"))
}

/// Allocations (and bytes) reported leaked at context destruction so far.
#[no_mangle]
pub extern "C" fn zero_gpusim_leaks(bytes: *mut u64) -> usize {
    let (n, b) = leaked();
    if !bytes.is_null() {
        // SAFETY: a non-null output the caller owns.
        unsafe { *bytes = b };
    }
    n
}

/// The most bytes live at once on visible device `ordinal` since the process started,
/// every allocation counted (the default pool's alone: `CU_MEMPOOL_ATTR_USED_MEM_HIGH`);
/// `u64::MAX` for a device that does not exist.
#[no_mangle]
pub extern "C" fn zero_gpusim_peak_bytes(ordinal: c_int) -> u64 {
    match settings() {
        Ok(c) if ordinal >= 0 && (ordinal as usize) < c.visible.len() => {
            memory().usage(ordinal as usize).peak
        }
        _ => u64::MAX,
    }
}

/// Frees a string this library returned.
#[no_mangle]
pub extern "C" fn zero_gpusim_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from CString::into_raw above, and is freed once.
        drop(unsafe { CString::from_raw(s) });
    }
}
