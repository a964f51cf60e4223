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

/// The oldest NVRTC major version zero supports (CUDA 12.2 drivers and newer).
pub const OLDEST_MAJOR: i32 = 12;
/// The first major version that dropped GPUs below sm_75.
const MAJOR_WITHOUT_SM70: i32 = 13;

/// The NVRTC major versions to try, in order, for a driver of CUDA version `driver` and a
/// GPU of compute capability `cc`: the driver's major, then each older one down to
/// [`OLDEST_MAJOR`], never a newer one (its cubins would not load). A cubin of an older
/// major loads on a newer driver, so a CUDA 13 driver with only NVRTC 12 installed (the
/// usual PyTorch cu12 setup) works. Majors that cannot compile for `cc` are left out
/// (CUDA 13 compiles only for sm_75 and newer). With no driver (a machine that only
/// compiles), the newest first.
pub fn majors_to_try(driver: Option<(i32, i32)>, cc: Option<(i32, i32)>) -> Vec<i32> {
    let newest = driver.map_or(MAJOR_WITHOUT_SM70, |(major, _)| major);
    let mut majors: Vec<i32> = if newest < OLDEST_MAJOR {
        vec![newest]
    } else {
        (OLDEST_MAJOR..=newest).rev().collect()
    };
    if let Some((a, b)) = cc {
        if a * 10 + b < 75 {
            majors.retain(|&m| m < MAJOR_WITHOUT_SM70);
        }
    }
    majors
}

/// Opens the NVRTC for a driver of CUDA version `driver` (none: a machine that only
/// compiles) and a GPU of compute capability `cc` (none: any), trying the majors of
/// [`majors_to_try`] in order and, for each, the wheel folders under `roots`, then the
/// loader's path; `override_path` (the `ZERO_NVRTC_LIB` variable) is tried alone when
/// given.
pub fn discover(
    override_path: Option<&str>,
    driver: Option<(i32, i32)>,
    cc: Option<(i32, i32)>,
    roots: &[PathBuf],
) -> Result<Nvrtc, NvrtcError> {
    if let Some(path) = override_path {
        return Nvrtc::open(path);
    }
    let majors = majors_to_try(driver, cc);
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
    let found: Vec<String> = (OLDEST_MAJOR..=MAJOR_WITHOUT_SM70)
        .rev()
        .filter(|m| !majors.contains(m))
        .flat_map(|m| candidates(m, roots))
        .filter_map(|c| {
            Nvrtc::open(&c)
                .ok()
                .map(|n| format!("NVRTC {}.{} at {c}", n.version().0, n.version().1))
        })
        .collect();
    Err(NvrtcError::NoMatch {
        driver: match (driver, cc) {
            (None, _) => "no CUDA".to_string(),
            (Some((a, b)), None) => format!("CUDA {a}.{b}"),
            (Some((a, b)), Some((x, y))) => format!("CUDA {a}.{b} (a sm_{x}{y} GPU)"),
        },
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
    fn the_drivers_major_then_older_ones_and_never_a_newer_one() {
        assert_eq!(majors_to_try(Some((13, 0)), None), [13, 12]);
        assert_eq!(majors_to_try(Some((13, 0)), Some((9, 0))), [13, 12]);
        assert_eq!(majors_to_try(Some((12, 4)), None), [12]);
        assert_eq!(majors_to_try(Some((12, 4)), Some((8, 6))), [12]);
        assert_eq!(majors_to_try(Some((14, 1)), None), [14, 13, 12]);
        // No driver: a machine that only compiles takes the newest first.
        assert_eq!(majors_to_try(None, None), [13, 12]);
        // Below sm_75 CUDA 13 cannot compile: a 13.x driver with a V100 takes NVRTC 12.
        assert_eq!(majors_to_try(Some((13, 0)), Some((7, 0))), [12]);
        assert_eq!(majors_to_try(Some((13, 0)), Some((7, 5))), [13, 12]);
        // Older than supported: only its own (the error then names it).
        assert_eq!(majors_to_try(Some((11, 8)), None), [11]);
    }

    #[test]
    fn no_match_names_the_driver_and_what_was_tried() {
        let err = discover(None, Some((11, 8)), None, &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("CUDA 11.8") && err.contains("libnvrtc.so.11"),
            "{err}"
        );
    }
}
