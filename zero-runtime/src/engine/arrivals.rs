//! Gradient arrivals: the one place that decides when a module's gradients are complete.
//!
//! A trainer hands the engine each trainable parameter's gradient as its backward
//! produces it (`begin_grad`, write it, `finish_grad`). The engine counts the arrivals per
//! parameter in the pass under way and compares them with what it expects of one
//! backward:
//!
//! | expectation | where it comes from | a module is complete |
//! |---|---|---|
//! | `Unknown` | nothing yet | at the end of backward |
//! | `Predicted` | `predict_grads`: the modules the first forward used only with gradients enabled (autograd sums a leaf's uses before accumulating it, so each of their parameters gets one gradient) | once each of its parameters got one, or at the end |
//! | `Learned` | what the first backward counted (`end_backward`) | once each of its parameters got as many as then; a module one of whose parameters got none waits for the end |
//!
//! A complete module is declared ready on the spot (`grads_ready`: its bucket's reduction
//! starts once every module of the bucket is), and `end_backward` declares the rest, in
//! reverse registration order, with a parameter that got nothing counting as zero. A
//! gradient for a module already declared ready is an error naming the parameter: its
//! bucket was already reduced (a parameter used in more reentrant checkpoint segments than
//! the first backward taught). Every rank decides alike, as their collectives must match.

use super::Engine;
use crate::device::Device;
use crate::EngineError;
use zero_comm::Communicator;

/// What the engine expects of one backward, per trainable parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation {
    /// Nothing yet: every module is complete at the end of backward.
    Unknown,
    /// One gradient per trainable parameter of the modules the trainer named before the
    /// first backward.
    Predicted,
    /// The counts of the first backward.
    Learned,
}

impl Expectation {
    /// Its name, as front-ends show it (`unknown`, `predicted`, `learned`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Predicted => "predicted",
            Self::Learned => "learned",
        }
    }
}

/// What the end of a backward decided ([`Engine::end_backward`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackwardEnd {
    /// Modules declared ready at the end, in the order they were (reverse registration).
    pub late: Vec<usize>,
    /// Trainable parameters that got no gradient in this backward, as `(module, k)` with
    /// `k` counting the module's trainable parameters: their gradient is zero.
    pub missing: Vec<(usize, usize)>,
    /// Whether this backward was the first, whose counts the engine now expects.
    pub learned_now: bool,
}

/// The counts, per trainable parameter (flattened module by module).
pub(super) struct Arrivals {
    /// Per module, its first trainable parameter's slot; one more entry at the end.
    first: Vec<usize>,
    /// Gradients received in the pass under way.
    counts: Vec<u32>,
    /// Gradients expected per backward (0: none known, the module waits for the end).
    expected: Vec<u32>,
    /// Per module: trainable parameters still short of their expected count in this
    /// pass (`None`: complete only at the end).
    short: Vec<Option<usize>>,
    /// `short` as each pass starts.
    short_at_start: Vec<Option<usize>>,
    /// Per module: declared complete in this pass (the engine's own per-micro-step
    /// readiness starts over as soon as every module is, which can be before the end of
    /// backward).
    complete: Vec<bool>,
    expectation: Expectation,
}

impl Arrivals {
    /// Counters for modules with these numbers of trainable parameters.
    pub(super) fn new(trainable: impl IntoIterator<Item = usize>) -> Self {
        let mut first = vec![0];
        for n in trainable {
            first.push(first[first.len() - 1] + n);
        }
        let params = first[first.len() - 1];
        let modules = first.len() - 1;
        Self {
            first,
            counts: vec![0; params],
            expected: vec![0; params],
            short: vec![None; modules],
            short_at_start: vec![None; modules],
            complete: vec![false; modules],
            expectation: Expectation::Unknown,
        }
    }

    /// Trainable parameters of module `m`.
    pub(super) fn trainable(&self, m: usize) -> usize {
        self.first[m + 1] - self.first[m]
    }

    pub(super) fn expectation(&self) -> Expectation {
        self.expectation
    }

    /// Expects one gradient per trainable parameter of `modules` (only while nothing is
    /// expected; a list without trainable parameters predicts nothing). Returns whether
    /// the engine now expects something.
    pub(super) fn predict(&mut self, modules: &[usize]) -> bool {
        if self.expectation != Expectation::Unknown {
            return true;
        }
        for &m in modules {
            let n = self.trainable(m);
            if n == 0 {
                continue;
            }
            self.expected[self.first[m]..self.first[m + 1]].fill(1);
            self.short_at_start[m] = Some(n);
            self.expectation = Expectation::Predicted;
        }
        self.short.clone_from(&self.short_at_start);
        self.expectation != Expectation::Unknown
    }

    /// Gradients parameter `k` of module `m` got in this pass.
    pub(super) fn count(&self, m: usize, k: usize) -> u32 {
        self.counts[self.first[m] + k]
    }

