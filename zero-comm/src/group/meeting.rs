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
    /// Posts `rank`'s buffers for collective `seq`; runs it if this completes it. A split
    /// (`desc.split`) posts no buffers and its `(color, key)` in `split`.
    fn post(
        &self,
        rank: usize,
        seq: u64,
        desc: OpDesc,
        buffers: Vec<B>,
        split: Option<(usize, usize)>,
    ) -> Arc<Slot<B>>;
    /// `rank`'s new group from split `seq`, once its slot was filled with success: the
    /// sub-group's meeting, `rank`'s rank in it and its size.
    fn take_split(&self, seq: u64, rank: usize) -> Option<SubGroup<B>>;
    /// Waits for `slot` until `deadline`.
    fn wait(&self, slot: &Slot<B>, deadline: Instant) -> Option<Result<Vec<B>, CommError>>;
    /// Aborts the group because `waiter`'s wait on `seq` expired.
    fn time_out(&self, seq: u64, waiter: usize, after: Duration, op: &str);
    /// Aborts the group (the first cause is kept) and fails everything pending.
    fn fail(&self, err: CommError);
}

/// A rank's share of a split: the new group's meeting, the rank in it, its size.
pub(crate) type SubGroup<B> = (Arc<dyn Meeting<B>>, usize, usize);

struct Post<B> {
    desc: OpDesc,
    buffers: Vec<B>,
    slot: Arc<Slot<B>>,
    /// A split's `(color, key)`.
    split: Option<(usize, usize)>,
}

struct State<B> {
    /// Collectives some but not all ranks have issued, by position.
    pending: BTreeMap<u64, Vec<Option<Post<B>>>>,
    /// Set once the group has failed; every later collective gets this error.
    broken: Option<CommError>,
    /// Completed splits' new groups, by (position, rank), until the rank takes its own.
    splits: BTreeMap<(u64, usize), SubGroup<B>>,
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
                splits: BTreeMap::new(),
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

impl<B: Send + 'static, E: Executor<B>> Shared<B, E> {
    /// Makes the new groups of split `seq`: the ranks of each color, ordered by (key,
    /// rank), meet in a fresh `Shared` with a fork of this group's executor.
    fn split(&self, seq: u64, posts: &[Post<B>]) -> Result<(), String> {
        let mut colors: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for (rank, p) in posts.iter().enumerate() {
            let (color, key) = p.split.unwrap_or((0, rank));
            colors.entry(color).or_default().push((key, rank));
        }
        let mut made = Vec::with_capacity(posts.len());
        for (_, mut members) in colors {
            members.sort_unstable();
            let exec = lock(&self.exec).fork()?;
            let n = members.len();
            let meeting: Arc<dyn Meeting<B>> = Arc::new(Shared::new(n, exec));
            for (new_rank, (_, rank)) in members.into_iter().enumerate() {
                made.push(((seq, rank), (meeting.clone(), new_rank, n)));
            }
        }
        lock(&self.state).splits.extend(made);
        Ok(())
    }

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
        let split = if desc.split {
            self.split(seq, &posts)
        } else {
            Ok(())
        };
        let (mut buffers, slots): (Vec<Vec<B>>, Vec<Arc<Slot<B>>>) =
            posts.into_iter().map(|p| (p.buffers, p.slot)).unzip();
        let ran = split.and_then(|()| {
            if desc.split {
                Ok(())
            } else {
                lock(&self.exec).execute(&desc, &mut buffers)
            }
        });
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

impl<B: Send + 'static, E: Executor<B>> Meeting<B> for Shared<B, E> {
    fn post(
        &self,
        rank: usize,
        seq: u64,
        desc: OpDesc,
        buffers: Vec<B>,
        split: Option<(usize, usize)>,
    ) -> Arc<Slot<B>> {
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
                split,
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

    fn take_split(&self, seq: u64, rank: usize) -> Option<SubGroup<B>> {
        lock(&self.state).splits.remove(&(seq, rank))
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
