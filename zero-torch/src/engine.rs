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
use crate::exchange::PyExchange;
use crate::relay::PyRelay;
use crate::results::{
    CommReport, ExternalPiece, HfLoad, LaunchInfo, MemoryReport, StepCounts, StepOutcome,
};
use crate::start::{self, Inner, Model, ModuleArg};
use crate::tensors::{self, add_into, read_into, write};
use crate::{cuda_tensors, views, with_host_type};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use zero_kernels::DType;
use zero_runtime::kernels::{AdamConfig, WeightDecay};
use zero_runtime::scaler::{DynamicState, ScalerState};
use zero_runtime::{ExternalArray, ImportedParam, ImportedState, LoadOptions};

/// Runs `$body` with `$e` bound to the engine inside `$inner`, whichever device it is on.
macro_rules! with_engine {
    ($inner:expr, $e:ident => $body:expr) => {
        match $inner {
            Inner::Host($e) => $body,
            Inner::Cuda($e) => $body,
        }
    };
}

/// One parameter's state as Python hands it to `import_state`: its name, then its whole
/// master weights, `exp_avg` and `exp_avg_sq` (the moments may be `None`).
type ImportedTensors<'py> = (
    String,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
);

/// A loss scaler's state from Python: the scale, and for a dynamic scaler
/// `(cur_iter, last_overflow_iter, cur_hysteresis)`.
type LossScaleState = (f64, Option<(i64, i64, u64)>);

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
    /// The engine, for one call: on the GPU the calling thread's current CUDA context (so
    /// torch's current device) is put back when the call ends, whatever zero bound.
    fn lock(&self) -> PyResult<Locked<'_>> {
        let guard = self
            .inner
            .lock()
            .map_err(|_| ZeroError::new_err("the engine is unusable: a call into it panicked"))?;
        let context = match &*guard {
            Inner::Cuda(_) => Some(
                zero_sys::driver::KeepCurrentContext::save()
                    .map_err(crate::errors::DeviceError::new_err)?,
            ),
            Inner::Host(_) => None,
        };
        Ok(Locked {
            guard,
            _context: context,
        })
    }
}

/// The stream a CUDA copy is ordered with: torch's current stream, which the caller must
/// name (`torch.cuda.current_stream().cuda_stream`; `0` is the legacy default stream, a
/// valid choice only when it is torch's). Never a silent default.
fn torch_stream(stream: Option<u64>) -> PyResult<u64> {
    stream.ok_or_else(|| {
        PyValueError::new_err(
            "a CUDA engine copies on torch's current stream: pass \
             stream=torch.cuda.current_stream().cuda_stream",
        )
    })
}

/// The engine locked for one call, and (on the GPU) the caller's CUDA context to restore.
struct Locked<'a> {
    guard: MutexGuard<'a, Inner>,
    _context: Option<zero_sys::driver::KeepCurrentContext>,
}

