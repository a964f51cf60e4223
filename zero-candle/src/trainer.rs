//! `ZeroCandle`: an ordinary candle model trained through the zero engine.

use crate::error::{to_candle, Error, Result};
use crate::init;
use crate::ops::{GradTap, Sink};
use crate::register::{Constants, Grouping, Live, Recorded, Recorder};
use crate::stage3::ZeroModule;
use crate::state::{ModuleState, Shared, Slot, State};
use candle_core::{CpuStorage, DType, Storage, Tensor, Var};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use zero_comm::Communicator;
use zero_runtime::{Device, Engine, ModuleSpec, ParamSpec, StepOutcome, ZeroConfig};

/// A predicate on parameter names.
pub type NameFilter = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// How a model is registered.
#[derive(Clone)]
pub struct Options {
    /// How parameters are grouped into engine modules ([`Grouping::Layer`]).
    pub grouping: Grouping,
    /// The seed every rank initializes from (with each parameter's name).
    pub seed: u64,
    /// Tensors the model asks for that are not parameters (none).
    pub constants: Option<Constants>,
    /// Parameters kept frozen (none): no gradient, no optimizer state.
    pub frozen: Option<NameFilter>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            grouping: Grouping::Layer,
            seed: 0,
            constants: None,
            frozen: None,
        }
    }
}

/// A candle model's parameters in the zero engine. Every rank builds its own model with
/// [`ZeroCandle::new`], runs forward in candle, calls [`backward`](Self::backward) on the
/// loss and [`step`](Self::step); the engine reduces, shards and updates, and the
/// parameters are written back into candle's storage in place.
pub struct ZeroCandle<C, D>
where
    C: Communicator + 'static,
    D: Device<Buffer = C::Buffer> + 'static,
{
    shared: Arc<Shared<C, D>>,
    /// The one variable every parameter tap hangs from (kept alive with the model).
    _anchor: Var,
}

