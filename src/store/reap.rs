//! The reaper's operations: who in the fleet is dead, and settling the
//! jobs a dead worker left in its processing list (one Lua script per job,
//! so concurrent reapers settle each job once).

use std::collections::BTreeSet;

use deadpool_redis::redis::{self, AsyncCommands};

use super::{Store, StoreError, now_ms, unexpected};
use crate::job::result::ErrorReason;
use crate::job::{JobResult, Status};

/// The workers of the fleet (the `workers` set), by whether their
/// heartbeat lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fleet {
    pub alive: BTreeSet<String>,
    /// In the set, but the heartbeat expired (or was never written).
    pub dead: BTreeSet<String>,
}

/// The results a job of a lost worker is settled with, built by the caller
/// (the reaper); the script picks one by the job's state.
#[derive(Debug, Clone)]
pub struct LostResults {
    /// For a job that was running.
    pub running: JobResult,
    /// For a job that was claimed but never started, and has no requeues left.
    pub dead: JobResult,
    /// For a running job a client had asked to cancel.
    pub cancelled: JobResult,
}

/// How the reaper settles one job of a lost worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReapPolicy {
    /// Times a claimed-but-never-started job is put back in the queue.
    pub max_requeues: u32,
    /// Whether a running job with attempts left may run again.
    pub retry: Retry,
    /// How long the lost attempt's real result may still replace the
    /// verdict (or the retry).
    pub late_window: std::time::Duration,
    /// The worker itself, restarted under the same id, recovers its own
    /// list (its heartbeat lives).
    pub own: bool,
}

/// Whether a lost attempt may be followed by another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Now: its sandbox is known to be gone.
    Allowed,
    /// Not yet: its sandbox may still run; the job stays in the lost
    /// worker's list until a later pass.
    NotYet,
    /// Never: the job is settled as lost even with attempts left.
    Never,
}

impl Retry {
    /// Whether `job`'s lost attempt may be followed by another now: only
    /// once nothing of it can still run. On the Docker host it ran on
    /// (`host`), that is once no container of the job is left; elsewhere,
    /// once its deadline has passed (its sandbox's own limits have ended
    /// it by then). `None` deadline: unknown, so never.
    pub fn decide(
        job: &LostJob,
        host: &str,
        containers_left: bool,
        deadline_passed: Option<bool>,
    ) -> Retry {
        if containers_left {
            return Retry::NotYet;
        }
        if job.host.as_deref() == Some(host) {
            return Retry::Allowed;
        }
        match deadline_passed {
            Some(true) => Retry::Allowed,
            Some(false) => Retry::NotYet,
            None => Retry::Never,
        }
    }
}

impl LostResults {
    /// The results a job of the lost `worker` is settled with.
    pub fn new(worker: &str, language: &str, version: &str, max_requeues: u32) -> Self {
        let lost = |error: String| {
            JobResult::without_stages(Status::Error, language, version)
                .with_error(error)
                .with_reason(ErrorReason::WorkerLost)
        };
        LostResults {
            running: lost(format!(
                "worker {worker} was lost (its heartbeat expired) while the job was running"
            )),
            dead: lost(format!(
                "the job was claimed {} times by workers that were lost before starting it (the last: {worker})",
                max_requeues + 1
            )),
            cancelled: JobResult::without_stages(Status::Cancelled, language, version),
        }
    }
}

/// What the reaper needs to know of a job of a lost worker before it
/// settles it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LostJob {
    pub status: Option<String>,
    pub worker: Option<String>,
    /// The Docker host its last attempt ran on.
    pub host: Option<String>,
    pub started_ms: Option<u64>,
    pub language: String,
    pub attempts: u32,
    pub max_attempts: u32,
}

/// What the reaper did with one job of a dead worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReapOutcome {
    /// Never started: back at the claim end of the queue (`requeues` so far).
    Requeued { requeues: u32 },
    /// Never started and out of requeues: `error` (`worker_lost`), and
    /// pushed onto `jobs:dead`.
    Dead { requeues: u32 },
    /// It was running and had no attempt left: `error` (`worker_lost`).
    WorkerLost,
    /// It was running and runs again: back in the queue after `attempt`
    /// attempts, with an `attempt` event.
    Retried { attempt: u32 },
    /// It was running and may run again, but its lost attempt's sandbox is
    /// not known gone yet: left in the list for a later pass.
    Waiting,
    /// It was running and a client had asked to cancel it: `cancelled`.
    Cancelled,
    /// It runs on another worker now; only dropped from the list.
    Moved,
    /// It had already ended with this status; only dropped from the list.
    Terminal(String),
    /// Its hash is gone (expired); only dropped from the list.
    Missing,
    /// Not in the processing list any more (another reaper settled it).
    Absent,
    /// The worker's heartbeat is back: nothing was done.
    Alive,
}

