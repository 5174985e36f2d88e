//! What the Redis in use keeps and throws away: whether it persists its
//! data (AOF, snapshots) and whether it evicts keys when full. `doctor`
//! and `/readyz` warn about a Redis that would lose jobs; the reaper reads
//! how long the server has been up.

use std::time::Duration;

use deadpool_redis::redis;

use super::{Store, StoreError};

/// The Redis server's settings that decide what a restart or a full
/// memory loses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisHealth {
    /// `appendonly yes`.
    pub aof: bool,
    /// Snapshot points configured (`save`); `None` when the server does not
    /// tell (CONFIG refused, as on some managed Redis).
    pub snapshots: Option<bool>,
    /// `maxmemory-policy`.
    pub maxmemory_policy: String,
    /// `maxmemory` in bytes (0: none).
    pub maxmemory: u64,
}

/// Something about the Redis in use that loses jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisWarning {
    /// Neither AOF nor snapshots: a restart loses everything.
    NoPersistence,
    /// Snapshots only: a crash loses what changed since the last one.
    SnapshotsOnly,
    /// An evicting `maxmemory-policy`: a full Redis drops keys (jobs,
    /// results, heartbeats) instead of refusing writes.
    Evicting(String),
}

impl RedisWarning {
    /// The `check` name in `/readyz` warnings.
    pub fn check(&self) -> &'static str {
        match self {
            RedisWarning::NoPersistence | RedisWarning::SnapshotsOnly => "redis_persistence",
            RedisWarning::Evicting(_) => "redis_eviction",
        }
    }
}

impl std::fmt::Display for RedisWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisWarning::NoPersistence => write!(
                f,
                "redis has no persistence (appendonly no, no save points): a restart loses every queued and running job, every result and the token secret; run it with appendonly yes and appendfsync everysec"
            ),
            RedisWarning::SnapshotsOnly => write!(
                f,
                "redis keeps snapshots only (appendonly no): a crash loses every job change since the last snapshot; run it with appendonly yes and appendfsync everysec"
            ),
            RedisWarning::Evicting(policy) => write!(
                f,
                "redis evicts keys when full (maxmemory-policy {policy}): it may drop queued jobs, results and heartbeats; set maxmemory-policy noeviction"
            ),
        }
    }
}

impl RedisHealth {
    /// What in these settings can lose jobs.
    pub fn warnings(&self) -> Vec<RedisWarning> {
        let mut warnings = Vec::new();
        if !self.aof {
            warnings.push(match self.snapshots {
                Some(true) => RedisWarning::SnapshotsOnly,
                _ => RedisWarning::NoPersistence,
            });
        }
        if self.maxmemory_policy != "noeviction" {
            warnings.push(RedisWarning::Evicting(self.maxmemory_policy.clone()));
        }
        warnings
    }
}

/// The value of `name` in an `INFO` reply.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.trim().split_once(':')?;
        (key == name).then_some(value)
    })
}

impl Store {
    /// The server's persistence and eviction settings (`INFO`, and
    /// `CONFIG GET save` where allowed).
    pub async fn redis_health(&self) -> Result<RedisHealth, StoreError> {
        let mut conn = self.redis.conn().await?;
        let (persistence, memory): (String, String) = redis::pipe()
            .cmd("INFO")
            .arg("persistence")
            .cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await?;
        let save: Result<Vec<String>, _> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("save")
            .query_async(&mut conn)
            .await;
        let number = |info: &str, name: &str| {
            info_field(info, name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(RedisHealth {
            aof: info_field(&persistence, "aof_enabled").map(str::trim) == Some("1"),
            snapshots: save
                .ok()
                .and_then(|pair| pair.get(1).map(|points| !points.trim().is_empty())),
            maxmemory_policy: info_field(&memory, "maxmemory_policy")
                .unwrap_or("unknown")
                .trim()
                .to_string(),
            maxmemory: number(&memory, "maxmemory"),
        })
    }

    /// How long the Redis server has been up.
    pub async fn redis_uptime(&self) -> Result<Duration, StoreError> {
        let mut conn = self.redis.conn().await?;
        let server: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await?;
        let seconds = info_field(&server, "uptime_in_seconds")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| super::unexpected("info", "no uptime_in_seconds"))?;
        Ok(Duration::from_secs(seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(aof: bool, snapshots: Option<bool>, policy: &str) -> RedisHealth {
        RedisHealth {
            aof,
            snapshots,
            maxmemory_policy: policy.into(),
            maxmemory: 0,
        }
    }

    #[test]
    fn only_aof_with_noeviction_is_quiet() {
        assert!(
            health(true, Some(false), "noeviction")
                .warnings()
                .is_empty()
        );
        assert_eq!(
            health(false, Some(false), "noeviction").warnings(),
            [RedisWarning::NoPersistence]
        );
        assert_eq!(
            health(false, None, "noeviction").warnings(),
            [RedisWarning::NoPersistence]
        );
        assert_eq!(
            health(false, Some(true), "allkeys-lru").warnings(),
            [
                RedisWarning::SnapshotsOnly,
                RedisWarning::Evicting("allkeys-lru".into())
            ]
        );
    }

    #[test]
    fn info_fields_are_found() {
        let info = "# Persistence\r\nloading:0\r\naof_enabled:1\r\n";
        assert_eq!(info_field(info, "aof_enabled"), Some("1"));
        assert_eq!(info_field(info, "aof"), None);
    }
}
