//! The orphan reaper: cleans up after workers that died
//! without a drain (`kill -9`, OOM, a machine stopped). Every worker process
//! runs it; `code-runner reaper` runs only it. Each pass, every
//! `interval`:
//!
//! 1. Reads the fleet: the `workers` set, split by whether each heartbeat
//!    lives.
//! 2. Containers: removes (force, with volumes) every sandbox container
//!    whose worker is a dead member of this fleet, unless it was created
//!    less than `grace` ago (its worker may be creating it right now, before
//!    its first heartbeat); and every sandbox container, whoever made it,
//!    that is more than `grace` past its `code-runner.deadline` label. A
//!    container of a worker this fleet does not know (another fleet on the
//!    same Docker host, a `sandbox run` CLI) is otherwise left alone.
//! 3. Jobs: reaps each id in a dead worker's processing list with one
//!    atomic script, so reapers running in every worker never reap a job
//!    twice: claimed but never started → back to the queue (up to
//!    `max_requeues` times, then `error`/`worker_lost` and `jobs:dead`);
//!    started → run again while it has attempts left (`max_attempts`, never
//!    for an interactive job) once nothing of the lost attempt can still run
//!    (no container of the job on this host and the attempt ran here, or
//!    its deadline passed), else `error`/`worker_lost`. A dead worker whose
//!    list is empty is forgotten.
//! 4. Overdue jobs: a job `running` on a live worker past its deadline
//!    (stored by start: the engine's start timeout + the stages' wall
//!    limits + the engine's deadline grace after it started, see
//!    [`crate::job::deadline`]) plus `grace`
//!    is given up on: settled as `error`/`deadline_exceeded`, its worker
//!    being alive but silent about it. Its container, past its deadline
//!    label, goes by rule 2.
//!
//! An outage is not a death. A heartbeat that expired while Redis was
//! unreachable says nothing about its worker, so the reaper judges no one
//! (rules 2's dead-worker part, 3 and 4) until it has seen Redis answer
//! continuously for a full heartbeat TTL: a probe asks Redis every
//! [`PROBE_INTERVAL`] how long it has been up, and any failure (of the
//! probe or of a pass) or a restart of Redis starts the count again. By
//! then every live worker has re-announced itself. A reaper never judges
//! the worker of its own process.
//!
//! Redis or Docker being down is expected: the pass logs a warning, does
//! what it can without it, and the loop goes on.
//!
//! What it does not know: Redis keys and the reap scripts (they are the
//! store's), bollard (containers are listed and removed through
//! [`SandboxEngine::list_sandboxes`](crate::sandbox::SandboxEngine::list_sandboxes)
//! and `remove_sandbox`), the worker, and job specs: it prepares nothing and
//! reads every deadline from the job ([`ReaperHandles`]: the store, the
//! engine, the catalog for the verdicts' versions, the metrics, and the
//! longest wall budget for a job started before deadlines were stored).
//! Which container goes is a pure function, [`judge`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::job::result::ErrorReason;
use crate::job::{JobResult, Status};
use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::sandbox::{Engine, SandboxContainer};
use crate::store::{
    Fleet, ForgetOutcome, LATE_RESULT_WINDOW, LostJob, LostResults, ReapOutcome, ReapPolicy, Retry,
    RunningJob, Store, StoreError, now_ms,
};

#[derive(Debug, Clone)]
pub struct ReaperConfig {
    /// Time between two passes.
    pub interval: Duration,
    /// A dead worker's container younger than this is left alone; any
    /// container older than its deadline plus this is removed.
    pub grace: Duration,
    /// Times a claimed-but-never-started job is put back in the queue.
    pub max_requeues: u32,
    /// How long a heartbeat lives: after any Redis failure, the reaper
    /// judges no one until Redis answered this long without one.
    pub heartbeat_ttl: Duration,
    /// The worker of this reaper's own process, never judged dead.
    pub own_worker: Option<String>,
}

