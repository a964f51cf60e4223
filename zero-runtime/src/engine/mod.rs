//! The engine: one set of shared pieces (bucket plan, partitions, reductions, gathers) and
//! a per-stage policy ([`StagePolicy`]) that decides what is sharded and when it moves.
//!
//! Lifecycle of one optimizer step, for `K` accumulation micro-steps:
//!
//! ```text
//! repeat K times:
//!   forward:  fetch(m); params(m) … compute …; release(m)        for m in 0..M
//!   backward: fetch(m); … grads into grads_mut(m) …; grads_ready(m); release(m)
//!                                                                  for m in M-1..=0
//! step()
//! ```
//!
//! Or the engine decides when a module is complete (`arrivals.rs`): per gradient
//! `begin_grad(m, k)`, write it, `finish_grad(m, k)` (declares `m` ready when complete),
//! then `end_backward(release)` for the rest. `window.rs` is the accumulation window, in
//! one place: a DeepSpeed front-end's `step()` calls (`step_call`) and the micro-steps the
//! reductions count.
//!
//! The trainer multiplies its loss by [`Engine::loss_scale_factor`] (the loss scale over
//! `K`, as DeepSpeed's `backward` does).

mod arrivals;
mod books;
mod buffers;
mod checkpoint;
mod gather;
mod gather_state;
mod grad_state;
mod grads;
mod groups;
mod held;
mod loan;
mod master;
mod offload;
mod pass;
mod pool;
mod report;
mod step;
mod tiers;
mod views;
mod window;

pub use arrivals::{BackwardEnd, Expectation};
pub use checkpoint::{HfLoadOptions, ImportedParam, ImportedState, SaveOptions, StatePiece};
pub use groups::ExternalPiece;
pub use held::HeldParam;
pub use report::{CommReport, MemoryReport, StepOutcome, TierBytes, Timings};
pub use step::ExternalArray;
pub use tiers::TierCounters;

use crate::checkpoint::format::Steps;
use crate::config::{Precision, ZeroConfig};
use crate::device::{AdamState, Device};
use crate::model::ModuleSpec;
use crate::plan::Plan;
use crate::scaler::LossScaler;
use crate::schedule::LrSchedule;
use crate::EngineError;
use std::collections::VecDeque;
use zero_comm::{CommStats, Communicator, Tiered};
use zero_kernels::DType;

/// What a stage shards and when it communicates: the only place stages differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagePolicy {
    /// The ZeRO stage, 0–3.
    pub stage: u8,
}

impl StagePolicy {
    /// Optimizer state covers only the owned partition (stages 1–3).
    pub fn shards_optimizer(self) -> bool {
        self.stage >= 1
    }
    /// Gradients are reduce-scattered every micro-step and only the owned partition is
    /// kept (stages 2–3); otherwise full gradients are kept and reduced at the boundary.
    pub fn shards_gradients(self) -> bool {
        self.stage >= 2
    }
    /// Parameters are kept as the owned partition and gathered on use (stage 3).
    pub fn shards_parameters(self) -> bool {
        self.stage >= 3
    }
}

/// Per-bucket buffers of one rank.
struct BucketState<B, W2> {
    /// Parameters: the whole bucket, or (stage 3, non-persistent) the owned partition;
    /// lent only to the step's all-gathers (`loan.rs`).
    params: loan::Loan<B>,
    /// Its gradient buffers, their variant chosen by the stage (`grad_state.rs`).
    grads: grad_state::Grads<B>,
    /// Bytes of this bucket's gradients (the partition in stages 2–3, the whole gradients
    /// in stages 0–1) handed back to the kernel when the last step ended (host mappings), until
    /// gradients are written there again: reported as `released`.
    released: usize,
    /// fp32 sum of the reduced gradients of a micro-step that was reopened after its
    /// reductions (a second backward before the step), shaped like the buffer
    /// `step_grads` reads; dropped after the step.
    carry: Option<B>,
    /// fp32 optimizer state of the owned range.
    opt: AdamState<B>,
    /// Modules of this bucket whose gradients are not ready yet in this micro-step.
    pending: usize,
    /// Stage 3: only the partition, an all-gather in flight, or the whole bucket.
    gather: gather_state::Gather<B, W2>,
    /// hpZ (stage 3): this rank's piece of the bucket as the micro-step's first gather
    /// brought it, read by the micro-step's later gathers inside the node.
    secondary: Option<B>,
}

