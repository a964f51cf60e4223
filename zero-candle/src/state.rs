//! What the adapter and its candle ops share: the engine, and for each parameter the
//! candle tensor the model reads and where it is in the engine (the engine counts the
//! gradients that arrive, and decides when a module is complete).

use crate::error::{Error, Result};
use crate::ops::{empty_storage, fill_storage};
use candle_core::Tensor;
use std::sync::{Mutex, MutexGuard};
use zero_comm::Communicator;
use zero_runtime::plan::ParamLoc;
use zero_runtime::{Device, Engine};

/// One parameter of the model.
pub(crate) struct Slot {
    /// Its full candle name (`blocks.0.attn.q.weight`).
    pub name: String,
    /// The tensor the model holds (the output of its gradient tap).
    pub tensor: Option<Tensor>,
    /// Engine module, and index among the module's parameters.
    pub module: usize,
    pub index: usize,
    /// Index among the module's trainable parameters.
    pub trainable: Option<usize>,
    /// Whether candle's storage holds its values now.
    pub filled: bool,
    /// Elements.
    pub numel: usize,
    /// Stage 3: whether its bucket is gathered per use (not persistent).
    pub gathered: bool,
    /// Stage 3: whether its module is wrapped, so its storage is filled only between the
    /// wrapper's fetch and release (unwrapped modules stay filled, refreshed after each
    /// step, so a module called outside a wrapper still reads valid values).
    pub sharded: bool,
}

/// Per engine module.
pub(crate) struct ModuleState {
    /// Its parameters' slots.
    pub slots: Vec<usize>,
    /// Stage 3: whether it is fetched now.
    pub fetched: bool,
}

/// The shared state.
pub(crate) struct State<C: Communicator, D: Device<Buffer = C::Buffer>> {
    pub engine: Engine<C, D>,
    pub slots: Vec<Slot>,
    pub modules: Vec<ModuleState>,
    /// Bytes of parameters held in candle storage now, and the most so far.
    pub filled_bytes: usize,
    pub peak_filled_bytes: usize,
    /// Names of parameters that got no gradient in the last backward.
    pub missing: Vec<String>,
    /// Things the user should know about the setup (see `ZeroCandle::notes`).
    pub notes: Vec<String>,
}

