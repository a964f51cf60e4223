//! Starting a shared-memory group from the launcher's environment.
//!
//! 1. Rank 0 creates the segment (a `memfd`: no name in `/dev/shm`, nothing to leak) and
//!    listens on an abstract Unix socket named after a fresh random nonce (no file either).
//! 2. An [`IdExchange`] hands every rank the nonce: zero's TCP rendezvous
//!    ([`crate::launch::rendezvous`](mod@crate::launch::rendezvous)), which refuses a rank
//!    launched with another world size or of another job, naming both; or a framework's
//!    (torch's store under zero_torch).
//! 3. Each other rank connects to rank 0's socket, says who it is, and receives the
//!    segment's descriptor (`SCM_RIGHTS`). A rank on another machine (or network
//!    namespace) cannot reach the socket: that is an error saying every rank must run on
//!    rank 0's machine.
//! 4. Every rank maps the segment, writes its pid, and passes a first barrier in it.
//!
//! A job's segment is reachable only through its descriptor, handed to the ranks that
//! knew the nonce: another job on the same machine never sees it.

use super::segment::{segment_bytes, Segment};
use crate::launch::{IdExchange, LaunchEnv};
use crate::CommError;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};
use zero_sys::ipc::{peer_credentials, recv_with_fd, send_with_fd, SharedMapping};

/// Bytes per window unless `ZERO_SHM_WINDOW` says otherwise: 1 MiB, so a reduction's
/// chunk (one window, a piece per rank) crosses between cores while it is still in cache.
/// Against 4 MiB, on 2 cores (2026-11-28, 64 Mi bf16, docs/BENCHMARKS.md): at 2 processes
/// all-reduce 13.3–13.6 ms against 14.1–14.3; at 4 processes all-reduce 38.1–40.5 against
/// 49.4–52.6 ms and reduce-scatter 29.8–31.3 against 38.2–39.3 ms. (On 2026-11-23, with
/// the waits of then, 4 MiB had measured faster.)
pub const DEFAULT_WINDOW: usize = 1 << 20;
const HELLO_MAGIC: &[u8; 4] = b"ZSHM";

pub(crate) fn startup_error(reason: impl Into<String>) -> CommError {
    CommError::Backend {
        seq: 0,
        op: "start-up of the shared-memory group".into(),
        reason: reason.into(),
    }
}

/// The window size: `ZERO_SHM_WINDOW` (bytes, a multiple of 64 that holds at least 64
/// elements per rank), else [`DEFAULT_WINDOW`].
fn window_bytes(world: usize) -> Result<usize, CommError> {
    let Ok(v) = std::env::var("ZERO_SHM_WINDOW") else {
        return Ok(DEFAULT_WINDOW);
    };
    let w: usize = v
        .trim()
        .parse()
        .map_err(|e| startup_error(format!("ZERO_SHM_WINDOW={v}: not a byte count ({e})")))?;
    let least = 64 * 4 * world;
    if w % 64 != 0 || w < least {
        return Err(startup_error(format!(
            "ZERO_SHM_WINDOW={v}: must be a multiple of 64 of at least {least} bytes for {world} ranks"
        )));
    }
    Ok(w)
}

pub(crate) fn nonce() -> Result<[u8; 16], CommError> {
    let mut n = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut n))
        .map_err(|e| startup_error(format!("reading /dev/urandom: {e}")))?;
    Ok(n)
}