impl<B, W2> BucketState<B, W2> {
    /// Frozen bucket `b`'s state: its parameters (the owned partition at stage 3), and
    /// zero-length optimizer arrays.
    fn frozen<D: Device<Buffer = B>>(b: usize, params: B, dev: &D) -> Result<Self, EngineError> {
        Ok(Self {
            params: loan::Loan::held_by(params, loan::What::Params(b)),
            grads: grad_state::Grads::Frozen,
            released: 0,
            carry: None,
            opt: AdamState {
                master: None,
                exp_avg: dev.zeros(DType::F32, 0)?,
                exp_avg_sq: dev.zeros(DType::F32, 0)?,
            },
            pending: 0,
            gather: gather_state::Gather::Idle,
            secondary: None,
        })
    }
}

/// A reduction in flight.
enum Reduction<W1, W2> {
    AllReduce {
        bucket: usize,
        work: W1,
    },
    /// `cap`: the capacity of its input, a pooled staging buffer at stages 2–3 (read when
    /// it is issued: the bucket may take another staging buffer before this one is back).
    ReduceScatter {
        bucket: usize,
        work: W2,
        dest: Dest,
        cap: usize,
    },
}

/// Where a reduce-scatter's output goes when it finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dest {
    /// It is the bucket's gradient shard (stages 2–3), or the reduced partition that
    /// stage 1 copies back into its whole-bucket buffer.
    Shard,
    /// A scratch output added into the bucket's gradient shard (a window summed in the
    /// gradients' dtype, after its first reduction).
    AddToShard,
    /// A scratch output that crosses to the bucket's partition in host memory
    /// (`offload_optimizer` at stages 2–3): copied there, or added in (`add`).
    Host { add: bool },
}

/// Counters of elements sent, by purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommCounters {
    /// Gradient all-reduce / reduce-scatter.
    pub grad_reduce: u64,
    /// Parameter all-gathers (after the step in stages 1–2; before use in stage 3).
    pub param_gather: u64,
    /// The per-step exchange of norm partials and overflow flags.
    pub control: u64,
}

type W1<C> = <Tiered<C> as Communicator>::Pending<<C as Communicator>::Buffer>;
type W2<C> = <Tiered<C> as Communicator>::Pending<(
    <C as Communicator>::Buffer,
    <C as Communicator>::Buffer,
)>;

/// A rank's place in a group of ranks: its index and the group's size.
#[derive(Debug, Clone, Copy)]
struct Place {
    rank: usize,
    size: usize,
}

