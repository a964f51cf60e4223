//! The accumulation window, in one place: what a DeepSpeed front-end counts
//! (`micro_steps`, its `step()` calls; the passes since the last; the boundary a script
//! declared with `set_gradient_accumulation_boundary`) and what the reductions follow
//! (the micro-steps that ended in the window, the boundary applied to them, whether the
//! last one ended the window). DeepSpeed's engine keeps the first half in Python; here
//! both live beside the reductions, so a front-end asks instead of computing, and a
//! change to accumulation is made here.
//!
//! ```text
//! backward() ─backward_call─► the declared boundary is applied to the pass
//!   first gradient ─begin_pass─► a second pass before step(): reopen_micro_step
//!   last module ready ─end_micro_step─► ended + 1; it ended the window? (applied, else
//!                                       ended == gradient_accumulation_steps)
//!   end of backward ─end_backward─► passes_since_step + 1
//! step() ─step_call─► no pass: Order error │ micro_steps + 1 │ boundary? → optimizer step
//! Engine::step ─is_complete?─► no: Order error │ the step │ close: ended 0
//! zero_grad() ─discard─► window discarded (micro_steps back to the window's start)
//! ```

use super::Engine;
use crate::device::Device;
use crate::EngineError;
use zero_comm::Communicator;

/// The window's counters (see the module docs). Every change goes through a method
/// named for the transition.
#[derive(Debug)]
pub(super) struct Window {
    /// `gradient_accumulation_steps`.
    length: u64,
    /// `step()` calls (DeepSpeed's `engine.micro_steps`).
    micro_steps: u64,
    /// Passes since the last `step()` call: a second reopens the micro-step.
    passes_since_step: u64,
    /// What `set_gradient_accumulation_boundary` last said (`None`: never called).
    declared: Option<bool>,
    /// Micro-steps of this window that ended (every trainable module reported ready).
    ended: u64,
    /// The window's end as applied to the reductions (`set_accumulation_boundary`);
    /// `None`: `length` micro-steps are counted.
    applied: Option<bool>,
    /// Whether the micro-step that ended last ended the window (its reductions ran).
    last_ended_window: bool,
}

impl Window {
    /// An empty window of `length` micro-steps.
    pub(super) fn new(length: u64) -> Self {
        Self {
            length,
            micro_steps: 0,
            passes_since_step: 0,
            declared: None,
            ended: 0,
            applied: None,
            last_ended_window: false,
        }
    }

    /// Whether the micro-step under way ends the window: the applied boundary, else
    /// whether it is the window's `length`-th.
    pub(super) fn pass_ends_window(&self) -> bool {
        self.applied.unwrap_or(self.ended + 1 == self.length)
    }

    /// Micro-steps of this window that ended.
    pub(super) fn ended(&self) -> u64 {
        self.ended
    }

    /// Whether the micro-step that ended last ended the window.
    pub(super) fn last_ended_window(&self) -> bool {
        self.last_ended_window
    }

    /// Every trainable module of the micro-step under way reported ready.
    pub(super) fn end_micro_step(&mut self) {
        self.last_ended_window = self.pass_ends_window();
        self.ended += 1;
    }

    /// The micro-step that ended last takes another pass (`reopen_micro_step`).
    pub(super) fn reopen(&mut self) {
        self.ended -= 1;
    }

    /// Whether the window is complete, so the optimizer may step: it ended on the
    /// applied boundary, or after `length` micro-steps.
    pub(super) fn is_complete(&self) -> bool {
        match self.applied {
            Some(_) => self.ended >= 1 && self.last_ended_window,
            None => self.ended == self.length,
        }
    }

    /// The step ended (taken or skipped), or the window was discarded: a new window.
    pub(super) fn close(&mut self) {
        self.ended = 0;
        self.last_ended_window = false;
    }

    /// The trainer applies a boundary (`None`: count `length` again).
    pub(super) fn apply(&mut self, boundary: Option<bool>) {
        self.applied = boundary;
    }

    /// The front-end's backward ended.
    pub(super) fn end_backward(&mut self) {
        self.passes_since_step += 1;
    }

    /// The script declares the boundary (`set_gradient_accumulation_boundary`).
    fn declare(&mut self, boundary: bool) {
        self.declared = Some(boundary);
    }

