//! Read-only views of the fleet for the operator dashboard: the live
//! workers with their heartbeats, and the newest jobs. Nothing here
//! changes state; every read is bounded (the `workers` set is pruned by the
//! reaper, the recent list is capped at submit).

use deadpool_redis::redis::{self, AsyncCommands};

use super::redis::Redis;
use super::workers::Heartbeat;
use super::{StoreError, parse_status};
use crate::job::Status;

/// How many of the newest job ids `jobs:recent` keeps (the submit script
/// trims it to this length in the same step that adds one).
pub const RECENT_JOBS_KEPT: u64 = 200;

/// A worker whose heartbeat lives, with what its heartbeat says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveWorker {
    pub id: String,
    pub heartbeat: Heartbeat,
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
    /// what its heartbeat says.
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
                    heartbeat: Heartbeat::parse(&heartbeat?),
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

/// What the fleet does with one language: the slots of the live workers
/// that run it, and the jobs of it queued and running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LanguageLoad {
    /// Slots of the live workers that have the language's image (a slot
    /// serves any language of its worker, so a slot counts for each).
    pub slots: u64,
    /// Of those, the slots free now.
    pub free: u64,
    pub queued: u64,
    pub running: u64,
}

impl Overview {
    /// Per language (catalog id): the live workers' slots that run it and
    /// the queued and running jobs of `api_keys` (their active sets). A
    /// language nobody runs and nobody waits for is absent. Bounded by the
    /// workers and the active jobs (each key's `max_active`).
    pub async fn load_by_language(
        &self,
        api_keys: &[&str],
    ) -> Result<std::collections::BTreeMap<String, LanguageLoad>, StoreError> {
        let mut loads = std::collections::BTreeMap::<String, LanguageLoad>::new();
        let workers = self.live_workers().await?;
        let mut conn = self.redis.conn().await?;
        if !workers.is_empty() {
            let keys: Vec<String> = workers
                .iter()
                .map(|w| self.redis.keys.languages(&w.id))
                .collect();
            let lists: Vec<Option<String>> =
                redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
            for (worker, list) in workers.iter().zip(lists) {
                let max = worker.heartbeat.slots_max.unwrap_or(0);
                let used = worker.heartbeat.slots_used.unwrap_or(0);
                for language in list.iter().flat_map(|l| l.split(',')) {
                    if language.is_empty() {
                        continue;
                    }
                    let load = loads.entry(language.to_string()).or_default();
                    load.slots += max;
                    load.free += max.saturating_sub(used);
                }
            }
        }
        if api_keys.is_empty() {
            return Ok(loads);
        }
        let mut pipe = redis::pipe();
        for key in api_keys {
            pipe.smembers(self.redis.keys.active(key));
        }
        let sets: Vec<Vec<String>> = pipe.query_async(&mut conn).await?;
        let ids: Vec<String> = sets.into_iter().flatten().collect();
        for chunk in ids.chunks(500) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("HMGET")
                    .arg(self.redis.keys.job(id))
                    .arg(&["status", "language"]);
            }
            let rows: Vec<(Option<String>, Option<String>)> = pipe.query_async(&mut conn).await?;
            for (id, (status, language)) in chunk.iter().zip(rows) {
                let (Some(status), Some(language)) = (status, language) else {
                    continue;
                };
                let load = loads.entry(language).or_default();
                match parse_status(id, &status)? {
                    Status::Queued => load.queued += 1,
                    Status::Running => load.running += 1,
                    _ => {}
                }
            }
        }
        Ok(loads)
    }
}
