//! Run-time loading of shared libraries with clear errors.

use std::path::PathBuf;

/// A shared library could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// None of the candidate names or paths could be opened.
    #[error("could not load {library}: tried {}{}", tried.join(", "), env_hint(env_override))]
    NotFound {
        /// Human name of the library (for example `NCCL`).
        library: String,
        /// Every name or path tried, each with the loader's reason.
        tried: Vec<String>,
        /// The environment variable that overrides the search, if any.
        env_override: Option<String>,
    },
    /// The override names one library, and `cudarc`, which opens the CUDA driver by its
    /// usual names, would call another one.
    #[error(
        "{env_override}={wanted}, but cudarc opens the CUDA driver by its usual names and \
         finds {other} first, a different library: the override would be silently ignored. \
         Remove {other}'s folder from LD_LIBRARY_PATH (a CUDA toolkit's stubs folder is a \
         common cause), or unset {env_override}"
    )]
    Shadowed {
        /// The override variable.
        env_override: String,
        /// The library it names.
        wanted: String,
        /// The file `cudarc` opens instead.
        other: String,
    },
    /// The override names a library `cudarc` cannot reach: none of its names resolves.
    #[error(
        "{env_override}={wanted} loads, but cudarc opens the CUDA driver only by the names \
         {}, and none of them resolves (a driver library has the soname libcuda.so.1; \
         put its folder on LD_LIBRARY_PATH)",
        names.join(", ")
    )]
    Unreachable {
        /// The override variable.
        env_override: String,
        /// The library it names.
        wanted: String,
        /// The names `cudarc` tries.
        names: Vec<String>,
    },
}

fn env_hint(var: &Option<String>) -> String {
    match var {
        Some(v) => format!(" (set {v} to the library's full path to override)"),
        None => String::new(),
    }
}

/// An opened shared library. Symbols are resolved by the `*-sys` bindings built on it.
#[derive(Debug)]
pub struct LoadedLibrary {
    /// The name or path that was opened.
    pub opened_as: String,
    /// The library handle; it stays open as long as this value lives.
    pub handle: libloading::Library,
}

/// Opens the first library that loads from `env_override` (if that variable is set, it is
/// tried first and alone) or else from `candidates`, in order.
///
/// `library` is the human name used in the error, for example `"NCCL"`.
pub fn load_library(
    library: &str,
    candidates: &[&str],
    env_override: Option<&str>,
) -> Result<LoadedLibrary, LoadError> {
    let mut names: Vec<String> = Vec::new();
    if let Some(var) = env_override {
        if let Some(path) = std::env::var_os(var) {
            names.push(PathBuf::from(path).display().to_string());
        }
    }
    if names.is_empty() {
        names.extend(candidates.iter().map(|c| c.to_string()));
    }
    let mut tried = Vec::with_capacity(names.len());
    for name in names {
        // SAFETY: opening a library runs its initialisers. We only open the vendor
        // libraries named by our callers (libcuda, libnvrtc, libnccl) or the path the user
        // set in the override variable, whose initialisers have no preconditions.
        match unsafe { libloading::Library::new(&name) } {
            Ok(handle) => {
                return Ok(LoadedLibrary {
                    opened_as: name,
                    handle,
                })
            }
            Err(e) => tried.push(format!("{name} ({e})")),
        }
    }
    Err(LoadError::NotFound {
        library: library.to_string(),
        tried,
        env_override: env_override.map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_an_error_naming_it_and_the_places_tried() {
        let err = load_library(
            "Nonexistent",
            &["libzero_definitely_missing.so.9", "libzero_missing_too.so"],
            Some("ZERO_TEST_UNSET_VARIABLE"),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("Nonexistent"), "{msg}");
        assert!(msg.contains("libzero_definitely_missing.so.9"), "{msg}");
        assert!(msg.contains("libzero_missing_too.so"), "{msg}");
        assert!(msg.contains("ZERO_TEST_UNSET_VARIABLE"), "{msg}");
    }

    #[test]
    fn a_present_library_loads() {
        // libc is on every Linux machine this project supports.
        let lib = load_library("libc", &["libzero_missing.so", "libc.so.6"], None)
            .expect("libc.so.6 should load");
        assert_eq!(lib.opened_as, "libc.so.6");
    }
}
