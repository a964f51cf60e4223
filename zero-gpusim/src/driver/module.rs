//! Modules and functions: a cubin is found by its hash in the PTX store and its PTX parsed
//! (once per image); PTX text is parsed as it comes. The architecture and PTX version are
//! checked as a CUDA 13.0 driver on an sm_90 GPU checks them.

use super::config::ARCH;
use crate::ptx;
use crate::ptx_store;
use cudarc::driver::sys::cudaError_enum as E;
use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, OnceLock};

/// A loaded module.
pub struct LoadedModule {
    /// Its number.
    pub id: u64,
    /// Its device.
    pub device: usize,
    /// The parsed PTX.
    pub ptx: Arc<ptx::Module>,
    /// Where it came from, for messages.
    pub origin: String,
}

/// A kernel of a loaded module.
pub struct Function {
    /// Its number.
    pub id: u64,
    /// Its module.
    pub module: Arc<LoadedModule>,
    /// The entry's name.
    pub name: String,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` (default 48 KiB less static).
    pub max_dynamic_shared: AtomicU32,
}

impl Function {
    /// Its kernel.
    pub fn kernel(&self) -> Option<&ptx::Kernel> {
        self.module.ptx.kernel(&self.name)
    }
}

/// The highest PTX ISA version a CUDA 13.0 driver JIT-compiles.
const MAX_PTX: (u32, u32) = (9, 0);

/// Bytes an ELF64 image spans, from its headers; `None` if the headers are not sane.
///
/// # Safety
/// `image` points to a readable ELF64 image whose headers and section table are complete.
unsafe fn elf_len(image: *const u8) -> Option<usize> {
    let rd = |off: usize, n: usize| -> u64 {
        let mut v = 0u64;
        for i in 0..n {
            // SAFETY: the caller guarantees the headers are readable.
            v |= u64::from(unsafe { *image.add(off + i) }) << (8 * i);
        }
        v
    };
    if rd(4, 1) != 2 {
        return None; // not ELF64
    }
    let shoff = rd(0x28, 8) as usize;
    let shentsize = rd(0x3a, 2) as usize;
    let shnum = rd(0x3c, 2) as usize;
    let phoff = rd(0x20, 8) as usize;
    let phentsize = rd(0x36, 2) as usize;
    let phnum = rd(0x38, 2) as usize;
    if shentsize < 64 || shnum > 65_000 || shoff > (1 << 32) {
        return None;
    }
    let mut end = (shoff + shentsize * shnum).max(phoff + phentsize * phnum);
    for i in 0..shnum {
        let h = shoff + i * shentsize;
        let kind = rd(h + 4, 4);
        let off = rd(h + 0x18, 8) as usize;
        let size = rd(h + 0x20, 8) as usize;
        if kind != 8 && off.checked_add(size)? < (1 << 32) {
            end = end.max(off + size);
        }
    }
    Some(end)
}

fn parsed(key: &str, text: &str) -> Result<Arc<ptx::Module>, (E, String)> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<ptx::Module>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(m) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
        return Ok(m.clone());
    }
    let m = Arc::new(ptx::Module::parse(text).map_err(|e| {
        (
            E::CUDA_ERROR_INVALID_PTX,
            format!("zero-gpusim cannot interpret this module's PTX: {e}"),
        )
    })?);
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key.to_string(), m.clone());
    Ok(m)
}

/// The sm number of an architecture name (`sm_90` → 90, `sm_90a` → 90).
fn sm_number(arch: &str) -> Option<u32> {
    let digits: String = arch
        .trim_start_matches("sm_")
        .trim_start_matches("compute_")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Loads the image at `image` (`cuModuleLoadData`): a cubin the tap filed, or PTX text.
///
/// # Safety
/// `image` points to a complete cubin or a NUL-terminated PTX text, as the driver API
/// requires.
pub unsafe fn load(image: *const u8) -> Result<(Arc<ptx::Module>, String), (E, String)> {
    if image.is_null() {
        return Err((
            E::CUDA_ERROR_INVALID_VALUE,
            "cuModuleLoadData: the image is null".into(),
        ));
    }
    // SAFETY: at least the first four bytes of any image are readable.
    let magic = unsafe { std::slice::from_raw_parts(image, 4) };
    if magic == b"\x7fELF" {
        // SAFETY: an ELF image: its headers are readable (the caller's contract).
        let len = unsafe { elf_len(image) }.ok_or_else(|| {
            (
                E::CUDA_ERROR_INVALID_IMAGE,
                "cuModuleLoadData: not an ELF64 cubin".to_string(),
            )
        })?;
        // SAFETY: the image spans `len` bytes (its own headers say so).
        let bytes = unsafe { std::slice::from_raw_parts(image, len) };
        let key = ptx_store::key(bytes);
        let Some(entry) = ptx_store::get(bytes) else {
            return Err((
                E::CUDA_ERROR_INVALID_IMAGE,
                format!(
                    "zero-gpusim never saw this cubin ({len} bytes, SHA-256 {key}) come out of \
                     its NVRTC tap, so it has no PTX to run: compile through the tap \
                     (ZERO_NVRTC_LIB=<the stand-in>), or the cubin came from elsewhere (a \
                     kernel cache of another machine or NVRTC, or ZERO_GPUSIM_PTX_DIR changed)"
                ),
            ));
        };
        let want = sm_number(ARCH);
        if sm_number(&entry.arch) != want {
            return Err((
                E::CUDA_ERROR_NO_BINARY_FOR_GPU,
                format!(
                    "this cubin is for {} (program {}, NVRTC {}.{}) and this GPU is {ARCH}: a \
                     cubin runs only on its own architecture",
                    entry.arch, entry.program, entry.nvrtc.0, entry.nvrtc.1
                ),
            ));
        }
        let m = parsed(&key, &entry.ptx)?;
        return Ok((
            m,
            format!(
                "cubin {} of {} (NVRTC {}.{})",
                &key[..12],
                entry.program,
                entry.nvrtc.0,
                entry.nvrtc.1
            ),
        ));
    }
    if magic == [0x50, 0xed, 0x55, 0xba] {
        return Err((
            E::CUDA_ERROR_NOT_SUPPORTED,
            "cuModuleLoadData: fat binaries are not implemented by zero-gpusim (load a cubin or PTX)".into(),
        ));
    }
    // SAFETY: not ELF nor fatbin: PTX text, NUL-terminated (the caller's contract).
    let text = unsafe { std::ffi::CStr::from_ptr(image.cast()) }.to_string_lossy();
    let m = parsed(&ptx_store::key(text.as_bytes()), &text)?;
    if m.version() > MAX_PTX {
        return Err((
            E::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
            format!(
                "PTX ISA {}.{} is newer than this CUDA 13.0 driver's {}.{}: the NVRTC that wrote \
                 it is newer than the driver (load a cubin instead)",
                m.version().0,
                m.version().1,
                MAX_PTX.0,
                MAX_PTX.1
            ),
        ));
    }
    if sm_number(m.target()).is_none_or(|t| t > 90) {
        return Err((
            E::CUDA_ERROR_NO_BINARY_FOR_GPU,
            format!("PTX for {} cannot run on this {ARCH} GPU", m.target()),
        ));
    }
    Ok((m, "PTX text".to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn architecture_numbers() {
        assert_eq!(super::sm_number("sm_90"), Some(90));
        assert_eq!(super::sm_number("sm_90a"), Some(90));
        assert_eq!(super::sm_number("compute_80"), Some(80));
        assert_eq!(super::sm_number("x"), None);
    }
}
