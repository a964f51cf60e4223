//! Whether the loaded NVRTC can build kernels this driver and GPU run.
//!
//! The kernels are compiled to cubins for the device's exact architecture. A cubin loads
//! on any driver of the NVRTC's major version or newer (cubins cross minor versions, not
//! major ones), so NVRTC 13.5 works on a CUDA 13.0 driver but NVRTC 13 on a CUDA 12
//! driver does not; and CUDA 13 dropped every architecture below sm_75.

/// `Ok` where NVRTC `nvrtc` can compile for compute capability `cc` and its cubins load on
/// a driver of CUDA version `driver`; otherwise the reason, naming both versions.
pub fn check_toolchain(
    driver: (i32, i32),
    nvrtc: (i32, i32),
    cc: (i32, i32),
) -> Result<(), String> {
    if nvrtc.0 > driver.0 {
        return Err(format!(
            "NVRTC {}.{} is newer than the driver (CUDA {}.{}): its cubins need a CUDA {}.x \
             driver. Use the NVRTC of the driver's major version (for a 12.x driver: pip \
             install nvidia-cuda-nvrtc-cu12, then ZERO_NVRTC_LIB=<its nvidia/cuda_nvrtc/lib/\
             libnvrtc.so.12>) or update the driver",
            nvrtc.0, nvrtc.1, driver.0, driver.1, nvrtc.0
        ));
    }
    let sm = cc.0 * 10 + cc.1;
    if nvrtc.0 >= 13 && sm < 75 {
        return Err(format!(
            "this GPU is sm_{}{}, and NVRTC {}.{} (CUDA 13) compiles only for sm_75 and newer: \
             GPUs below sm_75 need NVRTC 12 (pip install nvidia-cuda-nvrtc-cu12, then \
             ZERO_NVRTC_LIB=<its libnvrtc.so.12>) and a 12.x driver",
            cc.0, cc.1, nvrtc.0, nvrtc.1
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_toolchain;

    #[test]
    fn newer_minor_versions_and_older_majors_are_fine() {
        assert_eq!(check_toolchain((13, 0), (13, 0), (9, 0)), Ok(()));
        assert_eq!(check_toolchain((13, 0), (13, 5), (9, 0)), Ok(()));
        assert_eq!(check_toolchain((13, 0), (12, 9), (8, 0)), Ok(()));
        assert_eq!(check_toolchain((12, 2), (12, 9), (7, 0)), Ok(()));
    }

    #[test]
    fn an_nvrtc_of_a_newer_major_names_both_versions() {
        let e = check_toolchain((12, 4), (13, 0), (9, 0)).unwrap_err();
        assert!(e.contains("NVRTC 13.0") && e.contains("CUDA 12.4"), "{e}");
        assert!(e.contains("nvidia-cuda-nvrtc-cu12"), "{e}");
    }

    #[test]
    fn old_gpus_need_nvrtc_12() {
        let e = check_toolchain((13, 0), (13, 0), (7, 0)).unwrap_err();
        assert!(e.contains("sm_70") && e.contains("NVRTC 12"), "{e}");
    }
}
