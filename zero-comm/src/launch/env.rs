//! Where this process sits in the job, read from the launcher's environment.
//!
//! | launcher | rank | world size | local rank | rank 0's host | port |
//! |---|---|---|---|---|---|
//! | `torchrun`, `deepspeed`, or set by hand | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `MASTER_ADDR` | `MASTER_PORT` |
//! | SLURM `srun` | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | `MASTER_ADDR`, else the first host of `SLURM_JOB_NODELIST` | `MASTER_PORT`, else 29500 |
//! | Open MPI `mpirun` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `MASTER_ADDR` (must be given: `mpirun -x MASTER_ADDR=…`) | `MASTER_PORT`, else 29500 |
//!
//! Precedence: the explicit variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`) win — `torchrun`
//! started by `srun` sets them while SLURM's describe the `srun` task, and that is not a
//! conflict. Without them, SLURM's and Open MPI's variables are read; where both are set
//! (an `mpirun` inside an `salloc`) and disagree, that is an error naming both. 29500 is
//! DeepSpeed's and PyTorch's default port.
//!
//! The rendezvous port: `ZERO_RENDEZVOUS_PORT` if set; else `MASTER_PORT + 1` under
//! `torchrun` (whose agent already serves its own store on `MASTER_PORT`, which it says by
//! setting `TORCHELASTIC_USE_AGENT_STORE`); else the master port.
//!
//! The job, so that a process of another job that reaches this job's rendezvous is
//! refused by name: `ZERO_JOB_ID`, else torchrun's `TORCHELASTIC_RUN_ID`, SLURM's
//! `SLURM_JOB_ID` (with `SLURM_STEP_ID`), Open MPI's `PMIX_NAMESPACE` or
//! `OMPI_MCA_ess_base_jobid`; none for the deepspeed launcher or variables set by hand.
//! The ranks on this machine: `LOCAL_WORLD_SIZE` (torchrun), `SLURM_NTASKS_PER_NODE`,
//! `OMPI_COMM_WORLD_LOCAL_SIZE`, where set.

/// Reading the launcher's environment failed; every variant names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapError {
    /// A launcher variable is missing.
    #[error("{0} is not set: launch with torchrun --no-python, deepspeed --no_python, srun or mpirun, or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT")]
    Missing(&'static str),
    /// A launcher variable does not parse or is out of range.
    #[error("{var}={value}: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Two launchers' variables disagree.
    #[error("the launchers' variables disagree: {first} but {second}; set RANK, WORLD_SIZE and LOCAL_RANK (they take precedence) or run under one launcher")]
    Conflict {
        /// One launcher's variables and values.
        first: String,
        /// The other's.
        second: String,
    },
    /// The rendezvous did not complete.
    #[error("rendezvous at {addr} (rank {rank} of {world}): {reason}")]
    Rendezvous {
        /// `host:port`.
        addr: String,
        /// This rank.
        rank: usize,
        /// The world size.
        world: usize,
        /// What went wrong.
        reason: String,
    },
    /// An [`IdExchange`](super::IdExchange) other than zero's rendezvous (a framework's
    /// store) did not hand out rank 0's id.
    #[error("handing out rank 0's id through {via} (rank {rank} of {world}): {reason}")]
    Exchange {
        /// What carried the id: "torch's store", say.
        via: String,
        /// This rank.
        rank: usize,
        /// The world size.
        world: usize,
        /// What went wrong.
        reason: String,
    },
}

/// Which launcher's variables gave the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `torchrun` (its agent's variables are set).
    Torchrun,
    /// `RANK` / `WORLD_SIZE` / `LOCAL_RANK` without torchrun's agent: the `deepspeed`
    /// launcher, or set by hand.
    RankVariables,
    /// SLURM's `srun`.
    Slurm,
    /// Open MPI's `mpirun`.
    OpenMpi,
}

/// Where this process sits in the job, as the launcher said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank on this node (picks the GPU where several are visible).
    pub local_rank: usize,
    /// Rank 0's host.
    pub master_addr: String,
    /// The rendezvous port (see the module docs).
    pub port: u16,
    /// Whose variables these were.
    pub launcher: Launcher,
    /// The job's identity, where the launcher gives one (see the module docs), as
    /// `VARIABLE=value`.
    pub job: Option<String>,
    /// Ranks on this machine, where the launcher says.
    pub local_world_size: Option<usize>,
}

/// Every variable [`LaunchEnv::from_vars`] reads (for clearing a child's environment, or
/// listing them).
pub const LAUNCH_VARIABLES: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "ZERO_RENDEZVOUS_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "ZERO_JOB_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "LOCAL_WORLD_SIZE",
    "SLURM_NTASKS_PER_NODE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
];

