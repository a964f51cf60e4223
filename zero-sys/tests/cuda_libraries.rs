//! The CUDA libraries users install from PyPI, checked without a GPU:
//! - NCCL: every entry point zero calls resolves in each wheel CI installs (an old and the
//!   newest `nvidia-nccl-cu12`, and `nvidia-nccl-cu13`), and our `ncclConfig_t` (from the
//!   bindings of NCCL 2.28.9) agrees with each wheel's `nccl.h`: the same magic and the
//!   same offset for every field both have (NCCL copies `min(size, its sizeof)` of the
//!   struct and defaults the fields it did not get), and exactly the header's size and
//!   version for the bindings' own NCCL version.
//! - NVRTC: discovery by the driver's major version finds the wheel of that major and
//!   refuses the other, naming what it found.
//!
//! `.ci/run` installs the wheels under `target/cuda-pip` and sets `ZERO_NCCL_WHEELS` and
//! `ZERO_NVRTC_WHEELS` (folders separated by `:`); without them each test prints a visible
//! skip, and `ZERO_REQUIRE_CUDA_COMPILE=1` turns that skip into a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use zero_sys::nccl::{bindings as b, nonblocking_config, Nccl, CONFIG_MAGIC};
use zero_sys::nvrtc::{discover, NvrtcError};

fn folders(var: &str, test: &str) -> Option<Vec<PathBuf>> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(std::env::split_paths(&v).collect()),
        _ => {
            assert!(
                std::env::var_os("ZERO_REQUIRE_CUDA_COMPILE").is_none(),
                "ZERO_REQUIRE_CUDA_COMPILE is set but {var} is not"
            );
            println!("SKIPPED {test}: {var} is not set (.ci/run installs the wheels)");
            None
        }
    }
}

#[test]
fn every_nccl_entry_point_zero_calls_resolves_in_each_wheel() {
    let Some(wheels) = folders("ZERO_NCCL_WHEELS", "NCCL wheels") else {
        return;
    };
    for w in wheels {
        let lib = w.join("nvidia/nccl/lib/libnccl.so.2");
        let path = lib.display().to_string();
        let nccl = Nccl::load(&[path.as_str()], None).unwrap_or_else(|e| panic!("{e}"));
        let v = nccl.version().expect("ncclGetVersion");
        println!("NCCL {}.{}.{} from {path}", v.major, v.minor, v.patch);
        assert_eq!(nccl.missing_symbols(), Vec::<&str>::new(), "{path}");
    }
}

/// The field names of `ncclConfig_t` in the header's text.
fn config_fields(header: &str) -> Vec<String> {
    let start = header
        .find("typedef struct ncclConfig_v")
        .expect("ncclConfig_t in nccl.h");
    let body = &header[start..];
    let body = &body[body.find('{').expect("{") + 1..body.find("} ncclConfig_t;").expect("}")];
    let mut code = String::new();
    let mut rest = body;
    while let Some(open) = rest.find("/*") {
        code.push_str(&rest[..open]);
        rest = rest[open..]
            .find("*/")
            .map_or("", |close| &rest[open + close + 2..]);
    }
    code.push_str(rest);
    code.split(';')
        .filter_map(|decl| {
            let words: Vec<&str> = decl
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .collect();
            words.last().map(|w| w.to_string())
        })
        .collect()
}

/// What the header says: sizeof, the initializer's magic and version, NCCL_VERSION_CODE,
/// and each field's offset.
fn header_layout(include: &Path, dir: &Path) -> (Vec<u64>, Vec<(String, u64)>) {
    let header = std::fs::read_to_string(include.join("nccl.h")).expect("nccl.h");
    let fields = config_fields(&header);
    let stub = dir.join("stub");
    std::fs::create_dir_all(&stub).expect("stub dir");
    std::fs::write(
        stub.join("cuda_runtime.h"),
        "#include <stddef.h>\n#include <stdint.h>\ntypedef struct CUstream_st* cudaStream_t;\n\
         typedef struct CUevent_st* cudaEvent_t;\n",
    )
    .expect("stub");
    for h in ["cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h"] {
        std::fs::write(stub.join(h), "").expect("stub");
    }
    let offsets: String = fields
        .iter()
        .map(|f| format!("  printf(\" %zu\", offsetof(ncclConfig_t, {f}));\n"))
        .collect();
    let src = dir.join("layout.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <stddef.h>\n#include \"nccl.h\"\nint main(void) {{\n  \
             ncclConfig_t c = NCCL_CONFIG_INITIALIZER;\n  printf(\"%zu %u %u %d\", sizeof(ncclConfig_t), \
             c.magic, c.version, (int)NCCL_VERSION_CODE);\n{offsets}  printf(\"\\n\");\n  return 0;\n}}\n"
        ),
    )
    .expect("write");
    let exe = dir.join("layout");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-I")
        .arg(&stub)
        .arg("-I")
        .arg(include)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().expect("run layout");
    let numbers: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|x| x.parse().expect("a number"))
        .collect();
    let (head, offs) = numbers.split_at(4);
    (
        head.to_vec(),
        fields.into_iter().zip(offs.iter().copied()).collect(),
    )
}

