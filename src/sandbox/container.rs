//! The one place that builds a sandbox container's configuration, and the
//! guard that removes the container on every path.
//!
//! [`container_config`] makes every sandbox from a [`SandboxShape`] (image,
//! language, [`SandboxClass`], uid, job or warm): no network, a read-only
//! root, tmpfs `/workspace` and `/tmp` sized by `disk_mb` and owned by the
//! sandbox's uid, every capability dropped but SETUID/SETGID,
//! `no-new-privileges`, the seccomp profile, memory = memory + swap, pids,
//! CPU quota, ulimits, logging off (output travels over the attach
//! stream), and the labels the reaper finds containers by
//! (`code-runner.job` on a job's container, `code-runner.warm` on a pool
//! member, `code-runner.deadline`, `code-runner.uid`, …).
//!
//! [`ContainerGuard`] removes its container when the future running a job
//! is dropped, and holds the sandbox's uid until the container is gone. It
//! makes the create call on a task of its own that a dropped caller does
//! not cut short, and every removal waits for that call to end: a removal
//! that reached Docker before the creation would find nothing, and the
//! container would be created after it and left.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, ContainerSummary, ContainerSummaryStateEnum, HostConfig,
    HostConfigLogConfig, ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
};

use super::SandboxConfig;
use super::uids::UidLease;
use crate::job::limits::Limits;

/// Labels on every sandbox container; the reaper finds containers by them.
pub const LABEL_JOB: &str = "code-runner.job";
pub const LABEL_WORKER: &str = "code-runner.worker";
pub const LABEL_CREATED: &str = "code-runner.created";
/// Unix milliseconds after which the container has outlived its job.
pub const LABEL_DEADLINE: &str = "code-runner.deadline";
pub const LABEL_LANGUAGE: &str = "code-runner.language";
/// `1` on a warm sandbox: started before any job, it has no job label (labels
/// cannot change once a container exists) and serves one job when claimed.
pub const LABEL_WARM: &str = "code-runner.warm";
/// The uid (and gid) the sandbox's programs run as.
pub const LABEL_UID: &str = "code-runner.uid";
/// On a graded job's checker sandbox (beside the job's own, same job label).
pub const LABEL_CHECKER: &str = "code-runner.checker";

/// Capabilities the supervisor keeps (to drop to the sandbox uid); everything
/// else is dropped, and user code runs with none.
pub const KEPT_CAPABILITIES: &[&str] = &["SETUID", "SETGID"];
/// Kept as well under gVisor, whose kernel lets a process ask to be traced
/// (`PTRACE_TRACEME`) only by a parent with its ids or this capability
/// (Linux asks nothing): the supervisor traces an interactive stage to say
/// when it waits for input (crates/init/src/watch.rs). Inside gVisor's own
/// kernel, held by PID 1 alone; user code runs with no capability and under
/// the supervisor's filter, which refuses `ptrace`.
pub const GVISOR_CAPABILITIES: &[&str] = &["SYS_PTRACE"];

/// The capabilities a sandbox's container keeps.
pub fn kept_capabilities(config: &SandboxConfig) -> Vec<String> {
    let mut kept: Vec<String> = KEPT_CAPABILITIES.iter().map(|c| c.to_string()).collect();
    if config.is_gvisor() {
        kept.extend(GVISOR_CAPABILITIES.iter().map(|c| c.to_string()));
    }
    kept
}

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

/// Container name for one run of a job, chosen before the create call, so a
/// guard can remove it even when the create call's answer was never seen.
pub fn container_name(job_id: &str) -> String {
    // A suffix of its own: a job that runs again (another attempt, after
    // its worker was lost) never meets a late container of a lost attempt
    // under the same name.
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("code-runner-{job_id}-{}", &suffix[..8])
}

/// Container name for a warm sandbox (no job yet).
pub fn warm_container_name(member: &str) -> String {
    format!("code-runner-warm-{member}")
}

/// The container-level limits a sandbox is created with. They cannot change
/// once it exists, so a warm sandbox serves only jobs of exactly its class
/// (the per-stage limits travel in the bundle and are the job's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxClass {
    pub memory_mb: u64,
    pub pids: u64,
    /// Size of `/workspace` and `/tmp`, and the largest file.
    pub disk_mb: u64,
}

impl SandboxClass {
    pub fn of(limits: &Limits) -> Self {
        Self {
            memory_mb: limits.memory_mb,
            pids: limits.pids,
            disk_mb: limits.disk_mb,
        }
    }
}

