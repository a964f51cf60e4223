//! Finding the NVRTC that fits the driver.
//!
//! Order: the override variable (`ZERO_NVRTC_LIB`, tried alone); else, for the driver's
//! major version (or, with no driver, 13 then 12), the pip wheels' folders under every
//! Python package directory we know of, then the soname on the loader's search path.

use super::{Nvrtc, NvrtcError};
use std::path::{Path, PathBuf};

/// Where each NVRTC wheel puts its library, under a Python package directory:
/// `nvidia-cuda-nvrtc` (13.x) and `nvidia-cuda-nvrtc-cu12` (12.x).
pub const WHEEL_LIB_DIRS: [(i32, &str); 2] =
    [(13, "nvidia/cu13/lib"), (12, "nvidia/cuda_nvrtc/lib")];

/// The Python package directories to look in for NVRTC wheels: `PYTHONPATH` entries, then
/// `site-packages`/`dist-packages` of the active virtual environment or conda prefix, of
/// every `…/bin` on `PATH`, of pyenv's versions, of `~/.local`, `/usr/local` and `/usr`.
pub fn wheel_roots() -> Vec<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(pp) = var("PYTHONPATH") {
        roots.extend(std::env::split_paths(&pp));
    }
    let mut prefixes: Vec<PathBuf> = Vec::new();
    prefixes.extend(var("VIRTUAL_ENV").map(PathBuf::from));
    prefixes.extend(var("CONDA_PREFIX").map(PathBuf::from));
    if let Some(path) = var("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.ends_with("bin") {
                prefixes.extend(dir.parent().map(Path::to_path_buf));
            }
        }
    }
    if let Some(home) = var("HOME").map(PathBuf::from) {
        let pyenv = var("PYENV_ROOT").map_or(home.join(".pyenv"), PathBuf::from);
        if let Ok(versions) = std::fs::read_dir(pyenv.join("versions")) {
            prefixes.extend(versions.flatten().map(|e| e.path()));
        }
        prefixes.push(home.join(".local"));
    }
    prefixes.extend([PathBuf::from("/usr/local"), PathBuf::from("/usr")]);
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("python3") {
                roots.push(e.path().join("site-packages"));
                roots.push(e.path().join("dist-packages"));
            }
        }
    }
    roots.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    let mut seen = std::collections::HashSet::new();
    roots.retain(|r| r.is_dir() && seen.insert(r.clone()));
    roots
}

/// NVRTC's builtins libraries in `dir` (`libnvrtc-builtins.so.13.0`; not the `.alt.`
/// variant).
pub(crate) fn builtins_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so.") && !n.contains(".alt."))
        })
        .collect();
    found.sort();
    found
}

/// The places to look for NVRTC of `major`: the wheel folders under `roots`, then the
/// soname for the loader's search path.
fn candidates(major: i32, roots: &[PathBuf]) -> Vec<String> {
    let file = format!("libnvrtc.so.{major}");
    let file = file.as_str();
    let mut out: Vec<String> = WHEEL_LIB_DIRS
        .iter()
        .filter(|(m, _)| *m == major)
        .flat_map(|(_, rel)| roots.iter().map(move |r| r.join(rel).join(file)))
        .filter(|p| p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    out.push(file.to_string());
    out
}

/// Opens the NVRTC for a driver of CUDA version `driver` (none: a machine that only
/// compiles), looking under the package directories `roots`; `override_path` (the
/// `ZERO_NVRTC_LIB` variable) is tried alone when given.
pub fn discover(
    override_path: Option<&str>,
    driver: Option<(i32, i32)>,
    roots: &[PathBuf],
) -> Result<Nvrtc, NvrtcError> {
    if let Some(path) = override_path {
        return Nvrtc::open(path);
    }
    let majors: Vec<i32> = match driver {
        Some((major, _)) => vec![major],
        None => vec![13, 12],
    };
    let mut tried = Vec::new();
    for &major in &majors {
        for c in candidates(major, roots) {
            match Nvrtc::open(&c) {
                Ok(n) if n.version().0 == major => return Ok(n),
                Ok(n) => tried.push(format!("{c} (NVRTC {}.{})", n.version().0, n.version().1)),
                Err(e) => tried.push(format!("{c} ({e})")),
            }
        }
    }
    let found: Vec<String> = [13, 12]
        .into_iter()
        .filter(|m| !majors.contains(m))
        .flat_map(|m| candidates(m, roots))
        .filter_map(|c| {
            Nvrtc::open(&c)
                .ok()
                .map(|n| format!("NVRTC {}.{} at {c}", n.version().0, n.version().1))
        })
        .collect();
    Err(NvrtcError::NoMatch {
        driver: driver.map_or("no CUDA".to_string(), |(a, b)| format!("CUDA {a}.{b}")),
        tried,
        found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_folders_come_before_the_soname_and_match_the_major() {
        let root = std::env::temp_dir().join(format!("zero-nvrtc-roots-{}", std::process::id()));
        let cu13 = root.join("a/nvidia/cu13/lib");
        let cu12 = root.join("b/nvidia/cuda_nvrtc/lib");
        std::fs::create_dir_all(&cu13).unwrap();
        std::fs::create_dir_all(&cu12).unwrap();
        std::fs::write(cu13.join("libnvrtc.so.13"), b"").unwrap();
        std::fs::write(cu12.join("libnvrtc.so.12"), b"").unwrap();
        std::fs::write(cu13.join("libnvrtc-builtins.so.13.0"), b"").unwrap();
        std::fs::write(cu13.join("libnvrtc-builtins.alt.so.13.0"), b"").unwrap();
        let roots = [root.join("a"), root.join("b"), root.join("missing")];
        let c13 = candidates(13, &roots);
        assert_eq!(
            c13,
            [
                cu13.join("libnvrtc.so.13").display().to_string(),
                "libnvrtc.so.13".into()
            ]
        );
        let c12 = candidates(12, &roots);
        assert_eq!(
            c12,
            [
                cu12.join("libnvrtc.so.12").display().to_string(),
                "libnvrtc.so.12".into()
            ]
        );
        assert_eq!(builtins_in(&cu13), [cu13.join("libnvrtc-builtins.so.13.0")]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn no_match_names_the_driver_and_what_was_tried() {
        let err = discover(None, Some((11, 8)), &[]).unwrap_err().to_string();
        assert!(
            err.contains("CUDA 11.8") && err.contains("libnvrtc.so.11"),
            "{err}"
        );
    }
}
