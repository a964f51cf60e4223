//! The accumulation window as a DeepSpeed front-end counts it: `micro_steps` (calls of its
//! `step()`, every micro-step's), the passes (backwards) since the last, and the boundary
//! a script declared (`set_gradient_accumulation_boundary`). DeepSpeed's engine keeps
//! these in Python; here the engine keeps them beside its own reductions' window, so a
//! front-end asks instead of computing.
//!
//! ```text
//! backward() ─backward_call─► declared boundary applies to the pass
//!   first gradient hook ─begin_pass─► a second pass before step(): reopen_micro_step
//!   end of backward ─end_backward─► passes_since_step + 1
//! step() ─step_call─► no pass: Order error │ micro_steps + 1 │ boundary? → optimizer step
//! zero_grad() ─zero_grad─► window discarded (micro_steps back to the window's start)
//! ```

use super::Engine;
use crate::device::Device;
use crate::EngineError;
use zero_comm::Communicator;

/// The front-end's counters.
#[derive(Debug, Default)]
pub(super) struct Window {
    /// `step()` calls (DeepSpeed's `engine.micro_steps`).
    pub(super) micro_steps: u64,
    /// Passes since the last `step()` call: a second reopens the micro-step.
    pub(super) passes_since_step: u64,
    /// What `set_gradient_accumulation_boundary` last said (`None`: never called).
    pub(super) declared: Option<bool>,
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// DeepSpeed's `engine.micro_steps`: `step()` calls so far, less those of windows
    /// `zero_grad` discarded.
    pub fn micro_steps(&self) -> u64 {
        self.window.micro_steps
    }

    /// Passes (backwards) since the last `step()` call.
    pub fn passes_since_step(&self) -> u64 {
        self.window.passes_since_step
    }

    /// DeepSpeed's `set_gradient_accumulation_boundary`: whether the next `step()` calls
    /// apply the optimizer, instead of counting micro-steps; it holds until declared
    /// again, and reaches the reductions at the next [`backward_call`](Self::backward_call).
    pub fn declare_boundary(&mut self, boundary: bool) {
        self.window.declared = Some(boundary);
    }

    /// DeepSpeed's `is_gradient_accumulation_boundary`: the declared boundary, else whether
    /// the next `step()` call completes `gradient_accumulation_steps` micro-steps.
    pub fn is_gradient_accumulation_boundary(&self) -> bool {
        self.window
            .declared
            .unwrap_or((self.window.micro_steps + 1) % self.cfg.gradient_accumulation_steps == 0)
    }

    /// The front-end's `backward()` begins: a declared boundary applies to its pass
    /// ([`set_accumulation_boundary`](Self::set_accumulation_boundary), whose errors it
    /// raises).
    pub fn backward_call(&mut self) -> Result<(), EngineError> {
        match self.window.declared {
            Some(b) => self.set_accumulation_boundary(Some(b)),
            None => Ok(()),
        }
    }

    /// A backward of this engine begins (its first gradient, or its first module): a
    /// second pass before `step()` adds to the first's gradients
    /// ([`reopen_micro_step`](Self::reopen_micro_step)), as a second `backward()` does in
    /// DeepSpeed.
    pub fn begin_pass(&mut self) -> Result<(), EngineError> {
        if self.window.passes_since_step > 0 {
            self.reopen_micro_step()?;
        }
        Ok(())
    }

    /// The front-end's `step()`: counts a micro-step and says whether the optimizer steps
    /// now (the accumulation boundary). An error when no backward ran since the last.
    pub fn step_call(&mut self) -> Result<bool, EngineError> {
        if self.window.passes_since_step == 0 {
            return Err(EngineError::Order(
                "step() was called before backward(): there are no gradients for this micro-step"
                    .into(),
            ));
        }
        let boundary = self.is_gradient_accumulation_boundary();
        self.window.passes_since_step = 0;
        self.window.micro_steps += 1;
        Ok(boundary)
    }

    /// `zero_grad` discards the window: no pass since the step, and `micro_steps` back at
    /// the window's start.
    pub(super) fn discard_window(&mut self) {
        self.window.passes_since_step = 0;
        self.window.micro_steps -= self.window.micro_steps % self.cfg.gradient_accumulation_steps;
    }
}