/// The ZeRO engine of one rank.
pub struct Engine<C: Communicator, D: Device<Buffer = C::Buffer>> {
    cfg: ZeroConfig,
    policy: StagePolicy,
    /// The shard group (the whole world unless `mics_shard_size` cuts it), with the
    /// replica and hpZ groups behind it (`zero_comm::Tiered`).
    comm: Tiered<C>,
    dev: D,
    /// This rank in its shard group, and the group's size: what partitions are cut by.
    shard: Place,
    /// This rank in the data-parallel world, and its size.
    dp: Place,
    dtype: DType,
    modules: Vec<ModuleSpec>,
    plan: Plan,
    buckets: Vec<BucketState<C::Buffer, W2<C>>>,
    frozen: C::Buffer,
    /// Stages 2–3's staging buffers and scratch outputs.
    pool: pool::StagingPool<C::Buffer>,
    inflight: VecDeque<Reduction<W1<C>, W2<C>>>,
    scaler: LossScaler,
    schedule: LrSchedule,
    /// Optimizer steps taken, skipped, and all (what a checkpoint records).
    steps: Steps,
    /// Which modules this micro-step fetched and which reported their gradients ready.
    pass: pass::Pass,
    /// Gradients counted per trainable parameter in the pass under way, and what one
    /// backward is expected to bring: decides when a module is complete.
    arrivals: arrivals::Arrivals,
    /// The accumulation window: the front-end's counters and the reductions'.
    window: window::Window,
    trace: gather::Trace,
    /// Elements gathered whole now, and the most at once.
    live: gather::Live,
    /// Elements sent, by purpose and tier, in all and in the last step.
    books: books::CommBooks,
    timings: report::Clock,
    last_load_stats: crate::io::ReadStats,
    /// The optimizer state when it lives off the device.
    offload: Option<offload::Offload>,
    /// Stage 3's owned parameter partitions when they live off the device.
    param_tier: Option<offload::ParamTier>,
    /// The optimizer parameter groups and the runs they cut each bucket into.
    groups: groups::Groups,
    /// A step handed to an external optimizer, begun and not yet finished.
    external: Option<step::External>,
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Builds the engine of this rank: lays the model out, allocates this rank's buffers and
    /// fills the parameters from `init`, which must give every rank the same values. The
    /// fp32 master weights start from the rounded 16-bit values, as in DeepSpeed.
    pub fn new(
        cfg: ZeroConfig,
        modules: Vec<ModuleSpec>,
        comm: C,
        dev: D,
        mut init: impl FnMut(usize, &crate::model::ParamSpec, &mut [f32]),
    ) -> Result<Self, EngineError> {
        validate_model(&modules)?;
        let (dp_rank, dp_world) = (comm.rank(), comm.world_size());
        let world = dp_world;
        let expected =
            cfg.train_batch_size / (cfg.micro_batch_per_rank * cfg.gradient_accumulation_steps);
        if expected != world as u64 {
            return Err(crate::ConfigError::Inconsistent(format!(
                "the config was resolved for world size {expected} but the communicator has {world} ranks"
            ))
            .into());
        }
        let dtype = match cfg.precision {
            Precision::Fp32 => DType::F32,
            Precision::Fp16(_) => DType::F16,
            Precision::Bf16 => DType::BF16,
        };
        let policy = StagePolicy {
            stage: cfg.zero.stage,
        };
        let comm = Tiered::split(
            comm,
            cfg.ranks_per_node.unwrap_or(dp_world),
            cfg.zero.shard_size.unwrap_or(dp_world),
            cfg.zero.hpz_partition_size,
            cfg.zero.hierarchical_gather,
        )?;
        let (rank, world) = (comm.rank(), comm.world_size());
        let clamp = |v: u64| v.min(usize::MAX as u64) as usize;
        let plan = Plan::new(
            &modules,
            dtype,
            world,
            clamp(cfg.zero.reduce_bucket_size),
            clamp(cfg.zero.param_persistence_threshold),
            policy.shards_parameters(),
        )?;
        let accumulate = cfg.gradient_accumulation_steps > 1;
        let accum_dtype = Self::accum_dtype(&cfg, dtype);
        // Gradients summed in their own dtype need no accumulator: whole-bucket ones
        // (stages 0–1) sum in place, stages 2–3 in the shard.
        let own_dtype = Self::sums_in_own_dtype(&cfg, dtype);
        let offloaded = cfg.zero.offload_optimizer.device != crate::config::OffloadDevice::None;
        let params_offloaded = policy.shards_parameters()
            && cfg.zero.offload_param.device != crate::config::OffloadDevice::None;
        let master_apart = Self::keeps_master_apart(dtype, offloaded, params_offloaded);
        // With the optimizer offloaded, stages 2–3's reduced partitions live beside it.
        let grads_on_host = offloaded && policy.shards_gradients();
        let mut buckets = Vec::with_capacity(plan.buckets.len());
        for (i, b) in plan.buckets.iter().enumerate() {
            let (total, part) = (b.layout.total_len(), b.layout.partition_len());
            let owned = if offloaded {
                0 // the state lives in the offload tier
            } else if policy.shards_optimizer() {
                part
            } else {
                total
            };
            let sharded_params = policy.shards_parameters() && !b.persistent;
            let params_len = match (sharded_params, params_offloaded) {
                (true, true) => 0, // the partition lives in the parameter tier
                (true, false) => part,
                (false, _) => total,
            };
            if b.frozen {
                // Parameters only: no gradient, no optimizer state.
                buckets.push(BucketState::frozen(i, dev.zeros(dtype, params_len)?, &dev)?);
                continue;
            }
            buckets.push(BucketState {
                params: loan::Loan::held_by(dev.zeros(dtype, params_len)?, loan::What::Params(i)),
                grads: if grads_on_host {
                    grad_state::Grads::OnHost { fresh: true }
                } else if policy.shards_gradients() {
                    grad_state::Grads::sharded(
                        i,
                        dev.zeros(dtype, part)?,
                        (accumulate && !own_dtype)
                            .then(|| dev.zeros(accum_dtype, part))
                            .transpose()?,
                    )
                } else {
                    grad_state::Grads::whole(
                        i,
                        dev.zeros(dtype, total)?,
                        (accumulate && !own_dtype)
                            .then(|| dev.zeros(accum_dtype, total))
                            .transpose()?,
                    )
                },
                released: 0,
                carry: None,
                opt: AdamState {
                    master: master_apart
                        .then(|| dev.zeros(DType::F32, owned))
                        .transpose()?,
                    exp_avg: dev.zeros(DType::F32, owned)?,
                    exp_avg_sq: dev.zeros(DType::F32, owned)?,
                },
                pending: b.modules.len(),
                gather: gather_state::Gather::Idle,
                secondary: None,
            });
        }
        let n_buckets = buckets.len();
        let trainable_modules = plan.module_buckets.iter().filter(|b| !b.is_empty()).count();
        if let (true, Some(o)) = (offloaded, &cfg.optimizer) {
            if o.adam.is_none() {
                return Err(crate::ConfigError::Unsupported {
                    key: "zero_optimization.offload_optimizer".into(),
                    reason: format!(
                        "the offloaded optimizer is zero's fused Adam, and the optimizer is `{}`: use Adam or AdamW (DeepSpeed's DeepSpeedCPUAdam), or do not offload",
                        o.name
                    ),
                }
                .into());
            }
        }
        let offload = if offloaded {
            let owned: Vec<usize> = plan
                .trainable()
                .iter()
                .map(|b| b.layout.partition_len())
                .collect();
            let grad_dtype = if accumulate && policy.shards_gradients() {
                accum_dtype
            } else {
                dtype
            };
            let mut off = offload::Offload::new(
                &cfg.zero.offload_optimizer,
                cfg.aio,
                cfg.zero.sub_group_size,
                &owned,
                (dtype, grad_dtype),
                dp_rank, // (the swap file's folder: one per process, replicas too)
            )?;
            if grads_on_host {
                off.host_grads = Some(offload::HostGrads::new(
                    &off.arena,
                    &owned,
                    (grad_dtype, dtype),
                    accumulate,
                    offload::stage_elements(),
                )?);
            }
            Some(off)
        } else {
            None
        };
        let param_tier = if params_offloaded {
            let parts = plan
                .buckets
                .iter()
                .map(|b| (!b.persistent).then(|| b.layout.partition_len()))
                .collect();
            Some(offload::ParamTier::new(
                &cfg.zero.offload_param,
                cfg.aio,
                parts,
                dtype,
                dp_rank,
            )?)
        } else {
            None
        };
        let base = match &cfg.optimizer {
            Some(o) => o
                .adam
                .unwrap_or_else(|| zero_kernels::AdamConfig::adam(1e-3)),
            None => zero_kernels::AdamConfig::adam(1e-3),
        };
        // The config's lr as written (f64), not its f32 rounding: schedules compute in f64.
        let base_lr = cfg
            .optimizer
            .as_ref()
            .and_then(|o| o.params.get("lr"))
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(base.lr as f64);
        let group_count = 1 + modules
            .iter()
            .flat_map(|m| &m.params)
            .map(|p| p.group)
            .max()
            .unwrap_or(0);
        let mut runs = Vec::with_capacity(plan.trainable_buckets);
        {
            let specs: Vec<&crate::model::ParamSpec> =
                modules.iter().flat_map(|m| &m.params).collect();
            for (b, bp) in plan.trainable().iter().enumerate() {
                let held = if policy.shards_optimizer() {
                    bp.layout.partition_range(rank)?
                } else {
                    0..bp.layout.total_len()
                };
                runs.push(groups::bucket_runs(&plan, b, held, |id| specs[id].group));
            }
        }
        let mut engine = Self {
            scaler: LossScaler::new(&cfg.precision),
            schedule: LrSchedule::new(base_lr, cfg.scheduler),
            window: window::Window::new(cfg.gradient_accumulation_steps),
            groups: groups::Groups {
                adam: vec![base; group_count],
                base_lrs: vec![base_lr; group_count],
                runs,
            },
            external: None,
            frozen: dev.zeros(dtype, plan.frozen_len)?,
            cfg,
            policy,
            comm,
            dev,
            shard: Place { rank, size: world },
            dp: Place {
                rank: dp_rank,
                size: dp_world,
            },
            dtype,
            pass: pass::Pass::new(modules.len(), trainable_modules),
            arrivals: arrivals::Arrivals::new(
                modules
                    .iter()
                    .map(|m| m.params.iter().filter(|p| p.trainable).count()),
            ),
            modules,
            buckets,
            plan,
            pool: pool::StagingPool::new(n_buckets),
            inflight: VecDeque::new(),
            steps: Steps::default(),
            trace: gather::Trace::default(),
            live: gather::Live::default(),
            books: books::CommBooks::default(),
            timings: report::Clock::default(),
            last_load_stats: crate::io::ReadStats::default(),
            offload,
            param_tier,
        };
        engine.initialize(&mut init)?;
        Ok(engine)
    }

