//! Every CUDA kernel compiles with NVRTC for sm_80 and sm_90 and assembles with ptxas with
//! no register spills; registers per kernel are printed.
//!
//! Needs NVRTC (`ZERO_NVRTC_LIB` or on the library path) and ptxas (`ZERO_PTXAS` or on
//! `PATH`): `.ci/run` installs both from PyPI (CUDA 13.0) and sets
//! `ZERO_REQUIRE_CUDA_COMPILE=1`, which turns a missing compiler from a visible skip into a
//! failure. No GPU is needed.

use std::path::PathBuf;
use std::process::Command;
use zero_kernels::cuda::SOURCES;
use zero_sys::nvrtc::{compile_ptx, NvrtcError};

/// What ptxas reported for one entry point.
#[derive(Debug, Default)]
struct Resources {
    registers: u32,
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
}

fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ZERO_PTXAS") {
        return Some(PathBuf::from(p));
    }
    Command::new("ptxas")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("ptxas"))
}

fn number_before(line: &str, what: &str) -> Option<u32> {
    let end = line.find(what)?;
    line[..end].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v` output into per-function resources.
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

#[test]
fn every_kernel_compiles_for_sm80_and_sm90_without_spills() {
    let required = std::env::var_os("ZERO_REQUIRE_CUDA_COMPILE").is_some();
    let Some(ptxas) = ptxas() else {
        assert!(
            !required,
            "ZERO_REQUIRE_CUDA_COMPILE is set but ptxas was not found (set ZERO_PTXAS)"
        );
        println!(
            "SKIPPED: ptxas not found (set ZERO_PTXAS); the CUDA kernels were not compile-checked"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("zero-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut failures = Vec::new();
    for (arch, sm) in [("compute_80", "sm_80"), ("compute_90", "sm_90")] {
        for src in SOURCES {
            let ptx = match compile_ptx(&src.program(), src.name, arch, &[]) {
                Ok(p) => p,
                Err(NvrtcError::NotFound(e)) => {
                    assert!(
                        !required,
                        "ZERO_REQUIRE_CUDA_COMPILE is set but NVRTC is missing: {e}"
                    );
                    println!("SKIPPED: {e}; the CUDA kernels were not compile-checked");
                    return;
                }
                Err(e) => {
                    failures.push(format!("{e}"));
                    continue;
                }
            };
            let file = dir.join(format!("{}.{sm}.ptx", src.name));
            std::fs::write(&file, &ptx).expect("write ptx");
            let out = Command::new(&ptxas)
                .args(["-v", "--warn-on-spills", "-arch", sm, "-o"])
                .arg(dir.join(format!("{}.{sm}.cubin", src.name)))
                .arg(&file)
                .output()
                .expect("run ptxas");
            let log = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if !out.status.success() {
                failures.push(format!("ptxas {sm} {}: {log}", src.name));
                continue;
            }
            let found = parse(&log);
            for entry in src.entries {
                match found.iter().find(|(name, _)| name == entry) {
                    None => failures.push(format!(
                        "{sm} {}: no entry point `{entry}` in ptxas' report",
                        src.name
                    )),
                    Some((_, r)) => {
                        println!(
                            "{sm} {entry:<16} {:>3} registers, {:>3} bytes stack, {} / {} bytes spill stores / loads",
                            r.registers, r.stack, r.spill_stores, r.spill_loads
                        );
                        if r.spill_stores > 0 || r.spill_loads > 0 {
                            failures.push(format!("{sm} {entry}: spills ({r:?})"));
                        }
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
