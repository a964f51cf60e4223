//! Joining the job and building this rank's engine: on the CPU over the shared-memory group
//! and, for ranks on several machines, torch's gloo group between them
//! (`Engine<CpuComm, HostDevice>`), or on the process's GPU over NCCL
//! (`Engine<NcclComm, CudaDevice>`). Every rank starts from rank 0's initial values:
//! `initialize` broadcast the model over torch's group, as DeepSpeed does, and the engine
//! reads each rank's tensors.

use crate::errors::{comm_to_py, device_to_py, to_py, ZeroError};
use crate::exchange::PyExchange;
use crate::relay::PyRelay;
use crate::tensors;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::time::Duration;
use zero_comm::launch::LaunchEnv;
use zero_comm::nccl::NcclComm;
use zero_comm::{CommError, Communicator, CpuComm, RelayComm, ShmGroup};
use zero_runtime::{CudaDevice, Engine, HostDevice, ModuleSpec, ParamSpec, ZeroConfig};

/// The CPU engine: one process per rank, over shared memory on one machine and torch's
/// gloo group between machines.
pub type HostEngine = Engine<CpuComm, HostDevice>;
/// The GPU engine: one process per rank and GPU over NCCL, on torch's CUDA tensors.
pub type CudaEngine = Engine<NcclComm, CudaDevice>;

/// This rank's engine, on the device the model lives on.
pub enum Inner {
    /// Host buffers, CPU tensors.
    Host(HostEngine),
    /// GPU buffers, CUDA tensors.
    Cuda(CudaEngine),
}

/// One module as Python registers it: its name and its parameters' names, shapes,
/// whether each is trained, the other full names of each (tied weights), and its
/// optimizer parameter group.
pub type ModuleArg = (String, Vec<(String, Vec<usize>, bool, Vec<String>, usize)>);

/// The launcher's description of this process, or a world of one.
pub fn launch_env() -> PyResult<LaunchEnv> {
    if LaunchEnv::launched() {
        return LaunchEnv::from_env().map_err(|e| crate::errors::CommError::new_err(e.to_string()));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ZeroError::new_err(format!("finding a free port for a world of one: {e}")))?;
    Ok(LaunchEnv::local(0, 1, port))
}

/// The engine's modules, and where every parameter's initial value comes from (in
/// registration order): a CPU tensor, whatever the device, or a callable returning one
/// when the engine reaches that parameter (zero.Init's unit-by-unit fill), or `None` (the
/// parameter stays zero: a checkpoint loaded right after the build fills it).
pub struct Model<'a, 'py> {
    specs: Vec<ModuleSpec>,
    tensors: Vec<&'a Bound<'py, PyAny>>,
}