    /// One more gradient for parameter `k` of module `m`: whether the module is now
    /// complete.
    pub(super) fn arrive(&mut self, m: usize, k: usize) -> bool {
        let slot = self.first[m] + k;
        self.counts[slot] += 1;
        if self.counts[slot] != self.expected[slot] {
            return false;
        }
        let done = match &mut self.short[m] {
            Some(left) => {
                *left -= 1;
                *left == 0
            }
            None => false,
        };
        self.complete[m] |= done;
        done
    }

    /// Whether module `m` was declared complete in this pass.
    pub(super) fn complete(&self, m: usize) -> bool {
        self.complete[m]
    }

    /// Trainable modules not yet complete in this pass, in reverse order; they are from
    /// now on.
    fn complete_the_rest(&mut self) -> Vec<usize> {
        let late: Vec<usize> = (0..self.complete.len())
            .rev()
            .filter(|&m| self.trainable(m) > 0 && !self.complete[m])
            .collect();
        self.complete.fill(true);
        late
    }

    /// At the end of the first backward: its counts become what every later one expects,
    /// and a module is complete early only when each of its parameters got at least one.
    /// Returns whether it learned now.
    pub(super) fn learn(&mut self) -> bool {
        if self.expectation == Expectation::Learned {
            return false;
        }
        self.expected.clone_from(&self.counts);
        for m in 0..self.short_at_start.len() {
            let range = self.first[m]..self.first[m + 1];
            let all = !range.is_empty() && self.counts[range].iter().all(|&c| c > 0);
            self.short_at_start[m] = all.then(|| self.trainable(m));
        }
        self.expectation = Expectation::Learned;
        true
    }

    /// Trainable parameters that got nothing in this pass, as `(module, k)`.
    pub(super) fn missing(&self) -> Vec<(usize, usize)> {
        (0..self.short.len())
            .flat_map(|m| (0..self.trainable(m)).map(move |k| (m, k)))
            .filter(|&(m, k)| self.count(m, k) == 0)
            .collect()
    }

    /// Starts the next pass from zero.
    pub(super) fn reset(&mut self) {
        self.counts.fill(0);
        self.short.clone_from(&self.short_at_start);
        self.complete.fill(false);
    }
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// What the engine expects of one backward (see the module docs).
    pub fn expectation(&self) -> Expectation {
        self.arrivals.expectation()
    }

    /// Before the first backward: each trainable parameter of `modules` (the modules the
    /// first forward used, every use with gradients enabled) gets one gradient per
    /// backward, so those modules are reduced as soon as they are complete from the first
    /// backward on. Once something is expected this does nothing. Returns whether the
    /// engine now expects something (a list without trainable parameters predicts
    /// nothing).
    pub fn predict_grads(&mut self, modules: &[usize]) -> Result<bool, EngineError> {
        for &m in modules {
            self.module(m)?;
        }
        Ok(self.arrivals.predict(modules))
    }

    /// Whether module `m`'s gradients were declared complete in the pass under way (its
    /// reduction is issued or waits for the rest of its bucket).
    pub fn grads_complete(&self, m: usize) -> Result<bool, EngineError> {
        self.module(m)?;
        Ok(self.arrivals.complete(m))
    }

    /// A gradient of trainable parameter `k` of module `m` (counting trainable parameters
    /// only) is about to be written into the engine's buffers; [`finish_grad`](Self::finish_grad)
    /// follows the write. Returns whether the write copies over the buffer (its first
    /// arrival in this micro-step, where the buffers do not accumulate micro-steps in
    /// place) rather than adds. An error when the module's gradients were already
    /// complete: its bucket was reduced.
    pub fn begin_grad(&mut self, m: usize, k: usize) -> Result<bool, EngineError> {
        let module = self.module(m)?;
        let n = self.arrivals.trainable(m);
        if k >= n {
            return Err(EngineError::GradShape {
                module: module.name.clone(),
                detail: format!("no trainable parameter {k}: the module has {n}"),
            });
        }
        let count = self.arrivals.count(m, k);
        if self.arrivals.complete(m) {
            let before = match self.arrivals.expectation() {
                Expectation::Learned => "the first backward",
                _ => "its uses in the first forward predicted",
            };
            return Err(EngineError::Order(format!(
                "parameter {} received its gradient {} times in this backward, more than the {count} {before} (a parameter used in more reentrant checkpoint segments than before?); its bucket was already reduced",
                self.trainable_name(m, k),
                count + 1
            )));
        }
        Ok(count == 0 && !self.grads_accumulate_in_place())
    }

    /// The gradient [`begin_grad`](Self::begin_grad) announced is written: it is counted,
    /// and when module `m` is now complete it is declared ready (its reduction starts once
    /// its bucket is complete). Returns whether it was.
    pub fn finish_grad(&mut self, m: usize, k: usize) -> Result<bool, EngineError> {
        if !self.count_grad(m, k)? {
            return Ok(false);
        }
        self.grads_ready(m)?;
        Ok(true)
    }

