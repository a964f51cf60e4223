//! The state the ranks of an in-process group share: the posts of the collectives some
//! but not all ranks have issued, the executor, and the bell waiters sleep on.

use super::Executor;
use crate::op::OpDesc;
use crate::wait::{spin_budget, Bell};
use crate::CommError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where one rank's result of one collective lands.
pub(crate) struct Slot<B> {
    ready: AtomicBool,
    value: Mutex<Option<Result<Vec<B>, CommError>>>,
}

/// A mutex whose holder panicked still guards consistent data here (every critical
/// section leaves it whole), so its poisoning is ignored.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<B> Slot<B> {
    fn new() -> Self {
        Slot {
            ready: AtomicBool::new(false),
            value: Mutex::new(None),
        }
    }

    /// Stores the result unless one is there already.
    fn fill(&self, r: Result<Vec<B>, CommError>) {
        let mut v = lock(&self.value);
        if v.is_none() && !self.ready.load(Ordering::Acquire) {
            *v = Some(r);
            self.ready.store(true, Ordering::Release);
        }
    }

    /// Whether the result is in.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The result, once.
    pub fn take(&self) -> Option<Result<Vec<B>, CommError>> {
        if !self.is_ready() {
            return None;
        }
        lock(&self.value).take()
    }
}

/// What a rank needs of the group's shared state (object-safe, so the rank's type does not
/// name the executor).
pub(crate) trait Meeting<B>: Send + Sync {
    /// Posts `rank`'s buffers for collective `seq`; runs it if this completes it.
    fn post(&self, rank: usize, seq: u64, desc: OpDesc, buffers: Vec<B>) -> Arc<Slot<B>>;
    /// Waits for `slot` until `deadline`.
    fn wait(&self, slot: &Slot<B>, deadline: Instant) -> Option<Result<Vec<B>, CommError>>;
    /// Aborts the group because `waiter`'s wait on `seq` expired.
    fn time_out(&self, seq: u64, waiter: usize, after: Duration, op: &str);
    /// Aborts the group (the first cause is kept) and fails everything pending.
    fn fail(&self, err: CommError);
}

struct Post<B> {
    desc: OpDesc,
    buffers: Vec<B>,
    slot: Arc<Slot<B>>,
}

struct State<B> {
    /// Collectives some but not all ranks have issued, by position.
    pending: BTreeMap<u64, Vec<Option<Post<B>>>>,
    /// Set once the group has failed; every later collective gets this error.
    broken: Option<CommError>,
}

/// The shared state of one group.
pub(crate) struct Shared<B, E> {
    world: usize,
    spin: Duration,
    state: Mutex<State<B>>,
    exec: Mutex<E>,
    bell_word: AtomicU32,
    sleepers: AtomicU32,
}

impl<B, E> Shared<B, E> {
    pub fn new(world: usize, exec: E) -> Self {
        Shared {
            world,
            spin: spin_budget(world),
            state: Mutex::new(State {
                pending: BTreeMap::new(),
                broken: None,
            }),
            exec: Mutex::new(exec),
            bell_word: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
        }
    }

    fn bell(&self) -> Bell<'_> {
        Bell {
            word: &self.bell_word,
            sleepers: &self.sleepers,
        }
    }
}

impl<B: Send, E: Executor<B>> Shared<B, E> {
    /// Runs collective `seq` now that every rank posted it.
    fn complete(&self, seq: u64, posts: Vec<Post<B>>) {
        if posts.iter().any(|p| p.desc != posts[0].desc) {
            let detail = posts
                .iter()
                .enumerate()
                .map(|(r, p)| format!("rank {r} issued {}", p.desc))
                .collect::<Vec<_>>()
                .join("; ");
            let err = CommError::Mismatch { seq, detail };
            for p in &posts {
                p.slot.fill(Err(err.clone()));
            }
            self.fail(err);
            return;
        }
        let desc = posts[0].desc.clone();
        let (mut buffers, slots): (Vec<Vec<B>>, Vec<Arc<Slot<B>>>) =
            posts.into_iter().map(|p| (p.buffers, p.slot)).unzip();
        let ran = lock(&self.exec).execute(&desc, &mut buffers);
        match ran {
            Ok(()) => {
                for (b, slot) in buffers.into_iter().zip(&slots) {
                    slot.fill(Ok(b));
                }
                self.bell().ring();
            }
            Err(reason) => {
                let err = CommError::Backend {
                    seq,
                    op: desc.to_string(),
                    reason,
                };
                for slot in &slots {
                    slot.fill(Err(err.clone()));
                }
                self.fail(err);
            }
        }
    }
}

impl<B: Send, E: Executor<B>> Meeting<B> for Shared<B, E> {
    fn post(&self, rank: usize, seq: u64, desc: OpDesc, buffers: Vec<B>) -> Arc<Slot<B>> {
        let slot = Arc::new(Slot::new());
        let complete = {
            let mut st = lock(&self.state);
            if let Some(err) = &st.broken {
                slot.fill(Err(err.clone()));
                return slot;
            }
            let world = self.world;
            let posts = st
                .pending
                .entry(seq)
                .or_insert_with(|| (0..world).map(|_| None).collect());
            posts[rank] = Some(Post {
                desc,
                buffers,
                slot: slot.clone(),
            });
            if posts.iter().all(Option::is_some) {
                st.pending.remove(&seq)
            } else {
                None
            }
        };
        if let Some(posts) = complete {
            self.complete(seq, posts.into_iter().flatten().collect());
        }
        slot
    }

    fn wait(&self, slot: &Slot<B>, deadline: Instant) -> Option<Result<Vec<B>, CommError>> {
        self.bell().wait(self.spin, deadline, || slot.take())
    }

    fn time_out(&self, seq: u64, waiter: usize, after: Duration, op: &str) {
        let missing = lock(&self.state)
            .pending
            .get(&seq)
            .map_or(Vec::new(), |posts| {
                posts
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.is_none())
                    .map(|(r, _)| r)
                    .collect()
            });
        self.fail(CommError::Timeout {
            seq,
            op: op.to_string(),
            after,
            waiter,
            missing,
        });
    }

    fn fail(&self, err: CommError) {
        {
            let mut st = lock(&self.state);
            let err = st.broken.get_or_insert(err).clone();
            for (_, posts) in std::mem::take(&mut st.pending) {
                for p in posts.into_iter().flatten() {
                    p.slot.fill(Err(err.clone()));
                }
            }
        }
        self.bell().ring();
    }
}
