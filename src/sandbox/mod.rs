//! The sandbox engine: runs one prepared job in one hardened container through
//! the Docker Engine API. It knows Docker and the frame protocol; it knows
//! nothing of HTTP or Redis.
//!
//! The cold path costs four Engine API round trips: create, attach, start,
//! remove (plus an inspect only when the sandbox died without reporting);
//! the result is ready before the remove. The warm path ([`pool`]) takes a
//! sandbox started before the job came: no Engine API call before the job
//! runs, one (remove) after.
//!
//! - `container`: the one function that builds a container's configuration,
//!   the labels, the guard that removes a container on every path.
//! - `session`: starting a sandbox, and one job's frames until its end.
//! - [`pool`]: warm sandboxes, their lifecycle and refill.
//! - `uids`: one uid per live sandbox on a host.
//! - `egress`: a job's egress proxy on a socket mounted into its sandbox.
//! - `seccomp`: loading and checking the profile.

mod checker;
pub mod checker_cache;
mod connection;
mod container;
mod egress;
mod grading;
mod outcome;
pub mod pool;
mod run;
mod seccomp;
mod session;
mod uids;

use std::time::Duration;

use bollard::Docker;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use container::{
    ContainerGuard, KEPT_CAPABILITIES, LABEL_CREATED, LABEL_DEADLINE, LABEL_JOB, LABEL_LANGUAGE,
    LABEL_UID, LABEL_WARM, LABEL_WORKER, SandboxClass, SandboxContainer, SandboxShape,
    container_config, container_name, force_remove, list_sandboxes,
};
pub use egress::{DEFAULT_EGRESS_DIR, EgressConfig, parse_test_hosts};
pub use pool::{WarmPool, WarmSandbox, WarmSpec, WarmStatus};
pub use seccomp::{Door, EMBEDDED_PROFILE, MUST_DENY, SeccompError, SeccompProfile};
pub use session::{Cleanup, RunOutcome};
pub use uids::{DEFAULT_LOCK_DIR, DEFAULT_UID_BASE, RANGE_SIZE, UidError, UidRange};

/// How many uid ranges a host has.
pub const fn uids_ranges() -> u32 {
    uids::MAX_RANGES
}

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::job::{JobResult, PreparedJob, StageResult};
use crate::protocol::SignalKind;

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
    /// Longest wait from create until the supervisor says it is ready.
    pub start_timeout: Duration,
    /// Added to the sum of the stages' wall limits before the engine kills the
    /// container itself, whatever the supervisor says.
    pub deadline_grace: Duration,
    /// The first sandbox uid of the host (see `uids`).
    pub uid_base: u32,
    /// Where the host-wide uid range locks live.
    pub uid_lock_dir: PathBuf,
    /// How jobs with outbound network get it.
    pub egress: EgressConfig,
    /// After `done`, how long the supervisor of a job that ran in a warm
    /// sandbox may stay, idle, until the [`Cleanup`] ends it (see
    /// [`Cleanup::is_idle`]); zero: it exits at once, as a cold job's
    /// always does. The worker sets it when its background work yields to
    /// jobs.
    pub linger: Duration,
    /// Compiled checker programs kept for the next graded job with the
    /// same checker (shared by the config's clones; see `checker_cache`).
    pub checker_cache: checker_cache::CheckerCache,
}

/// The checker cache's size when nothing sets it.
pub const DEFAULT_CHECKER_CACHE_MB: u64 = 64;

impl SandboxConfig {
    pub fn new(seccomp: SeccompProfile, worker_id: impl Into<String>) -> Self {
        Self {
            runtime: None,
            seccomp,
            worker_id: worker_id.into(),
            cpus: 1.0,
            start_timeout: Duration::from_secs(30),
            deadline_grace: Duration::from_secs(3),
            uid_base: DEFAULT_UID_BASE,
            uid_lock_dir: PathBuf::from(DEFAULT_LOCK_DIR),
            egress: EgressConfig::default(),
            linger: Duration::ZERO,
            checker_cache: checker_cache::CheckerCache::new(DEFAULT_CHECKER_CACHE_MB << 20),
        }
    }

    /// The OCI runtime of a sandbox with egress ([`egress::egress_runtime`]).
    pub fn egress_runtime(&self) -> Option<String> {
        egress::egress_runtime(&self.egress, self.runtime.as_deref())
    }

    /// What a job's deadline adds to the wall limits of its stages: the
    /// start timeout and the grace. A job's whole budget is this plus
    /// [`PreparedJob::stages_wall_ms`]; the worker stores the deadline from
    /// it when the job starts.
    pub fn deadline_slack(&self) -> Duration {
        self.start_timeout + self.deadline_grace
    }