#[test]
fn our_nccl_config_matches_each_wheels_header() {
    let Some(wheels) = folders("ZERO_NCCL_WHEELS", "ncclConfig_t") else {
        return;
    };
    let ours: Vec<(&str, u64)> = {
        use std::mem::offset_of;
        type C = b::ncclConfig_t;
        vec![
            ("size", offset_of!(C, size)),
            ("magic", offset_of!(C, magic)),
            ("version", offset_of!(C, version)),
            ("blocking", offset_of!(C, blocking)),
            ("cgaClusterSize", offset_of!(C, cgaClusterSize)),
            ("minCTAs", offset_of!(C, minCTAs)),
            ("maxCTAs", offset_of!(C, maxCTAs)),
            ("netName", offset_of!(C, netName)),
            ("splitShare", offset_of!(C, splitShare)),
            ("trafficClass", offset_of!(C, trafficClass)),
            ("commName", offset_of!(C, commName)),
            ("collnetEnable", offset_of!(C, collnetEnable)),
            ("CTAPolicy", offset_of!(C, CTAPolicy)),
            ("shrinkShare", offset_of!(C, shrinkShare)),
            ("nvlsCTAs", offset_of!(C, nvlsCTAs)),
            ("nChannelsPerNetPeer", offset_of!(C, nChannelsPerNetPeer)),
            ("nvlinkCentricSched", offset_of!(C, nvlinkCentricSched)),
        ]
        .into_iter()
        .map(|(n, o)| (n, o as u64))
        .collect()
    };
    let config = nonblocking_config();
    assert_eq!(config.magic, CONFIG_MAGIC);
    let mut exact = 0;
    for (i, w) in wheels.iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("zero-nccl-h-{}-{i}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (head, fields) = header_layout(&w.join("nvidia/nccl/include"), &dir);
        let _ = std::fs::remove_dir_all(&dir);
        let (size, magic, version, code) = (head[0], head[1], head[2], head[3]);
        println!(
            "{}: NCCL_VERSION_CODE {code}, sizeof(ncclConfig_t) {size} (ours {}), {} fields",
            w.display(),
            config.size,
            fields.len()
        );
        assert_eq!(magic, u64::from(CONFIG_MAGIC), "{}", w.display());
        // The leading fields, in order, are the same fields at the same offsets.
        let common = fields.len().min(ours.len());
        assert!(
            common >= 4,
            "{}: too few fields parsed: {fields:?}",
            w.display()
        );
        for ((name, off), (our_name, our_off)) in fields.iter().zip(&ours).take(common) {
            assert_eq!(
                (name.as_str(), *off),
                (*our_name, *our_off),
                "{}",
                w.display()
            );
        }
        if code == u64::from(b::NCCL_VERSION_CODE) {
            exact += 1;
            assert_eq!(
                config.size as u64, size,
                "size differs from the bindings' header"
            );
            assert_eq!(u64::from(config.version), version);
            assert_eq!(
                fields.len(),
                ours.len(),
                "fields differ from the bindings' header"
            );
        }
    }
    assert!(
        exact > 0,
        "no wheel of the bindings' NCCL version ({}) was checked",
        b::NCCL_VERSION_CODE
    );
}

#[test]
fn nvrtc_is_chosen_by_the_drivers_major_version() {
    let Some(wheels) = folders("ZERO_NVRTC_WHEELS", "NVRTC discovery") else {
        return;
    };
    for (driver, major) in [((13, 0), 13), ((12, 4), 12)] {
        let n = discover(None, Some(driver), None, &wheels).unwrap_or_else(|e| panic!("{e}"));
        println!(
            "driver {}.{}: NVRTC {}.{} from {}",
            driver.0,
            driver.1,
            n.version().0,
            n.version().1,
            n.opened_as()
        );
        assert_eq!(n.version().0, major);
        assert!(
            n.opened_as().starts_with('/'),
            "found in a wheel folder, not on the loader path"
        );
        // Opened by path, with no library path: the builtins were found beside it.
        let cubin = n
            .compile_cubin(
                "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }",
                "k.cu",
                "sm_80",
                &[],
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&cubin.image[..4], b"\x7fELF");
    }
    // Only a 13.x wheel, and a 12.x driver: refused, naming the driver and what was found.
    let only13: Vec<PathBuf> = wheels
        .iter()
        .filter(|w| w.join("nvidia/cu13/lib/libnvrtc.so.13").exists())
        .cloned()
        .collect();
    // Only a 12.x wheel and a 13.0 driver (PyTorch's cu12 wheels on a new driver): NVRTC
    // 12, whose cubins load on the newer driver. Both wheels and a sm_70 GPU: NVRTC 12 too.
    let only12: Vec<PathBuf> = wheels
        .iter()
        .filter(|w| w.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12").exists())
        .cloned()
        .collect();
    for (roots, cc) in [(&only12, None), (&wheels, Some((7, 0)))] {
        let n = discover(None, Some((13, 0)), cc, roots).unwrap_or_else(|e| panic!("{e}"));
        println!(
            "driver 13.0, GPU {cc:?}, {} folders: NVRTC {}.{} from {}",
            roots.len(),
            n.version().0,
            n.version().1,
            n.opened_as()
        );
        assert_eq!(n.version().0, 12, "{}", n.opened_as());
    }
    match discover(None, Some((12, 4)), None, &only13) {
        Err(e @ NvrtcError::NoMatch { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("CUDA 12.4") && msg.contains("NVRTC 13."),
                "{msg}"
            );
        }
        Ok(n) if !n.opened_as().starts_with('/') => {
            println!(
                "a libnvrtc.so.12 on the loader path answered: {}",
                n.opened_as()
            )
        }
        other => panic!("expected NoMatch, got {other:?}"),
    }
}
