//! What the engine's collectives sent, by purpose and by tier: since the engine was built,
//! and in the last optimizer step (the comm report reads both).

use super::tiers::TierCounters;
use super::CommCounters;
use zero_comm::TierStats;

/// The engine's books of elements sent.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CommBooks {
    /// Since the engine was built, by purpose.
    pub(super) total: CommCounters,
    /// The same, by tier.
    pub(super) tiers: TierCounters,
    /// Both at the start of the step under way.
    at_step_start: (CommCounters, TierCounters),
    /// In the last optimizer step, by purpose.
    pub(super) last_step: CommCounters,
    /// The same, by tier.
    pub(super) last_step_tiers: TierCounters,
}

impl CommBooks {
    /// Books what the communicator sent between `before` and `after` under `category`.
    pub(super) fn book(
        &mut self,
        category: fn(&mut CommCounters) -> &mut u64,
        before: TierStats,
        after: TierStats,
    ) {
        *category(&mut self.total) +=
            after.total().total_elements() - before.total().total_elements();
        self.tiers.book(category, before, after);
    }

    /// An optimizer step ended: what it sent becomes the last step's, and the next starts.
    pub(super) fn close_step(&mut self) {
        let (total, tiers) = self.at_step_start;
        self.last_step = self.total.since(total);
        self.last_step_tiers = self.tiers.since(tiers);
        self.at_step_start = (self.total, self.tiers);
    }
}
