//! Vector clocks: which operations happened before which.
//!
//! Every agent (a stream, or the host) counts its own operations. An operation carries the
//! clock of everything it is ordered after: its own stream's earlier operations, the
//! streams whose events its stream waited for, and whatever the host had synchronized with
//! when it enqueued the operation. Operation `(agent a, tick t)` happened before an
//! operation with clock `V` exactly when `V[a] >= t`.

/// An agent: a stream, or the host (all host threads together, [`HOST`]).
pub type Agent = u32;

/// The host's agent number.
pub const HOST: Agent = 0;

/// A sparse vector clock: `(agent, tick)` pairs sorted by agent, absent agents at 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VectorClock(Vec<(Agent, u64)>);

impl VectorClock {
    /// The tick of `agent` (0 if absent).
    pub fn get(&self, agent: Agent) -> u64 {
        match self.0.binary_search_by_key(&agent, |&(a, _)| a) {
            Ok(i) => self.0[i].1,
            Err(_) => 0,
        }
    }

    /// Raises `agent`'s tick to at least `tick`.
    pub fn raise(&mut self, agent: Agent, tick: u64) {
        match self.0.binary_search_by_key(&agent, |&(a, _)| a) {
            Ok(i) => self.0[i].1 = self.0[i].1.max(tick),
            Err(i) => self.0.insert(i, (agent, tick)),
        }
    }

    /// Joins `other` into this clock (element-wise maximum).
    pub fn join(&mut self, other: &VectorClock) {
        if other.0.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(self.0.len() + other.0.len());
        let (mut i, mut j) = (0, 0);
        while i < self.0.len() || j < other.0.len() {
            match (self.0.get(i), other.0.get(j)) {
                (Some(&(a, x)), Some(&(b, y))) if a == b => {
                    out.push((a, x.max(y)));
                    i += 1;
                    j += 1;
                }
                (Some(&(a, x)), Some(&(b, _))) if a < b => {
                    out.push((a, x));
                    i += 1;
                }
                (Some(_), Some(&(b, y))) => {
                    out.push((b, y));
                    j += 1;
                }
                (Some(&p), None) => {
                    out.push(p);
                    i += 1;
                }
                (None, Some(&p)) => {
                    out.push(p);
                    j += 1;
                }
                (None, None) => break,
            }
        }
        self.0 = out;
    }

    /// Whether operation `(agent, tick)` happened before anything carrying this clock.
    pub fn covers(&self, agent: Agent, tick: u64) -> bool {
        self.get(agent) >= tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_is_the_elementwise_maximum() {
        let mut a = VectorClock::default();
        a.raise(1, 5);
        a.raise(4, 2);
        let mut b = VectorClock::default();
        b.raise(2, 7);
        b.raise(4, 9);
        a.join(&b);
        assert_eq!((a.get(1), a.get(2), a.get(3), a.get(4)), (5, 7, 0, 9));
        assert!(a.covers(4, 9) && !a.covers(4, 10) && a.covers(3, 0));
    }
}
