//! The progress thread of a host group: matches the collectives ranks issue, checks them
//! against each other, runs them, and turns every failure into an error for every rank.

use super::Executor;
use crate::op::OpDesc;
use crate::CommError;
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::time::Duration;

/// A collective as one rank issued it.
pub(super) struct Post<B> {
    pub rank: usize,
    pub seq: u64,
    pub desc: OpDesc,
    pub buffers: Vec<B>,
    pub reply: Sender<Result<Vec<B>, CommError>>,
}

/// What ranks tell the progress thread.
pub(super) enum Msg<B> {
    /// A rank issued a collective.
    Post(Post<B>),
    /// A rank issued a collective with bad arguments: the group is aborted.
    Invalid(CommError),
    /// A rank's wait on collective `seq` expired: the group is aborted.
    Timeout {
        waiter: usize,
        seq: u64,
        after: Duration,
    },
    /// A rank dropped its communicator.
    Leave { rank: usize, panicked: bool },
}

struct Group<B, E> {
    world: usize,
    exec: E,
    /// Collectives some but not all ranks have issued, by position.
    pending: BTreeMap<u64, Vec<Option<Post<B>>>>,
    /// Set once the group has failed; every later collective gets this error.
    broken: Option<CommError>,
    left: usize,
}

/// Runs until every rank has left.
pub(super) fn run<B, E: Executor<B>>(world: usize, rx: Receiver<Msg<B>>, exec: E) {
    let mut g = Group {
        world,
        exec,
        pending: BTreeMap::new(),
        broken: None,
        left: 0,
    };
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Post(p) => g.post(p),
            Msg::Invalid(err) => g.fail(err),
            Msg::Timeout { waiter, seq, after } => {
                let (op, missing) = match g.pending.get(&seq) {
                    Some(slots) => (
                        slots
                            .iter()
                            .flatten()
                            .next()
                            .map(|p| p.desc.to_string())
                            .unwrap_or_default(),
                        slots
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.is_none())
                            .map(|(r, _)| r)
                            .collect(),
                    ),
                    None => (String::new(), Vec::new()),
                };
                g.fail(CommError::Timeout {
                    seq,
                    op,
                    after,
                    waiter,
                    missing,
                });
            }
            Msg::Leave { rank, panicked } => {
                g.left += 1;
                g.fail(CommError::RankLeft { rank, panicked });
                if g.left == g.world {
                    return;
                }
            }
        }
    }
}

impl<B, E: Executor<B>> Group<B, E> {
    fn post(&mut self, p: Post<B>) {
        if let Some(err) = &self.broken {
            let _ = p.reply.send(Err(err.clone()));
            return;
        }
        let world = self.world;
        let slots = self
            .pending
            .entry(p.seq)
            .or_insert_with(|| (0..world).map(|_| None).collect());
        let rank = p.rank;
        slots[rank] = Some(p);
        if slots.iter().all(Option::is_some) {
            let seq = rank_seq(slots);
            if let Some(slots) = self.pending.remove(&seq) {
                let posts: Vec<Post<B>> = slots.into_iter().flatten().collect();
                self.complete(seq, posts);
            }
        }
    }

    fn complete(&mut self, seq: u64, posts: Vec<Post<B>>) {
        if posts.iter().any(|p| p.desc != posts[0].desc) {
            let detail = posts
                .iter()
                .map(|p| format!("rank {} issued {}", p.rank, p.desc))
                .collect::<Vec<_>>()
                .join("; ");
            for p in &posts {
                let _ = p.reply.send(Err(CommError::Mismatch {
                    seq,
                    detail: detail.clone(),
                }));
            }
            self.fail(CommError::Mismatch { seq, detail });
            return;
        }
        let desc = posts[0].desc.clone();
        let (mut buffers, replies): (Vec<Vec<B>>, Vec<_>) =
            posts.into_iter().map(|p| (p.buffers, p.reply)).unzip();
        if let Err(reason) = self.exec.execute(&desc, &mut buffers) {
            let err = CommError::Backend {
                seq,
                op: desc.to_string(),
                reason,
            };
            for reply in &replies {
                let _ = reply.send(Err(err.clone()));
            }
            self.fail(err);
            return;
        }
        for (b, reply) in buffers.into_iter().zip(replies) {
            let _ = reply.send(Ok(b));
        }
    }

    /// Marks the group failed (keeping the first cause) and fails everything pending.
    fn fail(&mut self, err: CommError) {
        let err = self.broken.get_or_insert(err).clone();
        for (_, slots) in std::mem::take(&mut self.pending) {
            for p in slots.into_iter().flatten() {
                let _ = p.reply.send(Err(err.clone()));
            }
        }
    }
}

fn rank_seq<B>(slots: &[Option<Post<B>>]) -> u64 {
    slots.iter().flatten().next().map_or(0, |p| p.seq)
}
