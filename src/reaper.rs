//! The orphan reaper (DESIGN §6, issue 5): cleans up after workers that died
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
//! 3. Jobs: settles each id in a dead worker's processing list with one
//!    atomic script, so reapers running in every worker never settle a job
//!    twice: claimed but never started → back to the queue (up to
//!    `max_requeues` times, then `error`/`worker_lost` and `jobs:dead`);
//!    started → `error`/`worker_lost` (never run twice). A dead worker whose
//!    list is empty is forgotten.
//! 4. Stuck jobs: a job `running` on a live worker past its start time plus
//!    its deadline budget (the engine's start timeout + the stages' wall
//!    limits + the engine's deadline grace) plus `grace` is settled as
//!    `error`/`deadline_exceeded`: its worker is alive but silent about it.
//!    Its container, past its deadline label, goes by rule 2.
//!
//! Redis or Docker being down is expected: the pass logs a warning, does
//! what it can without it, and the loop goes on.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::job::limits::LimitPolicy;
use crate::job::result::ErrorReason;
use crate::job::{JobResult, JobSpec, Status, Timings, prepare};
use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::queue::{
    Fleet, ForgetOutcome, LostResults, Queue, QueueError, ReapOutcome, RunningJob, now_ms,
};
use crate::sandbox::{SandboxContainer, SandboxEngine};
use crate::worker::Services;

#[derive(Debug, Clone)]
pub struct ReaperConfig {
    /// Time between two passes.
    pub interval: Duration,
    /// A dead worker's container younger than this is left alone; any
    /// container older than its deadline plus this is removed.
    pub grace: Duration,
    /// Times a claimed-but-never-started job is put back in the queue.
    pub max_requeues: u32,
}

/// Why a container is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerVerdict {
    Keep,
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
    /// Jobs settled now: (worker, job id, outcome); ids another reaper
    /// settled first are not here.
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
        ReapOutcome::Terminal(_) | ReapOutcome::Missing => Some("dropped"),
        ReapOutcome::Absent | ReapOutcome::Alive => None,
    }
}

/// Removes orphaned containers and settles the jobs of dead workers; see
/// the module documentation.
#[derive(Debug, Clone)]
pub struct Reaper {
    config: ReaperConfig,
    queue: Queue,
    engine: SandboxEngine,
    catalog: LanguageCatalog,
    policy: LimitPolicy,
    metrics: Metrics,
    /// Deadline budgets of running jobs, by id: (started_ms, budget_ms), so
    /// a job's spec is read and prepared once per run, not every pass.
    budgets: Arc<Mutex<HashMap<String, (u64, u64)>>>,
}

impl Reaper {
    pub fn new(config: ReaperConfig, services: Services) -> Self {
        let Services {
            queue,
            engine,
            catalog,
            policy,
            metrics,
            carried: _,
        } = services;
        Self {
            config,
            queue,
            engine,
            catalog,
            policy,
            metrics,
            budgets: Arc::default(),
        }
    }