/// Everything one container is created from.
#[derive(Debug, Clone)]
pub struct SandboxShape {
    /// The image, with its tag.
    pub image: String,
    pub language: String,
    pub class: SandboxClass,
    /// The uid and gid its programs run as (and its tmpfs mounts belong to).
    pub uid: u32,
    /// The job it is created for; `None` for a warm sandbox.
    pub job_id: Option<String>,
    /// Unix ms: created, and after which the container has outlived its use.
    pub created_ms: u64,
    pub deadline_ms: u64,
    /// A graded job's checker sandbox.
    pub checker: bool,
    /// The host directory of the job's egress socket, mounted read-only at
    /// [`crate::job::EGRESS_MOUNT`]; the sandbox then runs under the egress
    /// runtime ([`SandboxConfig::egress_runtime`]). `None`: no network.
    pub egress_dir: Option<std::path::PathBuf>,
}

/// The hardened configuration of a sandbox container (docs/security.md says
/// what each setting keeps out).
pub fn container_config(shape: &SandboxShape, config: &SandboxConfig) -> ContainerCreateBody {
    let class = &shape.class;
    let memory = i64::try_from(class.memory_mb * 1024 * 1024).unwrap_or(i64::MAX);
    let disk = format!("{}m", class.disk_mb);
    // `exec`: Docker mounts a tmpfs noexec unless told otherwise, and compiled
    // programs run from the workspace. `uid`/`gid`: runc ignores `mode` and
    // keeps the mode of the image's directory; the owner options it keeps.
    let tmpfs_options = format!(
        "rw,exec,nosuid,nodev,size={disk},mode=1777,uid={uid},gid={uid}",
        uid = shape.uid
    );
    let fsize = i64::try_from(class.disk_mb * 1024 * 1024).unwrap_or(i64::MAX);
    let ulimit = |name: &str, value: i64| ResourcesUlimits {
        name: Some(name.to_string()),
        soft: Some(value),
        hard: Some(value),
    };
    let mut labels = HashMap::from([
        (LABEL_WORKER.to_string(), config.worker_id.clone()),
        (LABEL_CREATED.to_string(), shape.created_ms.to_string()),
        (LABEL_DEADLINE.to_string(), shape.deadline_ms.to_string()),
        (LABEL_LANGUAGE.to_string(), shape.language.clone()),
        (LABEL_UID.to_string(), shape.uid.to_string()),
    ]);
    match &shape.job_id {
        Some(job_id) => labels.insert(LABEL_JOB.to_string(), job_id.clone()),
        None => labels.insert(LABEL_WARM.to_string(), "1".to_string()),
    };
    if shape.checker {
        labels.insert(LABEL_CHECKER.to_string(), "1".to_string());
    }
    ContainerCreateBody {
        image: Some(shape.image.clone()),
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
            cap_add: Some(kept_capabilities(config)),
            security_opt: Some(vec![
                "no-new-privileges".into(),
                config.seccomp.security_opt(),
            ]),
            memory: Some(memory),
            memory_swap: Some(memory),
            memory_swappiness: (config.runtime.is_none()).then_some(0),
            pids_limit: Some(
                i64::try_from(if config.is_gvisor() {
                    gvisor_pids_limit(class.pids)
                } else {
                    class.pids
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
            binds: shape
                .egress_dir
                .as_deref()
                .map(|dir| vec![super::egress::bind(dir)]),
            runtime: match shape.egress_dir {
                Some(_) => config.egress_runtime(),
                None => config.runtime.clone(),
            },
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

/// Removes its container when dropped, unless [`ContainerGuard::remove`] ran,
/// and keeps the sandbox's uid until the container is gone. A drop happens
/// when the future running a job is dropped or cancelled; the removal is then
/// spawned onto the runtime. The container's creation
/// ([`ContainerGuard::create`]) is never cut short, and every removal waits
/// for it: a removal that reached Docker before a creation still under way
/// would find nothing, and the container would be created after it and left.
pub struct ContainerGuard {
    docker: Docker,
    name: String,
    lease: Option<UidLease>,
    armed: bool,
    /// Held while the create call is in flight (see [`ContainerGuard::create`]).
    creating: Arc<tokio::sync::Mutex<()>>,
}

impl ContainerGuard {
    pub fn new(docker: Docker, name: String, lease: Option<UidLease>) -> Self {
        Self {
            docker,
            name,
            lease,
            armed: true,
            creating: Arc::default(),
        }
    }

    /// Creates the container, on a task of its own: dropping the caller's
    /// future does not cut the call short, and a removal (by
    /// [`ContainerGuard::remove`] or the drop) waits until it has ended, so
    /// it finds the container if Docker made it.
    pub(super) async fn create(
        &self,
        options: CreateContainerOptions,
        body: ContainerCreateBody,
    ) -> Result<(), bollard::errors::Error> {
        let held = Arc::clone(&self.creating).lock_owned().await;
        let docker = self.docker.clone();
        let call = tokio::spawn(async move {
            let created = docker.create_container(Some(options), body).await;
            drop(held);
            created.map(drop)
        });
        match call.await {
            Ok(created) => created,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }

    /// Waits until Docker says the container is not running (its own view,
    /// which lags the process's exit a little); `false` when Docker could
    /// not say.
    pub(super) async fn wait_stopped(&self) -> bool {
        use futures_util::StreamExt;
        let mut wait = self.docker.wait_container(&self.name, None);
        matches!(
            wait.next().await,
            Some(Ok(_) | Err(bollard::errors::Error::DockerContainerWaitError { .. }))
        )
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The uid of the sandbox's programs, when it has one of its own.
    pub fn uid(&self) -> Option<u32> {
        self.lease.as_ref().map(UidLease::uid)
    }

    /// Removes a container that may still be running (an idle warm
    /// sandbox): kills it, waits until Docker has handled its exit (at most
    /// [`STOP_BEFORE_REMOVE_WAIT`]), then removes it as [`Self::remove`]
    /// does. Docker 20.10 removing a running container by force kills it
    /// and, when the exit is slow to be handled (hundreds removed at once,
    /// as at a pool's shutdown), deletes the container's directory while
    /// its exit handling still writes `hostconfig.json` into it: the removal
    /// fails with "directory not empty" and the container stays listed as
    /// "Removal In Progress" until dockerd restarts (moby/moby#52161). Docker
    /// marks a container stopped within its exit handling, holding the
    /// container's lock, and a removal takes that lock before it deletes
    /// anything: waiting for "stopped" first keeps the two apart. Measured,
    /// not proven: docs/performance.md, "Stopping a worker with a pool of 300".
    pub async fn stop_then_remove(self) -> bool {
        // No signal named: Docker's default for a kill is SIGKILL.
        match self.docker.kill_container(&self.name, None).await {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) => {
                if tokio::time::timeout(STOP_BEFORE_REMOVE_WAIT, self.wait_stopped())
                    .await
                    .is_err()
                {
                    tracing::debug!(container = %self.name, "docker did not say the killed sandbox stopped; removing it by force");
                }
            }
            Err(error) => {
                tracing::debug!(container = %self.name, %error, "could not kill the sandbox container; removing it by force");
            }
        }
        self.remove().await
    }

    /// Force-removes the container (and its anonymous volumes) now; when
    /// Docker does not answer, keeps trying in the background (with the uid
    /// still held) and returns `false`. A removal cancelled half way (its
    /// future dropped) leaves the guard armed, so its drop removes.
    pub async fn remove(mut self) -> bool {
        let _created = self.creating.lock().await;
        let result = force_remove(&self.docker, &self.name).await;
        self.armed = false;
        let lease = self.lease.take();
        let name = std::mem::take(&mut self.name);
        match result {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(container = %name, %error, "could not remove the sandbox container; retrying in the background");
                remove_in_background(self.docker.clone(), name, lease);
                false
            }
        }
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let docker = self.docker.clone();
        let name = std::mem::take(&mut self.name);
        let lease = self.lease.take();
        let creating = Arc::clone(&self.creating);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _created = creating.lock().await;
                if let Err(error) = force_remove(&docker, &name).await {
                    tracing::warn!(container = %name, %error, "could not remove a dropped sandbox container; retrying in the background");
                    remove_in_background(docker, name, lease);
                }
            });
        }
    }
}

/// How long [`ContainerGuard::stop_then_remove`] waits for Docker to say a
/// killed container stopped before it removes the container by force.
const STOP_BEFORE_REMOVE_WAIT: Duration = Duration::from_secs(10);

/// Delays between the background attempts to remove a container Docker did
/// not remove when asked (Docker not answering, e.g. dockerd restarting):
/// every second for the first minute, so a container goes within a second
/// of a restarted dockerd answering (an attempt against a Docker that is not
/// there is a refused connection: cheap), then every 10 s; five minutes in
/// all; after that the reaper removes it once its deadline has passed.
fn background_remove_delays() -> impl Iterator<Item = Duration> {
    std::iter::repeat_n(Duration::from_secs(1), 60)
        .chain(std::iter::repeat_n(Duration::from_secs(10), 24))
}

/// Keeps trying to remove a container in the background, for a job whose
/// result must not wait for Docker to come back; the uid is given back once
/// the container is gone (or given up on: the engine's next container listing
/// marks it busy while the container lives).
fn remove_in_background(docker: Docker, name: String, lease: Option<UidLease>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        let mut last = None;
        for delay in background_remove_delays() {
            tokio::time::sleep(delay).await;
            match force_remove(&docker, &name).await {
                Ok(()) => {
                    tracing::info!(container = %name, "removed the sandbox container once docker answered");
                    drop(lease);
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
    /// The `code-runner.uid` label: the uid its programs run as.
    pub uid: Option<u32>,
    /// An idle or claimed warm sandbox (`code-runner.warm`).
    pub warm: bool,
    /// Docker is removing it already (state `removing`): asking again only
    /// answers 409, and the container is on its way out.
    pub removing: bool,
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
            uid: labels.get(LABEL_UID).and_then(|v| v.parse().ok()),
            warm: labels.get(LABEL_WARM).is_some_and(|v| v == "1"),
            removing: summary.state == Some(ContainerSummaryStateEnum::REMOVING),
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
