//! The one place that builds a sandbox container's configuration, and the
//! guard that removes the container on every path.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, ContainerSummary, HostConfig, HostConfigLogConfig, ResourcesUlimits,
};
use bollard::query_parameters::{ListContainersOptions, RemoveContainerOptions};

use super::SandboxConfig;
use crate::job::PreparedJob;

/// Labels on every sandbox container; the reaper finds containers by them.
pub const LABEL_JOB: &str = "code-runner.job";
pub const LABEL_WORKER: &str = "code-runner.worker";
pub const LABEL_CREATED: &str = "code-runner.created";
/// Unix milliseconds after which the container has outlived its job.
pub const LABEL_DEADLINE: &str = "code-runner.deadline";
pub const LABEL_LANGUAGE: &str = "code-runner.language";

/// Capabilities the supervisor keeps (to drop to the sandbox uid); everything
/// else is dropped, and user code runs with none.
pub const KEPT_CAPABILITIES: &[&str] = &["SETUID", "SETGID"];

/// Under runsc the pids cgroup counts gVisor's own host threads, not the
/// sandbox's processes: an idle sandbox uses about 44, and with gVisor's
/// ptrace platform each sandboxed process gets one host thread per sentry
/// thread that ever ran it — up to about one per running task. A fork bomb
/// held to 64 processes by RLIMIT_NPROC was seen at 2,200-2,900 host
/// threads; when the cgroup runs out, gVisor's sentry or the supervisor dies
/// and the job ends as a platform error instead of a verdict. So under
/// gVisor the job's process count is held by RLIMIT_NPROC inside gVisor's
/// kernel (threads count too), and the cgroup is only the host's backstop:
/// see [`gvisor_pids_limit`].
pub const GVISOR_BASE_THREADS: u64 = 64;
pub const GVISOR_THREADS_PER_PROCESS: u64 = 16;
/// The most host threads one gVisor sandbox may have, whatever its `pids`.
pub const GVISOR_MAX_HOST_THREADS: u64 = 16_384;

/// The pids cgroup limit of a gVisor sandbox whose job may have `pids`
/// processes: room for every process to be run by every sentry thread
/// (`pids * (pids + 16)` plus the base: 5,184 for the default 64), capped at
/// [`GVISOR_MAX_HOST_THREADS`].
pub fn gvisor_pids_limit(pids: u64) -> u64 {
    pids.saturating_mul(pids.saturating_add(GVISOR_THREADS_PER_PROCESS))
        .saturating_add(GVISOR_BASE_THREADS)
        .min(GVISOR_MAX_HOST_THREADS)
}

/// Whether sandboxes run under gVisor.
pub fn is_gvisor(config: &SandboxConfig) -> bool {
    config.runtime.as_deref() == Some("runsc")
}

/// Container name for a job: predictable, so a guard can remove it even when
/// the create call's answer was never seen.
pub fn container_name(job_id: &str) -> String {
    format!("code-runner-{job_id}")
}

/// The hardened configuration of a job's container (DESIGN §4).
pub fn container_config(
    job_id: &str,
    job: &PreparedJob,
    config: &SandboxConfig,
    created_ms: u64,
    deadline_ms: u64,
) -> ContainerCreateBody {
    let limits = &job.limits;
    let memory = i64::try_from(limits.memory_mb * 1024 * 1024).unwrap_or(i64::MAX);
    let disk = format!("{}m", limits.disk_mb);
    // `exec`: Docker mounts a tmpfs noexec unless told otherwise, and compiled
    // programs run from the workspace. `uid`/`gid`: runc ignores `mode` and
    // keeps the mode of the image's directory; the owner options it keeps.
    let tmpfs_options = format!(
        "rw,exec,nosuid,nodev,size={disk},mode=1777,uid={uid},gid={gid}",
        uid = crate::job::SANDBOX_UID,
        gid = crate::job::SANDBOX_GID
    );
    let fsize = i64::try_from(limits.disk_mb * 1024 * 1024).unwrap_or(i64::MAX);
    let ulimit = |name: &str, value: i64| ResourcesUlimits {
        name: Some(name.to_string()),
        soft: Some(value),
        hard: Some(value),
    };
    let labels = HashMap::from([
        (LABEL_JOB.to_string(), job_id.to_string()),
        (LABEL_WORKER.to_string(), config.worker_id.clone()),
        (LABEL_CREATED.to_string(), created_ms.to_string()),
        (LABEL_DEADLINE.to_string(), deadline_ms.to_string()),
        (LABEL_LANGUAGE.to_string(), job.language.id.clone()),
    ]);
    ContainerCreateBody {
        image: Some(job.language.image_ref()),
        hostname: Some("sandbox".into()),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        // The supervisor's environment holds no secrets: only what the image sets.
        env: Some(vec![]),
        working_dir: Some(crate::job::WORKSPACE.into()),
        network_disabled: Some(true),
        labels: Some(labels),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([
                (crate::job::WORKSPACE.to_string(), tmpfs_options.clone()),
                ("/tmp".to_string(), tmpfs_options),
            ])),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(KEPT_CAPABILITIES.iter().map(|c| c.to_string()).collect()),
            security_opt: Some(vec![
                "no-new-privileges".into(),
                config.seccomp.security_opt(),
            ]),
            memory: Some(memory),
            memory_swap: Some(memory),
            memory_swappiness: (config.runtime.is_none()).then_some(0),
            pids_limit: Some(
                i64::try_from(if is_gvisor(config) {
                    gvisor_pids_limit(limits.pids)
                } else {
                    limits.pids
                })
                .unwrap_or(i64::MAX),
            ),
            nano_cpus: Some((config.cpus * 1e9) as i64),
            ulimits: Some(vec![
                ulimit("nofile", 1024),
                ulimit("fsize", fsize),
                ulimit("core", 0),
            ]),
            ipc_mode: Some("private".into()),
            shm_size: Some(16 * 1024 * 1024),
            runtime: config.runtime.clone(),
            init: Some(false),
            // Output travels over the attach stream; nothing is logged to disk.
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".into()),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Removes its container when dropped, unless [`ContainerGuard::remove`] ran.
/// A drop happens when the future running a job is dropped or cancelled; the
/// removal is then spawned onto the runtime, and tried again a little later in
/// case the create call was still in flight.
pub struct ContainerGuard {
    docker: Docker,
    name: String,
    armed: bool,
}

impl ContainerGuard {
    pub fn new(docker: Docker, name: String) -> Self {
        Self {
            docker,
            name,
            armed: true,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Force-removes the container (and its anonymous volumes) now.
    pub async fn remove(mut self) -> Result<(), bollard::errors::Error> {
        self.armed = false;
        force_remove(&self.docker, &self.name).await
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let docker = self.docker.clone();
        let name = std::mem::take(&mut self.name);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                for delay in [Duration::ZERO, Duration::from_secs(2)] {
                    tokio::time::sleep(delay).await;
                    if let Err(error) = force_remove(&docker, &name).await {
                        tracing::warn!(container = %name, %error, "could not remove a dropped sandbox container");
                    }
                }
            });
        }
    }
}

