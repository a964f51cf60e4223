//! Joining a communicator: mapping its segment, claiming this rank, waiting for every
//! other rank, and the checks NCCL makes at init.
//!
//! 1. The first rank to arrive creates `/dev/shm/zero-gpusim-nccl-<hex>` (`O_EXCL`) and
//!    formats it for its `nranks`; the others open it and wait for its header.
//! 2. A rank whose `nranks` differs from the creator's refuses the communicator, naming
//!    both values and ranks.
//! 3. Each rank claims its block (compare-and-swap): a rank number claimed twice is
//!    refused, naming both pids. It then writes its pid, pid namespace and device key, and
//!    marks itself ready.
//! 4. Every rank waits until all are ready: until the timeout (naming the ranks that never
//!    joined), the caller's [`AbortFlag`], a refusal or abort recorded by another rank, or
//!    the death of a rank that had claimed its block.
//! 5. Every rank checks that no two ranks gave the same device key.
//! 6. Every rank unlinks the name (all have it mapped now; the memory lives on until the
//!    last unmap).
//!
//! Any failure after the segment is mapped is recorded in it, so every other rank fails at
//! once, naming the culprit. A failing rank then waits until a process has visited the
//! segment as every rank (so that a rank arriving late finds the failure too, instead of
//! creating a fresh segment and waiting out its timeout), or until its deadline or abort
//! flag, and unlinks the name: nothing is left in `/dev/shm`.

use super::error::CollError;
use super::liveness::{pid_namespace, Peer};
use super::record::{self, Cause, Record};
use super::segment::{self, state, Segment, MAX_KEY, MAX_RANKS};
use super::wait::spin_budget;
use super::{segment_name, AbortFlag, Member, UNIQUE_ID_BYTES};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The longest sleep while joining: how soon an [`AbortFlag`] or a dead rank is noticed.
const JOIN_SLICE: Duration = Duration::from_millis(10);

/// A joined communicator's segment and the watchers of its peers (`None` for this rank).
pub(crate) struct Joined {
    pub seg: Segment,
    pub peers: Vec<Option<Peer>>,
}

/// Bytes per window half for a segment this rank creates: `ZERO_GPUSIM_NCCL_WINDOW` if
/// set (a multiple of 64 of at least 64 bytes per rank), else 32 MiB shared by the ranks'
/// two halves, between 64 KiB and 4 MiB.
fn window_bytes(me: &Member) -> Result<usize, CollError> {
    let least = 64 * me.nranks;
    if let Ok(v) = std::env::var("ZERO_GPUSIM_NCCL_WINDOW") {
        let w: usize = v.trim().parse().map_err(|e| CollError::BadMember {
            rank: me.rank,
            nranks: me.nranks,
            reason: format!("ZERO_GPUSIM_NCCL_WINDOW={v}: not a byte count ({e})"),
        })?;
        if w % 64 != 0 || w < least {
            return Err(CollError::BadMember {
                rank: me.rank,
                nranks: me.nranks,
                reason: format!(
                    "ZERO_GPUSIM_NCCL_WINDOW={v}: must be a multiple of 64 of at least {least} bytes"
                ),
            });
        }
        return Ok(w);
    }
    let w = ((32usize << 20) / (2 * me.nranks)).clamp(64 << 10, 4 << 20);
    Ok((w / 4096 * 4096).max(least.div_ceil(4096) * 4096))
}

/// Checks what the caller says about this rank.
fn check_member(me: &Member) -> Result<(), CollError> {
    let bad = |reason: String| CollError::BadMember {
        rank: me.rank,
        nranks: me.nranks,
        reason,
    };
    if me.nranks == 0 || me.nranks > MAX_RANKS {
        return Err(bad(format!("nranks must be 1 to {MAX_RANKS}")));
    }
    if me.rank >= me.nranks {
        return Err(bad(format!(
            "rank {} is not below nranks {}",
            me.rank, me.nranks
        )));
    }
    if me.device_key.len() > MAX_KEY {
        return Err(bad(format!(
            "device key of {} bytes; at most {MAX_KEY}",
            me.device_key.len()
        )));
    }
    Ok(())
}