    /// Runs a pass every `interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(
            interval_ms = self.config.interval.as_millis() as u64,
            grace_ms = self.config.grace.as_millis() as u64,
            max_requeues = self.config.max_requeues,
            "reaper started"
        );
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
        tracing::info!("reaper stopped");
    }

    /// One pass: containers first (so a job settled as `worker_lost` has no
    /// sandbox left running), then the jobs of dead workers, then stuck jobs
    /// of live ones. Never fails:
    /// what cannot be done now is logged and tried again next pass.
    pub async fn pass(&self) -> PassReport {
        let mut report = PassReport::default();
        let fleet = match self.queue.fleet().await {
            Ok(fleet) => Some(fleet),
            Err(error) => {
                tracing::warn!(%error, "the reaper cannot read the fleet from redis; only expired containers are removed this pass");
                None
            }
        };
        // Dead workers that still have a container (one inside the grace
        // period, or one Docker would not remove): they stay in the fleet so
        // a later pass still knows those containers' worker is dead.
        let with_containers = self.reap_containers(fleet.as_ref(), &mut report).await;
        if let Some(fleet) = &fleet {
            for worker in &fleet.dead {
                let forget = with_containers
                    .as_ref()
                    .is_some_and(|workers| !workers.contains(worker.as_str()));
                if let Err(error) = self.reap_worker(worker, forget, &mut report).await {
                    tracing::warn!(worker.id = %worker, %error, "the reaper could not settle the jobs of a dead worker; retrying next pass");
                }
            }
            let mut seen = HashSet::new();
            for worker in &fleet.alive {
                if let Err(error) = self.settle_stuck(worker, &mut seen, &mut report).await {
                    tracing::warn!(worker.id = %worker, %error, "the reaper could not check the jobs of a live worker; retrying next pass");
                }
            }
            self.lock_budgets().retain(|id, _| seen.contains(id));
        }
        report
    }

    fn lock_budgets(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, u64)>> {
        self.budgets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Settles the jobs of a live worker that outlived their deadline plus
    /// the grace; `seen` collects the ids of every job running on it.
    async fn settle_stuck(
        &self,
        worker: &str,
        seen: &mut HashSet<String>,
        report: &mut PassReport,
    ) -> Result<(), QueueError> {
        let sandbox = self.engine.config();
        // The least budget any job has: no wall time at all.
        let floor_ms =
            (sandbox.start_timeout + sandbox.deadline_grace + self.config.grace).as_millis() as u64;
        for job in self.queue.running_on(worker).await? {
            seen.insert(job.id.clone());
            let now = now_ms();
            if job.started_ms.saturating_add(floor_ms) >= now {
                continue;
            }
            let wall_ms = self.wall_budget(&job).await?;
            let budget_ms = floor_ms.saturating_add(wall_ms);
            if job.started_ms.saturating_add(budget_ms) >= now {
                continue;
            }
            let result = self.stuck_result(worker, &job, budget_ms);
            if !self.queue.settle_stuck(worker, &job, &result).await? {
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
                "the reaper settled a job that outlived its deadline on a live worker"
            );
            report.stuck.push((worker.to_string(), job.id));
        }
        Ok(())
    }

    /// The sum of a running job's stage wall limits, from its spec as this
    /// process would prepare it; the policy's maximums when it cannot be
    /// prepared here (another catalog or policy).
    async fn wall_budget(&self, job: &RunningJob) -> Result<u64, QueueError> {
        if let Some(&(started_ms, wall_ms)) = self.lock_budgets().get(&job.id)
            && started_ms == job.started_ms
        {
            return Ok(wall_ms);
        }
        let spec = self.queue.job_spec(&job.id).await?;
        let prepared = spec
            .and_then(|spec| serde_json::from_str::<JobSpec>(&spec).ok())
            .and_then(|spec| prepare(&spec, &self.catalog, &self.policy).ok());
        let wall_ms = match prepared {
            Some(prepared) => prepared.stages_wall_ms(),
            None => self
                .policy
                .maximum
                .wall_ms
                .saturating_add(self.policy.compile_maximum.wall_ms),
        };
        self.lock_budgets()
            .insert(job.id.clone(), (job.started_ms, wall_ms));
        Ok(wall_ms)
    }

    fn stuck_result(&self, worker: &str, job: &RunningJob, budget_ms: u64) -> JobResult {
        JobResult {
            status: Status::Error,
            language: job.language.clone(),
            version: self.version(&job.language),
            compile: None,
            run: None,
            error: Some(format!(
                "the job outlived its deadline ({budget_ms} ms after it started, with the reaper's grace) on worker {worker}, which never reported it"
            )),
            reason: Some(ErrorReason::DeadlineExceeded),
            start: None,
            timings: Timings::default(),
        }
    }

    fn version(&self, language: &str) -> String {
        self.catalog
            .find(language)
            .map(|l| l.version.clone())
            .unwrap_or_default()
    }

    /// Removes what `judge` condemns. Returns the workers that still have a
    /// container afterwards, or `None` when Docker could not be listed.
    async fn reap_containers(
        &self,
        fleet: Option<&Fleet>,
        report: &mut PassReport,
    ) -> Option<HashSet<String>> {
        let containers = match self.engine.list_sandboxes().await {
            Ok(containers) => containers,
            Err(error) => {
                tracing::warn!(%error, "the reaper cannot list containers; retrying next pass");
                return None;
            }
        };
        let now = now_ms();
        let mut remaining = HashSet::new();
        for container in containers {
            let verdict = judge(&container, fleet, now, self.config.grace);
            if verdict == ContainerVerdict::Keep {
                remaining.insert(container.worker.clone());
                continue;
            }
            if let Err(error) = self.engine.remove_sandbox(&container.id).await {
                tracing::warn!(container.id = %container.id, %error, "the reaper could not remove a container; retrying next pass");
                remaining.insert(container.worker.clone());
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
        report: &mut PassReport,
    ) -> Result<(), QueueError> {
        for id in self.queue.processing(worker).await? {
            let language = self.queue.job_language(&id).await?.unwrap_or_default();
            let results = self.lost_results(worker, &language);
            let outcome = self
                .queue
                .reap_job(worker, &id, self.config.max_requeues, &results)
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
                "the reaper settled a job of a dead worker"
            );
            report.jobs.push((worker.to_string(), id, outcome));
        }
        if forget && self.queue.forget_worker(worker).await? == ForgetOutcome::Forgotten {
            tracing::info!(worker.id = %worker, "the reaper forgot a dead worker");
            report.forgotten.push(worker.to_string());
        }
        Ok(())
    }

    fn lost_results(&self, worker: &str, language: &str) -> LostResults {
        let version = self.version(language);
        let lost = |error: String| JobResult {
            status: Status::Error,
            language: language.to_string(),
            version: version.clone(),
            compile: None,
            run: None,
            error: Some(error),
            reason: Some(ErrorReason::WorkerLost),
            start: None,
            timings: Timings::default(),
        };
        LostResults {
            running: lost(format!(
                "worker {worker} was lost (its heartbeat expired) while the job was running"
            )),
            dead: lost(format!(
                "the job was claimed {} times by workers that were lost before starting it (the last: {worker})",
                self.config.max_requeues + 1
            )),
        }
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
        }
    }

    fn fleet() -> Fleet {
        Fleet {
            alive: ["alive".to_string()].into(),
            dead: ["dead".to_string()].into(),
        }
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
