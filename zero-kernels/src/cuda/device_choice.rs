//! Which GPU a process uses.
//!
//! Launchers differ: `torchrun` and `deepspeed` show every process all of a node's GPUs
//! and expect it to pick the one at its local rank, while SLURM (`--gpus-per-task`) and
//! Kubernetes often show each process exactly one GPU through `CUDA_VISIBLE_DEVICES`, in
//! which case that GPU is device 0 whatever the local rank. So:
//! - exactly one GPU visible: use it;
//! - otherwise the local rank (device 0 when no launcher gave one), which must be below
//!   the number of visible GPUs.
//!
//! Every error names `CUDA_VISIBLE_DEVICES` and the counts.

/// The device ordinal for a process with `local_rank` (if a launcher set one) on a
/// machine where the driver shows `visible` GPUs; `cuda_visible_devices` is the variable's
/// value, for the error.
pub fn choose_device(
    local_rank: Option<usize>,
    visible: usize,
    cuda_visible_devices: Option<&str>,
) -> Result<usize, String> {
    let shown = shown(cuda_visible_devices);
    match (visible, local_rank) {
        (0, _) => Err(format!(
            "the CUDA driver shows no GPU ({shown}); check the GPUs given to this process"
        )),
        (1, _) => Ok(0),
        (_, None) => Ok(0),
        (n, Some(r)) if r < n => Ok(r),
        (n, Some(r)) => Err(format!(
            "local rank {r} has no GPU: {n} GPUs are visible ({shown}); start at most {n} \
             processes per node, or show each process one GPU through CUDA_VISIBLE_DEVICES"
        )),
    }
}

/// Device `ordinal`, chosen by a framework, checked against the `visible` GPUs.
pub fn check_ordinal(
    ordinal: usize,
    visible: usize,
    cuda_visible_devices: Option<&str>,
) -> Result<usize, String> {
    if ordinal < visible {
        Ok(ordinal)
    } else {
        Err(format!(
            "GPU {ordinal} was asked for, but {visible} GPUs are visible ({})",
            shown(cuda_visible_devices)
        ))
    }
}

/// `CUDA_VISIBLE_DEVICES` as the errors name it.
fn shown(cuda_visible_devices: Option<&str>) -> String {
    match cuda_visible_devices {
        Some(v) => format!("CUDA_VISIBLE_DEVICES={v:?}"),
        None => "CUDA_VISIBLE_DEVICES is not set".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_ordinal, choose_device};

    #[test]
    fn a_frameworks_ordinal_must_be_visible() {
        assert_eq!(check_ordinal(2, 4, None), Ok(2));
        let e = check_ordinal(1, 1, Some("3")).unwrap_err();
        assert!(
            e.contains("GPU 1") && e.contains("1 GPUs") && e.contains("CUDA_VISIBLE_DEVICES=\"3\""),
            "{e}"
        );
    }

    #[test]
    fn one_visible_gpu_is_used_whatever_the_local_rank() {
        // SLURM --gpus-per-task=1: rank 5 on its node sees one GPU, device 0.
        assert_eq!(choose_device(Some(5), 1, Some("5")), Ok(0));
        assert_eq!(choose_device(None, 1, None), Ok(0));
    }

    #[test]
    fn several_visible_gpus_are_chosen_by_local_rank() {
        assert_eq!(choose_device(Some(3), 8, None), Ok(3));
        assert_eq!(choose_device(Some(0), 8, Some("0,1,2,3,4,5,6,7")), Ok(0));
        assert_eq!(choose_device(None, 4, None), Ok(0));
    }

    #[test]
    fn errors_name_the_variable_and_the_counts() {
        let e = choose_device(Some(4), 2, Some("0,1")).unwrap_err();
        assert!(
            e.contains("local rank 4")
                && e.contains("2 GPUs")
                && e.contains("CUDA_VISIBLE_DEVICES=\"0,1\""),
            "{e}"
        );
        let e = choose_device(Some(0), 0, Some("")).unwrap_err();
        assert!(
            e.contains("no GPU") && e.contains("CUDA_VISIBLE_DEVICES"),
            "{e}"
        );
        let e = choose_device(Some(2), 2, None).unwrap_err();
        assert!(e.contains("CUDA_VISIBLE_DEVICES is not set"), "{e}");
    }
}
