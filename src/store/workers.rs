//! Workers' presence: heartbeats (`worker:<wid>:hb`, with an expiry; its
//! value is a [`Heartbeat`], written and read through that one type), the
//! `workers` set of every id ever seen, the languages each live worker
//! can run, and forgetting a dead worker whose list is empty. A worker's
//! processing list holds its claims and belongs to the job's life
//! ([`super::Jobs::claimed_by`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, AsyncCommands, Script};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use super::redis::Redis;
use super::{StoreError, unexpected};

/// A worker's heartbeat value (JSON): what the worker says of itself at
/// every beat, for operators and autoscalers, the dashboard, the capacity
/// API and Judge0's `/workers`. The worker writes every field it has
/// ([`Heartbeat::to_json`]); a reader gets `None` for a field a heartbeat
/// lacks or holds in another shape ([`Heartbeat::parse`]: one field's
/// garbage spoils no other, and fields newer workers add are ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub slots_used: Option<u64>,
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub slots_max: Option<u64>,
    /// The worker's `code-runner` version.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub version: Option<String>,
    /// When the worker started, Unix ms.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub started_ms: Option<u64>,
    /// With a warm pool: its sandboxes per language.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub warm: Option<BTreeMap<String, WarmFigures>>,
    /// With a warm pool: whether it starts none for want of memory.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub warm_memory_held: Option<bool>,
}

/// One language's warm sandboxes on a worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmFigures {
    /// Ready now (0 when the heartbeat does not say).
    #[serde(default, deserialize_with = "lenient_count")]
    pub ready: u64,
    /// What the worker aims to keep ready (0 when it does not say).
    #[serde(default, deserialize_with = "lenient_count")]
    pub target: u64,
}

impl Heartbeat {
    /// The heartbeat in `text`; every field `None` when it is not JSON.
    pub fn parse(text: &str) -> Self {
        serde_json::from_str(text).unwrap_or_default()
    }

    /// The value the worker writes.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }
}

/// A field of the shape asked, else `None` (never an error for the rest).
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).ok())
}

/// A count, else 0.
fn lenient_count<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    Ok(lenient(deserializer)?.unwrap_or(0))
}

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

    /// Refreshes a worker's heartbeat (and records the worker id); `value`
    /// is a [`Heartbeat::to_json`].
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_reads_back_what_the_worker_wrote() {
        let heartbeat = Heartbeat {
            slots_used: Some(1),
            slots_max: Some(4),
            version: Some("0.1.0".into()),
            started_ms: Some(0),
            warm: Some(BTreeMap::from([(
                "python".to_string(),
                WarmFigures {
                    ready: 3,
                    target: 4,
                },
            )])),
            warm_memory_held: Some(false),
        };
        assert_eq!(Heartbeat::parse(&heartbeat.to_json()), heartbeat);
        // Without a pool, its fields are not written at all.
        let plain = Heartbeat {
            warm: None,
            warm_memory_held: None,
            ..heartbeat
        };
        let value: serde_json::Value = serde_json::from_str(&plain.to_json()).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"slots_used": 1, "slots_max": 4, "version": "0.1.0", "started_ms": 0})
        );
    }

    #[test]
    fn a_field_of_another_shape_is_none_and_spoils_no_other() {
        let read = Heartbeat::parse(
            r#"{"slots_used":"x","slots_max":4,"version":7,"warm":{"c":{"ready":-1,"target":2}},"extra":true}"#,
        );
        assert_eq!(read.slots_used, None);
        assert_eq!(read.slots_max, Some(4));
        assert_eq!(read.version, None);
        assert_eq!(
            read.warm,
            Some(BTreeMap::from([(
                "c".to_string(),
                WarmFigures {
                    ready: 0,
                    target: 2
                }
            )]))
        );
        assert_eq!(Heartbeat::parse("not json"), Heartbeat::default());
        assert_eq!(Heartbeat::parse("{}"), Heartbeat::default());
    }
}
