//! The reaper's operations: who in the fleet is dead, and settling the
//! jobs a dead worker left in its processing list (one Lua script per job,
//! so concurrent reapers settle each job once).

use std::collections::BTreeSet;

use deadpool_redis::redis::{self, AsyncCommands};

use super::{Queue, QueueError, now_ms};
use crate::job::JobResult;

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
}

/// What the reaper did with one job of a dead worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReapOutcome {
    /// Never started: back at the claim end of the queue (`requeues` so far).
    Requeued { requeues: u32 },
    /// Never started and out of requeues: `error` (`worker_lost`), and
    /// pushed onto `jobs:dead`.
    Dead { requeues: u32 },
    /// It was running: `error` (`worker_lost`); it is not run again.
    WorkerLost,
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
        !matches!(self, ReapOutcome::Absent | ReapOutcome::Alive)
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

impl Queue {
    /// The jobs in `worker`'s processing list that are running on it.
    pub async fn running_on(&self, worker: &str) -> Result<Vec<RunningJob>, QueueError> {
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
    pub async fn job_spec(&self, id: &str) -> Result<Option<String>, QueueError> {
        let mut conn = self.conn().await?;
        Ok(conn.hget(self.keys.job(id), "spec").await?)
    }

    /// Settles a job that outlived its deadline on a live worker with
    /// `result`, if it is still the same run; whether it was settled.
    pub async fn settle_stuck(
        &self,
        worker: &str,
        job: &RunningJob,
        result: &JobResult,
    ) -> Result<bool, QueueError> {
        let json = serde_json::to_string(result).map_err(|e| QueueError::Corrupt {
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
            .invoke_async(&mut conn)
            .await?;
        Ok(settled == 1)
    }
    /// Every worker in the `workers` set, split by whether its heartbeat
    /// lives.
    pub async fn fleet(&self) -> Result<Fleet, QueueError> {
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
    pub async fn processing(&self, worker: &str) -> Result<Vec<String>, QueueError> {
        let mut conn = self.conn().await?;
        Ok(conn.lrange(self.keys.processing(worker), 0, -1).await?)
    }

    /// A job's language id; `None` when the job does not exist.
    pub async fn job_language(&self, id: &str) -> Result<Option<String>, QueueError> {
        let mut conn = self.conn().await?;
        Ok(conn.hget(self.keys.job(id), "language").await?)
    }

    /// Settles one job in the processing list of a worker whose heartbeat
    /// expired, in one atomic step (see [`ReapOutcome`]): concurrent reapers
    /// settle it once; a job that had started is never queued again.
    pub async fn reap_job(
        &self,
        worker: &str,
        id: &str,
        max_requeues: u32,
        results: &LostResults,
    ) -> Result<ReapOutcome, QueueError> {
        let json = |result: &JobResult| {
            serde_json::to_string(result).map_err(|e| QueueError::Corrupt {
                id: id.to_string(),
                message: e.to_string(),
            })
        };
        let (running, dead) = (json(&results.running)?, json(&results.dead)?);
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
            .arg(max_requeues)
            .arg(running)
            .arg(dead)
            .invoke_async(&mut conn)
            .await?;
        let requeues = || detail.parse().unwrap_or(0);
        Ok(match outcome.as_str() {
            "requeued" => ReapOutcome::Requeued {
                requeues: requeues(),
            },
            "dead" => ReapOutcome::Dead {
                requeues: requeues(),
            },
            "worker_lost" => ReapOutcome::WorkerLost,
            "terminal" => ReapOutcome::Terminal(detail),
            "missing" => ReapOutcome::Missing,
            "alive" => ReapOutcome::Alive,
            _ => ReapOutcome::Absent,
        })
    }

    /// Removes a dead worker whose processing list is empty from the
    /// `workers` set (atomically with that check).
    pub async fn forget_worker(&self, worker: &str) -> Result<ForgetOutcome, QueueError> {
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
            _ => ForgetOutcome::Absent,
        })
    }
}
