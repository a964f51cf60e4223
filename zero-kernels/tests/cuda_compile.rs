//! Every CUDA kernel compiles with NVRTC to a cubin — what `Gpu::open` loads — with no
//! register spills and no stack; registers per kernel are printed.
//!
//! Each result must be an ELF image for the CUDA machine (`EM_CUDA`) holding every entry
//! point, and ptxas' report (NVRTC's log with `--ptxas-options=-v`) must show no spill.
//! With `ZERO_NVRTC_LIBS` (paths separated by `:`), every one of those NVRTCs compiles for
//! sm_75, 80, 86, 89 and 90, plus sm_100 and sm_120 where it supports them (12.8+): `.ci/run`
//! installs NVRTC 12.2, 12.9, 13.0 and 13.5 from PyPI for it. Without it, the process's
//! NVRTC compiles for sm_80 and sm_90. `ZERO_REQUIRE_CUDA_COMPILE=1` turns a missing
//! compiler from a visible skip into a failure. No GPU is needed.

use zero_kernels::cuda::SOURCES;
use zero_sys::nvrtc::{Nvrtc, NvrtcError};

/// What ptxas reported for one entry point.
#[derive(Debug, Default)]
struct Resources {
    registers: u32,
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
}

fn number_before(line: &str, what: &str) -> Option<u32> {
    let end = line.find(what)?;
    line[..end].split_whitespace().last()?.parse().ok()
}

/// Parses ptxas' `-v` report into per-function resources.
fn parse(log: &str) -> Vec<(String, Resources)> {
    let mut out: Vec<(String, Resources)> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            out.push((rest.trim().to_string(), Resources::default()));
        } else if let Some((_, r)) = out.last_mut() {
            if let Some(n) = number_before(line, "bytes stack frame") {
                r.stack = n;
            }
            if let Some(n) = number_before(line, "bytes spill stores") {
                r.spill_stores = n;
            }
            if let Some(n) = number_before(line, "bytes spill loads") {
                r.spill_loads = n;
            }
            if let Some(n) = number_before(line, "registers") {
                r.registers = n;
            }
        }
    }
    out
}

/// `EM_CUDA` (ELF machine 190): what the driver's module loader takes as a cubin.
const EM_CUDA: u16 = 190;

/// Checks the ELF header: magic, 64-bit, little-endian, machine EM_CUDA.
fn elf_problem(image: &[u8]) -> Option<String> {
    if image.len() < 64 || &image[..4] != b"\x7fELF" {
        return Some("not an ELF image".into());
    }
    if image[4] != 2 || image[5] != 1 {
        return Some(format!(
            "ELF class {} / data {}, not 64-bit little-endian",
            image[4], image[5]
        ));
    }
    let machine = u16::from_le_bytes([image[18], image[19]]);
    (machine != EM_CUDA).then(|| format!("ELF machine {machine}, not EM_CUDA ({EM_CUDA})"))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The architectures `nvrtc` is checked for.
fn archs(nvrtc: (i32, i32), all: bool) -> Vec<&'static str> {
    if !all {
        return vec!["sm_80", "sm_90"];
    }
    let mut v = vec!["sm_75", "sm_80", "sm_86", "sm_89", "sm_90"];
    if nvrtc >= (12, 8) {
        v.extend(["sm_100", "sm_120"]);
    }
    v
}

/// Compiles every kernel with `nvrtc` for `archs`; the problems found.
fn check(nvrtc: &Nvrtc, archs: &[&str]) -> Vec<String> {
    let (major, minor) = nvrtc.version();
    let mut failures = Vec::new();
    for sm in archs {
        let mut worst = 0;
        for src in SOURCES {
            let cubin =
                match nvrtc.compile_cubin(&src.program(), src.name, sm, &["--ptxas-options=-v"]) {
                    Ok(c) => c,
                    Err(e) => {
                        failures.push(format!("NVRTC {major}.{minor} {sm}: {e}"));
                        continue;
                    }
                };
            if let Some(p) = elf_problem(&cubin.image) {
                failures.push(format!("NVRTC {major}.{minor} {sm} {}: {p}", src.name));
            }
            let found = parse(&cubin.log);
            for entry in src.entries {
                if !contains(&cubin.image, entry.as_bytes()) {
                    failures.push(format!(
                        "NVRTC {major}.{minor} {sm} {}: no `{entry}` in the cubin",
                        src.name
                    ));
                }
                match found.iter().find(|(name, _)| name == entry) {
                    None => failures.push(format!(
                        "NVRTC {major}.{minor} {sm} {}: no entry point `{entry}` in ptxas' report:\n{}",
                        src.name, cubin.log
                    )),
                    Some((_, r)) => {
                        worst = worst.max(r.registers);
                        if archs.len() == 2 {
                            println!(
                                "{sm} {entry:<16} {:>3} registers, {:>3} bytes stack, {} / {} bytes spill stores / loads",
                                r.registers, r.stack, r.spill_stores, r.spill_loads
                            );
                        }
                        if r.spill_stores > 0 || r.spill_loads > 0 || r.stack > 0 {
                            failures.push(format!("NVRTC {major}.{minor} {sm} {entry}: spills or stack ({r:?})"));
                        }
                    }
                }
            }
        }
        println!(
            "NVRTC {major}.{minor} ({}) {sm}: every kernel a cubin, at most {worst} registers",
            nvrtc.opened_as()
        );
    }
    failures
}

#[test]
fn every_kernel_compiles_to_a_cubin_without_spills() {
    let required = std::env::var_os("ZERO_REQUIRE_CUDA_COMPILE").is_some();
    let listed: Vec<String> = std::env::var("ZERO_NVRTC_LIBS")
        .map(|v| {
            v.split(':')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let failures: Vec<String> = if listed.is_empty() {
        let nvrtc = match Nvrtc::get() {
            Ok(n) => n,
            Err(NvrtcError::NotFound(e)) => {
                assert!(
                    !required,
                    "ZERO_REQUIRE_CUDA_COMPILE is set but NVRTC is missing: {e}"
                );
                println!("SKIPPED: {e}; the CUDA kernels were not compile-checked");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        check(nvrtc, &archs(nvrtc.version(), false))
    } else {
        // One thread per NVRTC: each is its own library, and NVRTC is thread-safe.
        std::thread::scope(|s| {
            let runs: Vec<_> = listed
                .iter()
                .map(|path| {
                    s.spawn(move || match Nvrtc::open(path) {
                        Ok(n) => check(&n, &archs(n.version(), true)),
                        Err(e) => vec![format!("{path}: {e}")],
                    })
                })
                .collect();
            runs.into_iter()
                .flat_map(|h| h.join().expect("compile thread"))
                .collect()
        })
    };
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_elf_check_refuses_what_is_not_a_cuda_cubin() {
    assert!(
        elf_problem(b".version 9.0\n.target sm_90\n").is_some(),
        "PTX is not a cubin"
    );
    let mut x86 = vec![0u8; 64];
    x86[..4].copy_from_slice(b"\x7fELF");
    x86[4] = 2;
    x86[5] = 1;
    x86[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    assert!(elf_problem(&x86).unwrap().contains("machine 62"));
    x86[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
    assert_eq!(elf_problem(&x86), None);
}
