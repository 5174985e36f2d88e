//! What a compatible API needs beside a job to answer about it: Judge0's
//! (`compat:<id>`: its language id, expected output, limits as given),
//! JSON, expiring a day after the job's result would; and Jobe's file ids
//! (`compat:jobe-file:<key>:<id>`: the SHA-256 of the stored file the id
//! names, expiring when unused as long as the file itself would).

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

    /// Names `api_key`'s stored file `digest` by the Jobe file id `id`,
    /// for `keep` after its last use.
    pub async fn set_jobe_file(
        &self,
        api_key: &str,
        id: &str,
        digest: &str,
        keep: std::time::Duration,
    ) -> Result<(), StoreError> {
        let mut conn = self.redis.conn().await?;
        let _: () = conn
            .set_ex(
                self.redis.keys.jobe_file(api_key, id),
                digest,
                keep.as_secs().max(1),
            )
            .await?;
        Ok(())
    }

    /// The SHA-256 `api_key`'s Jobe file id `id` names, if any; a use,
    /// which renews its time to `keep`.
    pub async fn jobe_file(
        &self,
        api_key: &str,
        id: &str,
        keep: std::time::Duration,
    ) -> Result<Option<String>, StoreError> {
        let mut conn = self.redis.conn().await?;
        Ok(redis::cmd("GETEX")
            .arg(self.redis.keys.jobe_file(api_key, id))
            .arg("EX")
            .arg(keep.as_secs().max(1))
            .query_async(&mut conn)
            .await?)
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
