//! Compiled kernels, cached per process and on disk.
//!
//! A kernel file compiles once per process (an in-memory map) and once per machine: the
//! PTX is written under the cache directory with a name keyed by the program text's hash,
//! the architecture and the NVRTC version, so a changed source, another GPU or another
//! NVRTC never reads a stale entry. Each file starts with a line holding the hash of the
//! PTX after it; a file that does not match (a torn or edited write) is recompiled and
//! replaced. Files are written to a temporary name and renamed, so a reader never sees a
//! partial file. A cache that cannot be read or written only costs a compile: it is never
//! an error.
//!
//! The directory is `ZERO_KERNEL_CACHE` if set (`off` disables the disk cache), else
//! `$XDG_CACHE_HOME/zero/kernels`, else `$HOME/.cache/zero/kernels`.

use super::KernelSource;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use zero_sys::nvrtc::{compile_ptx, NvrtcError};

/// Bumped whenever the file format or the compile options change.
const FORMAT: &str = "zero-ptx-v1";

/// Where a compiled program came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtxOrigin {
    /// Compiled by NVRTC in this call.
    Compiled,
    /// Read from the disk cache.
    Disk,
    /// Already compiled in this process.
    Memory,
}

/// 64-bit FNV-1a: a stable hash (std's hasher may change between Rust releases).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate the parts, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cache directory, or `None` when the disk cache is off or no home is known.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("ZERO_KERNEL_CACHE") {
        Some(v) if v == "off" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("zero").join("kernels")),
    }
}

/// The file name of `src` compiled for `arch` by NVRTC `nvrtc`.
pub fn cache_file_name(src: &KernelSource, arch: &str, nvrtc: (i32, i32)) -> String {
    let program = src.program();
    let hash = fnv1a(&[
        FORMAT.as_bytes(),
        zero_sys::nvrtc::COMPILE_FLAGS.as_bytes(),
        program.as_bytes(),
    ]);
    let stem = src.name.trim_end_matches(".cu");
    format!("{stem}-{arch}-nvrtc{}.{}-{hash:016x}.ptx", nvrtc.0, nvrtc.1)
}

fn read_entry(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let (header, ptx) = text.split_once('\n')?;
    let want = header.strip_prefix("// zero-ptx-cache ")?;
    (want == format!("{:016x}", fnv1a(&[ptx.as_bytes()]))).then(|| ptx.to_string())
}

fn write_entry(dir: &Path, name: &str, ptx: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let text = format!("// zero-ptx-cache {:016x}\n{ptx}", fnv1a(&[ptx.as_bytes()]));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

type MemoryCache = Mutex<HashMap<String, Arc<str>>>;
static MEMORY: OnceLock<MemoryCache> = OnceLock::new();

/// The PTX of `src` for `arch` (for example `compute_90`), from this process's cache, the
/// disk cache in `dir`, or NVRTC, in that order.
pub fn compiled_ptx(
    src: &KernelSource,
    arch: &'static str,
    dir: Option<&Path>,
) -> Result<(Arc<str>, PtxOrigin), NvrtcError> {
    let name = cache_file_name(src, arch, zero_sys::nvrtc::version()?);
    let memory = MEMORY.get_or_init(Default::default);
    let key = format!(
        "{}/{name}",
        dir.map(Path::display)
            .map_or(String::new(), |d| d.to_string())
    );
    if let Some(ptx) = memory.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok((ptx, PtxOrigin::Memory));
    }
    let (ptx, origin) = match dir.and_then(|d| read_entry(&d.join(&name))) {
        Some(ptx) => (ptx, PtxOrigin::Disk),
        None => {
            let ptx = compile_ptx(&src.program(), src.name, arch, &[])?;
            if let Some(d) = dir {
                // A cache we cannot write only costs a compile next time.
                let _ = write_entry(d, &name, &ptx);
            }
            (ptx, PtxOrigin::Compiled)
        }
    };
    let ptx: Arc<str> = ptx.into();
    if let Ok(mut m) = memory.lock() {
        m.insert(key, ptx.clone());
    }
    Ok((ptx, origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_stable_and_separates_parts() {
        // Published FNV-1a test vector for "a" (before our part separator).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        h ^= u64::from(b'a');
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        assert_eq!(h, 0xaf63_dc4c_8601_ec8c);
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }

    #[test]
    fn the_file_name_changes_with_source_arch_and_nvrtc() {
        let a = KernelSource {
            name: "x.cu",
            body: "extern \"C\" __global__ void k() {}",
            entries: &["k"],
        };
        let b = KernelSource {
            body: "extern \"C\" __global__ void k() { }",
            ..a
        };
        let base = cache_file_name(&a, "compute_90", (13, 0));
        assert!(base.starts_with("x-compute_90-nvrtc13.0-"), "{base}");
        assert_eq!(base, cache_file_name(&a, "compute_90", (13, 0)));
        assert_ne!(base, cache_file_name(&b, "compute_90", (13, 0)));
        assert_ne!(base, cache_file_name(&a, "compute_80", (13, 0)));
        assert_ne!(base, cache_file_name(&a, "compute_90", (12, 8)));
    }

    #[test]
    fn a_damaged_entry_is_not_read() {
        let dir = std::env::temp_dir().join(format!("zero-cache-unit-{}", std::process::id()));
        write_entry(&dir, "e.ptx", ".version 9.0\n.target sm_90\n").expect("write");
        assert_eq!(
            read_entry(&dir.join("e.ptx")).as_deref(),
            Some(".version 9.0\n.target sm_90\n")
        );
        let path = dir.join("e.ptx");
        let text = std::fs::read_to_string(&path).expect("read");
        std::fs::write(&path, text.replace("sm_90", "sm_80")).expect("edit");
        assert_eq!(read_entry(&path), None);
        std::fs::write(&path, "").expect("truncate");
        assert_eq!(read_entry(&path), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
