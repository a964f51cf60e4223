//! `NativeEngine`: zero's engine for one rank, driven from Python, on the CPU (host
//! buffers, the shared-memory group) or on the process's GPU (device buffers, NCCL).
//!
//! The Python side (`zero_torch.engine`) registers the model's modules and calls these
//! methods from its hooks. Calls that communicate or compute (fetch, release, reductions,
//! the optimizer step, checkpoints) release the GIL; calls that copy between the engine and
//! torch tensors hold it (the tensors' memory is found through their public `data_ptr()`).
//! On the GPU those copies take torch's current stream (`stream`, its raw handle) and are
//! ordered with it by events in both directions.

use crate::errors::{to_py, ZeroError};
use crate::start::{self, Inner, Model, ModuleArg};
use crate::tensors::{self, add_into, read_into, write};
use crate::{cuda_tensors, with_host_type};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use zero_kernels::DType;
use zero_runtime::{LoadOptions, ZeroConfig};

/// Runs `$body` with `$e` bound to the engine inside `$inner`, whichever device it is on.
macro_rules! with_engine {
    ($inner:expr, $e:ident => $body:expr) => {
        match $inner {
            Inner::Host($e) => $body,
            Inner::Cuda($e) => $body,
        }
    };
}

/// zero's engine for this process's rank.
#[pyclass(module = "zero_torch._native")]
pub struct NativeEngine {
    inner: Mutex<Inner>,
    rank: usize,
    world: usize,
    local_rank: usize,
    dtype: DType,
}

impl NativeEngine {
    fn lock(&self) -> PyResult<MutexGuard<'_, Inner>> {
        self.inner
            .lock()
            .map_err(|_| ZeroError::new_err("the engine is unusable: a call into it panicked"))
    }
}

/// Runs `$body` on the engine with the GIL released, mapping engine errors.
macro_rules! detached {
    ($self:expr, $py:expr, $e:ident => $body:expr) => {
        $py.detach(|| {
            let mut guard = $self.lock()?;
            with_engine!(&mut *guard, $e => $body).map_err(to_py)
        })
    };
}

/// Runs `$body` on the engine with the GIL held, mapping engine errors.
macro_rules! held {
    ($self:expr, $e:ident => $body:expr) => {{
        let guard = $self.lock()?;
        with_engine!(&*guard, $e => $body)
    }};
}

#[pymethods]
impl NativeEngine {
    /// Joins the job (the launcher's environment, or a world of one), reads the config,
    /// takes every parameter's initial value from rank 0's tensors (CPU tensors, whatever
    /// the device) and builds the engine on `device`: `"cpu"` (one process per rank over
    /// shared memory) or `"cuda"` (the process's GPU, NCCL).
    #[new]
    #[pyo3(signature = (config_json, modules, values, timeout_s=300.0, device="cpu"))]
    fn new(
        py: Python<'_>,
        config_json: &str,
        modules: Vec<ModuleArg>,
        values: Vec<Vec<Bound<'_, PyAny>>>,
        timeout_s: f64,
        device: &str,
    ) -> PyResult<Self> {
        let model = Model::read(modules, &values)?;
        let env = start::launch_env()?;
        let timeout = Duration::from_secs_f64(timeout_s.max(1.0));
        let inner = match device {
            "cpu" => start::host(py, &env, config_json, model, timeout)?,
            "cuda" => start::cuda(py, &env, config_json, model, timeout)?,
            other => {
                return Err(PyValueError::new_err(format!(
                    "device {other:?}: zero trains on \"cpu\" or \"cuda\""
                )))
            }
        };
        let dtype = with_engine!(&inner, e => e.dtype());
        Ok(NativeEngine {
            rank: env.rank,
            world: env.world_size,
            local_rank: env.local_rank,
            dtype,
            inner: Mutex::new(inner),
        })
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.world
    }