    /// The first half of [`finish_grad`](Self::finish_grad), which never communicates:
    /// counts the gradient and returns whether module `m` is now complete, which the
    /// caller then declares with [`grads_ready`](Self::grads_ready) (a front-end counts
    /// under the lock it wrote the gradient under, and leaves it only to declare).
    pub fn count_grad(&mut self, m: usize, k: usize) -> Result<bool, EngineError> {
        self.module(m)?;
        if k >= self.arrivals.trainable(m) {
            return Err(EngineError::Order(format!(
                "finish_grad({m}, {k}) without begin_grad: the module has {} trainable parameters",
                self.arrivals.trainable(m)
            )));
        }
        Ok(self.arrivals.arrive(m, k))
    }

    /// The end of a backward: the first one's counts become what the engine expects,
    /// every trainable module not yet complete is declared ready (in reverse
    /// registration order; a parameter that got no gradient counts as zero), the pass is
    /// counted (`passes_since_step`), and the next pass counts from zero.
    ///
    /// `release`: the modules the trainer is done with (stage 3: those still gathered).
    /// Each one declared ready here is released right after it is, and the others after
    /// every declaration, in the order given: the last declaration ends the micro-step
    /// and rewinds the fetch trace, so a module released before it is freed, as a module
    /// complete during backward is, rather than kept for a reuse the trace would foresee.
    pub fn end_backward(&mut self, release: &[usize]) -> Result<BackwardEnd, EngineError> {
        for &m in release {
            self.module(m)?;
        }
        let learned_now = self.arrivals.learn();
        let missing = self.arrivals.missing();
        let late = self.arrivals.complete_the_rest();
        self.arrivals.reset();
        for &m in &late {
            self.grads_ready(m)?;
            if release.contains(&m) {
                self.release(m)?;
            }
        }
        for &m in release.iter().filter(|m| !late.contains(m)) {
            self.release(m)?;
        }
        self.window.end_backward();
        Ok(BackwardEnd {
            late,
            missing,
            learned_now,
        })
    }

    /// Forgets the arrivals counted in a pass that failed part-way (the buffers keep what
    /// was written: [`zero_grad`](Self::zero_grad) discards it).
    pub fn discard_arrivals(&mut self) {
        self.arrivals.reset();
    }

    /// The full name of trainable parameter `k` of module `m` (`module.param`).
    fn trainable_name(&self, m: usize, k: usize) -> String {
        let module = &self.modules[m];
        let param = module.params.iter().filter(|p| p.trainable).nth(k);
        match (module.name.as_str(), param) {
            (_, None) => format!("{k} of module `{}`", module.name),
            ("", Some(p)) => p.name.clone(),
            (name, Some(p)) => format!("{name}.{}", p.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_completes_nothing_early() {
        let mut a = Arrivals::new([2, 0, 1]);
        assert!(!a.arrive(0, 0) && !a.arrive(0, 1) && !a.arrive(2, 0));
        assert_eq!(a.missing(), vec![]);
        a.reset();
        assert_eq!(a.count(0, 0), 0);
    }

    #[test]
    fn a_prediction_completes_a_module_at_its_last_gradient() {
        let mut a = Arrivals::new([2, 0, 1]);
        assert!(
            !a.predict(&[1]),
            "a module without trainable parameters predicts nothing"
        );
        assert!(a.predict(&[0]));
        assert_eq!(a.expectation(), Expectation::Predicted);
        assert!(!a.arrive(0, 1));
        assert!(a.arrive(0, 0));
        assert!(!a.arrive(2, 0), "module 2 was not predicted");
        assert_eq!(a.missing(), vec![]);
    }

    #[test]
    fn the_first_backward_teaches_the_counts() {
        let mut a = Arrivals::new([2, 1, 1]);
        a.predict(&[0, 1, 2]);
        // Module 0's first parameter twice (a reentrant segment), module 2's never.
        a.arrive(0, 0);
        a.arrive(0, 0);
        a.arrive(0, 1);
        a.arrive(1, 0);
        assert_eq!(a.missing(), vec![(2, 0)]);
        assert!(a.learn());
        assert!(!a.learn(), "only the first backward teaches");
        a.reset();
        assert!(
            !a.arrive(0, 0) && !a.arrive(0, 1),
            "two expected of the first"
        );
        assert!(a.arrive(0, 0));
        assert!(a.arrive(1, 0));
        assert!(
            !a.arrive(2, 0),
            "a module with a parameter that got none waits for the end"
        );
        assert!(a.complete(0) && a.complete(1) && !a.complete(2));
        assert_eq!(a.complete_the_rest(), vec![2]);
        a.reset();
        assert!(!a.complete(0));
    }
}
