//! [`DockerEngine`]: the [`SandboxEngine`] that runs every job in a hardened
//! container through the Docker Engine API (runc, or gVisor's runsc).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;

use super::container::{SandboxContainer, force_remove, list_sandboxes};
use super::egress;
use super::engine::{RunOutcome, SandboxEngine};
use super::pool::{PoolSettings, WarmPool, WarmSandbox};
use super::uids::UidRange;
use super::{JobIo, SandboxConfig, SandboxError, run};
use crate::job::deadline::{Budget, now_ms};
use crate::job::{PreparedJob, Status};

/// Runs jobs in containers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DockerEngine {
    docker: Docker,
    config: SandboxConfig,
    uids: UidRange,
    /// Unix ms of the last time Docker answered a call of this engine.
    docker_answered_ms: Arc<AtomicU64>,
    /// The Docker daemon's own id (`docker info`): which host's containers
    /// this engine sees.
    host_id: Arc<str>,
}

impl DockerEngine {
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

    /// Notes that Docker just answered.
    pub(crate) fn docker_answered(&self) {
        self.docker_answered_ms.store(now_ms(), Ordering::Relaxed);
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
}

#[async_trait]
impl SandboxEngine for DockerEngine {
    fn host_id(&self) -> &str {
        &self.host_id
    }

    fn budget(&self) -> Budget {
        self.config.budget
    }

    fn answered_within(&self, within: Duration) -> bool {
        let last = self.docker_answered_ms.load(Ordering::Relaxed);
        now_ms().saturating_sub(last) <= within.as_millis() as u64
    }

    fn note_unanswered(&self) {
        self.docker_answered_ms.store(0, Ordering::Relaxed);
    }

    async fn readiness(&self, images: &[String], timeout: Duration) -> Vec<(String, String)> {
        if let Some(message) = failure_within(timeout, self.docker.ping()).await {
            self.note_unanswered();
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

    /// Every sandbox container on this Docker host (see
    /// [`SandboxContainer`]). Refreshes which uids of this engine's range
    /// other containers use.
    async fn list_sandboxes(&self) -> Result<Vec<SandboxContainer>, SandboxError> {
        let containers = list_sandboxes(&self.docker)
            .await
            .map_err(SandboxError::List)?;
        self.docker_answered();
        self.uids
            .refresh_busy(containers.iter().filter_map(|c| c.uid));
        Ok(containers)
    }

    /// Force-removes a container with its volumes.
    async fn remove_sandbox(&self, id: &str) -> Result<(), SandboxError> {
        force_remove(&self.docker, id)
            .await
            .map_err(|source| SandboxError::Remove {
                id: id.to_string(),
                source,
            })
    }

    async fn run_job(
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
                run::run_in(self, run, io, warm.into_started(), started).await
            }
            None => run::run_cold(self, job_id, job, io).await,
        };
        // A platform error may be Docker going away (dockerd stopping ends
        // the sandbox after it started): the next claim asks Docker first.
        if outcome.result.status == Status::Error {
            self.note_unanswered();
        } else if outcome.result.timings.container_start_ms > 0 {
            self.docker_answered();
        }
        outcome
    }

    fn warm_pool(&self, settings: PoolSettings) -> Option<WarmPool> {
        Some(WarmPool::start(self, settings))
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
