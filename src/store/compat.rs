//! What a compatible API (Judge0) needs beside a job to answer about it
//! (`compat:<id>`: its language id, expected output, limits as given):
//! JSON, expiring a day after the job's result would.

use deadpool_redis::redis::{self, AsyncCommands};

use super::StoreError;
use super::redis::Redis;

#[derive(Debug, Clone)]
pub struct CompatRecords {
    redis: Redis,
}

impl CompatRecords {
    pub(super) fn new(redis: Redis) -> Self {
        Self { redis }
    }

    /// Stores what a compatible API needs beside job `id` (written before
    /// the job is submitted). It outlives the job's own keys by a day, so a
    /// job that waited long in the queue still has it.
    pub async fn put(&self, id: &str, json: &str) -> Result<(), StoreError> {
        let ttl = self.redis.result_ttl_secs() * 2 + 86_400;
        let mut conn = self.redis.conn().await?;
        let _: () = conn.set_ex(self.redis.keys.compat(id), json, ttl).await?;
        Ok(())
    }

    /// The records of `ids`, in order (`None` where there is none).
    pub async fn get_many(&self, ids: &[String]) -> Result<Vec<Option<String>>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids.iter().map(|id| self.redis.keys.compat(id)).collect();
        let mut conn = self.redis.conn().await?;
        Ok(redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?)
    }
}
