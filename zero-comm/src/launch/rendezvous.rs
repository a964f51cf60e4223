//! A TCP rendezvous that hands every rank rank 0's id (NCCL's unique id, or the
//! shared-memory group's nonce).
//!
//! Rank 0 listens on the rendezvous port ([`LaunchEnv::port`]); every other rank connects
//! (retrying until the deadline) and says who it is: a magic word, the protocol version,
//! its rank, the world size it was launched with and its job ([`LaunchEnv::job`]). Once
//! all have arrived, rank 0 checks them (ranks unique and in range, world sizes and jobs
//! equal, each mismatch named with both values) and sends each the id, or the reason it
//! refuses. Any rank that does not arrive, or arrives with a mismatch, makes
//! every rank return an error naming it by the deadline (plus [`VERDICT_GRACE`] for rank
//! 0's answer to travel); none hangs.

use super::env::{BootstrapError, LaunchEnv};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Bytes of an NCCL unique id.
pub const ID_BYTES: usize = 128;
const MAGIC: &[u8; 4] = b"ZERO";
const VERSION: u32 = 2;
/// The longest job identity sent.
const JOB_MAX: usize = 256;
/// How long past its deadline a rank waits for rank 0's verdict.
pub const VERDICT_GRACE: Duration = Duration::from_secs(1);

/// Exchanges rank 0's `id` with every rank within `timeout`; rank 0 passes its id, the
/// others `None`. Returns the id on every rank.
pub fn rendezvous(
    env: &LaunchEnv,
    id: Option<[u8; ID_BYTES]>,
    timeout: Duration,
) -> Result<[u8; ID_BYTES], BootstrapError> {
    let deadline = Instant::now() + timeout;
    if env.world_size == 1 {
        return id.ok_or_else(|| env.error("rank 0 must supply the id"));
    }
    if env.rank == 0 {
        let id = id.ok_or_else(|| env.error("rank 0 must supply the id"))?;
        serve(env, id, deadline)
    } else {
        join(env, deadline)
    }
}

/// The greeting: magic, version, rank, world size, then the job as a length (u32) and its
/// bytes (at most [`JOB_MAX`]).
fn hello(env: &LaunchEnv) -> Vec<u8> {
    let job = env.job.as_deref().unwrap_or("").as_bytes();
    let job = &job[..job.len().min(JOB_MAX)];
    let mut b = Vec::with_capacity(20 + job.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(env.rank as u32).to_le_bytes());
    b.extend_from_slice(&(env.world_size as u32).to_le_bytes());
    b.extend_from_slice(&(job.len() as u32).to_le_bytes());
    b.extend_from_slice(job);
    b
}

