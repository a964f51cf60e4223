//! `zero_optimization.offload_optimizer`, `zero_optimization.offload_param`, the `aio`
//! section and DeepSpeed's legacy `cpu_offload*` keys, with DeepSpeed's defaults
//! (`deepspeed/runtime/zero/offload_config.py`, `deepspeed/runtime/swap_tensor/aio_config.py`).

use super::json::Obj;
use super::offload_keys::{
    AIO_SECTION, BLOCK_SIZE, BUFFER_SIZE, DEVICE, FAST_INIT, INTRA_OP_PARALLELISM, MAX_IN_CPU,
    NVME_PATH, OFFLOAD_OPTIMIZER_SECTION, OFFLOAD_PARAM_SECTION, OPTIMIZER_BUFFER_COUNT,
    OVERLAP_EVENTS, PARAM_BUFFER_COUNT, PIN_MEMORY, PIPELINE_READ, PIPELINE_WRITE, QUEUE_DEPTH,
    RATIO, SINGLE_SUBMIT, THREAD_COUNT, USE_GDS,
};
use super::zero_keys::{
    CPU_OFFLOAD, CPU_OFFLOAD_PARAM, CPU_OFFLOAD_USE_PIN_MEMORY, OFFLOAD_OPTIMIZER, OFFLOAD_PARAM,
};
use super::ConfigError;
use std::path::PathBuf;

/// Where an offloaded state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadDevice {
    /// On the device (no offload).
    None,
    /// In host memory.
    Cpu,
    /// In files on an NVMe (any `O_DIRECT`-capable) file system, staged through host
    /// buffers.
    Nvme,
}

/// `zero_optimization.offload_optimizer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadOptimizerConfig {
    /// `device`.
    pub device: OffloadDevice,
    /// `nvme_path` (required for `nvme`).
    pub nvme_path: Option<PathBuf>,
    /// `pin_memory` (default true, as DeepSpeed since PR #8207): the host buffers the
    /// device copies through are pinned on a GPU.
    pub pin_memory: bool,
    /// `buffer_count` (4): host buffers of the NVMe pipeline (at least 3 are used: read
    /// ahead, compute, write behind).
    pub buffer_count: u64,
    /// `pipeline_read` (false in DeepSpeed): zero always reads ahead.
    pub pipeline_read: bool,
    /// `pipeline_write` (false in DeepSpeed): zero always writes behind.
    pub pipeline_write: bool,
    /// `fast_init` (false): accepted.
    pub fast_init: bool,
    /// `ratio` below 1: DeepSpeed's partial offload (stage 3 keeps the first sub-groups'
    /// state on the device). zero offloads all of it: the numbers are the same, only where
    /// the state lives differs.
    pub partial: bool,
}

/// `zero_optimization.offload_param` (stage 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadParamConfig {
    /// `device`.
    pub device: OffloadDevice,
    /// `nvme_path` (required for `nvme`).
    pub nvme_path: Option<PathBuf>,
    /// `pin_memory`.
    pub pin_memory: bool,
    /// `buffer_count` (5).
    pub buffer_count: u64,
    /// `buffer_size` (1e8 elements).
    pub buffer_size: u64,
    /// `max_in_cpu` (1e9 elements).
    pub max_in_cpu: u64,
}

/// The `aio` section: how NVMe files are read and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AioConfig {
    /// `block_size` (1 MiB): bytes per request.
    pub block_size: u64,
    /// `queue_depth` (8): requests in flight per thread.
    pub queue_depth: u64,
    /// `intra_op_parallelism` (1), or its older name `thread_count`: I/O threads.
    pub intra_op_parallelism: u64,
    /// `single_submit` (false): accepted.
    pub single_submit: bool,
    /// `overlap_events` (true): accepted.
    pub overlap_events: bool,
}

impl Default for OffloadOptimizerConfig {
    fn default() -> Self {
        Self {
            device: OffloadDevice::None,
            nvme_path: None,
            pin_memory: const { PIN_MEMORY.flag() },
            buffer_count: const { OPTIMIZER_BUFFER_COUNT.count() },
            pipeline_read: const { PIPELINE_READ.flag() },
            pipeline_write: const { PIPELINE_WRITE.flag() },
            fast_init: const { FAST_INIT.flag() },
            partial: false,
        }
    }
}

impl Default for OffloadParamConfig {
    fn default() -> Self {
        Self {
            device: OffloadDevice::None,
            nvme_path: None,
            pin_memory: const { PIN_MEMORY.flag() },
            buffer_count: const { PARAM_BUFFER_COUNT.count() },
            buffer_size: const { BUFFER_SIZE.count() },
            max_in_cpu: const { MAX_IN_CPU.count() },
        }
    }
}