impl Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.guard
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.guard
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
    /// shared memory), `"cuda:N"` (GPU `N`, NCCL) or `"cuda"` (the local rank's GPU).
    /// `id_exchange(id, timeout_s)` hands rank 0's id to every rank (torch's store:
    /// `_dist.id_exchange`); without it zero's own rendezvous does, on the port the
    /// launcher's variables imply. On the CPU with ranks on several machines, `machines`
    /// names every rank's machine and `relay` (`_gloo_tier.GlooRelay`) carries what
    /// crosses them; `id_exchange` is then this machine's.
    #[new]
    #[pyo3(signature = (config_json, modules, values, timeout_s=300.0, device="cpu", id_exchange=None, machines=None, relay=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        config_json: &str,
        modules: Vec<ModuleArg>,
        values: Vec<Vec<Bound<'_, PyAny>>>,
        timeout_s: f64,
        device: &str,
        id_exchange: Option<Py<PyAny>>,
        machines: Option<Vec<usize>>,
        relay: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let model = Model::read(modules, &values)?;
        let env = start::launch_env()?;
        let timeout = Duration::from_secs_f64(timeout_s.max(1.0));
        let exchange = id_exchange.map(|f| PyExchange::new(f, "torch's store"));
        let inner = match start::Placement::parse(device)? {
            start::Placement::Cpu => {
                let machines = match (machines, relay) {
                    (Some(of_rank), Some(relay)) => Some(start::Machines {
                        of_rank,
                        relay: PyRelay::new(py, relay)?,
                    }),
                    (None, None) => None,
                    _ => {
                        return Err(PyValueError::new_err(
                            "machines and relay come together (ranks on several machines) or not at all",
                        ))
                    }
                };
                start::host(py, &env, config_json, model, timeout, exchange, machines)?
            }
            start::Placement::Cuda(ordinal) => {
                start::cuda(py, &env, config_json, model, timeout, ordinal, exchange)?
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

    /// Waits for the engine's collectives in flight (reductions, prefetched gathers),
    /// before the script issues its own on another communicator.
    fn wait_collectives(&self, py: Python<'_>) -> PyResult<()> {
        detached!(self, py, e => e.wait_collectives())
    }

    /// Whether parameter `k` of module `m` stays whole on every rank.
    fn param_persistent(&self, m: usize, k: usize) -> PyResult<bool> {
        held!(self, e => e.param_persistent(m, k)).map_err(to_py)
    }

    /// Tensors over the engine's own memory for parameters `ks` of module `m`: one DLPack
    /// capsule each, shaped like its parameter, on the engine's device (`cuda:N` on a GPU),
    /// for `torch.from_dlpack`. The capsule leases the buffer, so the tensor stays valid
    /// after the engine is gone. In stage 3 a partitioned parameter's module must be
    /// fetched first (the capsule then views the gathered bucket). On a GPU, torch's use
    /// of them is ordered with the engine's writes by [`cross`](Self::cross).
    fn views<'py>(
        &self,
        py: Python<'py>,
        m: usize,
        ks: Vec<usize>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let guard = self.lock()?;
        views::capsules(py, &guard, m, &ks)
    }

    /// What this rank keeps of parameter `k` of module `m` between uses, flattened
    /// (DeepSpeed's `ds_tensor`): a DLPack capsule over the engine's memory, or `f32`
    /// bytes read from the NVMe swap file where the partition lives there.
    fn held<'py>(&self, py: Python<'py>, m: usize, k: usize) -> PyResult<Bound<'py, PyAny>> {
        let mut guard = self.lock()?;
        views::held(py, &mut guard, m, k)
    }

    /// `(address, bytes)` of every engine buffer that holds parameters now (device
    /// addresses on a GPU): each bucket's parameters, stage 3's gathered buckets, the
    /// frozen parameters.
    fn storage_ranges(&self) -> PyResult<Vec<(usize, usize)>> {
        let guard = self.lock()?;
        views::storage_ranges(&guard)
    }

    /// On a GPU: the engine's stream waits for everything torch queued on `stream` (its
    /// current stream) so far, and `stream` waits for everything the engine queued. Made
    /// around the engine's writes into the parameters torch views (before and after a
    /// step, a load, an adoption), so neither side reads memory the other is still
    /// writing. Nothing waits on the host. A no-op on the CPU.
    #[pyo3(signature = (stream=None))]
    fn cross(&self, stream: Option<u64>) -> PyResult<()> {
        let guard = self.lock()?;
        match &*guard {
            Inner::Host(_) => Ok(()),
            Inner::Cuda(e) => {
                let st = e.device().stream();
                let owner = st
                    .borrow_foreign(torch_stream(stream)?)
                    .map_err(crate::errors::device_to_py)?;
                st.crossing(&owner, |_| Ok(()))
                    .map_err(crate::errors::device_to_py)
            }
        }
    }

    /// Takes `(module, k, tensor)` values as the parameters' new values on this rank only
    /// (no collective): what the trainer wrote into a parameter itself (a
    /// `load_state_dict`, `p.data = ...`) becomes the engine's, master weights included.
    /// Tensors on the CPU.
    fn adopt_params(&self, params: Vec<(usize, usize, Bound<'_, PyAny>)>) -> PyResult<()> {
        let mut guard = self.lock()?;
        let values = views::adopted(&guard, &params)?;
        with_engine!(&mut *guard, e => e.adopt_params(&values)).map_err(to_py)
    }

    /// Puts the gradient of trainable parameter `k` of module `m` (counting trainable
    /// parameters only) into the engine: copied on its first arrival in this pass,
    /// added on later ones (always added where the engine accumulates micro-steps in
    /// place). The engine counts it; returns whether the module's gradients are now
    /// complete (the engine declared it ready: its reduction starts once its bucket is).
    #[pyo3(signature = (m, k, grad, stream=None))]
    fn put_grad(
        &self,
        py: Python<'_>,
        m: usize,
        k: usize,
        grad: Bound<'_, PyAny>,
        stream: Option<u64>,
    ) -> PyResult<bool> {
        let complete = {
            let mut guard = self.lock()?;
            let first = with_engine!(&mut *guard, e => e.begin_grad(m, k)).map_err(to_py)?;
            match &mut *guard {
                Inner::Cuda(e) => {
                    cuda_tensors::put_grad(e, m, k, &grad, first, torch_stream(stream)?)?
                }
                Inner::Host(e) => with_host_type!(self.dtype, T => {
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
                })?,
            }
            with_engine!(&mut *guard, e => e.count_grad(m, k)).map_err(to_py)?
        };
        // Declaring the module complete may start a reduction: with the GIL released, as
        // every collective (a gradient that completes nothing leaves the GIL alone).
        if complete {
            detached!(self, py, e => e.grads_ready(m))?;
        }
        Ok(complete)
    }

    /// Each trainable parameter of `modules` (used in the first forward, every use with
    /// gradients enabled) gets one gradient per backward: they are reduced as soon as they
    /// are complete from the first backward on. Nothing once the engine expects something.
    /// Returns whether it now does.
    fn predict_grads(&self, modules: Vec<usize>) -> PyResult<bool> {
        let mut guard = self.lock()?;
        with_engine!(&mut *guard, e => e.predict_grads(&modules)).map_err(to_py)
    }

    /// What the engine expects of one backward: `"unknown"`, `"predicted"` or `"learned"`.
    fn expectation(&self) -> PyResult<&'static str> {
        Ok(held!(self, e => e.expectation().name()))
    }

    /// Whether module `m`'s gradients were declared complete in the backward under way.
    fn grads_complete(&self, m: usize) -> PyResult<bool> {
        held!(self, e => e.grads_complete(m)).map_err(to_py)
    }

    /// The end of backward: the modules not yet complete are declared ready (a parameter
    /// that got no gradient counts as zero), each of `release` (the modules still
    /// gathered) released right after its declaration or after them all, and the first
    /// backward's counts become what the engine expects. Returns whether this backward
    /// was the first.
    fn end_backward(&self, py: Python<'_>, release: Vec<usize>) -> PyResult<bool> {
        detached!(self, py, e => e.end_backward(&release).map(|end| end.learned_now))
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

    /// What to multiply the loss by before backward (the loss scale over the
    /// accumulation steps).
    fn loss_scale_factor(&self) -> PyResult<f64> {
        Ok(held!(self, e => e.loss_scale_factor()))
    }

    /// The current loss scale.
    fn loss_scale(&self) -> PyResult<f64> {
        Ok(held!(self, e => e.loss_scale()))
    }

    /// The optimizer step, at the accumulation boundary.
    fn step(&self, py: Python<'_>) -> PyResult<StepOutcome> {
        let out = detached!(self, py, e => e.step())?;
        Ok(StepOutcome::from(&out))
    }

    /// DeepSpeed's `engine.micro_steps`: `step()` calls so far (less those of windows
    /// `zero_grad` discarded).
    fn micro_steps(&self) -> PyResult<u64> {
        Ok(held!(self, e => e.micro_steps()))
    }

    /// Passes (backwards) since the last `step()` call.
    fn passes_since_step(&self) -> PyResult<u64> {
        Ok(held!(self, e => e.passes_since_step()))
    }

    /// DeepSpeed's `set_gradient_accumulation_boundary`: holds until declared again, and
    /// reaches the reductions at the next `backward()`.
    fn declare_boundary(&self, boundary: bool) -> PyResult<()> {
        let mut guard = self.lock()?;
        with_engine!(&mut *guard, e => e.declare_boundary(boundary));
        Ok(())
    }

    /// DeepSpeed's `is_gradient_accumulation_boundary`.
    fn is_gradient_accumulation_boundary(&self) -> PyResult<bool> {
        Ok(held!(self, e => e.is_gradient_accumulation_boundary()))
    }

    /// The front-end's `backward()` begins: a declared boundary applies to its pass.
    fn backward_call(&self, py: Python<'_>) -> PyResult<()> {
        detached!(self, py, e => e.backward_call())
    }

    /// A backward of this engine begins: a second one before `step()` adds to the first's
    /// gradients (the micro-step is reopened).
    fn begin_pass(&self, py: Python<'_>) -> PyResult<()> {
        detached!(self, py, e => e.begin_pass())
    }

    /// The front-end's `step()`: counts a micro-step; whether the optimizer steps now.
    fn step_call(&self, py: Python<'_>) -> PyResult<bool> {
        detached!(self, py, e => e.step_call())
    }

    /// The number of optimizer parameter groups.
    fn group_count(&self) -> PyResult<usize> {
        Ok(held!(self, e => e.group_count()))
    }

    /// Sets parameter group `g`'s hyper-parameters for the next steps (`lr` is the
    /// group's base LR; a config scheduler starts from it).
    #[pyo3(signature = (g, lr, beta1, beta2, eps, weight_decay, decoupled, bias_correction))]
    #[allow(clippy::too_many_arguments)]
    fn set_group(
        &self,
        g: usize,
        lr: f64,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
        bias_correction: bool,
    ) -> PyResult<()> {
        let cfg = AdamConfig {
            lr: lr as f32,
            beta1,
            beta2,
            eps,
            weight_decay,
            decay: if decoupled {
                WeightDecay::Decoupled
            } else {
                WeightDecay::L2
            },
            bias_correction,
        };
        let mut guard = self.lock()?;
        with_engine!(&mut *guard, e => e.set_group(g, cfg).and_then(|()| e.set_group_lr(g, lr)))
            .map_err(to_py)
    }

    /// Sets parameter group `g`'s base LR (in full precision), keeping its other
    /// hyper-parameters: what an external optimizer's schedule starts from.
    fn set_group_lr(&self, g: usize, lr: f64) -> PyResult<()> {
        let mut guard = self.lock()?;
        with_engine!(&mut *guard, e => e.set_group_lr(g, lr)).map_err(to_py)
    }

    /// The LR each parameter group's next step uses.
    fn group_lrs(&self) -> PyResult<Vec<f64>> {
        Ok(held!(self, e => e.group_lrs()))
    }

    /// The first half of a step for an optimizer zero does not run itself: `None` when
    /// the step goes on (read each group with `external_read`, then
    /// `step_external_finish`), else the skipped step's outcome.
    fn step_external_begin(&self, py: Python<'_>) -> PyResult<Option<StepOutcome>> {
        let out = detached!(self, py, e => e.step_external_begin())?;
        Ok(out.as_ref().map(StepOutcome::from))
    }

    /// Elements of parameter group `g` this rank steps.
    fn external_group_len(&self, g: usize) -> PyResult<usize> {
        Ok(held!(self, e => e.external_group_len(g)))
    }

    /// Where each parameter of group `g` lies in the group's shard, in shard order.
    fn external_group_pieces(&self, g: usize) -> PyResult<Vec<ExternalPiece>> {
        let pieces = held!(self, e => e.external_group_pieces(g)).map_err(to_py)?;
        Ok(pieces.iter().map(ExternalPiece::from).collect())
    }

    /// Copies parameter group `g`'s master weights (`what="master"`), the engine's Adam
    /// moments (`"exp_avg"`, `"exp_avg_sq"`) or, during an external step, its unscaled,
    /// clipped gradients (`"grad"`) into the float32 CPU tensor `out`.
    fn external_read(&self, g: usize, what: &str, out: Bound<'_, PyAny>) -> PyResult<()> {
        let kind = match what {
            "master" => ExternalArray::Master,
            "grad" => ExternalArray::Grad,
            "exp_avg" => ExternalArray::ExpAvg,
            "exp_avg_sq" => ExternalArray::ExpAvgSq,
            other => {
                return Err(PyValueError::new_err(format!(
                    "external_read reads \"master\", \"grad\", \"exp_avg\" or \"exp_avg_sq\", not {other:?}"
                )))
            }
        };
        let n = held!(self, e => e.external_group_len(g));
        let mut vals = vec![0f32; n];
        let mut guard = self.lock()?;
        with_engine!(&mut *guard, e => e.external_read(g, kind, &mut vals)).map_err(to_py)?;
        write::<f32>(&out, &vals)
    }

    /// The second half of an external step: each group's new master weights (float32
    /// tensors, as read).
    fn step_external_finish<'py>(
        &self,
        py: Python<'py>,
        masters: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<StepOutcome> {
        let vals = masters
            .iter()
            .map(tensors::read_f32)
            .collect::<PyResult<Vec<_>>>()?;
        let refs: Vec<&[f32]> = vals.iter().map(|v| &v[..]).collect();
        let out = detached!(self, py, e => e.step_external_finish(&refs))?;
        Ok(StepOutcome::from(&out))
    }

    /// Gives up a begun external step: nothing changes, the step is not counted.
    fn step_external_abort(&self, py: Python<'_>) -> PyResult<()> {
        detached!(self, py, e => e.step_external_abort())
    }

    /// Takes a run's training state read from another framework's checkpoint (every
    /// rank the same): `params` maps each parameter's name to `(master, exp_avg,
    /// exp_avg_sq)` float tensors of its whole size (moments may be `None`).
    #[pyo3(signature = (params, optimizer_steps, skipped_steps, global_steps, loss_scale=None, lr_last_batch_iteration=None, strict=true))]
    #[allow(clippy::too_many_arguments)]
    fn import_state(
        &self,
        py: Python<'_>,
        params: Vec<ImportedTensors<'_>>,
        optimizer_steps: u64,
        skipped_steps: u64,
        global_steps: u64,
        loss_scale: Option<LossScaleState>,
        lr_last_batch_iteration: Option<i64>,
        strict: bool,
    ) -> PyResult<()> {
        let mut state = ImportedState {
            optimizer_steps,
            skipped_steps,
            global_steps,
            loss_scaler: loss_scale.map(|(scale, dynamic)| ScalerState {
                scale,
                dynamic: dynamic.map(|(cur_iter, last_overflow_iter, cur_hysteresis)| {
                    DynamicState {
                        cur_iter,
                        last_overflow_iter,
                        cur_hysteresis,
                    }
                }),
            }),
            lr_last_batch_iteration,
            strict,
            ..Default::default()
        };
        for (name, master, m, v) in params {
            let moments = match (m, v) {
                (Some(m), Some(v)) => Some((tensors::read_f32(&m)?, tensors::read_f32(&v)?)),
                _ => None,
            };
            state.params.insert(
                name,
                ImportedParam {
                    master: tensors::read_f32(&master)?,
                    moments,
                },
            );
        }
        detached!(self, py, e => e.import_state(&state))
    }

    /// Discards the gradients of the current step (a collective), and the window's
    /// counters (`micro_steps` back at the window's start, no pass since `step()`).
    fn zero_grad(&self, py: Python<'_>) -> PyResult<()> {
        detached!(self, py, e => e.zero_grad())
    }

    /// The learning rate of the next step.
    fn lr(&self) -> PyResult<f64> {
        Ok(held!(self, e => e.lr()))
    }

    /// The step counters.
    fn step_counts(&self) -> PyResult<StepCounts> {
        let (optimizer_steps, skipped_steps, global_steps) = held!(self, e => e.step_counts());
        Ok(StepCounts {
            optimizer_steps,
            skipped_steps,
            global_steps,
        })
    }

    /// The engine's memory report: bytes per category on this rank.
    fn memory_report(&self) -> PyResult<MemoryReport> {
        Ok(held!(self, e => MemoryReport::from(&e.memory_report())))
    }

    /// Elements this rank sent in the last step, by purpose, and the theory.
    fn comm_report(&self) -> PyResult<CommReport> {
        let r = held!(self, e => e.comm_report());
        Ok(CommReport {
            grad_reduce: r.last_step.grad_reduce,
            param_gather: r.last_step.param_gather,
            control: r.last_step.control,
            theory: r.theory,
            intra_node: r.last_step_tiers.intra_node.grad_reduce
                + r.last_step_tiers.intra_node.param_gather,
            inter_node: r.last_step_tiers.inter_node.grad_reduce
                + r.last_step_tiers.inter_node.param_gather,
            theory_intra_node: r.theory_intra_node,
            theory_inter_node: r.theory_inter_node,
        })
    }

    /// Saves a checkpoint (every rank calls it); returns the tag. With
    /// `exclude_frozen_parameters`, frozen parameters are left out of it.
    #[pyo3(signature = (save_dir, tag=None, client_state_json="{}".to_string(), exclude_frozen_parameters=false))]
    fn save_checkpoint(
        &self,
        py: Python<'_>,
        save_dir: PathBuf,
        tag: Option<String>,
        client_state_json: String,
        exclude_frozen_parameters: bool,
    ) -> PyResult<String> {
        let client: serde_json::Value = serde_json::from_str(&client_state_json)
            .map_err(|e| PyValueError::new_err(format!("client_state is not JSON: {e}")))?;
        let options = zero_runtime::SaveOptions {
            exclude_frozen_parameters,
        };
        detached!(self, py, e => e.save_checkpoint_with(&save_dir, tag.as_deref(), client, options))
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

    /// Loads the Hugging Face checkpoint in `path` (every rank calls it; each reads only
    /// the byte ranges of what it holds): its tensors by Hugging Face's names (`prefix`:
    /// the model's base prefix, either way). With `strict`, every parameter must be there
    /// and every other tensor in `ignore` (the model's buffers). Returns what this rank
    /// read and the tensors no parameter took.
    /// `round_to` (`"bf16"`, `"fp16"`; `"fp32"` changes nothing): the values are rounded
    /// to that dtype before they become master weights (the dtype of the model they load
    /// into).
    #[pyo3(signature = (path, strict=true, prefix=None, ignore=Vec::new(), round_to=None))]
    fn load_hf_checkpoint(
        &self,
        py: Python<'_>,
        path: PathBuf,
        strict: bool,
        prefix: Option<String>,
        ignore: Vec<String>,
        round_to: Option<String>,
    ) -> PyResult<HfLoad> {
        let round_to = round_to
            .map(|name| {
                zero_runtime::checkpoint::export::parse_dtype_arg(&name).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "load_hf_checkpoint: round_to {name:?}: the values round to bf16, fp16 or fp32"
                    ))
                })
            })
            .transpose()?;
        let options = zero_runtime::HfLoadOptions {
            strict,
            prefix,
            ignore,
            round_to,
        };
        let (stats, left) = detached!(self, py, e => e.load_hf_checkpoint(&path, &options))?;
        Ok(HfLoad {
            requested: stats.requested,
            read: stats.read,
            files: stats.files,
            seconds: stats.elapsed.as_secs_f64(),
            left,
        })
    }

    /// Writes the 16-bit model as Hugging Face safetensors into `save_dir` (rank 0 writes;
    /// every rank calls it); returns the files written.
    fn save_16bit_model(&self, py: Python<'_>, save_dir: PathBuf) -> PyResult<Vec<String>> {
        let files = detached!(self, py, e => e.save_16bit_model(&save_dir))?;
        Ok(files.iter().map(|f| f.path.display().to_string()).collect())
    }

    /// Writes the weights as Hugging Face safetensors shards of at most `max_shard_bytes`
    /// into `save_dir`, in `dtype` ("fp32", "bf16", "fp16"; every rank calls it and writes
    /// its share of the shards, rank 0 the index); returns the files this rank wrote.
    fn save_hf_weights(
        &self,
        py: Python<'_>,
        save_dir: PathBuf,
        max_shard_bytes: u64,
        dtype: &str,
    ) -> PyResult<Vec<String>> {
        let dtype = zero_runtime::checkpoint::export::parse_dtype_arg(dtype).ok_or_else(|| {
            PyValueError::new_err(format!(
                "dtype {dtype:?}: the weights are saved as fp32, bf16 or fp16"
            ))
        })?;
        let files = detached!(self, py, e => e.save_hf_weights(&save_dir, max_shard_bytes, dtype))?;
        Ok(files.iter().map(|f| f.path.display().to_string()).collect())
    }
}

/// The job as the launcher describes it (torchrun, deepspeed, srun, mpirun; a world of
/// one without one), as `init_distributed` needs it to start torch's process group under
/// any launcher.
#[pyfunction]
pub fn launch_info() -> PyResult<LaunchInfo> {
    Ok(LaunchInfo::from(&start::launch_env()?))
}