/// A job for messages: its identity, or that the launcher gave none.
fn job_name(job: &str) -> String {
    if job.is_empty() {
        "no job identity".into()
    } else {
        job.to_string()
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Rank 0: accepts every other rank, checks them, answers each.
fn serve(
    env: &LaunchEnv,
    id: [u8; ID_BYTES],
    deadline: Instant,
) -> Result<[u8; ID_BYTES], BootstrapError> {
    let listener = TcpListener::bind(("0.0.0.0", env.port))
        .map_err(|e| env.error(format!("rank 0 cannot listen on port {}: {e}", env.port)))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| env.error(e.to_string()))?;
    let world = env.world_size;
    let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    let mut problems: Vec<String> = Vec::new();
    let mut extra: Vec<TcpStream> = Vec::new();
    // Accept until as many ranks as expected have arrived, valid or not, so that each
    // hears the verdict; or until the deadline.
    while peers.iter().flatten().count() + extra.len() < world - 1 {
        let Some(left) = remaining(deadline) else {
            break;
        };
        match listener.accept() {
            Ok((mut s, from)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(left));
                let mut b = [0u8; 16];
                if let Err(e) = s.read_exact(&mut b) {
                    problems.push(format!("a peer at {from} sent no greeting ({e})"));
                    extra.push(s);
                    continue;
                }
                let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                let (rank, their_world) = (word(8) as usize, word(12) as usize);
                if &b[..4] != MAGIC || word(4) != VERSION {
                    problems.push(format!("{from} is not a zero rank of this version"));
                    extra.push(s);
                    continue;
                }
                let mut len = [0u8; 4];
                let mut job = vec![0u8; 0];
                let read_job = s.read_exact(&mut len).and_then(|_| {
                    job = vec![0u8; (u32::from_le_bytes(len) as usize).min(JOB_MAX)];
                    s.read_exact(&mut job)
                });
                if let Err(e) = read_job {
                    problems.push(format!("a peer at {from} sent a short greeting ({e})"));
                    extra.push(s);
                    continue;
                }
                let (theirs, ours) = (
                    String::from_utf8_lossy(&job),
                    env.job.as_deref().unwrap_or(""),
                );
                if their_world != world {
                    problems.push(format!(
                        "rank {rank} at {from} was launched with WORLD_SIZE={their_world}, rank 0 with {world}"
                    ));
                } else if theirs != ours {
                    problems.push(format!(
                        "rank {rank} at {from} belongs to another job ({}), rank 0 to {}: two jobs share the rendezvous address {}",
                        job_name(&theirs),
                        job_name(ours),
                        env.addr()
                    ));
                } else if rank == 0 || rank >= world {
                    problems.push(format!("{from} claims rank {rank}, outside 1..{world}"));
                } else if peers[rank].is_some() {
                    problems.push(format!("rank {rank} arrived twice (second from {from})"));
                } else {
                    peers[rank] = Some(s);
                    continue;
                }
                extra.push(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                problems.push(format!("accept failed: {e}"));
                break;
            }
        }
    }
    let missing: Vec<usize> = (1..world).filter(|r| peers[*r].is_none()).collect();
    if problems.is_empty() && !missing.is_empty() {
        problems.push(format!("ranks {missing:?} did not arrive in time"));
    }
    let verdict = problems.join("; ");
    for s in peers.iter_mut().flatten().chain(extra.iter_mut()) {
        let _ = answer(s, &verdict, &id);
    }
    if verdict.is_empty() {
        Ok(id)
    } else {
        Err(env.error(verdict))
    }
}

/// Status byte, then the id (ok) or a length-prefixed reason (refused).
fn answer(s: &mut TcpStream, verdict: &str, id: &[u8; ID_BYTES]) -> std::io::Result<()> {
    if verdict.is_empty() {
        s.write_all(&[0])?;
        s.write_all(id)
    } else {
        let msg = verdict.as_bytes();
        s.write_all(&[1])?;
        s.write_all(&(msg.len() as u32).to_le_bytes())?;
        s.write_all(msg)
    }
}

/// Ranks 1..: connects to rank 0 (retrying), greets, reads the answer.
fn join(env: &LaunchEnv, deadline: Instant) -> Result<[u8; ID_BYTES], BootstrapError> {
    let addrs: Vec<_> = env
        .addr()
        .to_socket_addrs()
        .map_err(|e| env.error(format!("cannot resolve MASTER_ADDR: {e}")))?
        .collect();
    let mut last = String::from("no address");
    let mut stream = None;
    while stream.is_none() {
        let Some(left) = remaining(deadline) else {
            return Err(env.error(format!("rank 0 never answered ({last})")));
        };
        for a in &addrs {
            match TcpStream::connect_timeout(a, left.min(Duration::from_secs(1))) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e.to_string(),
            }
        }
        if stream.is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut s = stream.ok_or_else(|| env.error("no connection"))?;
    let io = |e: std::io::Error| env.error(format!("talking to rank 0: {e}"));
    s.write_all(&hello(env)).map_err(io)?;
    // Rank 0 answers by its own deadline at the latest; allow for the clocks' offset.
    let left = remaining(deadline).unwrap_or_default() + VERDICT_GRACE;
    s.set_read_timeout(Some(left)).map_err(io)?;
    let mut status = [0u8; 1];
    s.read_exact(&mut status).map_err(io)?;
    if status[0] == 0 {
        let mut id = [0u8; ID_BYTES];
        s.read_exact(&mut id).map_err(io)?;
        return Ok(id);
    }
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(io)?;
    let mut msg = vec![0u8; (u32::from_le_bytes(len) as usize).min(1 << 16)];
    s.read_exact(&mut msg).map_err(io)?;
    Err(env.error(format!("rank 0 refused: {}", String::from_utf8_lossy(&msg))))
}
