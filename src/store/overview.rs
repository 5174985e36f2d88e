//! Read-only views of the fleet for the operator dashboard: the live
//! workers with their heartbeat values, and the newest jobs. Nothing here
//! changes state; every read is bounded (the `workers` set is pruned by the
//! reaper, the recent list is capped at submit).

use deadpool_redis::redis::{self, AsyncCommands};

use super::redis::Redis;
use super::{StoreError, parse_status};
use crate::job::Status;

/// How many of the newest job ids `jobs:recent` keeps (the submit script
/// trims it to this length in the same step that adds one).
pub const RECENT_JOBS_KEPT: u64 = 200;

/// A worker whose heartbeat lives, with the heartbeat's value as the worker
/// wrote it (JSON: slots, version, and whatever newer workers add).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveWorker {
    pub id: String,
    pub heartbeat: String,
}

/// What the dashboard shows of one job: the small fields of its hash, never
/// its spec or result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSummary {
    pub id: String,
    pub status: Status,
    pub language: String,
    pub api_key: String,
    pub worker: Option<String>,
    pub created_ms: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
}

/// The dashboard's reads.
#[derive(Debug, Clone)]
pub struct Overview {
    redis: Redis,
}

impl Overview {
    pub(super) fn new(redis: Redis) -> Self {
        Self { redis }
    }

    /// Every worker of the `workers` set whose heartbeat lives, by id, with
    /// its heartbeat value.
    pub async fn live_workers(&self) -> Result<Vec<LiveWorker>, StoreError> {
        let mut conn = self.redis.conn().await?;
        let mut ids: Vec<String> = conn.smembers(self.redis.keys.workers()).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        ids.sort();
        let keys: Vec<String> = ids.iter().map(|id| self.redis.keys.heartbeat(id)).collect();
        let values: Vec<Option<String>> =
            redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
        Ok(ids
            .into_iter()
            .zip(values)
            .filter_map(|(id, heartbeat)| {
                Some(LiveWorker {
                    id,
                    heartbeat: heartbeat?,
                })
            })
            .collect())
    }

    /// The newest `count` submitted jobs that still exist, newest first
    /// (ids whose job expired are skipped).
    pub async fn recent_jobs(&self, count: u64) -> Result<Vec<JobSummary>, StoreError> {
        let count = count.clamp(1, RECENT_JOBS_KEPT);
        let mut conn = self.redis.conn().await?;
        let ids: Vec<String> = conn
            .lrange(self.redis.keys.recent(), 0, (count - 1) as isize)
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET").arg(self.redis.keys.job(id)).arg(&[
                "status",
                "language",
                "api_key",
                "worker",
                "created_ms",
                "started_ms",
                "finished_ms",
            ]);
        }
        type Fields = (
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
        );
        let rows: Vec<Fields> = pipe.query_async(&mut conn).await?;
        let mut jobs = Vec::with_capacity(ids.len());
        for (id, row) in ids.into_iter().zip(rows) {
            let (status, language, api_key, worker, created_ms, started_ms, finished_ms) = row;
            let Some(status) = status else { continue };
            jobs.push(JobSummary {
                status: parse_status(&id, &status)?,
                id,
                language: language.unwrap_or_default(),
                api_key: api_key.unwrap_or_default(),
                worker,
                created_ms: created_ms.unwrap_or(0),
                started_ms,
                finished_ms,
            });
        }
        Ok(jobs)
    }
}