    /// The rank on this machine.
    #[getter]
    fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The parameters' and gradients' dtype: `float32`, `float16` or `bfloat16`.
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.dtype {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
        }
    }

    /// Gathers module `m`'s parameters (stage 3; nothing to do otherwise).
    fn fetch(&self, py: Python<'_>, m: usize) -> PyResult<()> {
        detached!(self, py, e => e.fetch(m))
    }

    /// Module `m` is done for now (stage 3 frees its gathered bucket).
    fn release(&self, py: Python<'_>, m: usize) -> PyResult<()> {
        detached!(self, py, e => e.release(m))
    }

    /// The forward pass under way will have no backward.
    fn abandon_pass(&self, py: Python<'_>) -> PyResult<()> {
        detached!(self, py, e => e.abandon_pass())
    }

    /// Whether parameter `k` of module `m` stays whole on every rank.
    fn param_persistent(&self, m: usize, k: usize) -> PyResult<bool> {
        held!(self, e => e.param_persistent(m, k)).map_err(to_py)
    }

    /// Copies module `m`'s parameters (in registration order) into `tensors`, each of the
    /// engine's dtype and its parameter's length, on the engine's device (`stream`: torch's
    /// current stream on the GPU).
    #[pyo3(signature = (m, tensors, stream=0))]
    fn fill(&self, m: usize, tensors: Vec<Bound<'_, PyAny>>, stream: u64) -> PyResult<()> {
        let guard = self.lock()?;
        let e = match &*guard {
            Inner::Cuda(e) => return cuda_tensors::fill(e, m, &tensors, stream),
            Inner::Host(e) => e,
        };
        with_host_type!(self.dtype, T => {
            let params = e.params::<T>(m).map_err(to_py)?;
            if params.len() != tensors.len() {
                return Err(PyValueError::new_err(format!(
                    "module {m} has {} parameters, {} tensors were given",
                    params.len(),
                    tensors.len()
                )));
            }
            for (p, t) in params.iter().zip(&tensors) {
                write::<T>(t, p)?;
            }
            Ok(())
        })
    }

    /// Copies parameter `k` of module `m` into `tensor` (of the engine's dtype and the
    /// parameter's length): for parameters that stay whole (stage 3's persistent ones)
    /// while the rest of their module is not gathered.
    #[pyo3(signature = (m, k, tensor, stream=0))]
    fn fill_param(
        &self,
        m: usize,
        k: usize,
        tensor: Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<()> {
        let guard = self.lock()?;
        let e = match &*guard {
            Inner::Cuda(e) => return cuda_tensors::fill_param(e, m, k, &tensor, stream),
            Inner::Host(e) => e,
        };
        let (buf, range) = e.param_buffer(m, k).map_err(to_py)?;
        with_host_type!(self.dtype, T => {
            let all = buf.as_slice::<T>().ok_or_else(|| {
                ZeroError::new_err("the engine's parameter buffer has another dtype")
            })?;
            write::<T>(&tensor, &all[range])
        })
    }

    /// Puts the gradient of trainable parameter `k` of module `m` (counting trainable
    /// parameters only) into the engine: copied on its first arrival in a micro-step,
    /// added on later ones.
    #[pyo3(signature = (m, k, grad, first, stream=0))]
    fn put_grad(
        &self,
        m: usize,
        k: usize,
        grad: Bound<'_, PyAny>,
        first: bool,
        stream: u64,
    ) -> PyResult<()> {
        let mut guard = self.lock()?;
        let e = match &mut *guard {
            Inner::Cuda(e) => return cuda_tensors::put_grad(e, m, k, &grad, first, stream),
            Inner::Host(e) => e,
        };
        with_host_type!(self.dtype, T => {
            let mut views = e.grads_mut::<T>(m).map_err(to_py)?;
            let n = views.len();
            let slot = views.get_mut(k).ok_or_else(|| {
                PyValueError::new_err(format!("module {m} has {n} trainable parameters, not {}", k + 1))
            })?;
            if first {
                read_into::<T>(&grad, slot)
            } else {
                add_into::<T>(&grad, slot)
            }
        })
    }

    /// Sets parameters to rank `root`'s values on every rank (a collective; every rank
    /// passes the same `(module, parameter)` pairs, other ranks' values are ignored): the
    /// fp32 master weights and the 16-bit parameters, as `GatheredParameters` with
    /// `modifier_rank` does on exit.
    fn set_params(
        &self,
        py: Python<'_>,
        params: Vec<(usize, usize, Bound<'_, PyAny>)>,
        root: usize,
    ) -> PyResult<()> {
        let values = held!(self, e => params
            .iter()
            .map(|(m, k, t)| Ok((e.param_id(*m, *k).map_err(to_py)?, tensors::read_f32(t)?)))
            .collect::<PyResult<Vec<_>>>())?;
        detached!(self, py, e => e.set_params(values, root))
    }

    /// Module `m`'s gradients are complete for this micro-step: its bucket's reduction
    /// starts once every module of the bucket is.
    fn grads_ready(&self, py: Python<'_>, m: usize) -> PyResult<()> {
        detached!(self, py, e => e.grads_ready(m))
    }

    /// What to multiply the loss by before backward (the loss scale over the
    /// accumulation steps).
    fn loss_scale_factor(&self) -> PyResult<f64> {
        Ok(held!(self, e => e.loss_scale_factor()))
    }

    /// The current loss scale.
    fn loss_scale(&self) -> PyResult<f64> {
        Ok(held!(self, e => e.loss_scale()))
    }

    /// The optimizer step, at the accumulation boundary: a dict of `skipped`,
    /// `grad_norm`, `loss_scale` and `lr`.
    fn step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = detached!(self, py, e => e.step())?;
        let d = PyDict::new(py);
        d.set_item("skipped", out.skipped)?;
        d.set_item("grad_norm", out.grad_norm)?;
        d.set_item("loss_scale", out.loss_scale)?;
        d.set_item("lr", out.lr)?;
        Ok(d)
    }

    /// Discards the gradients of the current step (a collective).
    fn zero_grad(&self, py: Python<'_>) -> PyResult<()> {
        detached!(self, py, e => e.zero_grad())
    }

    /// The learning rate of the next step.
    fn lr(&self) -> PyResult<f64> {
        Ok(held!(self, e => e.lr()))
    }

    /// `(optimizer steps applied, steps skipped, global steps)`.
    fn step_counts(&self) -> PyResult<(u64, u64, u64)> {
        Ok(held!(self, e => e.step_counts()))
    }

    /// The engine's memory report: bytes per category on this rank.
    fn memory_report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = held!(self, e => e.memory_report());
        let d = PyDict::new(py);
        d.set_item("params", r.params)?;
        d.set_item("grads", r.grads)?;
        d.set_item("master", r.master)?;
        d.set_item("exp_avg", r.exp_avg)?;
        d.set_item("exp_avg_sq", r.exp_avg_sq)?;
        d.set_item("grad_accum", r.grad_accum)?;
        d.set_item("buckets", r.buckets)?;
        d.set_item("gathered", r.gathered)?;
        d.set_item("peak_gathered", r.peak_gathered)?;
        d.set_item("frozen", r.frozen)?;
        d.set_item("model_states", r.model_states())?;
        d.set_item("formula", r.formula)?;
        d.set_item("numel", r.numel)?;
        Ok(d)
    }

    /// Elements this rank sent in the last step, by purpose, and the theory.
    fn comm_report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = held!(self, e => e.comm_report());
        let d = PyDict::new(py);
        d.set_item("grad_reduce", r.last_step.grad_reduce)?;
        d.set_item("param_gather", r.last_step.param_gather)?;
        d.set_item("control", r.last_step.control)?;
        d.set_item("theory", r.theory)?;
        Ok(d)
    }

    /// Saves a checkpoint (every rank calls it); returns the tag.
    #[pyo3(signature = (save_dir, tag=None, client_state_json="{}".to_string()))]
    fn save_checkpoint(
        &self,
        py: Python<'_>,
        save_dir: PathBuf,
        tag: Option<String>,
        client_state_json: String,
    ) -> PyResult<String> {
        let client: serde_json::Value = serde_json::from_str(&client_state_json)
            .map_err(|e| PyValueError::new_err(format!("client_state is not JSON: {e}")))?;
        detached!(self, py, e => e.save_checkpoint(&save_dir, tag.as_deref(), client))
    }

    /// Loads a checkpoint at any world size and stage (every rank calls it); returns the
    /// client state as JSON.
    #[pyo3(signature = (load_dir, tag=None, load_optimizer_states=true, load_lr_scheduler_states=true, load_module_only=false, strict=true))]
    #[allow(clippy::too_many_arguments)]
    fn load_checkpoint(
        &self,
        py: Python<'_>,
        load_dir: PathBuf,
        tag: Option<String>,
        load_optimizer_states: bool,
        load_lr_scheduler_states: bool,
        load_module_only: bool,
        strict: bool,
    ) -> PyResult<String> {
        let options = LoadOptions {
            load_optimizer_states,
            load_lr_scheduler_states,
            load_module_only,
            strict,
        };
        let client =
            detached!(self, py, e => e.load_checkpoint(&load_dir, tag.as_deref(), options))?;
        Ok(client.to_string())
    }

    /// Writes the 16-bit model as Hugging Face safetensors into `save_dir` (rank 0 writes;
    /// every rank calls it); returns the files written.
    fn save_16bit_model(&self, py: Python<'_>, save_dir: PathBuf) -> PyResult<Vec<String>> {
        let files = detached!(self, py, e => e.save_16bit_model(&save_dir))?;
        Ok(files.iter().map(|f| f.path.display().to_string()).collect())
    }
}