/// How often the reaper asks Redis whether it answers (and how long it
/// has been up).
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Since when Redis is known to have answered without a break, as this
/// reaper saw it.
#[derive(Debug, Default)]
struct Connectivity {
    /// `None`: it failed last.
    healthy_since: Option<Instant>,
}

impl Connectivity {
    fn failed(&mut self) {
        self.healthy_since = None;
    }

    /// Redis answered now, having been up `uptime` (a restart, even one
    /// between two probes, counts as an outage).
    fn answered(&mut self, uptime: Duration) {
        let now = Instant::now();
        let since = self.healthy_since.unwrap_or(now);
        let started = now.checked_sub(uptime).unwrap_or(since);
        self.healthy_since = Some(since.max(started));
    }

    /// Whether Redis answered without a break for at least `span`.
    fn healthy_for(&self, span: Duration) -> bool {
        self.healthy_since
            .is_some_and(|since| since.elapsed() >= span)
    }
}

/// Why a container is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerVerdict {
    Keep,
    /// Docker is removing it already: neither kept nor removed again (a
    /// removal Docker never finishes would otherwise be counted and logged
    /// as one on every pass).
    BeingRemoved,
    /// Its worker is in this fleet and its heartbeat expired.
    DeadWorker,
    /// It outlived its deadline plus the grace, whatever its worker.
    PastDeadline,
}

impl ContainerVerdict {
    /// The `kind` label of `code_runner_reaper_orphans_total`.
    fn kind(self) -> &'static str {
        match self {
            ContainerVerdict::Keep => "kept",
            ContainerVerdict::BeingRemoved => "being_removed",
            ContainerVerdict::DeadWorker => "container",
            ContainerVerdict::PastDeadline => "expired_container",
        }
    }
}

/// What to do with `container` at `now_ms`; `dead` is this fleet's dead
/// workers (`None` when Redis could not say: only deadlines count then).
pub fn judge(
    container: &SandboxContainer,
    dead: Option<&Fleet>,
    now_ms: u64,
    grace: Duration,
) -> ContainerVerdict {
    if container.removing {
        return ContainerVerdict::BeingRemoved;
    }
    let grace_ms = grace.as_millis() as u64;
    if container
        .deadline_ms
        .is_some_and(|deadline| deadline.saturating_add(grace_ms) < now_ms)
    {
        return ContainerVerdict::PastDeadline;
    }
    let worker_dead = dead.is_some_and(|fleet| fleet.dead.contains(&container.worker));
    if worker_dead && container.created_ms.saturating_add(grace_ms) <= now_ms {
        return ContainerVerdict::DeadWorker;
    }
    ContainerVerdict::Keep
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Containers removed, with why.
    pub containers: Vec<(SandboxContainer, ContainerVerdict)>,
    /// Jobs reaped now: (worker, job id, outcome); ids another reaper
    /// reaped first are not here.
    pub jobs: Vec<(String, String, ReapOutcome)>,
    /// Dead workers removed from the `workers` set.
    pub forgotten: Vec<String>,
    /// Jobs of live workers settled as `deadline_exceeded`: (worker, id).
    pub stuck: Vec<(String, String)>,
}

/// The `kind` label of a job outcome, `None` for outcomes that did nothing.
fn outcome_kind(outcome: &ReapOutcome) -> Option<&'static str> {
    match outcome {
        ReapOutcome::Requeued { .. } => Some("requeued"),
        ReapOutcome::Dead { .. } => Some("dead"),
        ReapOutcome::WorkerLost => Some("worker_lost"),
        ReapOutcome::Retried { .. } => Some("retried"),
        ReapOutcome::Cancelled => Some("cancelled"),
        ReapOutcome::TurnReturned => Some("turn_returned"),
        ReapOutcome::Terminal(_) | ReapOutcome::Missing | ReapOutcome::Moved => Some("dropped"),
        ReapOutcome::Absent | ReapOutcome::Alive | ReapOutcome::Waiting => None,
    }
}

