//! What the native calls return, as typed, immutable Python objects (issue 49, item 3):
//! each a `#[pyclass(frozen, get_all)]` whose fields are the attributes Python reads, with
//! `as_dict()` for the public API's dicts and a Python-style `repr`. `_native.pyi` declares each one, and
//! `test_native_stub.py` checks its attributes against these fields.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Declares a result class: the struct, frozen with every field readable from Python,
/// `as_dict()` (the fields by name) and a `repr` that shows them as Python values.
macro_rules! result_class {
    (
        $(#[$doc:meta])*
        $name:ident {
            $( $(#[$fdoc:meta])* $field:ident : $ty:ty, )*
        }
    ) => {
        $(#[$doc])*
        #[pyclass(frozen, get_all, module = "zero_torch._native")]
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name {
            $( $(#[$fdoc])* pub $field: $ty, )*
        }

        #[pymethods]
        impl $name {
            /// The fields as a dict, by name.
            fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let d = PyDict::new(py);
                $( d.set_item(stringify!($field), self.$field.clone())?; )*
                Ok(d)
            }

            /// `Name(field=value, ...)`, each value as Python shows it.
            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                let fields: Vec<String> = vec![$(
                    format!(
                        "{}={}",
                        stringify!($field),
                        self.$field.clone().into_pyobject(py)?.repr()?
                    ),
                )*];
                Ok(format!("{}({})", stringify!($name), fields.join(", ")))
            }
        }
    };
}
pub(crate) use result_class;

result_class! {
    /// What an optimizer step (or an external step's begin or finish) did.
    StepOutcome {
        /// Whether the step was skipped (a gradient was not finite).
        skipped: bool,
        /// The unscaled global gradient norm before clipping (NaN when skipped).
        grad_norm: f64,
        /// The loss scale the gradients carried.
        loss_scale: f64,
        /// The learning rate used (or that would have been).
        lr: f64,
    }
}

impl From<&zero_runtime::StepOutcome> for StepOutcome {
    fn from(out: &zero_runtime::StepOutcome) -> Self {
        Self {
            skipped: out.skipped,
            grad_norm: out.grad_norm,
            loss_scale: out.loss_scale,
            lr: out.lr,
        }
    }
}

result_class! {
    /// The engine's step counters.
    StepCounts {
        /// Optimizer steps applied.
        optimizer_steps: u64,
        /// Steps skipped (fp16 overflow).
        skipped_steps: u64,
        /// DeepSpeed's `global_steps`: every step, applied or skipped.
        global_steps: u64,
    }
}

result_class! {
    /// Bytes this rank holds, by kind (`Engine::memory_report`; what each means:
    /// `ZeroEngine.memory_report`).
    MemoryReport {
        /// 16-bit (or training-dtype) parameters the engine holds.
        params: usize,
        /// Gradient buffers.
        grads: usize,
        /// fp32 master weights kept apart from the parameters.
        master: usize,
        /// Adam's first moment.
        exp_avg: usize,
        /// Adam's second moment.
        exp_avg_sq: usize,
        /// Gradient accumulators.
        grad_accum: usize,
        /// Reduction and gather staging.
        buckets: usize,
        /// Parameters gathered now (stage 3).
        gathered: usize,
        /// The most gathered at once.
        peak_gathered: usize,
        /// Frozen parameters.
        frozen: usize,
        /// Gradient bytes handed back to the kernel since the last step.
        released: usize,
        /// Offloaded state in host memory.
        host: usize,
        /// The shared-memory group's windows.
        comm: usize,
        /// Params, gradients and optimizer state together.
        model_states: usize,
        /// The paper's formula for `model_states`.
        formula: usize,
        /// Elements of the model (Ψ).
        numel: usize,
        /// Elements with the partitions' padding (Ψ').
        padded_numel: usize,
        /// The engine's device categories, summed.
        device_total: usize,
        /// What the device's allocator counts in use (0 on the CPU).
        allocator_used: usize,
        /// The allocator's high-water mark (0 on the CPU).
        allocator_peak: usize,
        /// The engine's bound on its peak device memory.
        device_bound: usize,
    }
}

impl From<&zero_runtime::MemoryReport> for MemoryReport {
    fn from(r: &zero_runtime::MemoryReport) -> Self {
        Self {
            params: r.params,
            grads: r.grads,
            master: r.master,
            exp_avg: r.exp_avg,
            exp_avg_sq: r.exp_avg_sq,
            grad_accum: r.grad_accum,
            buckets: r.buckets,
            gathered: r.gathered,
            peak_gathered: r.peak_gathered,
            frozen: r.frozen,
            released: r.released,
            host: r.host.total(),
            comm: r.comm,
            model_states: r.model_states(),
            formula: r.formula,
            numel: r.numel,
            padded_numel: r.padded_numel,
            device_total: r.device_total(),
            allocator_used: r.allocator_used.unwrap_or(0),
            allocator_peak: r.allocator_peak.unwrap_or(0),
            device_bound: r.device_bound,
        }
    }
}

result_class! {
    /// Elements this rank sent in the last step, by purpose, and the theory's count.
    CommReport {
        /// Gradient reductions (reduce-scatter or all-reduce).
        grad_reduce: u64,
        /// Parameter all-gathers.
        param_gather: u64,
        /// Small control collectives (overflow flags, norms).
        control: u64,
        /// The paper's elements per step for this stage.
        theory: u64,
        /// Of the gradient reductions and parameter gathers, what went over groups inside
        /// one node (shard groups, hpZ) and across nodes (the launcher's
        /// `LOCAL_WORLD_SIZE` says where nodes end).
        intra_node: u64,
        /// ... and across nodes.
        inter_node: u64,
        /// `theory`'s intra-node part.
        theory_intra_node: u64,
        /// `theory`'s inter-node part.
        theory_inter_node: u64,
    }
}

result_class! {
    /// What `load_hf_checkpoint` read on this rank, and the tensors no parameter took.
    HfLoad {
        /// Bytes of the ranges asked for.
        requested: u64,
        /// Bytes read.
        read: u64,
        /// Files opened.
        files: usize,
        /// Seconds it took.
        seconds: f64,
        /// The checkpoint's tensors no parameter took (the model's buffers, with `strict`).
        left: Vec<String>,
    }
}

result_class! {
    /// One parameter's stretch of an external optimizer's shard: its elements
    /// `element_start..element_end` lie at `shard_start..shard_end` of the group's shard.
    ExternalPiece {
        /// The module, in the engine's order.
        module: usize,
        /// The parameter's index in its module.
        param: usize,
        /// Where the stretch starts in the shard.
        shard_start: usize,
        /// Where it ends in the shard.
        shard_end: usize,
        /// Its first element in the parameter.
        element_start: usize,
        /// One past its last element in the parameter.
        element_end: usize,
    }
}

impl From<&zero_runtime::ExternalPiece> for ExternalPiece {
    fn from(p: &zero_runtime::ExternalPiece) -> Self {
        Self {
            module: p.module,
            param: p.param,
            shard_start: p.shard.start,
            shard_end: p.shard.end,
            element_start: p.elements.start,
            element_end: p.elements.end,
        }
    }
}

result_class! {
    /// The job as the launcher describes it (torchrun, deepspeed, srun, mpirun; a world of
    /// one without one).
    LaunchInfo {
        /// This process's rank.
        rank: usize,
        /// The number of ranks.
        world_size: usize,
        /// The rank on this machine.
        local_rank: usize,
        /// Ranks on this machine, where the launcher says.
        local_world_size: Option<usize>,
        /// Rank 0's host.
        master_addr: String,
    }
}

impl From<&zero_runtime::comm::launch::LaunchEnv> for LaunchInfo {
    fn from(env: &zero_runtime::comm::launch::LaunchEnv) -> Self {
        Self {
            rank: env.rank,
            world_size: env.world_size,
            local_rank: env.local_rank,
            local_world_size: env.local_world_size,
            master_addr: env.master_addr.clone(),
        }
    }
}
