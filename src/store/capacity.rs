//! The fleet-wide schedule of warm capacity (`capacity:schedule`).
//!
//! An entry says "hold `warm` ready sandboxes of `language` from `from_ms`
//! until `until_ms`" for the whole fleet; every live worker keeps its share.
//! Entries whose window has passed are dropped whenever the schedule is
//! read or written, so the hash stays bounded by the entries an operator
//! keeps current (at most [`MAX_ENTRIES`]).

use std::collections::HashMap;

use deadpool_redis::redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::redis::Redis;
use super::{StoreError, now_ms};

/// Most entries the schedule holds at once.
pub const MAX_ENTRIES: usize = 1000;

/// One entry of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityEntry {
    pub id: String,
    pub language: String,
    /// Ready sandboxes the fleet holds while the entry is active.
    pub warm: u64,
    pub from_ms: u64,
    pub until_ms: u64,
    /// The API key that made it.
    pub created_by: String,
    pub created_ms: u64,
    /// Whether the sandboxes hold the language's runtime started ahead
    /// while the entry is active (`None`: the workers' own setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_runtime: Option<bool>,
}

impl CapacityEntry {
    pub fn active_at(&self, now_ms: u64) -> bool {
        self.from_ms <= now_ms && now_ms < self.until_ms
    }

    /// An entry for unit tests.
    #[cfg(test)]
    pub(crate) fn sample(language: &str, warm: u64, from_ms: u64, until_ms: u64) -> Self {
        Self {
            id: format!("{language}-{from_ms}"),
            language: language.into(),
            warm,
            from_ms,
            until_ms,
            created_by: "ops".into(),
            created_ms: 0,
            warm_runtime: None,
        }
    }
}

/// What became of a new entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    Stored,
    /// The schedule already holds [`MAX_ENTRIES`] current entries.
    Full,
}

/// The fleet-wide schedule of warm sandboxes (`capacity:schedule`).
#[derive(Debug, Clone)]
pub struct Capacity {
    redis: Redis,
}

impl Capacity {
    pub(super) fn new(redis: Redis) -> Self {
        Self { redis }
    }

    /// The schedule's current and future entries, by start; drops those
    /// whose window has passed.
    pub async fn schedule(&self) -> Result<Vec<CapacityEntry>, StoreError> {
        let mut conn = self.redis.conn().await?;
        let key = self.redis.keys.capacity();
        let raw: HashMap<String, String> = conn.hgetall(&key).await?;
        let now = now_ms();
        let mut entries = Vec::with_capacity(raw.len());
        let mut stale = Vec::new();
        for (id, json) in raw {
            match serde_json::from_str::<CapacityEntry>(&json) {
                Ok(entry) if entry.until_ms > now => entries.push(entry),
                Ok(_) => stale.push(id),
                Err(error) => {
                    tracing::warn!(entry = %id, %error, "dropping an unreadable capacity entry");
                    stale.push(id);
                }
            }
        }
        if !stale.is_empty() {
            let _: u64 = conn.hdel(&key, stale).await?;
        }
        entries.sort_by(|a, b| (a.from_ms, &a.id).cmp(&(b.from_ms, &b.id)));
        Ok(entries)
    }

    /// Adds an entry unless the schedule is full.
    pub async fn put(&self, entry: &CapacityEntry) -> Result<PutOutcome, StoreError> {
        if self.schedule().await?.len() >= MAX_ENTRIES {
            return Ok(PutOutcome::Full);
        }
        let json = serde_json::to_string(entry).map_err(|e| StoreError::Corrupt {
            id: entry.id.clone(),
            message: e.to_string(),
        })?;
        let mut conn = self.redis.conn().await?;
        let _: u64 = conn
            .hset(self.redis.keys.capacity(), &entry.id, json)
            .await?;
        Ok(PutOutcome::Stored)
    }

    /// Removes an entry; `false` when there was none with that id.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let mut conn = self.redis.conn().await?;
        let removed: u64 = conn.hdel(self.redis.keys.capacity(), id).await?;
        Ok(removed > 0)
    }
}
