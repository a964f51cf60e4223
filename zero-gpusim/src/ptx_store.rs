//! The PTX behind each cubin NVRTC returned through the tap.
//!
//! The stand-in cannot run SASS; it interprets the PTX NVRTC wrote for the same program.
//! When the tap hands out a cubin it files that program's PTX under the SHA-256 of the
//! cubin's bytes, in memory and on disk (zero's kernel cache keeps cubins between
//! processes, so a later process may load a cubin it never compiled). A cubin that was
//! never filed is refused by `cuModuleLoadData` with an error saying so.
//!
//! The folder is `ZERO_GPUSIM_PTX_DIR`, else `$XDG_CACHE_HOME/zero-gpusim/ptx`, else
//! `$HOME/.cache/zero-gpusim/ptx`. Each file is a header line then the PTX text; files
//! are written to a temporary name and renamed.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// The PTX filed for a cubin.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The PTX text.
    pub ptx: String,
    /// The architecture it was compiled for (`sm_90`).
    pub arch: String,
    /// The NVRTC version that compiled it.
    pub nvrtc: (i32, i32),
    /// The NVRTC program's name.
    pub program: String,
}

const HEADER: &str = "zero-gpusim-ptx v1";

/// The hex SHA-256 of `bytes`.
pub fn key(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The store's folder, if one can be named.
pub fn dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("ZERO_GPUSIM_PTX_DIR") {
        return Some(PathBuf::from(d));
    }
    var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|b| b.join("zero-gpusim").join("ptx"))
}

fn memory() -> &'static Mutex<HashMap<String, Arc<Entry>>> {
    static M: OnceLock<Mutex<HashMap<String, Arc<Entry>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

/// Files `entry` as the PTX of `cubin`.
pub fn put(cubin: &[u8], entry: Entry) {
    let k = key(cubin);
    if let Some(d) = dir() {
        let text = format!(
            "{HEADER} arch={} nvrtc={}.{} program={}\n{}",
            entry.arch, entry.nvrtc.0, entry.nvrtc.1, entry.program, entry.ptx
        );
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&d)?;
            let tmp = d.join(format!("{k}.{}.tmp", std::process::id()));
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, d.join(format!("{k}.ptx")))
        };
        if let Err(e) = write() {
            eprintln!("zero-gpusim: could not file PTX in {}: {e}", d.display());
        }
    }
    memory()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(k, Arc::new(entry));
}

/// The PTX filed for `cubin`, from memory or disk.
pub fn get(cubin: &[u8]) -> Option<Arc<Entry>> {
    let k = key(cubin);
    if let Some(e) = memory().lock().unwrap_or_else(|p| p.into_inner()).get(&k) {
        return Some(e.clone());
    }
    let text = std::fs::read_to_string(dir()?.join(format!("{k}.ptx"))).ok()?;
    let (head, ptx) = text.split_once('\n')?;
    let fields = head.strip_prefix(HEADER)?;
    let field = |name: &str| {
        fields
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .unwrap_or("")
            .to_string()
    };
    let nvrtc = field("nvrtc");
    let (a, b) = nvrtc.split_once('.').unwrap_or(("0", "0"));
    let e = Arc::new(Entry {
        ptx: ptx.to_string(),
        arch: field("arch"),
        nvrtc: (a.parse().unwrap_or(0), b.parse().unwrap_or(0)),
        program: field("program"),
    });
    memory()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(k, e.clone());
    Some(e)
}