impl ReapOutcome {
    /// Whether this call changed anything (the job was settled now).
    pub fn settled(&self) -> bool {
        !matches!(
            self,
            ReapOutcome::Absent | ReapOutcome::Alive | ReapOutcome::Waiting
        )
    }

    fn from_reply(outcome: &str, detail: &str) -> Result<Self, StoreError> {
        let number = || {
            detail
                .parse::<u32>()
                .map_err(|_| unexpected("reap_job", (outcome, detail)))
        };
        Ok(match outcome {
            "requeued" => ReapOutcome::Requeued {
                requeues: number()?,
            },
            "dead" => ReapOutcome::Dead {
                requeues: number()?,
            },
            "worker_lost" => ReapOutcome::WorkerLost,
            "retried" => ReapOutcome::Retried { attempt: number()? },
            "waiting" => ReapOutcome::Waiting,
            "cancelled" => ReapOutcome::Cancelled,
            "moved" => ReapOutcome::Moved,
            "terminal" => ReapOutcome::Terminal(detail.to_string()),
            "missing" => ReapOutcome::Missing,
            "absent" => ReapOutcome::Absent,
            "alive" => ReapOutcome::Alive,
            _ => return Err(unexpected("reap_job", (outcome, detail))),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForgetOutcome {
    /// Out of the `workers` set, its keys deleted.
    Forgotten,
    /// Its heartbeat is back.
    Alive,
    /// Its processing list still holds ids.
    Busy,
    /// It is not in the set (another reaper forgot it first).
    Absent,
}

/// A job running on a live worker, as the stuck-state guard sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    pub id: String,
    pub language: String,
    pub started_ms: u64,
}

impl Store {
    /// The jobs in `worker`'s processing list that are running on it.
    pub async fn running_on(&self, worker: &str) -> Result<Vec<RunningJob>, StoreError> {
        let ids = self.processing(worker).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET").arg(self.keys.job(id)).arg(&[
                "status",
                "worker",
                "started_ms",
                "language",
            ]);
        }
        type Fields = (Option<String>, Option<String>, Option<u64>, Option<String>);
        let rows: Vec<Fields> = pipe.query_async(&mut conn).await?;
        Ok(ids
            .into_iter()
            .zip(rows)
            .filter_map(|(id, (status, owner, started_ms, language))| {
                let running = status.as_deref() == Some("running");
                (running && owner.as_deref() == Some(worker)).then_some(RunningJob {
                    id,
                    language: language.unwrap_or_default(),
                    started_ms: started_ms?,
                })
            })
            .collect())
    }

    /// A job's spec as submitted (JSON); `None` when the job is gone.
    pub async fn job_spec(&self, id: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn().await?;
        Ok(conn.hget(self.keys.job(id), "spec").await?)
    }

    /// Settles a job that outlived its deadline on a live worker with
    /// `result`, if it is still the same run; whether it was settled. The
    /// worker's real result may still replace it within `late_window`.
    pub async fn settle_stuck(
        &self,
        worker: &str,
        job: &RunningJob,
        result: &JobResult,
        late_window: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let json = serde_json::to_string(result).map_err(|e| StoreError::Corrupt {
            id: job.id.clone(),
            message: e.to_string(),
        })?;
        let mut conn = self.conn().await?;
        let settled: i64 = self
            .settle_stuck
            .key(self.keys.job(&job.id))
            .key(self.keys.processing(worker))
            .key(self.keys.events(&job.id))
            .key(self.keys.stdin(&job.id))
            .arg(&job.id)
            .arg(worker)
            .arg(job.started_ms)
            .arg(now_ms())
            .arg(self.result_ttl.as_secs().max(1))
            .arg(json)
            .arg(late_window.as_millis() as u64)
            .invoke_async(&mut conn)
            .await?;
        Ok(settled == 1)
    }
    /// Every worker in the `workers` set, split by whether its heartbeat
    /// lives.
    pub async fn fleet(&self) -> Result<Fleet, StoreError> {
        let mut conn = self.conn().await?;
        let ids: Vec<String> = conn.smembers(self.keys.workers()).await?;
        if ids.is_empty() {
            return Ok(Fleet::default());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.exists(self.keys.heartbeat(id));
        }
        let alive: Vec<bool> = pipe.query_async(&mut conn).await?;
        let mut fleet = Fleet::default();
        for (id, alive) in ids.into_iter().zip(alive) {
            if alive {
                fleet.alive.insert(id);
            } else {
                fleet.dead.insert(id);
            }
        }
        Ok(fleet)
    }