/// Creates the segment file, or opens the one another rank created: the file and
/// whether this rank created it.
fn create_or_open(path: &str) -> Result<Option<(File, bool)>, CollError> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => return Ok(Some((f, true))),
        Err(e) if e.kind() != ErrorKind::AlreadyExists => {
            return Err(CollError::io("creating", path, &e))
        }
        Err(_) => {}
    }
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => Ok(Some((f, false))),
        // Unlinked in between (a failed or finished join): try again.
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CollError::io("opening", path, &e)),
    }
}

/// Whether `path` still names the file `file` is open on.
fn still_named(file: &File, path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

/// Maps the segment at `path`, creating it if this rank is first.
fn map_segment(
    path: &str,
    me: &Member,
    deadline: Instant,
    abort: &AbortFlag,
) -> Result<Segment, CollError> {
    let mut opened: Option<File> = None;
    loop {
        if abort.is_set() {
            return Err(CollError::JoinAborted { rank: me.rank });
        }
        if Instant::now() >= deadline {
            return Err(CollError::JoinTimeout {
                rank: me.rank,
                nranks: me.nranks,
                missing: (0..me.nranks).filter(|&r| r != me.rank).collect(),
                after: deadline.saturating_duration_since(Instant::now()),
            });
        }
        let file = match opened.take() {
            Some(f) => f,
            None => match create_or_open(path)? {
                Some((f, true)) => {
                    let window = window_bytes(me).inspect_err(|_| {
                        let _ = segment::unlink(path);
                    })?;
                    return Segment::format(&f, me.nranks, window, me.rank).map_err(|e| {
                        let _ = segment::unlink(path);
                        CollError::io("sizing and mapping", path, &e)
                    });
                }
                Some((f, false)) => f,
                None => continue,
            },
        };
        match Segment::open(&file) {
            Ok(Some(seg)) => return Ok(seg),
            Ok(None) => {
                // Its creator is still formatting it; unless the name was unlinked since
                // (its creator failed): then start over.
                if still_named(&file, path) {
                    opened = Some(file);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(why) => {
                return Err(CollError::Io {
                    what: "not a segment of this engine:".into(),
                    path: path.to_string(),
                    message: why,
                })
            }
        }
    }
}

/// Joins the communicator `id` names as `me` (see the module docs).
pub(crate) fn join(
    id: &[u8; UNIQUE_ID_BYTES],
    me: &Member,
    timeout: Duration,
    abort: &AbortFlag,
) -> Result<Joined, CollError> {
    check_member(me)?;
    let name = segment_name(id).ok_or(CollError::BadUniqueId)?;
    let path = segment::path_of(&name);
    let start = Instant::now();
    let deadline = start + timeout;
    let seg = map_segment(&path, me, deadline, abort).map_err(|e| match e {
        CollError::JoinTimeout {
            rank,
            nranks,
            missing,
            ..
        } => CollError::JoinTimeout {
            rank,
            nranks,
            missing,
            after: start.elapsed(),
        },
        e => e,
    })?;
    seg.min_nranks()
        .fetch_min(me.nranks as u32, Ordering::AcqRel);
    if me.rank < seg.nranks() {
        seg.visited(me.rank).store(1, Ordering::Release);
    }
    seg.bell().ring();
    // From here on every failure is recorded for the others, and the name unlinked once
    // every rank has seen the record (or the deadline passed).
    let fail = |seg: &Segment, e: CollError, rec: Option<Record>| {
        record::publish(seg, &rec.unwrap_or_else(|| Record::from_error(&e, me.rank)));
        linger(seg, deadline, abort);
        let _ = segment::unlink(&path);
        e
    };
    if seg.nranks() != me.nranks {
        let e = CollError::NranksMismatch {
            rank: me.rank,
            nranks: me.nranks,
            other_rank: seg.creator(),
            other_nranks: seg.nranks(),
        };
        return Err(fail(&seg, e, None));
    }
    if let Some(rec) = record::recorded(&seg) {
        linger(&seg, deadline, abort);
        let _ = segment::unlink(&path);
        return Err(rec.to_join_error(me.rank));
    }
    claim(&seg, me).map_err(|e| fail(&seg, e, None))?;
    // Once claimed, a failure also marks this rank failed: it must not count as joined.
    let fail_claimed = |e: CollError, rec: Option<Record>| {
        seg.state(me.rank).store(state::FAILED, Ordering::Release);
        fail(&seg, e, rec)
    };
    let peers = wait_for_all(&seg, me, deadline, start, abort).map_err(|failed| {
        let (e, rec) = *failed;
        fail_claimed(e, rec)
    })?;
    check_devices(&seg, me).map_err(|e| fail_claimed(e, None))?;
    segment::unlink(&path)
        .map_err(|e| fail_claimed(CollError::io("unlinking", &path, &e), None))?;
    Ok(Joined { seg, peers })
}

/// After a failed join: waits until a process has visited the segment as every rank, so
/// that each finds the failure recorded rather than a fresh segment it would wait in
/// until its timeout; gives up at `deadline` or when `abort` is set. When the ranks
/// disagree on `nranks`, ranks up to the smallest value given are waited for.
fn linger(seg: &Segment, deadline: Instant, abort: &AbortFlag) {
    seg.bell().wait(Duration::ZERO, JOIN_SLICE, deadline, |_| {
        let n = seg
            .nranks()
            .min(seg.min_nranks().load(Ordering::Acquire) as usize);
        let all = (0..n).all(|r| seg.visited(r).load(Ordering::Acquire) != 0);
        (all || abort.is_set()).then_some(())
    });
}

/// Claims `me.rank`'s block and publishes this rank in it.
fn claim(seg: &Segment, me: &Member) -> Result<(), CollError> {
    let st = seg.state(me.rank);
    if let Err(held) = st.compare_exchange(
        state::FREE,
        state::CLAIMED,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // The holder writes its pid right after claiming; give it a moment.
        let t0 = Instant::now();
        let mut first_pid = seg.pid(me.rank).load(Ordering::Acquire);
        while first_pid == 0 && held == state::CLAIMED && t0.elapsed() < Duration::from_millis(100)
        {
            std::thread::sleep(Duration::from_millis(1));
            first_pid = seg.pid(me.rank).load(Ordering::Acquire);
        }
        return Err(CollError::RankTaken {
            rank: me.rank,
            first_pid,
            second_pid: me.pid,
        });
    }
    seg.pid(me.rank).store(me.pid, Ordering::Release);
    seg.pid_namespace(me.rank)
        .store(pid_namespace(), Ordering::Relaxed);
    seg.set_key(me.rank, &me.device_key);
    st.store(state::READY, Ordering::Release);
    seg.bell().ring();
    Ok(())
}

/// A failed wait: the error, and the record to publish (`None`: the error's own).
type JoinFailure = Box<(CollError, Option<Record>)>;

/// Waits until every rank is ready; returns a watcher per peer. On failure, the error and
/// the record to publish (`None`: the error's own).
fn wait_for_all(
    seg: &Segment,
    me: &Member,
    deadline: Instant,
    start: Instant,
    abort: &AbortFlag,
) -> Result<Vec<Option<Peer>>, JoinFailure> {
    let n = me.nranks;
    let mut peers: Vec<Option<Peer>> = (0..n).map(|_| None).collect();
    let got = seg
        .bell()
        .wait(spin_budget(n), JOIN_SLICE, deadline, |thorough| {
            // Joined: ready, or ready and gone since (a fast rank may even have failed a
            // collective and left: its record is for the first collective to report).
            let ready = |r: usize| {
                matches!(
                    seg.state(r).load(Ordering::Acquire),
                    state::READY | state::LEFT
                )
            };
            let all = (0..n).all(ready);
            match record::recorded(seg) {
                Some(rec) if !all || rec.cause == Cause::JoinRefused => {
                    return Some(Err((rec.to_join_error(me.rank), Some(rec))));
                }
                _ if all => return Some(Ok(())),
                _ => {}
            }
            if !thorough {
                return None;
            }
            if abort.is_set() {
                let rec = Record {
                    cause: Cause::JoinRefused,
                    rank: me.rank,
                    seq: 0,
                    extra: 0,
                    call: "ncclCommInitRank".into(),
                    reason: format!("rank {} aborted while joining", me.rank),
                };
                return Some(Err((CollError::JoinAborted { rank: me.rank }, Some(rec))));
            }
            for r in (0..n).filter(|&r| r != me.rank && ready(r)) {
                let peer = peers[r].get_or_insert_with(|| {
                    Peer::new(
                        seg.pid(r).load(Ordering::Acquire),
                        seg.pid_namespace(r).load(Ordering::Relaxed),
                    )
                });
                if peer.is_dead() {
                    let rec = Record {
                        cause: Cause::JoinRefused,
                        rank: r,
                        seq: 0,
                        extra: u64::from(peer.pid()),
                        call: "ncclCommInitRank".into(),
                        reason: format!(
                            "rank {r} (pid {}) died before every rank joined",
                            peer.pid()
                        ),
                    };
                    return Some(Err((rec.to_join_error(me.rank), Some(rec))));
                }
            }
            None
        });
    match got {
        Some(Ok(())) => {}
        Some(Err(e)) => return Err(Box::new(e)),
        None => {
            let missing: Vec<usize> = (0..n)
                .filter(|&r| {
                    !matches!(
                        seg.state(r).load(Ordering::Acquire),
                        state::READY | state::LEFT
                    )
                })
                .collect();
            return Err(Box::new((
                CollError::JoinTimeout {
                    rank: me.rank,
                    nranks: n,
                    missing,
                    after: start.elapsed(),
                },
                None,
            )));
        }
    }
    for (r, p) in peers.iter_mut().enumerate() {
        if r != me.rank && p.is_none() {
            *p = Some(Peer::new(
                seg.pid(r).load(Ordering::Acquire),
                seg.pid_namespace(r).load(Ordering::Relaxed),
            ));
        }
    }
    Ok(peers)
}

/// Refuses two ranks with the same device key (every rank finds the same pair).
fn check_devices(seg: &Segment, me: &Member) -> Result<(), CollError> {
    let keys: Vec<String> = (0..me.nranks).map(|r| seg.key(r)).collect();
    for (a, ka) in keys.iter().enumerate() {
        if let Some(b) = (a + 1..keys.len()).find(|&b| keys[b] == *ka) {
            return Err(CollError::SameDevice {
                rank: me.rank,
                first: a,
                second: b,
                device: ka.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(rank: usize, nranks: usize, key: &str) -> Member {
        Member {
            rank,
            nranks,
            device_key: key.into(),
            pid: std::process::id(),
        }
    }

    #[test]
    fn members_are_checked_before_anything_is_created() {
        let id = super::super::unique_id();
        let flag = AbortFlag::default();
        let t = Duration::from_secs(1);
        for (m, want) in [
            (member(2, 2, "k"), "not below"),
            (member(0, 0, "k"), "nranks must be"),
            (member(0, 1, &"x".repeat(MAX_KEY + 1)), "device key"),
        ] {
            let e = join(&id, &m, t, &flag).err().map(|e| e.to_string());
            assert!(e.as_deref().is_some_and(|e| e.contains(want)), "{e:?}");
        }
        let mut bad = id;
        bad[3] ^= 0xff;
        assert_eq!(
            join(&bad, &member(0, 1, "k"), t, &flag).err(),
            Some(CollError::BadUniqueId)
        );
        let name = segment_name(&id).unwrap_or_default();
        assert!(!std::path::Path::new(&segment::path_of(&name)).exists());
    }

    #[test]
    fn default_windows_shrink_with_more_ranks() {
        if std::env::var_os("ZERO_GPUSIM_NCCL_WINDOW").is_some() {
            return;
        }
        let w = |n| window_bytes(&member(0, n, "k")).unwrap_or(0);
        assert_eq!(w(1), 4 << 20);
        assert_eq!(w(8), 2 << 20);
        assert_eq!(w(4096), 256 << 10);
    }
}
