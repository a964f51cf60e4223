//! `NativeEngine`: zero's engine for one rank, on host buffers, driven from Python.
//!
//! The Python side (`zero_torch.engine`) registers the model's modules and calls these
//! methods from its hooks. Calls that communicate or compute (fetch, release, reductions,
//! the optimizer step, checkpoints) release the GIL; calls that copy between the engine and
//! torch tensors hold it (the tensors' memory is read through their public `data_ptr()`).

use crate::errors::{comm_to_py, to_py, ZeroError};
use crate::tensors::{self, add_into, read_into, write};
use crate::with_host_type;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use zero_comm::launch::LaunchEnv;
use zero_comm::{Communicator, Completion, HostBuffer, ShmComm, ShmGroup};
use zero_kernels::DType;
use zero_runtime::{
    Engine, EngineError, HostDevice, LoadOptions, ModuleSpec, ParamSpec, ZeroConfig,
};

type HostEngine = Engine<ShmComm, HostDevice>;

/// One module as Python registers it: its name and its parameters' names, shapes,
/// whether each is trained, and the other full names of each (tied weights).
type ModuleArg = (String, Vec<(String, Vec<usize>, bool, Vec<String>)>);

/// zero's engine for this process's rank.
#[pyclass(module = "zero_torch._native")]
pub struct NativeEngine {
    inner: Mutex<HostEngine>,
    rank: usize,
    world: usize,
    local_rank: usize,
    dtype: DType,
}

/// The launcher's description of this process, or a world of one.
fn launch_env() -> PyResult<LaunchEnv> {
    if LaunchEnv::launched() {
        return LaunchEnv::from_env().map_err(|e| crate::errors::CommError::new_err(e.to_string()));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ZeroError::new_err(format!("finding a free port for a world of one: {e}")))?;
    Ok(LaunchEnv::local(0, 1, port))
}

impl NativeEngine {
    fn lock(&self) -> PyResult<MutexGuard<'_, HostEngine>> {
        self.inner
            .lock()
            .map_err(|_| ZeroError::new_err("the engine is unusable: a call into it panicked"))
    }

    /// Runs `f` on the engine with the GIL released.
    fn detached<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut HostEngine) -> Result<R, EngineError> + Send,
    ) -> PyResult<R> {
        py.detach(|| {
            let mut e = self.lock()?;
            f(&mut e).map_err(to_py)
        })
    }
}