    fn initialize(
        &mut self,
        init: &mut impl FnMut(usize, &crate::model::ParamSpec, &mut [f32]),
    ) -> Result<(), EngineError> {
        let mut values = Vec::new();
        for mi in 0..self.modules.len() {
            for k in 0..self.modules[mi].params.len() {
                let id = self.plan.param_id(mi, k);
                let spec = &self.modules[mi].params[k];
                values.clear();
                values.resize(spec.numel(), 0.0);
                init(id, spec, &mut values);
                self.upload_param(id, &values)?;
            }
        }
        // Master weights start from the (rounded) parameters of the owned range.
        if let Some(r) = self.with_offload(|e, off| e.init_offloaded_master(off)) {
            return r;
        }
        for b in self.trainable_range() {
            if self.buckets[b].opt.master.is_none() {
                continue; // the parameters are the master weights
            }
            let owned = self.held_len(b);
            let start = self.held_param_offset(b)?;
            // An offloaded partition comes to the device for the copy.
            let tier_copy = self.tier_params_on_device(b)?;
            let state = &mut self.buckets[b];
            let params = match &tier_copy {
                Some(p) => p,
                None => state.params.get()?,
            };
            if let Some(master) = state.opt.master.as_mut() {
                self.dev.copy(params, start..start + owned, master, 0)?;
            }
        }
        Ok(())
    }