/// The job identity of the module docs, as `VARIABLE=value`.
fn job_identity(get: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let var = |k: &str| get(k).filter(|v| !v.is_empty()).map(|v| format!("{k}={v}"));
    var("ZERO_JOB_ID")
        .or_else(|| var("TORCHELASTIC_RUN_ID"))
        .or_else(|| {
            var("SLURM_JOB_ID").map(|j| match get("SLURM_STEP_ID") {
                Some(step) => format!("{j}.{step}"),
                None => j,
            })
        })
        .or_else(|| var("PMIX_NAMESPACE"))
        .or_else(|| var("OMPI_MCA_ess_base_jobid"))
}

/// The port PyTorch and DeepSpeed use when none is given.
pub const DEFAULT_PORT: usize = 29500;

/// One launcher's (rank, world size, local rank) and the variables they came from.
struct Triple {
    rank: usize,
    world: usize,
    local: usize,
    names: [&'static str; 3],
}

impl Triple {
    fn describe(&self) -> String {
        format!(
            "{}={}, {}={}, {}={}",
            self.names[0], self.rank, self.names[1], self.world, self.names[2], self.local
        )
    }
}

impl LaunchEnv {
    /// Reads the launcher's variables from the process environment.
    pub fn from_env() -> Result<Self, BootstrapError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Whether any launcher's rank variable is set (this process was started by one).
    pub fn launched() -> bool {
        ["RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"]
            .iter()
            .any(|k| std::env::var_os(k).is_some())
    }