    /// The ids in a worker's processing list.
    pub async fn processing(&self, worker: &str) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn().await?;
        Ok(conn.lrange(self.keys.processing(worker), 0, -1).await?)
    }

    /// What the reaper needs to know of a job in a lost worker's list.
    pub async fn lost_job(&self, id: &str) -> Result<LostJob, StoreError> {
        let mut conn = self.conn().await?;
        type Fields = (
            Option<String>,
            Option<String>,
            Option<String>,
            Option<u64>,
            Option<String>,
            Option<u32>,
            Option<u32>,
        );
        let (status, worker, host, started_ms, language, attempts, max_attempts): Fields =
            redis::cmd("HMGET")
                .arg(self.keys.job(id))
                .arg(&[
                    "status",
                    "worker",
                    "host",
                    "started_ms",
                    "language",
                    "attempts",
                    "max_attempts",
                ])
                .query_async(&mut conn)
                .await?;
        Ok(LostJob {
            status,
            worker,
            host,
            started_ms,
            language: language.unwrap_or_default(),
            attempts: attempts.unwrap_or(0),
            max_attempts: max_attempts.unwrap_or(1),
        })
    }

    /// Settles one job in the processing list of a worker whose heartbeat
    /// expired, in one atomic step (see [`ReapOutcome`]): concurrent reapers
    /// settle it once; a job that had started is never queued again.
    pub async fn reap_job(
        &self,
        worker: &str,
        id: &str,
        policy: ReapPolicy,
        results: &LostResults,
    ) -> Result<ReapOutcome, StoreError> {
        let json = |result: &JobResult| {
            serde_json::to_string(result).map_err(|e| StoreError::Corrupt {
                id: id.to_string(),
                message: e.to_string(),
            })
        };
        let (running, dead) = (json(&results.running)?, json(&results.dead)?);
        let cancelled = json(&results.cancelled)?;
        let mut conn = self.conn().await?;
        let (outcome, detail): (String, String) = self
            .reap_job
            .key(self.keys.processing(worker))
            .key(self.keys.heartbeat(worker))
            .key(self.keys.job(id))
            .key(self.keys.queue())
            .key(self.keys.dead())
            .key(self.keys.events(id))
            .key(self.keys.stdin(id))
            .arg(id)
            .arg(now_ms())
            .arg(self.result_ttl.as_secs().max(1))
            .arg(policy.max_requeues)
            .arg(running)
            .arg(dead)
            .arg(match policy.retry {
                Retry::Allowed => "1",
                Retry::NotYet => "0",
                Retry::Never => "never",
            })
            .arg(policy.late_window.as_millis() as u64)
            .arg(cancelled)
            .arg(if policy.own { "1" } else { "0" })
            .arg(worker)
            .invoke_async(&mut conn)
            .await?;
        ReapOutcome::from_reply(&outcome, &detail)
    }

    /// Removes a dead worker whose processing list is empty from the
    /// `workers` set (atomically with that check).
    pub async fn forget_worker(&self, worker: &str) -> Result<ForgetOutcome, StoreError> {
        let mut conn = self.conn().await?;
        let outcome: String = self
            .forget_worker
            .key(self.keys.workers())
            .key(self.keys.heartbeat(worker))
            .key(self.keys.processing(worker))
            .arg(worker)
            .invoke_async(&mut conn)
            .await?;
        Ok(match outcome.as_str() {
            "forgotten" => ForgetOutcome::Forgotten,
            "alive" => ForgetOutcome::Alive,
            "busy" => ForgetOutcome::Busy,
            "absent" => ForgetOutcome::Absent,
            other => return Err(unexpected("forget_worker", other)),
        })
    }
}