fn socket_name(nonce: &[u8]) -> String {
    let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    format!("zero-shm-{hex}")
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Maps the job's segment on every rank (see the module docs), the nonce handed out by
/// `exchange`.
pub(crate) fn connect(
    env: &LaunchEnv,
    timeout: Duration,
    exchange: &mut dyn IdExchange,
) -> Result<Segment, CommError> {
    let world = env.world_size;
    // Launchers that say the ranks span nodes (two torchrun agents, `--nnodes 2`) are
    // served when the nodes are one machine, as trying a multi-node launch on one box
    // does: a rank on another machine cannot reach rank 0's socket, and says so.
    let deadline = Instant::now() + timeout;
    if env.rank == 0 {
        let window = window_bytes(world)?;
        let nonce = nonce()?;
        let (seg, fd, listener) = create(world, window, &nonce)?;
        let mut id = [0u8; crate::launch::rendezvous::ID_BYTES];
        id[..16].copy_from_slice(&nonce);
        exchange
            .exchange(env, Some(id), timeout)
            .map_err(|e| startup_error(e.to_string()))?;
        if let Some(l) = listener {
            hand_out(&l, fd.as_fd(), world, deadline)?;
        }
        Ok(seg)
    } else {
        let id = exchange
            .exchange(env, None, timeout)
            .map_err(|e| startup_error(e.to_string()))?;
        let seg = receive(env.rank, world, &env.master_addr, &id[..16], deadline)?;
        Ok(seg)
    }
}

/// Rank 0's side: a new segment for `world` ranks and, if there are others, the
/// listening socket named after `nonce` that hands them its descriptor.
#[allow(clippy::type_complexity)]
pub(crate) fn create(
    world: usize,
    window: usize,
    nonce: &[u8],
) -> Result<(Segment, OwnedFd, Option<UnixListener>), CommError> {
    let (map, fd) = SharedMapping::create("zero-shm", segment_bytes(world, window))
        .map_err(|e| startup_error(format!("creating the shared memory: {e}")))?;
    let seg = Segment::format(map, world, window);
    let listener = if world > 1 {
        let addr = SocketAddr::from_abstract_name(socket_name(nonce).as_bytes())
            .map_err(|e| startup_error(e.to_string()))?;
        let l = UnixListener::bind_addr(&addr)
            .map_err(|e| startup_error(format!("binding rank 0's socket: {e}")))?;
        l.set_nonblocking(true)
            .map_err(|e| startup_error(e.to_string()))?;
        Some(l)
    } else {
        None
    };
    Ok((seg, fd, listener))
}

/// Rank 0: accepts every other rank and sends it the descriptor, or why not.
pub(crate) fn hand_out(
    listener: &UnixListener,
    fd: std::os::fd::BorrowedFd<'_>,
    world: usize,
    deadline: Instant,
) -> Result<(), CommError> {
    let mut seen = vec![false; world];
    seen[0] = true;
    let mut problems = Vec::new();
    let uid = peer_uid_of_self();
    while seen.iter().any(|s| !s) {
        let Some(left) = remaining(deadline) else {
            break;
        };
        let (mut s, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => return Err(startup_error(format!("accepting a rank: {e}"))),
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(left));
        let mut hello = [0u8; 12];
        if let Err(e) = s.read_exact(&mut hello) {
            problems.push(format!("a process sent no greeting ({e})"));
            continue;
        }
        let word =
            |i: usize| u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]);
        let (rank, theirs) = (word(4) as usize, word(8) as usize);
        let cred = peer_credentials(&s).ok();
        let problem = if &hello[..4] != HELLO_MAGIC {
            Some("a process that is not a zero rank connected".to_string())
        } else if theirs != world {
            Some(format!(
                "rank {rank} was launched with WORLD_SIZE={theirs}, rank 0 with {world}"
            ))
        } else if rank == 0 || rank >= world || seen[rank] {
            Some(format!(
                "a process claims rank {rank}, which is taken or outside 1..{world}"
            ))
        } else if let (Some(c), Some(u)) = (cred, uid) {
            (c.uid != u).then(|| format!("rank {rank} runs as uid {}, rank 0 as uid {u}", c.uid))
        } else {
            None
        };
        match problem {
            None => {
                seen[rank] = true;
                send_with_fd(&s, b"Y", fd)
                    .map_err(|e| startup_error(format!("sending rank {rank} the segment: {e}")))?;
            }
            Some(p) => {
                let _ = s.write_all(format!("N{p}").as_bytes());
                problems.push(p);
            }
        }
    }
    let missing: Vec<usize> = (0..world).filter(|&r| !seen[r]).collect();
    if !missing.is_empty() {
        problems.push(format!(
            "ranks {missing:?} did not reach rank 0's shared memory in time (every rank must \
             run on rank 0's machine)"
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(startup_error(problems.join("; ")))
    }
}

/// This process's uid, as the kernel reports it for a socket's peer (for comparing).
fn peer_uid_of_self() -> Option<u32> {
    let (a, _b) = UnixStream::pair().ok()?;
    peer_credentials(&a).ok().map(|c| c.uid)
}

/// Ranks 1..: connects to rank 0's socket and maps the segment it sends (`master_addr` is
/// rank 0's address, for the error where the socket cannot be reached).
pub(crate) fn receive(
    rank: usize,
    world: usize,
    master_addr: &str,
    nonce: &[u8],
    deadline: Instant,
) -> Result<Segment, CommError> {
    let addr = SocketAddr::from_abstract_name(socket_name(nonce).as_bytes())
        .map_err(|e| startup_error(e.to_string()))?;
    let mut last = String::new();
    let mut stream = None;
    while stream.is_none() {
        if remaining(deadline).is_none() {
            return Err(startup_error(format!(
                "rank {} cannot reach rank 0's shared memory ({last}): every rank of the \
                 shared-memory group must run on rank 0's machine ({}); across machines use \
                 --device cuda (NCCL), or zero_torch, which finds the machines and joins \
                 them over torch's gloo group (docs/GLOO_TIER.md)",
                rank, master_addr
            )));
        }
        match UnixStream::connect_addr(&addr) {
            Ok(s) => stream = Some(s),
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    let mut s = stream.ok_or_else(|| startup_error("no connection"))?;
    let mut hello = Vec::with_capacity(12);
    hello.extend_from_slice(HELLO_MAGIC);
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(world as u32).to_le_bytes());
    let io = |e: std::io::Error| startup_error(format!("talking to rank 0's socket: {e}"));
    s.write_all(&hello).map_err(io)?;
    s.set_read_timeout(remaining(deadline).or(Some(Duration::from_millis(1))))
        .map_err(io)?;
    let mut buf = [0u8; 1024];
    let (n, fd) = recv_with_fd(&s, &mut buf).map_err(io)?;
    match (buf.first(), fd) {
        (Some(b'Y'), Some(fd)) => {
            let len = std::fs::File::from(fd.try_clone().map_err(io)?)
                .metadata()
                .map_err(io)?
                .len() as usize;
            let map = SharedMapping::map(fd.as_fd(), len)
                .map_err(|e| startup_error(format!("mapping rank 0's segment: {e}")))?;
            Segment::open(map, world).map_err(|e| startup_error(e.0))
        }
        _ => {
            let mut text = String::from_utf8_lossy(&buf[1.min(n)..n]).into_owned();
            let mut rest = String::new();
            let _ = s.read_to_string(&mut rest);
            text.push_str(&rest);
            Err(startup_error(format!("rank 0 refused: {text}")))
        }
    }
}
