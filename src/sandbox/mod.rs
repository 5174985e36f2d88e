//! The sandbox engine: runs one prepared job in one hardened container through
//! the Docker Engine API. It knows Docker and the frame protocol; it knows
//! nothing of HTTP or Redis.
//!
//! The cold path costs four Engine API round trips: create, attach, start,
//! remove (plus an inspect only when the sandbox died without reporting).

mod container;
mod seccomp;
mod session;

use std::time::Duration;

use bollard::Docker;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use container::{
    ContainerGuard, KEPT_CAPABILITIES, LABEL_CREATED, LABEL_DEADLINE, LABEL_JOB, LABEL_LANGUAGE,
    LABEL_WORKER, SandboxContainer, container_config, container_name, force_remove, list_sandboxes,
};
pub use seccomp::{Door, EMBEDDED_PROFILE, MUST_DENY, SeccompError, SeccompProfile};

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
}

impl SandboxConfig {
    pub fn new(seccomp: SeccompProfile, worker_id: impl Into<String>) -> Self {
        Self {
            runtime: None,
            seccomp,
            worker_id: worker_id.into(),
            cpus: 1.0,
            start_timeout: Duration::from_secs(30),
            deadline_grace: Duration::from_secs(3),
        }
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
}

/// Runs jobs in containers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SandboxEngine {
    docker: Docker,
    config: SandboxConfig,
}

impl SandboxEngine {
    /// Connects to Docker (`DOCKER_HOST` or the local socket) and negotiates
    /// the API version with the daemon.
    pub async fn connect(config: SandboxConfig) -> Result<Self, SandboxError> {
        let docker = Docker::connect_with_defaults().map_err(SandboxError::Connect)?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(SandboxError::Ping)?;
        Ok(Self { docker, config })
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
            return vec![("docker".to_string(), message)];
        }
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
    pub async fn list_sandboxes(&self) -> Result<Vec<SandboxContainer>, SandboxError> {
        list_sandboxes(&self.docker)
            .await
            .map_err(SandboxError::List)
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

    /// Runs `job` to its end. Platform failures are a result with status
    /// `error`, never a panic; the container is removed on every path,
    /// including when this future is dropped.
    pub async fn run(&self, job_id: &str, job: &PreparedJob, io: JobIo) -> JobResult {
        session::run(&self.docker, &self.config, job_id, job, io).await
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