/// The shared state behind one lock (the gradient taps run inside candle's backward).
pub(crate) struct Shared<C: Communicator, D: Device<Buffer = C::Buffer>> {
    state: Mutex<State<C, D>>,
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Shared<C, D> {
    pub fn new(state: State<C, D>) -> Self {
        Self {
            state: Mutex::new(state),
        }
    }

    /// The state, locked.
    pub fn lock(&self) -> Result<MutexGuard<'_, State<C, D>>> {
        self.state
            .lock()
            .map_err(|_| Error::Model("a thread panicked while holding the adapter's state".into()))
    }
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> State<C, D> {
    /// Whether parameter `id` is sharded in stage 3 (its bucket is not persistent).
    pub fn is_sharded(engine: &Engine<C, D>, id: usize) -> bool {
        let plan = engine.plan();
        engine.policy().shards_parameters()
            && match plan.locs[id] {
                ParamLoc::Bucket { bucket, .. } => !plan.buckets[bucket].persistent,
                ParamLoc::Frozen { .. } => false,
            }
    }

    /// Copies slot `s`'s values from the engine into candle's storage (allocating it
    /// again if it was emptied).
    pub fn fill(&mut self, s: usize) -> Result<()> {
        let slot = &self.slots[s];
        let tensor = slot
            .tensor
            .as_ref()
            .ok_or_else(|| Error::Model(format!("`{}` has no tensor yet", slot.name)))?;
        let (buf, range) = self.engine.param_buffer(slot.module, slot.index)?;
        fill_storage(tensor, self.engine.device(), buf, range)?;
        if !slot.filled {
            self.filled_bytes += 4 * slot.numel;
            self.peak_filled_bytes = self.peak_filled_bytes.max(self.filled_bytes);
        }
        self.slots[s].filled = true;
        Ok(())
    }

    /// Frees slot `s`'s candle storage (stage 3, after release).
    pub fn empty(&mut self, s: usize) -> Result<()> {
        let slot = &mut self.slots[s];
        if let (Some(t), true) = (slot.tensor.as_ref(), slot.filled) {
            empty_storage(t)?;
            slot.filled = false;
            self.filled_bytes -= 4 * slot.numel;
        }
        Ok(())
    }

    /// Fetches engine module `m` (stage 3 gathers it) and fills its sharded parameters.
    pub fn fetch(&mut self, m: usize) -> Result<()> {
        self.engine.fetch(m)?;
        self.modules[m].fetched = true;
        for s in self.modules[m].slots.clone() {
            if self.slots[s].sharded {
                self.fill(s)?;
            }
        }
        Ok(())
    }

    /// Releases module `m` and empties its sharded parameters' storage.
    pub fn release(&mut self, m: usize) -> Result<()> {
        if self.unfill(m)? {
            self.engine.release(m)?;
        }
        Ok(())
    }

    /// Empties fetched module `m`'s sharded parameters' storage (the engine's release
    /// follows); whether it was fetched.
    fn unfill(&mut self, m: usize) -> Result<bool> {
        if !self.modules[m].fetched {
            return Ok(false);
        }
        self.modules[m].fetched = false;
        for s in self.modules[m].slots.clone() {
            if self.slots[s].sharded {
                self.empty(s)?;
            }
        }
        Ok(true)
    }

    /// A gradient arrived for slot `s` (fully accumulated by candle's backward): the
    /// engine counts it, and when its module is complete reduces it; stage 3 then frees
    /// the module's parameters.
    pub fn gradient(&mut self, s: usize, grad: &[f32]) -> Result<()> {
        let slot = &self.slots[s];
        let (m, k) = match slot.trainable {
            Some(k) => (slot.module, k),
            None => return Ok(()),
        };
        self.engine.begin_grad(m, k)?;
        self.engine.add_grad_f32(m, k, grad)?;
        if self.engine.finish_grad(m, k)? {
            self.release(m)?;
        }
        Ok(())
    }

    /// After backward: the engine declares the modules not yet complete ready (their
    /// parameters that got no gradient keep a zero one, and are reported by name) and
    /// releases each fetched one right after, and the next micro-step counts from zero.
    pub fn finish_backward(&mut self) -> Result<()> {
        let mut release = Vec::new();
        for m in 0..self.modules.len() {
            let trainable = self.modules[m]
                .slots
                .iter()
                .any(|&s| self.slots[s].trainable.is_some());
            if trainable && !self.engine.grads_complete(m)? && self.unfill(m)? {
                release.push(m);
            }
        }
        let end = self.engine.end_backward(&release)?;
        self.missing = end
            .missing
            .iter()
            .filter_map(|&(m, k)| {
                self.modules[m]
                    .slots
                    .iter()
                    .find(|&&s| self.slots[s].trainable == Some(k))
                    .map(|&s| self.slots[s].name.clone())
            })
            .collect();
        Ok(())
    }

    /// Writes every parameter not managed by a wrapper back into candle's storage (after a
    /// step or a load): in stage 3 its module is gathered for the copy and released.
    pub fn refresh_unwrapped(&mut self) -> Result<()> {
        for m in 0..self.modules.len() {
            let todo: Vec<usize> = self.modules[m]
                .slots
                .iter()
                .copied()
                .filter(|&s| !self.slots[s].sharded)
                .collect();
            if todo.is_empty() {
                continue;
            }
            let gather = todo.iter().any(|&s| self.slots[s].gathered);
            if gather {
                self.engine.fetch(m)?;
            }
            for s in todo {
                self.fill(s)?;
            }
            if gather {
                self.engine.release(m)?;
            }
        }
        Ok(())
    }
}