    /// Reads them through `get` (the environment, or a map in tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, BootstrapError> {
        let num = |var: &'static str| -> Result<Option<usize>, BootstrapError> {
            get(var)
                .map(|v| {
                    v.trim().parse().map_err(|e| BootstrapError::Invalid {
                        var,
                        value: v.clone(),
                        reason: format!("not a non-negative integer ({e})"),
                    })
                })
                .transpose()
        };
        let need = |var: &'static str| num(var)?.ok_or(BootstrapError::Missing(var));
        let triple = |names: [&'static str; 3]| -> Result<Option<Triple>, BootstrapError> {
            Ok(match num(names[0])? {
                None => None,
                Some(rank) => Some(Triple {
                    rank,
                    world: need(names[1])?,
                    local: need(names[2])?,
                    names,
                }),
            })
        };
        let explicit = get("RANK").is_some() || get("WORLD_SIZE").is_some();
        let (t, launcher) = if explicit {
            let t = Triple {
                rank: need("RANK")?,
                world: need("WORLD_SIZE")?,
                local: need("LOCAL_RANK")?,
                names: ["RANK", "WORLD_SIZE", "LOCAL_RANK"],
            };
            let agent = get("TORCHELASTIC_RUN_ID").is_some()
                || get("TORCHELASTIC_USE_AGENT_STORE").is_some();
            let launcher = if agent {
                Launcher::Torchrun
            } else {
                Launcher::RankVariables
            };
            (t, launcher)
        } else {
            let slurm = triple(["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"])?;
            let mpi = triple([
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ])?;
            match (slurm, mpi) {
                (Some(s), Some(m)) => {
                    if (s.rank, s.world, s.local) != (m.rank, m.world, m.local) {
                        return Err(BootstrapError::Conflict {
                            first: s.describe(),
                            second: m.describe(),
                        });
                    }
                    (m, Launcher::OpenMpi)
                }
                (Some(s), None) => (s, Launcher::Slurm),
                (None, Some(m)) => (m, Launcher::OpenMpi),
                (None, None) => return Err(BootstrapError::Missing("RANK")),
            }
        };
        if t.world == 0 {
            return Err(BootstrapError::Invalid {
                var: t.names[1],
                value: "0".into(),
                reason: "needs at least one rank".into(),
            });
        }
        if t.rank >= t.world {
            return Err(BootstrapError::Invalid {
                var: t.names[0],
                value: t.rank.to_string(),
                reason: format!("must be below {}={}", t.names[1], t.world),
            });
        }
        let master_addr = match (get("MASTER_ADDR"), launcher) {
            (Some(a), _) => a,
            (None, Launcher::Slurm) => {
                let (var, list) = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
                    .iter()
                    .find_map(|v| get(v).map(|l| (*v, l)))
                    .ok_or(BootstrapError::Missing("MASTER_ADDR"))?;
                first_host(&list).ok_or_else(|| BootstrapError::Invalid {
                    var,
                    value: list.clone(),
                    reason: "no host name in the node list".into(),
                })?
            }
            (None, Launcher::OpenMpi) => {
                return Err(BootstrapError::Invalid {
                    var: "MASTER_ADDR",
                    value: String::new(),
                    reason: "mpirun does not say where rank 0 runs: pass -x MASTER_ADDR=<rank 0's host> (and -x MASTER_PORT)".into(),
                })
            }
            (None, _) => return Err(BootstrapError::Missing("MASTER_ADDR")),
        };
        let master_port = match (num("MASTER_PORT")?, launcher) {
            (Some(p), _) => p,
            (None, Launcher::Slurm | Launcher::OpenMpi) => DEFAULT_PORT,
            (None, _) => return Err(BootstrapError::Missing("MASTER_PORT")),
        };
        let (var, port) = match num("ZERO_RENDEZVOUS_PORT")? {
            Some(p) => ("ZERO_RENDEZVOUS_PORT", p),
            None if get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v == "True") => {
                ("MASTER_PORT", master_port + 1)
            }
            None => ("MASTER_PORT", master_port),
        };
        let port =
            u16::try_from(port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| BootstrapError::Invalid {
                    var,
                    value: port.to_string(),
                    reason: "not a TCP port (1-65535)".into(),
                })?;
        let local_world_size = [
            "LOCAL_WORLD_SIZE",
            "SLURM_NTASKS_PER_NODE",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ]
        .iter()
        .find_map(|k| get(k).and_then(|v| v.trim().parse().ok()));
        Ok(LaunchEnv {
            rank: t.rank,
            world_size: t.world,
            local_rank: t.local,
            master_addr,
            port,
            launcher,
            job: job_identity(&get),
            local_world_size,
        })
    }

    /// Rank `rank` of a `world`-rank job on this machine whose rendezvous is at
    /// `127.0.0.1:port`, as torchrun would describe it (for tests and for starting ranks
    /// by hand).
    pub fn local(rank: usize, world: usize, port: u16) -> Self {
        LaunchEnv {
            rank,
            world_size: world,
            local_rank: rank,
            master_addr: "127.0.0.1".into(),
            port,
            launcher: Launcher::RankVariables,
            job: None,
            local_world_size: Some(world),
        }
    }

    /// The variables torchrun sets that describe this rank (`RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, and `ZERO_JOB_ID`
    /// where there is a job): what a child process needs to join as this rank.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("RANK", self.rank.to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_RANK", self.local_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.port.to_string()),
        ];
        if let Some(l) = self.local_world_size {
            v.push(("LOCAL_WORLD_SIZE", l.to_string()));
        }
        if let Some(job) = &self.job {
            v.push((
                "ZERO_JOB_ID",
                job.split_once('=')
                    .map_or(job.as_str(), |(_, j)| j)
                    .to_string(),
            ));
        }
        v
    }

    /// `host:port` of the rendezvous.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.master_addr, self.port)
    }

    /// This rank's [`BootstrapError::Exchange`]: an [`IdExchange`](super::IdExchange) other
    /// than zero's rendezvous (`via` names it) did not hand out rank 0's id.
    pub fn exchange_error(
        &self,
        via: impl Into<String>,
        reason: impl Into<String>,
    ) -> BootstrapError {
        BootstrapError::Exchange {
            via: via.into(),
            rank: self.rank,
            world: self.world_size,
            reason: reason.into(),
        }
    }

    pub(crate) fn error(&self, reason: impl Into<String>) -> BootstrapError {
        BootstrapError::Rendezvous {
            addr: self.addr(),
            rank: self.rank,
            world: self.world_size,
            reason: reason.into(),
        }
    }
}

/// The first host of a SLURM node list: `node[01-04,07],gpu5` → `node01`; `a1,b2` → `a1`;
/// `rack[1-2]-n[3-4]` → `rack1-n3`. `None` for an empty list.
pub fn first_host(list: &str) -> Option<String> {
    // The first entry: up to the first comma outside brackets.
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    let mut entry = &list[..end];
    // Each bracket group becomes its first element (zero padding kept).
    let mut host = String::new();
    while let Some(open) = entry.find('[') {
        host.push_str(&entry[..open]);
        let close = entry[open..].find(']')? + open;
        let first = entry[open + 1..close].split([',', '-']).next()?;
        host.push_str(first);
        entry = &entry[close + 1..];
    }
    host.push_str(entry);
    let host = host.trim().to_string();
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::first_host;

    #[test]
    fn the_first_host_of_a_slurm_node_list() {
        for (list, want) in [
            ("node01", Some("node01")),
            ("node[01-04,07]", Some("node01")),
            ("node[07,01-04]", Some("node07")),
            ("gpu-a[1-2],gpu-b[3-4]", Some("gpu-a1")),
            ("a1,b2", Some("a1")),
            ("rack[1-2]-n[003-004]", Some("rack1-n003")),
            ("x[5]y", Some("x5y")),
            ("", None),
            ("bad[1-2", None),
        ] {
            assert_eq!(first_host(list).as_deref(), want, "{list}");
        }
    }
}
