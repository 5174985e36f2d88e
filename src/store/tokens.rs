//! The secret attach tokens are signed with, when none is configured
//! (`config:token_secret`), shared by every API replica.

use deadpool_redis::redis;

use super::StoreError;
use super::redis::Redis;

#[derive(Debug, Clone)]
pub struct Tokens {
    redis: Redis,
}

impl Tokens {
    pub(super) fn new(redis: Redis) -> Self {
        Self { redis }
    }

    /// The secret attach tokens are signed with: `candidate` if no API
    /// replica stored one before, else the stored one (`SET NX`, then `GET`,
    /// in one transaction), so every replica signs with the same secret.
    pub async fn shared_secret(&self, candidate: &str) -> Result<String, StoreError> {
        let key = self.redis.keys.token_secret();
        let mut conn = self.redis.conn().await?;
        let (secret,): (String,) = redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(&key)
            .arg(candidate)
            .arg("NX")
            .ignore()
            .get(&key)
            .query_async(&mut conn)
            .await?;
        Ok(secret)
    }
}
