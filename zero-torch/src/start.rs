//! Joining the job and building this rank's engine: on the CPU over the shared-memory group
//! (`Engine<ShmComm, HostDevice>`), or on the process's GPU over NCCL
//! (`Engine<NcclComm, CudaDevice>`). Every rank starts from rank 0's initial values, as
//! DeepSpeed broadcasts the model.

use crate::errors::{comm_to_py, device_to_py, to_py, ZeroError};
use crate::tensors;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::time::Duration;
use zero_comm::launch::LaunchEnv;
use zero_comm::nccl::NcclComm;
use zero_comm::{Communicator, Completion, HostBuffer, ShmComm, ShmGroup};
use zero_runtime::{CudaDevice, Engine, HostDevice, ModuleSpec, ParamSpec, ZeroConfig};

/// The CPU engine: one process per rank over shared memory.
pub type HostEngine = Engine<ShmComm, HostDevice>;
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

/// The launcher's description of this process, or a world of one; `port` (chosen by
/// rank 0 and handed to every rank through torch's process group) replaces the
/// rendezvous port the launcher's variables imply, so zero's rendezvous never meets
/// torch's store on `MASTER_PORT`.
pub fn launch_env_at(port: Option<u16>) -> PyResult<LaunchEnv> {
    let mut env = launch_env()?;
    if let Some(p) = port {
        env.port = p;
    }
    Ok(env)
}

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

/// The engine's modules, and every parameter's initial value (rank 0's tensors on the
/// host, widened to `f32`) with where each starts.
pub struct Model {
    specs: Vec<ModuleSpec>,
    init: Vec<f32>,
    starts: Vec<usize>,
}

impl Model {
    /// Reads the modules Python registered and their initial values (CPU tensors).
    pub fn read(modules: Vec<ModuleArg>, values: &[Vec<Bound<'_, PyAny>>]) -> PyResult<Self> {
        same_count(modules.len(), values.len(), || {
            format!(
                "{} modules but initial values for {}",
                modules.len(),
                values.len()
            )
        })?;
        let mut specs = Vec::with_capacity(modules.len());
        let mut init: Vec<f32> = Vec::new();
        let mut starts = Vec::new();
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
                let v = tensors::read_f32(t)?;
                let numel: usize = shape.iter().product();
                same_count(numel, v.len(), || {
                    format!("{name}.{pname}: shape {shape:?} but {} values", v.len())
                })?;
                starts.push(init.len());
                init.extend_from_slice(&v);
                let spec = if trainable {
                    ParamSpec::new(pname, &shape)
                } else {
                    ParamSpec::frozen(pname, &shape)
                };
                ps.push(spec.with_aliases(aliases).in_group(group));
            }
            specs.push(ModuleSpec::new(name, ps));
        }
        Ok(Model {
            specs,
            init,
            starts,
        })
    }

    /// The engine over `comm` and `dev`, every parameter set from `init`.
    fn build<C, D>(self, py: Python<'_>, cfg: ZeroConfig, comm: C, dev: D) -> PyResult<Engine<C, D>>
    where
        C: Communicator + Send,
        D: zero_runtime::Device<Buffer = C::Buffer>,
    {
        let Model {
            specs,
            init,
            starts,
        } = self;
        py.detach(move || {
            Engine::new(cfg, specs, comm, dev, |id, spec, out| {
                let at = starts[id];
                out.copy_from_slice(&init[at..at + spec.numel()]);
            })
        })
        .map_err(to_py)
    }
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

/// Joins the job on the CPU and builds the host engine.
pub fn host(
    py: Python<'_>,
    env: &LaunchEnv,
    config_json: &str,
    mut model: Model,
    timeout: Duration,
) -> PyResult<Inner> {
    let comm = py
        .detach(|| ShmGroup::init(env, timeout))
        .map_err(comm_to_py)?;
    let cfg = read_config(config_json, comm.world_size())?;
    let comm = from_rank0(py, comm, &mut model, |comm, init| {
        comm.broadcast(HostBuffer::from(init), 0)
            .and_then(|w| w.wait())
            .map_err(comm_to_py)?
            .into_f32()
            .ok_or_else(|| ZeroError::new_err("the broadcast of initial values changed dtype"))
    })?;
    Ok(Inner::Host(model.build(py, cfg, comm, HostDevice)?))
}

/// Joins the job on this process's GPU (the one visible, else the local rank's) over NCCL
/// and builds the GPU engine.
pub fn cuda(
    py: Python<'_>,
    env: &LaunchEnv,
    config_json: &str,
    mut model: Model,
    timeout: Duration,
) -> PyResult<Inner> {
    // The GPU first: no driver (or no GPU) is a DeviceError naming it, before NCCL.
    zero_kernels::cuda::Gpu::open(Some(env.local_rank)).map_err(device_to_py)?;
    let comm = py
        .detach(|| NcclComm::init(env, timeout))
        .map_err(comm_to_py)?;
    let cfg = read_config(config_json, comm.world_size())?;
    let comm = from_rank0(py, comm, &mut model, |comm, init| {
        broadcast_on_gpu(comm, &init)
    })?;
    let dev = CudaDevice::new().map_err(to_py)?;
    Ok(Inner::Cuda(model.build(py, cfg, comm, dev)?))
}

/// Every rank takes rank 0's initial values, moved by `bcast` over `comm` with the GIL
/// released (nothing to do at world size 1).
fn from_rank0<C: Communicator + Send>(
    py: Python<'_>,
    comm: C,
    model: &mut Model,
    bcast: impl FnOnce(&C, Vec<f32>) -> PyResult<Vec<f32>> + Send,
) -> PyResult<C> {
    if comm.world_size() == 1 {
        return Ok(comm);
    }
    let init = std::mem::take(&mut model.init);
    let (comm, got) = py.detach(move || {
        let got = bcast(&comm, init);
        (comm, got)
    });
    model.init = got?;
    Ok(comm)
}

/// Rank 0's `init` on every rank, through a device buffer on the communicator's stream.
fn broadcast_on_gpu(comm: &NcclComm, init: &[f32]) -> PyResult<Vec<f32>> {
    let st = comm.stream();
    let buf = st.upload(init).map_err(device_to_py)?;
    let out = comm
        .broadcast(buf, 0)
        .and_then(|w| w.wait())
        .map_err(comm_to_py)?;
    st.download(&out, 0..init.len()).map_err(device_to_py)
}