/// Delays between the background attempts to remove a container Docker did
/// not remove when asked (Docker not answering, e.g. dockerd restarting):
/// about five minutes in all; after that the reaper removes it once its
/// deadline has passed.
const BACKGROUND_REMOVE_DELAYS_S: [u64; 9] = [1, 1, 2, 4, 8, 15, 30, 60, 180];

/// Keeps trying to remove a container in the background, for a job whose
/// result must not wait for Docker to come back.
pub(super) fn remove_in_background(docker: Docker, name: String) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        let mut last = None;
        for delay in BACKGROUND_REMOVE_DELAYS_S {
            tokio::time::sleep(Duration::from_secs(delay)).await;
            match force_remove(&docker, &name).await {
                Ok(()) => {
                    tracing::info!(container = %name, "removed the sandbox container once docker answered");
                    return;
                }
                Err(error) => last = Some(error),
            }
        }
        if let Some(error) = last {
            tracing::warn!(container = %name, %error, "gave up removing the sandbox container; the reaper removes it after its deadline");
        }
    });
}

/// Force-removes a container with its volumes; a container that is already
/// gone is not an error.
pub async fn force_remove(docker: &Docker, name: &str) -> Result<(), bollard::errors::Error> {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
    };
    match docker.remove_container(name, Some(options)).await {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409,
            ..
        }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// A sandbox container as the reaper sees it: who made it, for which job,
/// and until when it may live. Every container with a `code-runner.worker`
/// label is one, whoever created it (a worker of any fleet, the `sandbox run`
/// CLI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxContainer {
    pub id: String,
    /// The `code-runner.job` label (absent on a hand-made container).
    pub job: Option<String>,
    /// The `code-runner.worker` label.
    pub worker: String,
    /// The `code-runner.created` label, else Docker's own creation time.
    pub created_ms: u64,
    /// The `code-runner.deadline` label, if it is there and a number.
    pub deadline_ms: Option<u64>,
}

impl SandboxContainer {
    fn from_summary(summary: ContainerSummary) -> Option<Self> {
        let labels = summary.labels.unwrap_or_default();
        let number = |name: &str| labels.get(name).and_then(|v| v.parse::<u64>().ok());
        let docker_created_ms = summary
            .created
            .and_then(|s| u64::try_from(s).ok())
            .map_or(0, |s| s.saturating_mul(1000));
        Some(Self {
            id: summary.id?,
            job: labels.get(LABEL_JOB).cloned(),
            worker: labels.get(LABEL_WORKER)?.clone(),
            created_ms: number(LABEL_CREATED).unwrap_or(docker_created_ms),
            deadline_ms: number(LABEL_DEADLINE),
        })
    }
}

/// Every container (in any state) that carries the `code-runner.worker`
/// label.
pub async fn list_sandboxes(
    docker: &Docker,
) -> Result<Vec<SandboxContainer>, bollard::errors::Error> {
    let filters = HashMap::from([("label".to_string(), vec![LABEL_WORKER.to_string()])]);
    let options = ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    Ok(docker
        .list_containers(Some(options))
        .await?
        .into_iter()
        .filter_map(SandboxContainer::from_summary)
        .collect())
}