    /// The longest a job's container may live: the start timeout, the
    /// stages' wall limits and the grace.
    pub fn job_budget(&self, job: &PreparedJob) -> Duration {
        self.deadline_slack() + Duration::from_millis(job.stages_wall_ms())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot connect to docker: {0}")]
    Connect(#[source] bollard::errors::Error),
    #[error("docker is not answering: {0}")]
    Ping(#[source] bollard::errors::Error),
    #[error("docker could not list the sandbox containers: {0}")]
    List(#[source] bollard::errors::Error),
    #[error("docker could not remove container {id}: {source}")]
    Remove {
        id: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("cannot take a range of sandbox uids: {0}")]
    Uids(#[from] UidError),
}

/// What happens in a sandbox, as it happens.
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxEvent {
    /// The container exists and its supervisor is ready.
    Ready,
    StageStart {
        stage: String,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    StageEnd {
        stage: String,
        result: Box<StageResult>,
    },
    /// A graded job's test `index` started.
    TestStart {
        index: usize,
        name: String,
    },
    /// A graded job's test ended, with its verdict.
    TestEnd(Box<crate::job::grading::TestResult>),
    /// A process of the job waits for stdin with nothing buffered for it.
    InputWanted,
    /// A connection through the job's egress proxy ended.
    Egress(crate::egress::EgressEvent),
}

/// Input for a running job (interactive jobs, or signals for any job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobInput {
    Stdin(Vec<u8>),
    StdinClose,
    Signal(SignalKind),
}

/// The channels a caller attaches to a job. All optional.
#[derive(Debug, Default)]
pub struct JobIo {
    /// Receives events as they happen; a full channel slows the job down (the
    /// sandbox blocks on its output) rather than losing output.
    pub events: Option<mpsc::Sender<SandboxEvent>>,
    /// Input for the job; stdin given in the job itself is sent first.
    pub input: Option<mpsc::Receiver<JobInput>>,
    /// Cancelling kills the job; its status is then `cancelled`.
    pub cancel: CancellationToken,
    /// The job's deadline as the store keeps it (unix ms, set when the job
    /// started): the sandbox is killed by then at the latest and its
    /// container is labelled with it. `None` (a run outside the daemon):
    /// the engine takes [`SandboxConfig::job_budget`] from now.
    pub deadline_ms: Option<u64>,
}

/// Runs jobs in containers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SandboxEngine {
    docker: Docker,
    config: SandboxConfig,
    uids: UidRange,
    /// Unix ms of the last time Docker answered a call of this engine.
    docker_answered_ms: Arc<AtomicU64>,
    /// The Docker daemon's own id (`docker info`): which host's containers
    /// this engine sees.
    host_id: Arc<str>,
}

impl SandboxEngine {
    /// Connects to Docker (`DOCKER_HOST` or the local socket), negotiates
    /// the API version with the daemon, and takes a range of sandbox uids on
    /// this host (see `uids`).
    pub async fn connect(config: SandboxConfig) -> Result<Self, SandboxError> {
        let docker = Docker::connect_with_defaults().map_err(SandboxError::Connect)?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(SandboxError::Ping)?;
        let info = docker.info().await.map_err(SandboxError::Ping)?;
        let host_id: Arc<str> = info
            .id
            .filter(|id| !id.is_empty())
            .or(info.name)
            .unwrap_or_default()
            .into();
        let uids = UidRange::acquire(&config.uid_lock_dir, config.uid_base)?;
        egress::clear_stale(&egress::engine_dir(&config.egress, uids.first()));
        let mut config = config;
        if let Some(runtime) = config.egress_runtime()
            && !info
                .runtimes
                .as_ref()
                .is_some_and(|r| r.contains_key(&runtime))
        {
            let message = format!(
                "this worker cannot run jobs with network: Docker has no runtime {runtime:?} (gVisor needs one with --host-uds=open for the egress socket; see docs/egress.md)"
            );
            tracing::warn!("{message}");
            config.egress.unavailable = Some(message);
        }
        let engine = Self {
            docker,
            config,
            uids,
            docker_answered_ms: Arc::new(AtomicU64::new(0)),
            host_id,
        };
        engine.docker_answered();
        // Containers a dead previous holder of this uid range left behind.
        engine.list_sandboxes().await?;
        Ok(engine)
    }

    /// Notes that a call to Docker failed: until it answers again, callers
    /// asking [`Self::docker_answered_within`] check it themselves.
    pub(crate) fn docker_failed(&self) {
        self.docker_answered_ms.store(0, Ordering::Relaxed);
    }

    /// Notes that Docker just answered.
    pub(crate) fn docker_answered(&self) {
        self.docker_answered_ms.store(
            session::unix_ms(std::time::SystemTime::now()),
            Ordering::Relaxed,
        );
    }

    /// Whether Docker answered a call of this engine within `within`.
    pub fn docker_answered_within(&self, within: Duration) -> bool {
        let last = self.docker_answered_ms.load(Ordering::Relaxed);
        session::unix_ms(std::time::SystemTime::now()).saturating_sub(last)
            <= within.as_millis() as u64
    }

    /// The id of the Docker daemon this engine talks to: two engines with
    /// the same id see the same containers.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// This engine's range of sandbox uids.
    pub fn uids(&self) -> &UidRange {
        &self.uids
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// What keeps this engine from running jobs: Docker not answering within
    /// `timeout`, or an image of `images` missing. Each problem is
    /// `(check, message)`; empty when ready.
    pub async fn readiness(&self, images: &[String], timeout: Duration) -> Vec<(String, String)> {
        if let Some(message) = failure_within(timeout, self.docker.ping()).await {
            self.docker_failed();
            return vec![("docker".to_string(), message)];
        }
        self.docker_answered();
        let lookups = images.iter().map(|image| async move {
            failure_within(timeout, self.docker.inspect_image(image))
                .await
                .map(|message| (format!("image {image}"), message))
        });
        futures_util::future::join_all(lookups)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Every sandbox container on this Docker host, in any state, whoever
    /// created it (see [`SandboxContainer`]).
    /// Refreshes which uids of this engine's range other containers use.
    pub async fn list_sandboxes(&self) -> Result<Vec<SandboxContainer>, SandboxError> {
        let containers = list_sandboxes(&self.docker)
            .await
            .map_err(SandboxError::List)?;
        self.docker_answered();
        self.uids
            .refresh_busy(containers.iter().filter_map(|c| c.uid));
        Ok(containers)
    }

    /// Force-removes a container with its volumes (the reaper's kill); one
    /// already gone is not an error.
    pub async fn remove_sandbox(&self, id: &str) -> Result<(), SandboxError> {
        force_remove(&self.docker, id)
            .await
            .map_err(|source| SandboxError::Remove {
                id: id.to_string(),
                source,
            })
    }

    /// Runs `job` to its end in a new container and removes it. Platform
    /// failures are a result with status `error`, never a panic; the
    /// container is removed on every path, including when this future is
    /// dropped.
    pub async fn run(&self, job_id: &str, job: &PreparedJob, io: JobIo) -> JobResult {
        let outcome = self.run_job(job_id, job, io, None).await;
        outcome.cleanup.remove().await;
        outcome.result
    }

    /// Runs `job` to its end, in `warm` when given (a sandbox of the job's
    /// class from a [`WarmPool`]), else in a new container. The result comes
    /// back before the container is removed: call [`Cleanup::remove`] once
    /// it is durable (a dropped outcome removes it in the background).
    pub async fn run_job(
        &self,
        job_id: &str,
        job: &PreparedJob,
        io: JobIo,
        warm: Option<WarmSandbox>,
    ) -> RunOutcome {
        let outcome = match warm {
            Some(warm) => {
                let started = std::time::Instant::now();
                let run = run::Run {
                    job_id,
                    job,
                    egress_dir: None,
                };
                run::run_in(
                    &self.docker,
                    &self.config,
                    &self.uids,
                    run,
                    io,
                    warm.into_started(),
                    started,
                )
                .await
            }
            None => run::run_cold(&self.docker, &self.config, &self.uids, job_id, job, io).await,
        };
        // A platform error may be Docker going away (dockerd stopping ends
        // the sandbox after it started): the next claim asks Docker first.
        if outcome.result.status == crate::job::Status::Error {
            self.docker_failed();
        } else if outcome.result.timings.container_start_ms > 0 {
            self.docker_answered();
        }
        outcome
    }
}

/// Why `check` failed or did not answer within `timeout`; `None` on success.
async fn failure_within<T, E: std::fmt::Display>(
    timeout: Duration,
    check: impl Future<Output = Result<T, E>>,
) -> Option<String> {
    match tokio::time::timeout(timeout, check).await {
        Ok(Ok(_)) => None,
        Ok(Err(error)) => Some(error.to_string()),
        Err(_) => Some(format!("no answer within {} s", timeout.as_secs())),
    }
}
