//! Claim: a worker moves the next job id from `jobs:queue` into its
//! processing list (`BLMOVE`, one command: no script). No status changes:
//! the job stays `queued` until it starts.

use deadpool_redis::redis::{self, AsyncCommands};

use super::Jobs;
use crate::store::{BLOCK_TIMEOUT, StoreError};

impl Jobs {
    /// Claims the next job for `worker`, waiting up to [`BLOCK_TIMEOUT`], on a
    /// dedicated connection. The id moves to the worker's processing list in
    /// the same command, so a worker that dies now does not lose it.
    pub async fn claim(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        worker: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(conn
            .blmove(
                self.redis.keys.queue(),
                self.redis.keys.processing(worker),
                redis::Direction::Right,
                redis::Direction::Left,
                BLOCK_TIMEOUT.as_secs_f64(),
            )
            .await?)
    }

    /// The ids in `worker`'s processing list: the jobs it claimed.
    pub async fn claimed_by(&self, worker: &str) -> Result<Vec<String>, StoreError> {
        let mut conn = self.redis.conn().await?;
        Ok(conn
            .lrange(self.redis.keys.processing(worker), 0, -1)
            .await?)
    }
}
