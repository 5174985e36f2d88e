//! How the engine builds sandboxes ([`SandboxConfig`]), fixed for the life
//! of the process, and what follows from it for every stage (under gVisor,
//! the limits the supervisor applies itself: [`GvisorLimits`]).

use std::path::PathBuf;

use super::checker_cache::CheckerCache;
use super::egress::{self, EgressConfig};
use super::seccomp::SeccompProfile;
use super::uids::{DEFAULT_LOCK_DIR, DEFAULT_UID_BASE};
use crate::job::deadline::Budget;
use crate::protocol::StageLimits;

/// The checker cache's size when nothing sets it.
pub const DEFAULT_CHECKER_CACHE_MB: u64 = 64;

/// How the engine builds sandboxes; fixed for the life of the process.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// OCI runtime (`runsc` for gVisor); `None` is Docker's default (runc).
    pub runtime: Option<String>,
    pub seccomp: SeccompProfile,
    /// Written into every container's `code-runner.worker` label.
    pub worker_id: String,
    /// CPU quota of one sandbox, in CPUs.
    pub cpus: f64,
    /// The platform's share of every job's time: how long a sandbox may
    /// take to start, and the grace after the stages' wall limits before
    /// the engine kills the container itself (see [`crate::job::deadline`]).
    pub budget: Budget,
    /// The first sandbox uid of the host (see `uids`).
    pub uid_base: u32,
    /// Where the host-wide uid range locks live.
    pub uid_lock_dir: PathBuf,
    /// How jobs with outbound network get it.
    pub egress: EgressConfig,
    /// After `done`, how long the supervisor of a job that ran in a warm
    /// sandbox may stay, idle, until the [`Cleanup`](super::Cleanup) ends it
    /// (see [`Cleanup::is_idle`](super::Cleanup::is_idle)); zero: it exits at
    /// once, as a cold job's always does. The worker sets it when its
    /// background work yields to jobs.
    pub linger: std::time::Duration,
    /// Compiled checker programs kept for the next graded job with the
    /// same checker (shared by the config's clones; see `checker_cache`).
    pub checker_cache: CheckerCache,
}

impl SandboxConfig {
    pub fn new(seccomp: SeccompProfile, worker_id: impl Into<String>) -> Self {
        Self {
            runtime: None,
            seccomp,
            worker_id: worker_id.into(),
            cpus: 1.0,
            budget: Budget::default(),
            uid_base: DEFAULT_UID_BASE,
            uid_lock_dir: PathBuf::from(DEFAULT_LOCK_DIR),
            egress: EgressConfig::default(),
            linger: std::time::Duration::ZERO,
            checker_cache: CheckerCache::new(DEFAULT_CHECKER_CACHE_MB << 20),
        }
    }

    /// Whether sandboxes run under gVisor.
    pub fn is_gvisor(&self) -> bool {
        self.runtime.as_deref() == Some("runsc")
    }

    /// The OCI runtime of a sandbox with egress ([`egress::egress_runtime`]).
    pub fn egress_runtime(&self) -> Option<String> {
        egress::egress_runtime(&self.egress, self.runtime.as_deref())
    }

    /// What the supervisor enforces itself in every stage of a sandbox whose
    /// job may run `pids` processes: under gVisor the process limit and the
    /// CPU quota; nothing under runc, where the container's cgroup does.
    pub fn gvisor_limits(&self, pids: u64) -> Option<GvisorLimits> {
        self.is_gvisor().then(|| GvisorLimits {
            nproc: pids,
            cpu_quota_millis: (self.cpus * 1000.0).round() as u64,
        })
    }
}

/// Limits the supervisor applies to each stage under gVisor, where the
/// container's cgroup counts the sentry's threads rather than the job's
/// processes (see [`gvisor_pids_limit`](super::container::gvisor_pids_limit)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GvisorLimits {
    /// RLIMIT_NPROC inside gVisor's kernel: the job's `pids`.
    pub nproc: u64,
    /// The sandbox's CPU quota, in thousandths of a CPU.
    pub cpu_quota_millis: u64,
}

impl GvisorLimits {
    /// Gives a stage what `gvisor` says (and clears both limits under runc).
    pub fn apply(gvisor: Option<Self>, limits: &mut StageLimits) {
        limits.nproc = gvisor.map(|g| g.nproc);
        limits.cpu_quota_millis = gvisor.map(|g| g.cpu_quota_millis);
    }
}