impl<C, D> Sink for Shared<C, D>
where
    C: Communicator + 'static,
    D: Device<Buffer = C::Buffer> + 'static,
    Engine<C, D>: Send,
{
    fn gradient(&self, slot: usize, grad: &Tensor) -> candle_core::Result<()> {
        // Read candle's buffer in place (no copy) when it is a contiguous f32 one, as
        // backward produces them.
        let grad = if grad.dtype() == DType::F32 && grad.is_contiguous() {
            grad.clone()
        } else {
            grad.to_dtype(DType::F32)?.contiguous()?
        };
        let (storage, layout) = grad.storage_and_layout();
        let values: &[f32] = match (&*storage, layout.contiguous_offsets()) {
            (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => &v[a..b],
            _ => return Err(to_candle("a gradient is not f32 on candle's CPU device")),
        };
        self.lock()
            .and_then(|mut st| st.gradient(slot, values))
            .map_err(to_candle)
    }

    fn fetch(&self, modules: &[usize]) -> candle_core::Result<()> {
        let mut st = self.lock().map_err(to_candle)?;
        for &m in modules {
            if !st.modules[m].fetched {
                st.fetch(m).map_err(to_candle)?;
            }
        }
        Ok(())
    }

    fn release(&self, modules: &[usize]) -> candle_core::Result<()> {
        let mut st = self.lock().map_err(to_candle)?;
        for &m in modules {
            st.release(m).map_err(to_candle)?;
        }
        Ok(())
    }
}

impl<C, D> ZeroCandle<C, D>
where
    C: Communicator + 'static,
    D: Device<Buffer = C::Buffer> + 'static,
    Engine<C, D>: Send,
{
    /// Builds the model twice with `build` (once to record its parameters, once over the
    /// managed tensors), creates the engine for them on `comm` and `dev`, and returns the
    /// adapter and the model. The model must be built in f32 on candle's CPU device.
    pub fn new<M>(
        cfg: ZeroConfig,
        comm: C,
        dev: D,
        options: Options,
        build: impl Fn(VarBuilder<'_>) -> candle_core::Result<M>,
    ) -> Result<(Self, M)> {
        let cpu = candle_core::Device::Cpu;
        // 1. Record.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            seen: seen.clone(),
            constants: options.constants.clone(),
        };
        drop(build(VarBuilder::from_backend(
            Box::new(recorder),
            DType::F32,
            cpu.clone(),
        ))?);
        let recorded: Vec<Recorded> = seen
            .lock()
            .map_err(|_| Error::Model("registration poisoned".into()))?
            .clone();
        if recorded.is_empty() {
            return Err(Error::Model("the model asked for no parameters".into()));
        }
        // 2. Group into engine modules, in order of first appearance.
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, r) in recorded.iter().enumerate() {
            let g = options.grouping.module_of(&r.name)?;
            match groups.iter_mut().find(|(name, _)| *name == g) {
                Some((_, members)) => members.push(i),
                None => groups.push((g, vec![i])),
            }
        }
        let frozen = |name: &str| options.frozen.as_ref().is_some_and(|f| f(name));
        let mut specs = Vec::with_capacity(groups.len());
        let mut order = Vec::new(); // engine param id -> recorded index
        for (g, members) in &groups {
            let params = members
                .iter()
                .map(|&i| {
                    let r = &recorded[i];
                    let local = if g.is_empty() {
                        r.name.clone()
                    } else {
                        r.name[g.len() + 1..].to_string()
                    };
                    order.push(i);
                    if frozen(&r.name) {
                        ParamSpec::frozen(local, &r.shape)
                    } else {
                        ParamSpec::new(local, &r.shape)
                    }
                })
                .collect();
            specs.push(ModuleSpec::new(g.clone(), params));
        }
        // 3. The engine, initialized from the hints.
        let seed = options.seed;
        let mut engine = Engine::new(cfg, specs, comm, dev, |id, spec, values| {
            let r = &recorded[order[id]];
            init::fill(seed, &r.name, &spec.shape, &r.init, values)
        })?;
        // candle's backward hands each parameter's gradient over once, fully accumulated:
        // a module is complete at its last parameter's, from the first backward on.
        engine.predict_grads(&(0..groups.len()).collect::<Vec<_>>())?;
        let mut slots = Vec::with_capacity(order.len());
        let mut modules = Vec::with_capacity(groups.len());
        let mut id = 0;
        for (m, (_, members)) in groups.iter().enumerate() {
            let mut module_slots = Vec::new();
            let mut trainable = 0;
            for (index, &i) in members.iter().enumerate() {
                let r = &recorded[i];
                let t = (!frozen(&r.name)).then(|| {
                    trainable += 1;
                    trainable - 1
                });
                module_slots.push(slots.len());
                slots.push(Slot {
                    name: r.name.clone(),
                    tensor: None,
                    module: m,
                    index,
                    trainable: t,
                    filled: false,
                    numel: r.shape.iter().product(),
                    sharded: false,
                    gathered: State::is_sharded(&engine, id),
                });
                id += 1;
            }
            modules.push(ModuleState {
                slots: module_slots,
                fetched: false,
            });
        }
        let shared = Arc::new(Shared::new(State {
            engine,
            slots,
            modules,
            filled_bytes: 0,
            peak_filled_bytes: 0,
            missing: Vec::new(),
            notes: Vec::new(),
        }));
        // 4. The managed tensors: tap(anchor), filled from the engine.
        let as_sink: Arc<dyn Sink> = shared.clone();
        let sink = Arc::downgrade(&as_sink);
        drop(as_sink);
        let anchor = Var::zeros(1, DType::F32, &cpu)?;
        let mut tensors = HashMap::new();
        {
            let mut st = shared.lock()?;
            for s in 0..st.slots.len() {
                let shape = recorded[order[s]].shape.clone();
                let t = anchor.as_tensor().apply_op1(GradTap {
                    slot: s,
                    shape: candle_core::Shape::from_dims(&shape),
                    sink: sink.clone(),
                })?;
                tensors.insert(st.slots[s].name.clone(), t.clone());
                st.slots[s].tensor = Some(t);
            }
            st.refresh_unwrapped()?;
        }
        // 5. The model, over them.
        let live = Live {
            tensors,
            constants: options.constants.clone(),
        };
        let model = build(VarBuilder::from_backend(Box::new(live), DType::F32, cpu))?;
        Ok((
            Self {
                shared,
                _anchor: anchor,
            },
            model,
        ))
    }

    /// Multiply the loss by this before backward ([`backward`](Self::backward) does).
    pub fn loss_scale_factor(&self) -> Result<f64> {
        Ok(self.shared.lock()?.engine.loss_scale_factor())
    }

    /// Runs candle's backward from `loss` (scaled by the loss scale): each parameter's
    /// gradient goes into the engine as soon as candle has accumulated it, and a module's
    /// reduction starts when its last gradient arrives. Parameters that got none are listed
    /// by [`missing_grads`](Self::missing_grads); their gradient is zero.
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        let factor = self.loss_scale_factor()?;
        let scaled = if factor == 1.0 {
            loss.clone()
        } else {
            loss.affine(factor, 0.0)?
        };
        let result = scaled.backward();
        let mut st = self.shared.lock()?;
        match result {
            Ok(_grads) => st.finish_backward(),
            Err(e) => {
                st.engine.discard_arrivals();
                Err(e.into())
            }
        }
    }

    /// The optimizer step (see `Engine::step`); the new parameters are written into
    /// candle's storage in place (stage 3: those a wrapper gathers are written at their
    /// next fetch).
    pub fn step(&self) -> Result<StepOutcome> {
        let mut st = self.shared.lock()?;
        let out = st.engine.step()?;
        st.refresh_unwrapped()?;
        Ok(out)
    }

    /// Discards the gradients of the current step (`Engine::zero_grad`).
    pub fn zero_grad(&self) -> Result<()> {
        let mut st = self.shared.lock()?;
        st.engine.zero_grad()?;
        Ok(())
    }

    /// Notes on the setup worth a user's attention (a stage-3 wrapper whose bucket is
    /// shared with modules outside it, say); empty when there is nothing to say.
    pub fn notes(&self) -> Result<Vec<String>> {
        Ok(self.shared.lock()?.notes.clone())
    }

    /// Parameters that got no gradient in the last backward (a fused candle op without a
    /// backward cuts them off: RmsNorm, LayerNorm, softmax_last_dim, rope).
    pub fn missing_grads(&self) -> Result<Vec<String>> {
        Ok(self.shared.lock()?.missing.clone())
    }

    /// [`missing_grads`](Self::missing_grads) as a sentence to log, or `None` when every
    /// trainable parameter got a gradient.
    pub fn missing_grads_message(&self) -> Result<Option<String>> {
        let missing = self.missing_grads()?;
        Ok((!missing.is_empty()).then(|| {
            format!(
                "{} parameter(s) got no gradient in the last backward and will not train: {}. No path from the loss reaches them: a fused candle op without a backward (candle-nn's RmsNorm and LayerNorm on contiguous input, softmax_last_dim, rope) cuts the graph (candle issues #2168, #3011, #3569), or the model does not use them; freeze them (Options::frozen) or use differentiable ops",
                missing.len(),
                missing.join(", ")
            )
        }))
    }

    /// Bytes of parameters held in candle storage: now, and the most at any time.
    pub fn candle_param_bytes(&self) -> Result<(usize, usize)> {
        let st = self.shared.lock()?;
        Ok((st.filled_bytes, st.peak_filled_bytes))
    }

    /// Every parameter's current values, by name, in engine order (the fp32 view of the
    /// 16-bit parameters; under fp32, the master weights). Collective in stage 3: every
    /// rank must call it, as each module is gathered in turn.
    pub fn named_params(&self) -> Result<Vec<(String, Tensor)>> {
        let mut st = self.shared.lock()?;
        let mut out = Vec::with_capacity(st.slots.len());
        for m in 0..st.modules.len() {
            let gather =
                !st.modules[m].fetched && st.modules[m].slots.iter().any(|&s| st.slots[s].gathered);
            if gather {
                st.engine.fetch(m)?;
            }
            let values = st.engine.params_f32(m);
            if gather {
                st.engine.release(m)?;
            }
            for (v, &s) in values?.into_iter().zip(&st.modules[m].slots) {
                let t = st.slots[s].tensor.as_ref().map(|t| t.dims().to_vec());
                let shape = t.unwrap_or_else(|| vec![v.len()]);
                out.push((
                    st.slots[s].name.clone(),
                    Tensor::from_vec(v, shape, &candle_core::Device::Cpu)?,
                ));
            }
        }
        Ok(out)
    }

    /// The parameter names, in engine order.
    pub fn param_names(&self) -> Result<Vec<String>> {
        Ok(self
            .shared
            .lock()?
            .slots
            .iter()
            .map(|s| s.name.clone())
            .collect())
    }

    /// Runs `f` on the engine (reports, checkpoints, counters). After a load, call
    /// [`refresh`](Self::refresh).
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut Engine<C, D>) -> R) -> Result<R> {
        Ok(f(&mut self.shared.lock()?.engine))
    }

    /// Writes the engine's parameters into candle's storage again (after a checkpoint
    /// load through [`with_engine`](Self::with_engine)).
    pub fn refresh(&self) -> Result<()> {
        self.shared.lock()?.refresh_unwrapped()
    }

    /// Wraps the part of the model whose parameters are the engine modules named `prefix`
    /// or under it (`blocks.0` covers `blocks.0` and `blocks.0.attn`). In stage 3 the
    /// wrapper gathers them before its forward and again before its backward, and frees
    /// candle's storage after each; in stages 0–2 it only calls `inner`.
    pub fn wrap<M>(&self, prefix: &str, inner: M) -> Result<ZeroModule<M>> {
        let mut st = self.shared.lock()?;
        let stage3 = st.engine.policy().shards_parameters();
        let under = format!("{prefix}.");
        let names: Vec<String> = st.engine.modules().iter().map(|m| m.name.clone()).collect();
        let modules: Vec<usize> = names
            .iter()
            .enumerate()
            .filter(|(_, n)| prefix.is_empty() || *n == prefix || n.starts_with(&under))
            .map(|(m, _)| m)
            .collect();
        if modules.is_empty() {
            return Err(Error::Model(format!(
                "no parameters under `{prefix}` (modules: {})",
                names.join(", ")
            )));
        }
        if stage3 {
            for &m in &modules {
                for s in st.modules[m].slots.clone() {
                    // Persistent parameters stay whole and filled.
                    if st.slots[s].gathered {
                        st.slots[s].sharded = true;
                        st.empty(s)?;
                    }
                }
            }
            // The peak counts from here: construction filled the whole model once.
            st.peak_filled_bytes = st.filled_bytes;
            // Stage 3 gathers whole buckets: one shared with modules outside this wrapper
            // is gathered for each user.
            let plan = st.engine.plan();
            let mut shared: Vec<&str> = Vec::new();
            for &m in &modules {
                for &o in plan.fetch_buckets[m]
                    .iter()
                    .flat_map(|&b| &plan.buckets[b].modules)
                {
                    if !modules.contains(&o) && !shared.contains(&names[o].as_str()) {
                        shared.push(&names[o]);
                    }
                }
            }
            if !shared.is_empty() {
                let mut with = shared[..shared.len().min(3)].join(", ");
                if shared.len() > 3 {
                    with += &format!(" and {} more", shared.len() - 3);
                }
                let note = format!(
                    "stage 3: `{prefix}` shares a gathered bucket with {with}, so that bucket is gathered for each of them; a reduce_bucket_size below the size of a wrapped part gives each its own"
                );
                st.notes.push(note);
            }
        }
        let sink: Arc<dyn Sink> = self.shared.clone();
        Ok(ZeroModule::new(
            inner,
            if stage3 { modules } else { Vec::new() },
            sink,
        ))
    }
}
