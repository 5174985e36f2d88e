//! Workers' presence: heartbeats (`worker:<wid>:hb`, with an expiry), the
//! `workers` set of every id ever seen, the languages each live worker
//! can run, and forgetting a dead worker whose list is empty. A worker's
//! processing list holds its claims and belongs to the job's life
//! ([`super::Jobs::claimed_by`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, AsyncCommands, Script};

use super::redis::Redis;
use super::{StoreError, unexpected};

/// The workers of the fleet (the `workers` set), by whether their
/// heartbeat lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fleet {
    pub alive: BTreeSet<String>,
    /// In the set, but the heartbeat expired (or was never written).
    pub dead: BTreeSet<String>,
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

/// Workers' presence in the fleet.
#[derive(Debug, Clone)]
pub struct Workers {
    redis: Redis,
    forget: Arc<Script>,
}

impl Workers {
    pub(super) fn new(redis: Redis) -> Self {
        Self {
            redis,
            forget: Arc::new(Script::new(include_str!("workers.lua"))),
        }
    }

    /// Refreshes a worker's heartbeat (and records the worker id).
    pub async fn heartbeat(
        &self,
        worker: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let mut conn = self.redis.conn().await?;
        redis::pipe()
            .pset_ex(
                self.redis.keys.heartbeat(worker),
                value,
                (ttl.as_millis() as u64).max(1),
            )
            .ignore()
            .sadd(self.redis.keys.workers(), worker)
            .ignore()
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Removes a worker's heartbeat at a clean shutdown.
    pub async fn retire(&self, worker: &str) -> Result<(), StoreError> {
        let mut conn = self.redis.conn().await?;
        redis::pipe()
            .del(self.redis.keys.heartbeat(worker))
            .ignore()
            .del(self.redis.keys.worker_doorbell(worker))
            .ignore()
            .srem(self.redis.keys.workers(), worker)
            .ignore()
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Says which languages `worker` can run (it has their images), for as
    /// long as its heartbeat lives.
    pub async fn advertise_languages(
        &self,
        worker: &str,
        languages: &[&str],
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let mut conn = self.redis.conn().await?;
        let _: () = conn
            .pset_ex(
                self.redis.keys.languages(worker),
                languages.join(","),
                (ttl.as_millis() as u64).max(1),
            )
            .await?;
        Ok(())
    }

    /// The languages the live workers can run: the union of what each
    /// advertised, or `None` when no live worker has said.
    pub async fn advertised_languages(&self) -> Result<Option<BTreeSet<String>>, StoreError> {
        let mut conn = self.redis.conn().await?;
        let workers: Vec<String> = conn.smembers(self.redis.keys.workers()).await?;
        if workers.is_empty() {
            return Ok(None);
        }
        let keys: Vec<String> = workers
            .iter()
            .map(|w| self.redis.keys.languages(w))
            .collect();
        let lists: Vec<Option<String>> =
            redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
        let mut any = false;
        let mut languages = BTreeSet::new();
        for list in lists.into_iter().flatten() {
            any = true;
            languages.extend(list.split(',').filter(|l| !l.is_empty()).map(String::from));
        }
        Ok(any.then_some(languages))
    }

    /// Every worker in the `workers` set, split by whether its heartbeat
    /// lives.
    pub async fn fleet(&self) -> Result<Fleet, StoreError> {
        let mut conn = self.redis.conn().await?;
        let ids: Vec<String> = conn.smembers(self.redis.keys.workers()).await?;
        if ids.is_empty() {
            return Ok(Fleet::default());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.exists(self.redis.keys.heartbeat(id));
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

    /// Removes a dead worker whose processing list is empty from the
    /// `workers` set (atomically with that check).
    pub async fn forget(&self, worker: &str) -> Result<ForgetOutcome, StoreError> {
        let mut conn = self.redis.conn().await?;
        let outcome: String = self
            .forget
            .key(self.redis.keys.workers())
            .key(self.redis.keys.heartbeat(worker))
            .key(self.redis.keys.processing(worker))
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