impl Default for AioConfig {
    fn default() -> Self {
        Self {
            block_size: const { BLOCK_SIZE.count() },
            queue_depth: const { QUEUE_DEPTH.count() },
            intra_op_parallelism: const { INTRA_OP_PARALLELISM.count() },
            single_submit: const { SINGLE_SUBMIT.flag() },
            overlap_events: const { OVERLAP_EVENTS.flag() },
        }
    }
}

fn device(o: &Obj) -> Result<OffloadDevice, ConfigError> {
    Ok(
        match o.str(DEVICE.name)?.map(str::to_ascii_lowercase).as_deref() {
            None | Some("none") => OffloadDevice::None,
            Some("cpu") => OffloadDevice::Cpu,
            Some("nvme") => OffloadDevice::Nvme,
            Some(other) => {
                return Err(o.invalid(
                    DEVICE.name,
                    &format!("`{other}`: expected none, cpu or nvme"),
                ))
            }
        },
    )
}

fn nvme_path(o: &Obj, dev: OffloadDevice) -> Result<Option<PathBuf>, ConfigError> {
    let path = o.str(NVME_PATH.name)?.map(PathBuf::from);
    if dev == OffloadDevice::Nvme && path.is_none() {
        return Err(o.invalid(
            NVME_PATH.name,
            "device \"nvme\" needs a folder on an NVMe file system here",
        ));
    }
    Ok(path)
}

/// `offload_optimizer` of `zero` (the `zero_optimization` object).
pub(super) fn offload_optimizer(
    zero: &Obj,
    legacy: &Legacy,
) -> Result<OffloadOptimizerConfig, ConfigError> {
    let mut cfg = OffloadOptimizerConfig::default();
    if legacy.cpu_offload {
        cfg.device = OffloadDevice::Cpu;
    }
    if let Some(pin) = legacy.pin_memory {
        cfg.pin_memory = pin;
    }
    let Some(v) = zero.get(OFFLOAD_OPTIMIZER.name) else {
        return Ok(cfg);
    };
    let s = &OFFLOAD_OPTIMIZER_SECTION;
    let o = Obj::new(
        &zero.path(OFFLOAD_OPTIMIZER.name),
        v,
        &s.known(),
        &s.unsupported(),
    )?;
    let ratio = o.f64_or(RATIO.name, const { RATIO.float() })?;
    if !(ratio > 0.0 && ratio <= 1.0) {
        return Err(o.invalid(
            RATIO.name,
            &format!("{ratio}: expected a fraction in (0, 1]"),
        ));
    }
    cfg.partial = ratio < 1.0;
    cfg.device = device(&o)?;
    cfg.nvme_path = nvme_path(&o, cfg.device)?;
    cfg.pin_memory = o.bool_or(PIN_MEMORY.name, cfg.pin_memory)?;
    cfg.buffer_count = o.count_or(
        OPTIMIZER_BUFFER_COUNT.name,
        const { OPTIMIZER_BUFFER_COUNT.count() },
    )?;
    if cfg.buffer_count == 0 {
        return Err(o.invalid(OPTIMIZER_BUFFER_COUNT.name, "must be at least 1"));
    }
    cfg.pipeline_read = o.bool_or(PIPELINE_READ.name, const { PIPELINE_READ.flag() })?;
    cfg.pipeline_write = o.bool_or(PIPELINE_WRITE.name, const { PIPELINE_WRITE.flag() })?;
    cfg.fast_init = o.bool_or(FAST_INIT.name, const { FAST_INIT.flag() })?;
    Ok(cfg)
}

/// `offload_param` of `zero`.
pub(super) fn offload_param(
    zero: &Obj,
    legacy: &Legacy,
) -> Result<OffloadParamConfig, ConfigError> {
    let mut cfg = OffloadParamConfig::default();
    if legacy.cpu_offload_param {
        cfg.device = OffloadDevice::Cpu;
    }
    if let Some(pin) = legacy.pin_memory {
        cfg.pin_memory = pin;
    }
    let Some(v) = zero.get(OFFLOAD_PARAM.name) else {
        return Ok(cfg);
    };
    let s = &OFFLOAD_PARAM_SECTION;
    let o = Obj::new(
        &zero.path(OFFLOAD_PARAM.name),
        v,
        &s.known(),
        &s.unsupported(),
    )?;
    cfg.device = device(&o)?;
    cfg.nvme_path = nvme_path(&o, cfg.device)?;
    cfg.pin_memory = o.bool_or(PIN_MEMORY.name, cfg.pin_memory)?;
    cfg.buffer_count = o
        .count_or(
            PARAM_BUFFER_COUNT.name,
            const { PARAM_BUFFER_COUNT.count() },
        )?
        .max(1);
    cfg.buffer_size = o
        .count_or(BUFFER_SIZE.name, const { BUFFER_SIZE.count() })?
        .max(1);
    cfg.max_in_cpu = o.count_or(MAX_IN_CPU.name, const { MAX_IN_CPU.count() })?;
    Ok(cfg)
}