impl<'a, 'py> Model<'a, 'py> {
    /// Reads the modules Python registered, and checks each initial value's size.
    pub fn read(modules: Vec<ModuleArg>, values: &'a [Vec<Bound<'py, PyAny>>]) -> PyResult<Self> {
        same_count(modules.len(), values.len(), || {
            format!(
                "{} modules but initial values for {}",
                modules.len(),
                values.len()
            )
        })?;
        let mut specs = Vec::with_capacity(modules.len());
        let mut tensors = Vec::new();
        for ((name, params), vals) in modules.into_iter().zip(values) {
            same_count(params.len(), vals.len(), || {
                format!(
                    "module `{name}`: {} parameters but {} initial values",
                    params.len(),
                    vals.len()
                )
            })?;
            let mut ps = Vec::with_capacity(params.len());
            for ((pname, shape, trainable, aliases, group), t) in params.into_iter().zip(vals) {
                let numel: usize = shape.iter().product();
                if !t.is_callable() {
                    let have = tensors::numel(t)?;
                    same_count(numel, have, || {
                        format!("{name}.{pname}: shape {shape:?} but {have} values")
                    })?;
                }
                tensors.push(t);
                let spec = if trainable {
                    ParamSpec::new(pname, &shape)
                } else {
                    ParamSpec::frozen(pname, &shape)
                };
                ps.push(spec.with_aliases(aliases).in_group(group));
            }
            specs.push(ModuleSpec::new(name, ps));
        }
        Ok(Model { specs, tensors })
    }

    /// The engine over `comm` and `dev`, every parameter set from its tensor: each is read
    /// straight into the engine's buffers (one parameter widened at a time, no staging copy
    /// of the model), with the GIL held. Every rank's tensors already hold rank 0's values:
    /// `initialize` broadcast the model over torch's group, as DeepSpeed does.
    fn build<C, D>(self, cfg: ZeroConfig, comm: C, dev: D) -> PyResult<Engine<C, D>>
    where
        C: Communicator + Send,
        D: zero_runtime::Device<Buffer = C::Buffer>,
    {
        let Model { specs, tensors } = self;
        let mut failed: Option<PyErr> = None;
        let engine = Engine::new(cfg, specs, comm, dev, |id, spec, out| {
            if failed.is_none() {
                if let Err(e) = read_initial(tensors[id], spec, out) {
                    failed = Some(e);
                }
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        engine.map_err(to_py)
    }
}

/// One parameter's initial value into `out`: the tensor's, or what the callable returns
/// (nothing for `None`: `out` stays zero).
fn read_initial(source: &Bound<'_, PyAny>, spec: &ParamSpec, out: &mut [f32]) -> PyResult<()> {
    if !source.is_callable() {
        return tensors::read_f32_into(source, out);
    }
    let value = source.call0()?;
    if value.is_none() {
        return Ok(());
    }
    let have = tensors::numel(&value)?;
    same_count(out.len(), have, || {
        format!(
            "the fill of `{}` gave {have} values for shape {:?}",
            spec.name, spec.shape
        )
    })?;
    tensors::read_f32_into(&value, out)
}

/// A `ValueError` with `message` unless `a == b`.
fn same_count(a: usize, b: usize, message: impl FnOnce() -> String) -> PyResult<()> {
    if a == b {
        Ok(())
    } else {
        Err(PyValueError::new_err(message()))
    }
}

fn read_config(config_json: &str, world: usize) -> PyResult<ZeroConfig> {
    ZeroConfig::from_json_str(config_json, world)
        .map_err(|e| crate::errors::ConfigError::new_err(e.to_string()))
}

/// Ranks on several machines: which machine each rank is on (ranks with the same number
/// share one), and the relay between them (torch's gloo group).
pub struct Machines {
    /// Every rank's machine, by rank.
    pub of_rank: Vec<usize>,
    /// This rank's relay over every rank.
    pub relay: PyRelay,
}

/// Joins the job on the CPU and builds the host engine. On one machine (`machines` is
/// `None`) every rank joins one shared-memory group, handed out through `exchange`
/// (torch's store), else zero's rendezvous. On several, each machine's ranks join their
/// own (`exchange` is this machine's), and the relay carries what crosses machines.
pub fn host(
    py: Python<'_>,
    env: &LaunchEnv,
    config_json: &str,
    model: Model<'_, '_>,
    timeout: Duration,
    exchange: Option<PyExchange>,
    machines: Option<Machines>,
) -> PyResult<Inner> {
    let comm = py
        .detach(|| match (machines, exchange) {
            (None, Some(mut via)) => ShmGroup::init_with(env, timeout, &mut via).map(CpuComm::Shm),
            (None, None) => ShmGroup::init(env, timeout).map(CpuComm::Shm),
            (Some(m), Some(mut via)) => {
                let here = on_machine(env, &m.of_rank)?;
                let shm = ShmGroup::init_with(&here, timeout, &mut via)?;
                CpuComm::spanning(RelayComm::new(Box::new(m.relay)), shm, m.of_rank)
            }
            (Some(_), None) => Err(CommError::InvalidArgument {
                rank: env.rank,
                op: "start-up over several machines".into(),
                reason: "each machine's shared-memory group needs an id exchange (torch's store)"
                    .into(),
            }),
        })
        .map_err(comm_to_py)?;
    let mut cfg = read_config(config_json, comm.world_size())?;
    cfg.ranks_per_node = env.local_world_size;
    Ok(Inner::Host(model.build(cfg, comm, HostDevice)?))
}

/// `env` narrowed to this rank's machine: its place among the machine's ranks (in rank
/// order) and their number.
fn on_machine(env: &LaunchEnv, of_rank: &[usize]) -> Result<LaunchEnv, CommError> {
    of_rank
        .get(env.rank)
        .ok_or_else(|| CommError::InvalidArgument {
            rank: env.rank,
            op: "start-up over several machines".into(),
            reason: format!(
                "machines named for {} ranks in a world of {}",
                of_rank.len(),
                env.world_size
            ),
        })?;
    let here = zero_comm::machine_ranks(of_rank, env.rank);
    let mut narrowed = env.clone();
    narrowed.rank = here.iter().position(|&r| r == env.rank).unwrap_or(0);
    narrowed.world_size = here.len();
    Ok(narrowed)
}

/// Where a `NativeEngine` trains, from its `device` argument: `"cpu"`, `"cuda"` (the GPU
/// the launcher's local rank picks: the one visible, else the local rank's) or
/// `"cuda:N"` (device `N`: the one torch's model is on, so Python and Rust use one GPU).
pub enum Placement {
    /// The host engine.
    Cpu,
    /// The GPU engine on device `Some(N)`, or the local rank's.
    Cuda(Option<usize>),
}

impl Placement {
    /// Reads `device`; anything else is a `ValueError` naming it.
    pub fn parse(device: &str) -> PyResult<Self> {
        let bad = || {
            PyValueError::new_err(format!(
                "device {device:?}: zero trains on \"cpu\", \"cuda\" or \"cuda:N\""
            ))
        };
        match device.split_once(':') {
            None if device == "cpu" => Ok(Placement::Cpu),
            None if device == "cuda" => Ok(Placement::Cuda(None)),
            Some(("cuda", n)) => n
                .parse()
                .map(|n| Placement::Cuda(Some(n)))
                .map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

/// Joins the job on this process's GPU (`ordinal`, else the one visible, else the local
/// rank's) over NCCL and builds the GPU engine; NCCL's unique id is handed out through
/// `exchange` (torch's store), else zero's rendezvous.
pub fn cuda(
    py: Python<'_>,
    env: &LaunchEnv,
    config_json: &str,
    model: Model<'_, '_>,
    timeout: Duration,
    ordinal: Option<usize>,
    exchange: Option<PyExchange>,
) -> PyResult<Inner> {
    // The GPU first: no driver (or no GPU) is a DeviceError naming it, before NCCL, which
    // then uses the GPU opened here.
    match ordinal {
        Some(n) => zero_kernels::cuda::Gpu::open_ordinal(n),
        None => zero_kernels::cuda::Gpu::open(Some(env.local_rank)),
    }
    .map_err(device_to_py)?;
    // Two allocators share the GPU: when one of zero's allocations finds it full, torch's
    // caching allocator gives back what it keeps unused, and the allocation is tried again.
    zero_kernels::cuda::set_out_of_memory_hook(Some(std::sync::Arc::new(|| {
        Python::attach(|py| {
            let released = py
                .import("torch.cuda")
                .and_then(|cuda| cuda.call_method0("empty_cache"));
            if let Err(e) = released {
                eprintln!("zero: torch.cuda.empty_cache() failed: {e}");
            }
        })
    })));
    let comm = py
        .detach(|| match exchange {
            Some(mut via) => NcclComm::init_with(env, timeout, &mut via),
            None => NcclComm::init(env, timeout),
        })
        .map_err(comm_to_py)?;
    let mut cfg = read_config(config_json, comm.world_size())?;
    cfg.ranks_per_node = env.local_world_size;
    let dev = CudaDevice::new().map_err(to_py)?;
    Ok(Inner::Cuda(model.build(cfg, comm, dev)?))
}