    /// This rank in the data-parallel world.
    pub fn rank(&self) -> usize {
        self.dp.rank
    }

    /// Number of data-parallel ranks.
    pub fn world_size(&self) -> usize {
        self.dp.size
    }

    /// This rank in its shard group, and the group's size (`mics_shard_size`; the world
    /// when flat): the ranks the model's state is partitioned over.
    pub fn shard_group(&self) -> (usize, usize) {
        (self.shard.rank, self.shard.size)
    }

    /// Which shard group this rank belongs to (its replica), of how many.
    pub fn replica(&self) -> (usize, usize) {
        let l = self.comm.layout();
        (l.replica(), l.replicas())
    }

    /// The configuration in force.
    pub fn config(&self) -> &ZeroConfig {
        &self.cfg
    }

    /// The stage policy.
    pub fn policy(&self) -> StagePolicy {
        self.policy
    }

    /// The dtype of parameters and gradients.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The registered modules.
    pub fn modules(&self) -> &[ModuleSpec] {
        &self.modules
    }

    /// The device the engine's buffers live on (to read a parameter buffer into a
    /// framework's own storage, say).
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The bucket plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Micro-steps per optimizer step.
    pub fn gradient_accumulation_steps(&self) -> u64 {
        self.cfg.gradient_accumulation_steps
    }

    /// Whether the gradient buffers accumulate the micro-steps in place (stages 0–1,
    /// accumulation > 1, gradients summed in their own dtype: fp32 ones, and 16-bit ones
    /// under DeepSpeed's default `grad_accum_dtype`), so they hold the earlier
    /// micro-steps' sum when a micro-step starts: a trainer adds its gradients in, never
    /// copies over them.
    pub fn grads_accumulate_in_place(&self) -> bool {
        Self::sums_in_own_dtype(&self.cfg, self.dtype) && !self.policy.shards_gradients()
    }

    /// Whether stages 2–3 sum a window's reduced gradients in the shard itself (in the
    /// gradients' dtype: the first reduction of the window writes it, the later ones are
    /// added, as DeepSpeed's stage 3 sums into its partition buffer).
    fn sums_in_shard(&self) -> bool {
        Self::sums_in_own_dtype(&self.cfg, self.dtype) && self.policy.shards_gradients()
    }