/// `(rank, world_size, local_rank)` as the launcher says (a world of one without one).
#[pyfunction]
pub fn launch_info() -> PyResult<(usize, usize, usize)> {
    let env = start::launch_env()?;
    Ok((env.rank, env.world_size, env.local_rank))
}

/// Reads a DeepSpeed config (JSON text) for `world_size` ranks with zero's parser, and
/// returns it resolved ("auto" filled in) as JSON, with the notes it made: the same
/// checks and "did you mean" errors as everywhere else.
#[pyfunction]
pub fn resolve_config(config_json: &str, world_size: usize) -> PyResult<String> {
    let c = ZeroConfig::from_json_str(config_json, world_size)
        .map_err(|e| crate::errors::ConfigError::new_err(e.to_string()))?;
    let precision = match c.precision {
        zero_runtime::Precision::Fp32 => "float32",
        zero_runtime::Precision::Fp16(_) => "float16",
        zero_runtime::Precision::Bf16 => "bfloat16",
    };
    Ok(serde_json::json!({
        "train_batch_size": c.train_batch_size,
        "train_micro_batch_size_per_gpu": c.micro_batch_per_rank,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "gradient_clipping": c.gradient_clipping,
        "stage": c.zero.stage,
        "dtype": precision,
        "gather_16bit_weights_on_model_save": c.zero.gather_16bit_weights_on_model_save,
        "notes": c.notes,
    })
    .to_string())
}