/// Removes orphaned containers and reaps the jobs of dead workers; see
/// the module documentation.
#[derive(Debug, Clone)]
pub struct Reaper {
    config: ReaperConfig,
    store: Store,
    engine: Engine,
    catalog: LanguageCatalog,
    metrics: Metrics,
    /// The wall budget of a running job whose deadline was not stored (a
    /// job started by an earlier version): the longest any job may take.
    longest_wall: Duration,
    connectivity: Arc<Mutex<Connectivity>>,
}

/// What a reaper works with (each cheap to clone).
#[derive(Debug, Clone)]
pub struct ReaperHandles {
    pub store: Store,
    pub engine: Engine,
    /// For the language versions in the verdicts it writes.
    pub catalog: LanguageCatalog,
    pub metrics: Metrics,
    /// See [`LimitPolicy::longest_wall`](crate::job::limits::LimitPolicy::longest_wall).
    pub longest_wall: Duration,
}

/// What is left on this Docker host after the container rule.
#[derive(Debug, Default)]
struct Remaining {
    /// Workers that still have a container.
    workers: HashSet<String>,
    /// Jobs that still have a container.
    jobs: HashSet<String>,
}

impl Reaper {
    pub fn new(config: ReaperConfig, handles: ReaperHandles) -> Self {
        let ReaperHandles {
            store,
            engine,
            catalog,
            metrics,
            longest_wall,
        } = handles;
        Self {
            config,
            store,
            engine,
            catalog,
            metrics,
            longest_wall,
            connectivity: Arc::default(),
        }
    }

    fn lock_connectivity(&self) -> std::sync::MutexGuard<'_, Connectivity> {
        self.connectivity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks Redis how long it has been up, every [`PROBE_INTERVAL`].
    async fn probe(&self, shutdown: CancellationToken) {
        loop {
            let answer = tokio::select! {
                () = shutdown.cancelled() => return,
                answer = tokio::time::timeout(PROBE_INTERVAL * 4, self.store.redis_uptime()) => answer,
            };
            match answer {
                Ok(Ok(uptime)) => self.lock_connectivity().answered(uptime),
                _ => self.lock_connectivity().failed(),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(PROBE_INTERVAL) => {}
            }
        }
    }

    /// Whether the reaper may judge workers now: Redis answered without a
    /// break for a full heartbeat TTL.
    pub fn may_judge(&self) -> bool {
        self.lock_connectivity()
            .healthy_for(self.config.heartbeat_ttl)
    }