#[pymethods]
impl NativeEngine {
    /// Joins the job (the launcher's environment, or a world of one), reads the config,
    /// takes every parameter's initial value from rank 0's tensors and builds the engine.
    #[new]
    #[pyo3(signature = (config_json, modules, values, timeout_s=300.0))]
    fn new(
        py: Python<'_>,
        config_json: &str,
        modules: Vec<ModuleArg>,
        values: Vec<Vec<Bound<'_, PyAny>>>,
        timeout_s: f64,
    ) -> PyResult<Self> {
        if modules.len() != values.len() {
            return Err(PyValueError::new_err(format!(
                "{} modules but initial values for {}",
                modules.len(),
                values.len()
            )));
        }
        let env = launch_env()?;
        let timeout = Duration::from_secs_f64(timeout_s.max(1.0));
        let comm = py
            .detach(|| ShmGroup::init(&env, timeout))
            .map_err(comm_to_py)?;
        let world = comm.world_size();
        let cfg = ZeroConfig::from_json_str(config_json, world)
            .map_err(|e| crate::errors::ConfigError::new_err(e.to_string()))?;
        let mut specs = Vec::with_capacity(modules.len());
        let mut init: Vec<f32> = Vec::new();
        let mut starts = Vec::new();
        for ((name, params), vals) in modules.into_iter().zip(&values) {
            if params.len() != vals.len() {
                return Err(PyValueError::new_err(format!(
                    "module `{name}`: {} parameters but {} initial values",
                    params.len(),
                    vals.len()
                )));
            }
            let mut ps = Vec::with_capacity(params.len());
            for ((pname, shape, trainable, aliases), t) in params.into_iter().zip(vals) {
                let v = tensors::read_f32(t)?;
                let numel: usize = shape.iter().product();
                if v.len() != numel {
                    return Err(PyValueError::new_err(format!(
                        "{name}.{pname}: shape {shape:?} but {} values",
                        v.len()
                    )));
                }
                starts.push(init.len());
                init.extend_from_slice(&v);
                let spec = if trainable {
                    ParamSpec::new(pname, &shape)
                } else {
                    ParamSpec::frozen(pname, &shape)
                };
                ps.push(spec.with_aliases(aliases));
            }
            specs.push(ModuleSpec::new(name, ps));
        }
        // Every rank starts from rank 0's values (as DeepSpeed broadcasts the model).
        let (comm, init) = if world > 1 {
            let (comm, got) = py.detach(move || {
                let got = comm
                    .broadcast(HostBuffer::F32(init), 0)
                    .and_then(|w| w.wait());
                (comm, got)
            });
            let init = got.map_err(comm_to_py)?.into_f32().ok_or_else(|| {
                ZeroError::new_err("the broadcast of initial values changed dtype")
            })?;
            (comm, init)
        } else {
            (comm, init)
        };
        let engine = py
            .detach(move || {
                Engine::new(cfg, specs, comm, HostDevice, |id, spec, out| {
                    let at = starts[id];
                    out.copy_from_slice(&init[at..at + spec.numel()]);
                })
            })
            .map_err(to_py)?;
        Ok(NativeEngine {
            rank: env.rank,
            world: env.world_size,
            local_rank: env.local_rank,
            dtype: engine.dtype(),
            inner: Mutex::new(engine),
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
        self.detached(py, |e| e.fetch(m))
    }

    /// Module `m` is done for now (stage 3 frees its gathered bucket).
    fn release(&self, py: Python<'_>, m: usize) -> PyResult<()> {
        self.detached(py, |e| e.release(m))
    }

    /// The forward pass under way will have no backward.
    fn abandon_pass(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, |e| e.abandon_pass())
    }

    /// Whether parameter `k` of module `m` stays whole on every rank.
    fn param_persistent(&self, m: usize, k: usize) -> PyResult<bool> {
        self.lock()?.param_persistent(m, k).map_err(to_py)
    }

    /// Copies module `m`'s parameters (in registration order) into `tensors`, each of the
    /// engine's dtype and its parameter's length.
    fn fill(&self, m: usize, tensors: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let e = self.lock()?;
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
    fn fill_param(&self, m: usize, k: usize, tensor: Bound<'_, PyAny>) -> PyResult<()> {
        let e = self.lock()?;
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
    fn put_grad(&self, m: usize, k: usize, grad: Bound<'_, PyAny>, first: bool) -> PyResult<()> {
        let mut e = self.lock()?;
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
        let mut values = Vec::with_capacity(params.len());
        {
            let e = self.lock()?;
            for (m, k, t) in &params {
                let id = e.param_id(*m, *k).map_err(to_py)?;
                values.push((id, tensors::read_f32(t)?));
            }
        }
        self.detached(py, move |e| e.set_params(values, root))
    }

    /// Module `m`'s gradients are complete for this micro-step: its bucket's reduction
    /// starts once every module of the bucket is.
    fn grads_ready(&self, py: Python<'_>, m: usize) -> PyResult<()> {
        self.detached(py, |e| e.grads_ready(m))
    }

    /// What to multiply the loss by before backward (the loss scale over the
    /// accumulation steps).
    fn loss_scale_factor(&self) -> PyResult<f64> {
        Ok(self.lock()?.loss_scale_factor())
    }

    /// The current loss scale.
    fn loss_scale(&self) -> PyResult<f64> {
        Ok(self.lock()?.loss_scale())
    }

    /// The optimizer step, at the accumulation boundary: a dict of `skipped`,
    /// `grad_norm`, `loss_scale` and `lr`.
    fn step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = self.detached(py, |e| e.step())?;
        let d = PyDict::new(py);
        d.set_item("skipped", out.skipped)?;
        d.set_item("grad_norm", out.grad_norm)?;
        d.set_item("loss_scale", out.loss_scale)?;
        d.set_item("lr", out.lr)?;
        Ok(d)
    }

    /// Discards the gradients of the current step (a collective).
    fn zero_grad(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, |e| e.zero_grad())
    }

    /// The learning rate of the next step.
    fn lr(&self) -> PyResult<f64> {
        Ok(self.lock()?.lr())
    }

    /// `(optimizer steps applied, steps skipped, global steps)`.
    fn step_counts(&self) -> PyResult<(u64, u64, u64)> {
        Ok(self.lock()?.step_counts())
    }

    /// The engine's memory report: bytes per category on this rank.
    fn memory_report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.lock()?.memory_report();
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
        let r = self.lock()?.comm_report();
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
        self.detached(py, |e| e.save_checkpoint(&save_dir, tag.as_deref(), client))
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
        let client = self.detached(py, |e| {
            e.load_checkpoint(&load_dir, tag.as_deref(), options)
        })?;
        Ok(client.to_string())
    }

    /// Writes the 16-bit model as Hugging Face safetensors into `save_dir` (rank 0 writes;
    /// every rank calls it); returns the files written.
    fn save_16bit_model(&self, py: Python<'_>, save_dir: PathBuf) -> PyResult<Vec<String>> {
        let files = self.detached(py, |e| e.save_16bit_model(&save_dir))?;
        Ok(files.iter().map(|f| f.path.display().to_string()).collect())
    }
}

/// `(rank, world_size, local_rank)` as the launcher says (a world of one without one).
#[pyfunction]
pub fn launch_info() -> PyResult<(usize, usize, usize)> {
    let env = launch_env()?;
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
