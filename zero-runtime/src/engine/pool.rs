//! The staging buffers of stages 2–3's whole-bucket gradients, lent to a bucket from its
//! first gradient of a pass until its reduce-scatter is done (the pool keeps which bucket
//! holds which), and the scratch outputs of
//! reductions added into a gradient shard: what the engine keeps of both, and what the
//! memory report counts.

/// Idle buffers, and the books of every one allocated (see the module docs).
pub(super) struct StagingPool<B> {
    /// Idle staging buffers, with their capacity in elements.
    idle: Vec<(B, usize)>,
    /// Capacity of every staging buffer allocated (idle or in use), in elements.
    allocated: usize,
    /// Staging buffers allocated (idle or in use).
    buffers: usize,
    /// The most staging buffers in use at once in this micro-step: what the pool keeps.
    peak: usize,
    /// The staging buffer each bucket holds now, with its capacity.
    lent: Vec<Option<(B, usize)>>,
    /// Idle outputs of reductions added into a gradient shard (stages 2–3 summing a window
    /// in the gradients' dtype).
    scratch: Vec<B>,
    /// Capacity of every such output allocated, in elements.
    scratch_allocated: usize,
}

impl<B> StagingPool<B> {
    /// An empty pool for `buckets` buckets.
    pub(super) fn new(buckets: usize) -> Self {
        Self {
            idle: Vec::new(),
            allocated: 0,
            buffers: 0,
            peak: 0,
            lent: (0..buckets).map(|_| None).collect(),
            scratch: Vec::new(),
            scratch_allocated: 0,
        }
    }

    /// The smallest idle buffer of at least `len` elements, with its capacity, taken to
    /// be lent (then [`hold`](Self::hold)).
    pub(super) fn take_idle(&mut self, len: usize) -> Option<(B, usize)> {
        let i = (0..self.idle.len())
            .filter(|&i| self.idle[i].1 >= len)
            .min_by_key(|&i| self.idle[i].1)?;
        let taken = self.idle.swap_remove(i);
        self.peak = self.peak.max(self.in_use());
        Some(taken)
    }

    /// A new idle buffer of `len` elements.
    pub(super) fn add(&mut self, buf: B, len: usize) {
        self.idle.push((buf, len));
        self.allocated += len;
        self.buffers += 1;
    }

    /// Bucket `b` holds `buf` (of capacity `cap`): the buffer its backward writes.
    pub(super) fn hold(&mut self, b: usize, buf: B, cap: usize) -> &mut B {
        &mut self.lent[b].insert((buf, cap)).0
    }

    /// The buffer bucket `b` holds, if it holds one.
    pub(super) fn lent_mut(&mut self, b: usize) -> Option<&mut B> {
        self.lent[b].as_mut().map(|(buf, _)| buf)
    }

    /// The buffer each of `buckets` holds, if it holds one, in bucket order.
    pub(super) fn lent_mut_in(
        &mut self,
        buckets: std::ops::RangeInclusive<usize>,
    ) -> impl Iterator<Item = Option<&mut B>> {
        self.lent[buckets]
            .iter_mut()
            .map(|l| l.as_mut().map(|(buf, _)| buf))
    }

    /// The buffer bucket `b` holds, with its capacity, taken from it (for its
    /// reduce-scatter, or to be held again).
    pub(super) fn take_lent(&mut self, b: usize) -> Option<(B, usize)> {
        self.lent[b].take()
    }

    /// A lent buffer back (its capacity as lent).
    pub(super) fn give_back(&mut self, buf: B, cap: usize) {
        self.idle.push((buf, cap));
    }

    fn in_use(&self) -> usize {
        self.buffers - self.idle.len()
    }

    /// Keeps as many staging buffers as this micro-step had in use at once (the largest
    /// ones, which fit any bucket) and frees the other idle ones: a pass that held many
    /// (a first backward that cannot tell when a module is complete) does not keep them
    /// for the rest of the run.
    pub(super) fn trim(&mut self) {
        let in_use = self.in_use();
        let keep = self.peak.max(in_use);
        if self.buffers > keep {
            self.idle.sort_by_key(|(_, cap)| std::cmp::Reverse(*cap));
            let idle_kept = keep.saturating_sub(in_use);
            for (_, cap) in self.idle.drain(idle_kept..) {
                self.allocated -= cap;
                self.buffers -= 1;
            }
        }
        self.peak = in_use;
    }

    /// An idle scratch output whose length (`len_of`) is `len`.
    pub(super) fn take_scratch(&mut self, len: usize, len_of: impl Fn(&B) -> usize) -> Option<B> {
        let i = self.scratch.iter().position(|b| len_of(b) == len)?;
        Some(self.scratch.swap_remove(i))
    }

    /// A new scratch output of `len` elements is about to be allocated.
    pub(super) fn note_scratch(&mut self, len: usize) {
        self.scratch_allocated += len;
    }

    /// A scratch output back, idle.
    pub(super) fn give_back_scratch(&mut self, buf: B) {
        self.scratch.push(buf);
    }

    /// Elements of every staging buffer and scratch output allocated.
    pub(super) fn allocated_elements(&self) -> usize {
        self.allocated + self.scratch_allocated
    }
}
