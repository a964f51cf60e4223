//! Compiled kernels, cached per process and on disk.
//!
//! A kernel file compiles once per process (an in-memory map) and once per machine: the
//! cubin is written under the cache directory with a name keyed by the program text's
//! hash (with the compile flags), the output kind, the real architecture, the NVRTC
//! version and the driver version, so a changed source, another GPU, another NVRTC or
//! another driver never reads a stale entry. Each file starts with a line holding the hash
//! of the image after it; a file that does not match (a torn or edited write) is
//! recompiled and replaced. Files are written to a temporary name and renamed, so a reader never sees a
//! partial file. A cache that cannot be read or written only costs a compile: it is never
//! an error.
//!
//! The directory is `ZERO_KERNEL_CACHE` if set (`off` disables the disk cache), else
//! `$XDG_CACHE_HOME/zero/kernels`, else `$HOME/.cache/zero/kernels`.

use super::sources::KernelSource;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use zero_sys::nvrtc::{compile_cubin, NvrtcError};

/// Bumped whenever the file format or the compile options change.
const FORMAT: &str = "zero-cubin-v1";
/// The header line's prefix.
const HEADER: &str = "zero-kernel-cache ";

/// Where a compiled program came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOrigin {
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

/// What a cached program was compiled for and by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheKey<'a> {
    /// The real architecture, for example `sm_90`.
    pub sm: &'a str,
    /// NVRTC's version.
    pub nvrtc: (i32, i32),
    /// The driver's CUDA version, where a driver is present.
    pub driver: Option<(i32, i32)>,
}

/// The file name of `src` compiled as `key` says.
pub fn cache_file_name(src: &KernelSource, key: &CacheKey<'_>) -> String {
    let program = src.program();
    let flags = zero_sys::nvrtc::COMPILE_FLAGS.join(" ");
    let hash = fnv1a(&[FORMAT.as_bytes(), flags.as_bytes(), program.as_bytes()]);
    let stem = src.name.trim_end_matches(".cu");
    let driver = key
        .driver
        .map_or("none".to_string(), |(a, b)| format!("{a}.{b}"));
    format!(
        "{stem}-{}-nvrtc{}.{}-driver{driver}-{hash:016x}.cubin",
        key.sm, key.nvrtc.0, key.nvrtc.1
    )
}

fn read_entry(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    let nl = bytes.iter().position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&bytes[..nl]).ok()?;
    let image = &bytes[nl + 1..];
    let want = header.strip_prefix(HEADER)?;
    (want == format!("{:016x}", fnv1a(&[image]))).then(|| image.to_vec())
}

fn write_entry(dir: &Path, name: &str, image: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let mut bytes = format!("{HEADER}{:016x}\n", fnv1a(&[image])).into_bytes();
    bytes.extend_from_slice(image);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

type MemoryCache = Mutex<HashMap<String, Arc<[u8]>>>;
static MEMORY: OnceLock<MemoryCache> = OnceLock::new();

/// The cubin of `src` for `key.sm`, from this process's cache, the disk cache in `dir`, or
/// NVRTC, in that order. `key.nvrtc` must be the loaded NVRTC's version.
pub fn compiled_cubin(
    src: &KernelSource,
    key: &CacheKey<'_>,
    dir: Option<&Path>,
) -> Result<(Arc<[u8]>, CacheOrigin), NvrtcError> {
    let name = cache_file_name(src, key);
    let memory = MEMORY.get_or_init(Default::default);
    let mem_key = format!(
        "{}/{name}",
        dir.map(Path::display)
            .map_or(String::new(), |d| d.to_string())
    );
    if let Some(image) = memory.lock().ok().and_then(|m| m.get(&mem_key).cloned()) {
        return Ok((image, CacheOrigin::Memory));
    }
    let (image, origin) = match dir.and_then(|d| read_entry(&d.join(&name))) {
        Some(image) => (image, CacheOrigin::Disk),
        None => {
            let image = compile_cubin(&src.program(), src.name, key.sm, &[])?.image;
            if let Some(d) = dir {
                // A cache we cannot write only costs a compile next time.
                let _ = write_entry(d, &name, &image);
            }
            (image, CacheOrigin::Compiled)
        }
    };
    let image: Arc<[u8]> = image.into();
    if let Ok(mut m) = memory.lock() {
        m.insert(mem_key, image.clone());
    }
    Ok((image, origin))
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
    fn the_file_name_changes_with_source_arch_nvrtc_and_driver() {
        let a = KernelSource {
            name: "x.cu",
            body: "extern \"C\" __global__ void k() {}",
            entries: &["k"],
        };
        let b = KernelSource {
            body: "extern \"C\" __global__ void k() { }",
            ..a
        };
        let key = CacheKey {
            sm: "sm_90",
            nvrtc: (13, 0),
            driver: Some((13, 0)),
        };
        let base = cache_file_name(&a, &key);
        assert!(base.starts_with("x-sm_90-nvrtc13.0-driver13.0-"), "{base}");
        assert!(base.ends_with(".cubin"), "{base}");
        assert_eq!(base, cache_file_name(&a, &key));
        assert_ne!(base, cache_file_name(&b, &key));
        for other in [
            CacheKey { sm: "sm_80", ..key },
            CacheKey {
                nvrtc: (12, 8),
                ..key
            },
            CacheKey {
                driver: Some((13, 2)),
                ..key
            },
            CacheKey {
                driver: None,
                ..key
            },
        ] {
            assert_ne!(base, cache_file_name(&a, &other), "{other:?}");
        }
    }

    #[test]
    fn a_damaged_entry_is_not_read() {
        let dir = std::env::temp_dir().join(format!("zero-cache-unit-{}", std::process::id()));
        let image: &[u8] = b"\x7fELF\x02\x01\x01A\n\x00sm_90 code";
        write_entry(&dir, "e.cubin", image).expect("write");
        assert_eq!(read_entry(&dir.join("e.cubin")).as_deref(), Some(image));
        let path = dir.join("e.cubin");
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).expect("edit");
        assert_eq!(read_entry(&path), None);
        std::fs::write(&path, "").expect("truncate");
        assert_eq!(read_entry(&path), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
