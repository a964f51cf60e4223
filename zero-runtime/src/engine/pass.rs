//! Which modules the micro-step under way has fetched and which have reported their
//! gradients ready: a second fetch of a module starts the backward phase, and the last
//! trainable module's `grads_ready` ends the micro-step.

/// The modules' flags in the micro-step under way (see the module docs).
pub(super) struct Pass {
    /// Modules that reported their gradients ready.
    ready: Vec<bool>,
    /// Modules fetched.
    fetched: Vec<bool>,
    /// Trainable modules (those with gradient buckets) that reported ready.
    ready_count: usize,
    /// Trainable modules.
    trainable: usize,
}

impl Pass {
    /// A pass over `modules` modules, `trainable` of them with gradient buckets.
    pub(super) fn new(modules: usize, trainable: usize) -> Self {
        Self {
            ready: vec![false; modules],
            fetched: vec![false; modules],
            ready_count: 0,
            trainable,
        }
    }

    /// Whether module `m` reported its gradients ready.
    pub(super) fn is_ready(&self, m: usize) -> bool {
        self.ready[m]
    }

    /// Module `m` reported its gradients ready (`trainable`: it has gradient buckets).
    /// Whether that was the last trainable module: the micro-step is complete.
    pub(super) fn mark_ready(&mut self, m: usize, trainable: bool) -> bool {
        self.ready[m] = true;
        if trainable {
            self.ready_count += 1;
        }
        trainable && self.ready_count == self.trainable
    }

    /// Trainable modules that reported ready so far (0 between micro-steps).
    pub(super) fn ready_count(&self) -> usize {
        self.ready_count
    }

    /// Module `m` is fetched; whether it was already (its backward begins).
    pub(super) fn fetch(&mut self, m: usize) -> bool {
        std::mem::replace(&mut self.fetched[m], true)
    }

    /// A forward with no backward: its fetches do not count.
    pub(super) fn forget_fetches(&mut self) {
        self.fetched.iter_mut().for_each(|f| *f = false);
    }

    /// The micro-step ended (or was discarded): every flag down.
    pub(super) fn reset(&mut self) {
        self.ready_count = 0;
        self.ready.iter_mut().for_each(|r| *r = false);
        self.forget_fetches();
    }
}