    /// The front-end's `step()`: counts a micro-step and says whether it is the boundary;
    /// `None` when no backward ran since the last `step()` (nothing counted).
    fn step_call(&mut self) -> Option<bool> {
        if self.passes_since_step == 0 {
            return None;
        }
        let boundary = self.is_boundary();
        self.passes_since_step = 0;
        self.micro_steps += 1;
        Some(boundary)
    }

    /// DeepSpeed's `is_gradient_accumulation_boundary`.
    fn is_boundary(&self) -> bool {
        self.declared
            .unwrap_or((self.micro_steps + 1) % self.length == 0)
    }

    /// `zero_grad` discards the window: no pass since the step, `micro_steps` back at
    /// the window's start, and the reductions' window empty.
    fn discard(&mut self) {
        self.passes_since_step = 0;
        self.micro_steps -= self.micro_steps % self.length;
        self.close();
    }
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
        self.window.declare(boundary);
    }

    /// DeepSpeed's `is_gradient_accumulation_boundary`: the declared boundary, else whether
    /// the next `step()` call completes `gradient_accumulation_steps` micro-steps.
    pub fn is_gradient_accumulation_boundary(&self) -> bool {
        self.window.is_boundary()
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
        self.window.step_call().ok_or_else(|| {
            EngineError::Order(
                "step() was called before backward(): there are no gradients for this micro-step"
                    .into(),
            )
        })
    }

    /// Declares whether the next micro-steps end the accumulation window (`Some`), as
    /// DeepSpeed's `set_gradient_accumulation_boundary` (accelerate calls it before every
    /// backward, and steps only at a boundary): a window then holds as many micro-steps as
    /// the trainer ran, a short last one included, and `step()` follows a micro-step
    /// declared the boundary. `None` counts `gradient_accumulation_steps` again. A window
    /// of several micro-steps needs the accumulation buffers, so `Some(false)` with
    /// `gradient_accumulation_steps` 1 is refused. Set it between micro-steps.
    pub fn set_accumulation_boundary(&mut self, boundary: Option<bool>) -> Result<(), EngineError> {
        if boundary == Some(false) && self.window.length == 1 {
            return Err(EngineError::Order(
                "set_gradient_accumulation_boundary(False) with gradient_accumulation_steps 1: a window of several micro-steps needs gradient_accumulation_steps > 1 in the config".into(),
            ));
        }
        if self.pass.ready_count() != 0 {
            return Err(EngineError::Order(format!(
                "set_gradient_accumulation_boundary during a micro-step ({} modules reported ready): set it before the backward",
                self.pass.ready_count()
            )));
        }
        self.window.apply(boundary);
        Ok(())
    }

    /// The window is discarded (`zero_grad`).
    pub(super) fn discard_window(&mut self) {
        self.window.discard();
    }
}

#[cfg(test)]
mod tests {
    use super::Window;

    #[test]
    fn counted_window_completes_after_its_length() {
        let mut w = Window::new(3);
        for i in 0..3 {
            assert!(!w.is_complete(), "complete after {i} micro-steps");
            assert_eq!(w.pass_ends_window(), i == 2);
            w.end_micro_step();
        }
        assert!(w.is_complete() && w.last_ended_window());
        w.close();
        assert!(!w.is_complete());
        assert_eq!(w.ended(), 0);
    }

    #[test]
    fn applied_boundary_ends_a_short_window_and_reopen_takes_a_pass_back() {
        let mut w = Window::new(4);
        w.apply(Some(false));
        w.end_micro_step();
        assert!(!w.is_complete());
        w.apply(Some(true));
        assert!(w.pass_ends_window());
        w.end_micro_step();
        assert!(w.is_complete());
        w.reopen();
        assert_eq!(w.ended(), 1);
        assert!(
            w.last_ended_window(),
            "a reopened pass keeps the boundary it ended on"
        );
    }

    #[test]
    fn front_end_counts_and_discard() {
        let mut w = Window::new(2);
        assert!(!w.is_boundary());
        w.micro_steps = 3;
        assert!(w.is_boundary());
        w.declared = Some(false);
        assert!(!w.is_boundary());
        assert_eq!(
            w.step_call(),
            None,
            "a step() with no backward counts nothing"
        );
        w.end_backward();
        assert_eq!(w.step_call(), Some(false));
        assert_eq!((w.micro_steps, w.passes_since_step), (4, 0));
        w.micro_steps = 3;
        w.passes_since_step = 1;
        w.end_micro_step();
        w.discard();
        assert_eq!((w.micro_steps, w.passes_since_step, w.ended()), (2, 0, 0));
    }
}
