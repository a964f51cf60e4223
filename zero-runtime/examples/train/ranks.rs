//! Where the examples' ranks run: as threads of this process (`--ranks N`), or one per
//! process under a launcher (`torchrun --no-python`, `deepspeed --no_python`, `srun`,
//! `mpirun`), on CPU over the shared-memory group or on GPUs over NCCL. Shared by this
//! example and zero-candle's GPT example.

use std::time::Duration;
use zero_comm::launch::LaunchEnv;
use zero_comm::{ShmComm, ShmGroup};

/// How this run's ranks are laid out.
#[derive(Debug)]
pub enum Ranks {
    /// `n` ranks as threads of this process.
    Threads(usize),
    /// This process is one rank of a job a launcher started.
    Launched(LaunchEnv),
}

impl Ranks {
    /// The launcher's environment if one started this process (checked against
    /// `--local_rank`, which the deepspeed launcher passes), else `threads` ranks here.
    pub fn from_args(threads: usize, local_rank: Option<usize>) -> Result<Ranks, String> {
        if !LaunchEnv::launched() {
            if threads == 0 {
                return Err("--ranks must be at least 1".into());
            }
            return Ok(Ranks::Threads(threads));
        }
        let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
        if let Some(flag) = local_rank.filter(|&l| l != env.local_rank) {
            return Err(format!(
                "--local_rank={flag} disagrees with the launcher's local rank {} ({:?})",
                env.local_rank, env.launcher
            ));
        }
        Ok(Ranks::Launched(env))
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        match self {
            Ranks::Threads(n) => *n,
            Ranks::Launched(env) => env.world_size,
        }
    }

    /// How the ranks run, for the run's first line.
    pub fn how(&self) -> String {
        match self {
            Ranks::Threads(_) => "in this process".into(),
            Ranks::Launched(env) => format!("one process each ({:?})", env.launcher),
        }
    }

    /// Whether this process prints: all of them in-process, rank 0 under a launcher.
    pub fn leader(&self) -> bool {
        match self {
            Ranks::Threads(_) => true,
            Ranks::Launched(env) => env.rank == 0,
        }
    }

    /// This process's rank of a CPU job a launcher started, over shared memory.
    pub fn shm(env: &LaunchEnv, timeout: Duration) -> Result<Vec<ShmComm>, String> {
        let comm = ShmGroup::init(env, timeout).map_err(|e| {
            format!(
                "launched as rank {} of {} ({:?}) on CPU: {e}",
                env.rank, env.world_size, env.launcher
            )
        })?;
        Ok(vec![comm])
    }
}
