//! Reap: the reaper reaps one job in the processing list of a worker
//! whose heartbeat expired (`reap.lua`), so any number of reapers reap
//! it once: `queued` → `error` (requeues exhausted; a requeue keeps it
//! `queued`); `running` → `queued` (a retry), `cancelled` or `error` (the
//! `worker_lost` verdict).

use std::time::Duration;

use deadpool_redis::redis;

use super::Jobs;
use super::script::{Reply, StepScript, script_inputs};
use crate::job::lifecycle::Step;
use crate::job::result::ErrorReason;
use crate::job::{JobResult, Status};
use crate::store::{StoreError, now_ms};

script_inputs! {
    struct ReapInputs {
        keys { processing, heartbeat, job, queue, dead, events, stdin, tenants, tenant_turns }
        args {
            id: String,
            now_ms: u64,
            ttl: u64,
            max_requeues: u32,
            running_result: String,
            dead_result: String,
            retry: &'static str,
            late_window_ms: u64,
            cancelled_result: String,
            own: &'static str,
            worker: String,
        }
    }
}

pub(super) fn script() -> StepScript<ReapInputs> {
    StepScript::new(Step::Reap, include_str!("reap.lua"))
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
    pub late_window: Duration,
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
    /// When its last attempt had to have ended, as start stored it.
    pub deadline_ms: Option<u64>,
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
    /// Not in the processing list any more (another reaper reaped it).
    Absent,
    /// The worker's heartbeat is back: nothing was done.
    Alive,
    /// A turn the worker had moved but not yet taken a job for (it died
    /// between the two halves of a claim): back in `jobs:queue`.
    TurnReturned,
}

impl ReapOutcome {
    /// Whether this call changed anything (the job was reaped now).
    pub fn changed(&self) -> bool {
        !matches!(
            self,
            ReapOutcome::Absent | ReapOutcome::Alive | ReapOutcome::Waiting
        )
    }

    fn from_reply(reply: &Reply) -> Result<Self, StoreError> {
        Ok(match reply.outcome() {
            "requeued" => ReapOutcome::Requeued {
                requeues: reply.number(0)?,
            },
            "dead" => ReapOutcome::Dead {
                requeues: reply.number(0)?,
            },
            "worker_lost" => ReapOutcome::WorkerLost,
            "retried" => ReapOutcome::Retried {
                attempt: reply.number(0)?,
            },
            "waiting" => ReapOutcome::Waiting,
            "cancelled" => ReapOutcome::Cancelled,
            "moved" => ReapOutcome::Moved,
            "terminal" => ReapOutcome::Terminal(reply.detail(0).to_string()),
            "missing" => ReapOutcome::Missing,
            "absent" => ReapOutcome::Absent,
            "alive" => ReapOutcome::Alive,
            "turn" => ReapOutcome::TurnReturned,
            _ => return Err(reply.unexpected()),
        })
    }
}

impl Jobs {
    /// What the reaper needs to know of a job in a lost worker's list.
    pub async fn lost_job(&self, id: &str) -> Result<LostJob, StoreError> {
        let mut conn = self.redis.conn().await?;
        type Fields = (
            Option<String>,
            Option<String>,
            Option<String>,
            Option<u64>,
            Option<u64>,
            Option<String>,
            Option<u32>,
            Option<u32>,
        );
        let (status, worker, host, started_ms, deadline_ms, language, attempts, max_attempts): Fields =
            redis::cmd("HMGET")
                .arg(self.redis.keys.job(id))
                .arg(&[
                    "status",
                    "worker",
                    "host",
                    "started_ms",
                    "deadline_ms",
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
            deadline_ms,
            language: language.unwrap_or_default(),
            attempts: attempts.unwrap_or(0),
            max_attempts: max_attempts.unwrap_or(1),
        })
    }

    /// Reaps one job in the processing list of a worker whose heartbeat
    /// expired, in one atomic step (see [`ReapOutcome`]): concurrent reapers
    /// reap it once; a job that had started is never queued again.
    pub async fn reap(
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
        let keys = &self.redis.keys;
        let inputs = ReapInputs {
            processing: keys.processing(worker),
            heartbeat: keys.heartbeat(worker),
            job: keys.job(id),
            queue: keys.queue(),
            tenants: keys.tenants(),
            tenant_turns: keys.tenant_turns(),
            dead: keys.dead(),
            events: keys.events(id),
            stdin: keys.stdin(id),
            id: id.to_string(),
            now_ms: now_ms(),
            ttl: self.redis.result_ttl_secs(),
            max_requeues: policy.max_requeues,
            running_result: json(&results.running)?,
            dead_result: json(&results.dead)?,
            retry: match policy.retry {
                Retry::Allowed => "1",
                Retry::NotYet => "0",
                Retry::Never => "never",
            },
            late_window_ms: policy.late_window.as_millis() as u64,
            cancelled_result: json(&results.cancelled)?,
            own: if policy.own { "1" } else { "0" },
            worker: worker.to_string(),
        };
        let mut conn = self.redis.conn().await?;
        let reply = self.scripts.reap.run(&mut conn, &inputs, &[]).await?;
        ReapOutcome::from_reply(&reply)
    }
}