    /// Whether a window of several micro-steps is summed in an accumulator of another
    /// dtype (fp32 sums of 16-bit gradients): every reduction of the window is added in.
    fn accumulates_apart(&self) -> bool {
        self.cfg.gradient_accumulation_steps > 1 && !Self::sums_in_own_dtype(&self.cfg, self.dtype)
    }

    /// Stages 2–3 with `offload_optimizer`: the reduced gradient partitions, in host
    /// memory.
    fn host_grads(&self) -> Option<&offload::HostGrads> {
        self.offload.as_ref().and_then(|o| o.host_grads.as_ref())
    }

    fn host_grads_mut(&mut self) -> Option<&mut offload::HostGrads> {
        self.offload.as_mut().and_then(|o| o.host_grads.as_mut())
    }

    /// Whether a window of several micro-steps is summed in the gradients' own dtype.
    fn sums_in_own_dtype(cfg: &ZeroConfig, dtype: DType) -> bool {
        cfg.gradient_accumulation_steps > 1 && Self::accum_dtype(cfg, dtype) == dtype
    }

    /// The dtype a window's micro-steps' gradients are summed in
    /// (`data_types.grad_accum_dtype`: the training dtype unless it says fp32).
    fn accum_dtype(cfg: &ZeroConfig, dtype: DType) -> DType {
        match cfg.grad_accum_dtype {
            crate::GradAccumDtype::Model => dtype,
            crate::GradAccumDtype::Fp32 => DType::F32,
        }
    }

    /// The current loss scale.
    pub fn loss_scale(&self) -> f64 {
        self.scaler.scale()
    }

    /// The loss scaler (its full state: scale, hysteresis, iteration counters).
    pub fn loss_scaler(&self) -> &LossScaler {
        &self.scaler
    }

    /// What the trainer multiplies its loss by: the loss scale over the accumulation
    /// steps, so the gradients summed over micro-steps are the scaled mean gradient.
    pub fn loss_scale_factor(&self) -> f64 {
        self.scaler.scale() / self.cfg.gradient_accumulation_steps as f64
    }

    /// Optimizer steps taken, skipped steps, and all steps.
    pub fn step_counts(&self) -> (u64, u64, u64) {
        (self.steps.optimizer, self.steps.skipped, self.steps.global)
    }

    /// The communicator's own counters.
    pub fn comm_stats(&self) -> CommStats {
        self.comm.stats()
    }

    /// The trainable buckets (gradients, optimizer state); the frozen buckets follow them.
    fn trainable_range(&self) -> std::ops::Range<usize> {
        0..self.plan.trainable_buckets
    }

    /// Whether bucket `b`'s parameters are kept as the owned partition only (stage 3,
    /// non-persistent buckets).
    fn params_sharded(&self, b: usize) -> bool {
        self.policy.shards_parameters() && !self.plan.buckets[b].persistent
    }

    fn module(&self, index: usize) -> Result<&ModuleSpec, EngineError> {
        self.modules.get(index).ok_or(EngineError::UnknownModule {
            index,
            count: self.modules.len(),
        })
    }

    /// Runs `issue` on the communicator and books the elements it sends under `category`.
    fn issue<T>(
        &mut self,
        category: fn(&mut CommCounters) -> &mut u64,
        issue: impl FnOnce(&Tiered<C>) -> Result<T, zero_comm::CommError>,
    ) -> Result<T, EngineError> {
        let before = self.comm.tier_stats();
        let work = issue(&self.comm)?;
        let after = self.comm.tier_stats();
        self.books.book(category, before, after);
        Ok(work)
    }
}

fn validate_model(modules: &[ModuleSpec]) -> Result<(), EngineError> {
    if modules.is_empty() {
        return Err(EngineError::InvalidModel("no modules registered".into()));
    }
    for m in modules {
        let mut names = std::collections::HashSet::new();
        for p in &m.params {
            if !names.insert(&p.name) {
                return Err(EngineError::InvalidModel(format!(
                    "module `{}` has two parameters named `{}`",
                    m.name, p.name
                )));
            }
            if p.numel() == 0 {
                return Err(EngineError::InvalidModel(format!(
                    "parameter `{}.{}` has shape {:?}: it must have at least one element",
                    m.name, p.name, p.shape
                )));
            }
        }
    }
    if !modules.iter().any(|m| m.params.iter().any(|p| p.trainable)) {
        return Err(EngineError::InvalidModel(
            "the model has no trainable parameter".into(),
        ));
    }
    Ok(())
}