/// The legacy `zero_optimization` keys DeepSpeed still maps (`cpu_offload` →
/// `offload_optimizer.device: cpu`, `cpu_offload_param` → `offload_param.device: cpu`,
/// `cpu_offload_use_pin_memory` → both `pin_memory`).
#[derive(Debug, Default)]
pub(super) struct Legacy {
    cpu_offload: bool,
    cpu_offload_param: bool,
    pin_memory: Option<bool>,
}

impl Legacy {
    /// Reads them, noting each mapping in `notes`.
    pub(super) fn read(zero: &Obj, notes: &mut Vec<String>) -> Result<Self, ConfigError> {
        let legacy = Legacy {
            cpu_offload: zero.bool_or(CPU_OFFLOAD.name, const { CPU_OFFLOAD.flag() })?,
            cpu_offload_param: zero
                .bool_or(CPU_OFFLOAD_PARAM.name, const { CPU_OFFLOAD_PARAM.flag() })?,
            pin_memory: match zero.get(CPU_OFFLOAD_USE_PIN_MEMORY.name) {
                None => None,
                Some(_) => Some(zero.bool_or(
                    CPU_OFFLOAD_USE_PIN_MEMORY.name,
                    const { CPU_OFFLOAD_USE_PIN_MEMORY.flag() },
                )?),
            },
        };
        for (key, new) in [
            (CPU_OFFLOAD.name, "offload_optimizer.device = \"cpu\""),
            (CPU_OFFLOAD_PARAM.name, "offload_param.device = \"cpu\""),
            (CPU_OFFLOAD_USE_PIN_MEMORY.name, "offload_*.pin_memory"),
        ] {
            if zero.get(key).is_some() {
                notes.push(format!(
                    "zero_optimization.{key} is DeepSpeed's legacy name for {new}: read as that"
                ));
            }
        }
        Ok(legacy)
    }
}

/// The `aio` section of the top level.
pub(super) fn aio(top: &Obj, notes: &mut Vec<String>) -> Result<AioConfig, ConfigError> {
    let o = AIO_SECTION.open(top)?;
    if o.bool_or(USE_GDS.name, const { USE_GDS.flag() })? {
        return Err(ConfigError::Unsupported {
            key: o.path(USE_GDS.name),
            reason: "GPUDirect Storage is not built: NVMe offload goes through host memory".into(),
        });
    }
    let d = AioConfig::default();
    let intra_op = || {
        o.count_or(
            INTRA_OP_PARALLELISM.name,
            const { INTRA_OP_PARALLELISM.count() },
        )
    };
    let thread_count = || o.count_or(THREAD_COUNT.name, const { THREAD_COUNT.count() });
    let threads = match (o.get(INTRA_OP_PARALLELISM.name), o.get(THREAD_COUNT.name)) {
        (Some(_), Some(_)) if intra_op()? != thread_count()? => {
            return Err(ConfigError::Inconsistent(format!(
                "aio.intra_op_parallelism = {} and its older name aio.thread_count = {} disagree",
                intra_op()?,
                thread_count()?
            )))
        }
        (Some(_), _) => intra_op()?,
        (None, Some(_)) => {
            notes.push("aio.thread_count is the older name of aio.intra_op_parallelism (DeepSpeed now ignores it silently): read as that".into());
            thread_count()?
        }
        (None, None) => d.intra_op_parallelism,
    };
    let block_size = o.count_or(BLOCK_SIZE.name, d.block_size)?;
    if block_size == 0 || block_size % 4096 != 0 {
        return Err(o.invalid(
            BLOCK_SIZE.name,
            &format!("{block_size}: must be a positive multiple of 4096 (O_DIRECT)"),
        ));
    }
    Ok(AioConfig {
        block_size,
        queue_depth: o.count_or(QUEUE_DEPTH.name, d.queue_depth)?.max(1),
        intra_op_parallelism: threads.max(1),
        single_submit: o.bool_or(SINGLE_SUBMIT.name, d.single_submit)?,
        overlap_events: o.bool_or(OVERLAP_EVENTS.name, d.overlap_events)?,
    })
}