    /// Runs a pass every `interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(
            interval_ms = self.config.interval.as_millis() as u64,
            grace_ms = self.config.grace.as_millis() as u64,
            max_requeues = self.config.max_requeues,
            "reaper started"
        );
        let passes = async {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = self.pass() => {}
                }
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(self.config.interval) => {}
                }
            }
        };
        tokio::join!(passes, self.probe(shutdown.clone()));
        tracing::info!("reaper stopped");
    }

    /// One pass: containers first (so a job settled as `worker_lost` has no
    /// sandbox left running), then the jobs of dead workers, then stuck jobs
    /// of live ones. Never fails:
    /// what cannot be done now is logged and tried again next pass.
    pub async fn pass(&self) -> PassReport {
        let mut report = PassReport::default();
        match self.store.redis_uptime().await {
            Ok(uptime) => self.lock_connectivity().answered(uptime),
            Err(_) => self.lock_connectivity().failed(),
        }
        let may_judge = self.may_judge();
        let fleet = match self.store.workers().fleet().await {
            Ok(mut fleet) => {
                if let Some(own) = &self.config.own_worker
                    && fleet.dead.remove(own)
                {
                    fleet.alive.insert(own.clone());
                }
                Some(fleet)
            }
            Err(error) => {
                self.lock_connectivity().failed();
                tracing::warn!(%error, "the reaper cannot read the fleet from redis; only expired containers are removed this pass");
                None
            }
        };
        // Until Redis answered for a full heartbeat TTL, an expired
        // heartbeat may be the outage's doing: no one is judged dead.
        let judged = fleet.as_ref().filter(|_| may_judge);
        if fleet.as_ref().is_some_and(|f| !f.dead.is_empty()) && !may_judge {
            tracing::info!(
                heartbeat_ttl_ms = self.config.heartbeat_ttl.as_millis() as u64,
                "redis failed or restarted within the last heartbeat TTL; the reaper judges no worker until it has answered that long"
            );
        }
        // Dead workers that still have a container (one inside the grace
        // period, or one Docker would not remove): they stay in the fleet so
        // a later pass still knows those containers' worker is dead.
        let remaining = self.reap_containers(judged, &mut report).await;
        if let Some(fleet) = judged {
            for worker in &fleet.dead {
                let forget = remaining
                    .as_ref()
                    .is_some_and(|r| !r.workers.contains(worker.as_str()));
                if let Err(error) = self
                    .reap_worker(worker, forget, remaining.as_ref(), &mut report)
                    .await
                {
                    self.lock_connectivity().failed();
                    tracing::warn!(worker.id = %worker, %error, "the reaper could not reap the jobs of a dead worker; retrying next pass");
                }
            }
            for worker in &fleet.alive {
                if let Err(error) = self.give_up_overdue(worker, &mut report).await {
                    self.lock_connectivity().failed();
                    tracing::warn!(worker.id = %worker, %error, "the reaper could not check the jobs of a live worker; retrying next pass");
                }
            }
        }
        report
    }

    /// Gives up on the jobs of a live worker that outlived their deadline
    /// plus the grace.
    async fn give_up_overdue(
        &self,
        worker: &str,
        report: &mut PassReport,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        for job in self.store.jobs().running_on(worker).await? {
            let deadline_ms = self.deadline_ms(job.started_ms, job.deadline_ms);
            if deadline_ms.saturating_add(self.config.grace.as_millis() as u64) >= now {
                continue;
            }
            let budget_ms =
                deadline_ms.saturating_sub(job.started_ms) + self.config.grace.as_millis() as u64;
            let result = self.stuck_result(worker, &job, budget_ms);
            if !self
                .store
                .jobs()
                .give_up_overdue(worker, &job, &result, LATE_RESULT_WINDOW)
                .await?
            {
                continue;
            }
            self.metrics
                .reaper_orphans
                .with_label_values(&["deadline_exceeded"])
                .inc();
            tracing::info!(
                job.id = %job.id,
                worker.id = %worker,
                started_ms = job.started_ms,
                budget_ms,
                "the reaper gave up on a job that outlived its deadline on a live worker"
            );
            report.stuck.push((worker.to_string(), job.id));
        }
        Ok(())
    }

    /// A running job's deadline: as its start stored it, else (a job
    /// started by an earlier version) the longest any job may take from
    /// `started_ms`.
    fn deadline_ms(&self, started_ms: u64, stored: Option<u64>) -> u64 {
        stored.unwrap_or_else(|| {
            self.engine
                .budget()
                .deadline_ms(started_ms, self.longest_wall)
        })
    }

    fn stuck_result(&self, worker: &str, job: &RunningJob, budget_ms: u64) -> JobResult {
        JobResult::without_stages(Status::Error, &job.language, self.version(&job.language))
            .with_error(format!(
                "the job outlived its deadline ({budget_ms} ms after it started, with the reaper's grace) on worker {worker}, which never reported it"
            ))
            .with_reason(ErrorReason::DeadlineExceeded)
    }

    fn version(&self, language: &str) -> String {
        self.catalog
            .find(language)
            .map(|l| l.version.clone())
            .unwrap_or_default()
    }

    /// Removes what `judge` condemns. Returns the workers and jobs that
    /// still have a container afterwards, or `None` when Docker could not
    /// be listed.
    async fn reap_containers(
        &self,
        fleet: Option<&Fleet>,
        report: &mut PassReport,
    ) -> Option<Remaining> {
        let containers = match self.engine.list_sandboxes().await {
            Ok(containers) => containers,
            Err(error) => {
                tracing::warn!(%error, "the reaper cannot list containers; retrying next pass");
                return None;
            }
        };
        let now = now_ms();
        let mut remaining = Remaining::default();
        let mut keep = |container: &crate::sandbox::SandboxContainer| {
            remaining.workers.insert(container.worker.clone());
            if let Some(job) = &container.job {
                remaining.jobs.insert(job.clone());
            }
        };
        for container in containers {
            let verdict = judge(&container, fleet, now, self.config.grace);
            if verdict == ContainerVerdict::Keep {
                keep(&container);
                continue;
            }
            if verdict == ContainerVerdict::BeingRemoved {
                tracing::debug!(container.id = %container.id, "Docker is removing this container already");
                continue;
            }
            if let Err(error) = self.engine.remove_sandbox(&container.id).await {
                tracing::warn!(container.id = %container.id, %error, "the reaper could not remove a container; retrying next pass");
                keep(&container);
                continue;
            }
            self.metrics
                .reaper_orphans
                .with_label_values(&[verdict.kind()])
                .inc();
            tracing::info!(
                container.id = %container.id,
                job.id = container.job.as_deref().unwrap_or(""),
                worker.id = %container.worker,
                cause = verdict.kind(),
                deadline_ms = container.deadline_ms.unwrap_or(0),
                "the reaper removed an orphaned container"
            );
            report.containers.push((container, verdict));
        }
        Some(remaining)
    }

    /// Settles every job in a dead worker's processing list, then, if
    /// `forget` (none of its containers is left), forgets the worker once the
    /// list is empty.
    async fn reap_worker(
        &self,
        worker: &str,
        forget: bool,
        remaining: Option<&Remaining>,
        report: &mut PassReport,
    ) -> Result<(), StoreError> {
        // Job ids, and the turns of claims it stopped halfway through.
        for id in self.store.jobs().held_by(worker).await? {
            let job = self.store.jobs().lost_job(&id).await?;
            let results = LostResults::new(
                worker,
                &job.language,
                &self.version(&job.language),
                self.config.max_requeues,
            );
            let retry = match (job.status.as_deref(), remaining) {
                (Some("running"), Some(remaining)) => Retry::decide(
                    &job,
                    self.engine.host_id(),
                    remaining.jobs.contains(&id),
                    self.past_deadline(&job),
                ),
                // Docker could not be listed: nothing is known gone.
                (Some("running"), None) => Retry::NotYet,
                _ => Retry::Never,
            };
            let policy = ReapPolicy {
                max_requeues: self.config.max_requeues,
                retry,
                late_window: LATE_RESULT_WINDOW,
                own: false,
            };
            let outcome = self
                .store
                .jobs()
                .reap(worker, &id, policy, &results)
                .await?;
            if outcome == ReapOutcome::Alive {
                tracing::info!(worker.id = %worker, "the worker's heartbeat is back; leaving its jobs");
                return Ok(());
            }
            let Some(kind) = outcome_kind(&outcome) else {
                continue;
            };
            self.metrics.reaper_orphans.with_label_values(&[kind]).inc();
            tracing::info!(
                job.id = %id,
                worker.id = %worker,
                outcome = kind,
                detail = ?outcome,
                "the reaper reaped a job of a dead worker"
            );
            report.jobs.push((worker.to_string(), id, outcome));
        }
        if forget && self.store.workers().forget(worker).await? == ForgetOutcome::Forgotten {
            tracing::info!(worker.id = %worker, "the reaper forgot a dead worker");
            report.forgotten.push(worker.to_string());
        }
        Ok(())
    }

    /// Whether a lost job's last attempt is past its deadline and the
    /// grace: by then its sandbox's own limits have ended it wherever it
    /// ran. `None` when it never started.
    fn past_deadline(&self, job: &LostJob) -> Option<bool> {
        let started_ms = job.started_ms?;
        let deadline_ms = self.deadline_ms(started_ms, job.deadline_ms);
        Some(deadline_ms.saturating_add(self.config.grace.as_millis() as u64) < now_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(30);
    const NOW: u64 = 1_700_000_000_000;

    fn container(worker: &str, created_ms: u64, deadline_ms: Option<u64>) -> SandboxContainer {
        SandboxContainer {
            id: "c".into(),
            job: Some("j".into()),
            worker: worker.into(),
            created_ms,
            deadline_ms,
            uid: Some(100_000),
            warm: false,
            removing: false,
        }
    }

    #[test]
    fn a_container_docker_is_removing_is_left_to_docker() {
        let removing = SandboxContainer {
            removing: true,
            ..container("dead", NOW - 3_600_000, Some(NOW - 3_600_000))
        };
        // Past its deadline and of a dead worker: removed, were Docker not
        // removing it already.
        assert_eq!(
            judge(&removing, Some(&fleet()), NOW, GRACE),
            ContainerVerdict::BeingRemoved
        );
        let listed = SandboxContainer {
            removing: false,
            ..removing
        };
        assert_eq!(
            judge(&listed, Some(&fleet()), NOW, GRACE),
            ContainerVerdict::PastDeadline
        );
    }

    fn fleet() -> Fleet {
        Fleet {
            alive: ["alive".to_string()].into(),
            dead: ["dead".to_string()].into(),
        }
    }

    #[test]
    fn connectivity_counts_from_the_last_failure_or_redis_start() {
        let span = Duration::from_millis(50);
        let mut connectivity = Connectivity::default();
        assert!(!connectivity.healthy_for(Duration::ZERO), "never asked");
        // Up for an hour, first seen now: counted from now.
        connectivity.answered(Duration::from_secs(3600));
        assert!(!connectivity.healthy_for(span));
        std::thread::sleep(span);
        connectivity.answered(Duration::from_secs(3600));
        assert!(connectivity.healthy_for(span));
        // A failure starts the count again.
        connectivity.failed();
        connectivity.answered(Duration::from_secs(3600));
        assert!(!connectivity.healthy_for(span));
        std::thread::sleep(span);
        assert!(connectivity.healthy_for(span));
        // Redis restarted between two asks (up for less than the span): as
        // good as a failure.
        connectivity.answered(Duration::ZERO);
        assert!(!connectivity.healthy_for(span));
    }

    #[test]
    fn a_dead_workers_container_goes_after_the_grace() {
        let fleet = fleet();
        let old = container("dead", NOW - 31_000, Some(NOW + 60_000));
        assert_eq!(
            judge(&old, Some(&fleet), NOW, GRACE),
            ContainerVerdict::DeadWorker
        );
        let fresh = container("dead", NOW - 29_000, Some(NOW + 60_000));
        assert_eq!(
            judge(&fresh, Some(&fleet), NOW, GRACE),
            ContainerVerdict::Keep
        );
        // Redis did not answer: nobody is known dead.
        assert_eq!(judge(&old, None, NOW, GRACE), ContainerVerdict::Keep);
    }

    #[test]
    fn live_and_unknown_workers_keep_theirs_until_the_deadline() {
        let fleet = fleet();
        for worker in ["alive", "cli-123", "other-fleet"] {
            let within = container(worker, NOW - 3_600_000, Some(NOW - 29_000));
            assert_eq!(
                judge(&within, Some(&fleet), NOW, GRACE),
                ContainerVerdict::Keep
            );
            let past = container(worker, NOW - 3_600_000, Some(NOW - 31_000));
            assert_eq!(
                judge(&past, Some(&fleet), NOW, GRACE),
                ContainerVerdict::PastDeadline
            );
            assert_eq!(
                judge(&past, None, NOW, GRACE),
                ContainerVerdict::PastDeadline
            );
            let no_deadline = container(worker, NOW - 3_600_000, None);
            assert_eq!(
                judge(&no_deadline, Some(&fleet), NOW, GRACE),
                ContainerVerdict::Keep
            );
        }
    }
}
