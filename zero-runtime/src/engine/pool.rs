//! The staging buffers of stages 2–3's whole-bucket gradients, lent to a bucket from its
//! first gradient of a pass until its reduce-scatter is done, and the scratch outputs of
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
    /// Capacity of the staging buffer each bucket holds now.
    cap_of: Vec<usize>,
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
            cap_of: vec![0; buckets],
            scratch: Vec::new(),
            scratch_allocated: 0,
        }
    }

    /// The smallest idle buffer of at least `len` elements, lent to bucket `b`.
    pub(super) fn lend(&mut self, b: usize, len: usize) -> Option<B> {
        let i = (0..self.idle.len())
            .filter(|&i| self.idle[i].1 >= len)
            .min_by_key(|&i| self.idle[i].1)?;
        let (buf, cap) = self.idle.swap_remove(i);
        self.cap_of[b] = cap;
        self.peak = self.peak.max(self.in_use());
        Some(buf)
    }

    /// A new idle buffer of `len` elements.
    pub(super) fn add(&mut self, buf: B, len: usize) {
        self.idle.push((buf, len));
        self.allocated += len;
        self.buffers += 1;
    }

    /// The capacity of the buffer bucket `b` holds now.
    pub(super) fn cap_of(&self, b: usize) -> usize {
        self.cap_of[b]
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
