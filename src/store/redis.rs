//! The connection every part of the store shares: a pool for ordinary
//! commands, and a client for the dedicated connections blocking commands
//! need (so they never hold a pooled connection).

use std::time::Duration;

use deadpool_redis::redis;

use super::keys::Keys;
use super::{BLOCK_TIMEOUT, StoreError};

#[derive(Clone)]
pub(super) struct Redis {
    pool: deadpool_redis::Pool,
    client: redis::Client,
    pub(super) keys: Keys,
    pub(super) result_ttl: Duration,
    /// How long the run history lists a job (see [`super::history`]).
    pub(super) history_window: Duration,
    /// How long a day of the usage ledger is kept after it ends.
    pub(super) usage_retention: Duration,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").field("keys", &self.keys).finish()
    }
}

impl Redis {
    /// Sets up the pool; does not connect yet (the first command does).
    pub(super) fn new(
        url: &str,
        prefix: &str,
        result_ttl: Duration,
        pool_size: usize,
    ) -> Result<Self, StoreError> {
        // Nagle's algorithm off (redis-rs leaves it on): a command written
        // while an earlier one's reply is outstanding must not wait for a
        // delayed ACK (40 ms) on the hot path.
        // And no `CLIENT SETINFO` at connect: Redis before 7.2 (Debian 12
        // ships 7.0) answers it with an error, two per new connection, which
        // fill `INFO errorstats` with noise an operator would chase.
        let info = redis::IntoConnectionInfo::into_connection_info(url)?;
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let info = info
            .set_redis_settings(settings)
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let mut config = deadpool_redis::Config::default();
        let timeout = Some(Duration::from_secs(2));
        config.pool = Some(deadpool_redis::PoolConfig {
            max_size: pool_size,
            timeouts: deadpool_redis::Timeouts {
                wait: timeout,
                create: timeout,
                recycle: timeout,
            },
            ..Default::default()
        });
        let pool = deadpool_redis::Pool::builder(deadpool_redis::Manager::new(info.clone())?)
            .config(config.get_pool_config())
            .runtime(deadpool_redis::Runtime::Tokio1)
            .build()
            .map_err(|error| {
                StoreError::CreatePool(deadpool_redis::CreatePoolError::Build(error))
            })?;
        let client = redis::Client::open(info)?;
        Ok(Self {
            pool,
            client,
            keys: Keys::new(prefix),
            result_ttl,
            history_window: super::history::DEFAULT_WINDOW,
            usage_retention: Duration::from_secs(super::usage::DEFAULT_RETENTION_DAYS * 86_400),
        })
    }

    pub(super) async fn conn(&self) -> Result<deadpool_redis::Connection, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// A connection of its own, for blocking commands; its response timeout
    /// leaves room for the block.
    pub(super) async fn dedicated(&self) -> Result<redis::aio::MultiplexedConnection, StoreError> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(BLOCK_TIMEOUT + Duration::from_secs(5)));
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    /// How long the run history lists a job, in milliseconds (at least 1).
    pub(super) fn history_window_ms(&self) -> u64 {
        (self.history_window.as_millis() as u64).max(1)
    }

    /// How long a job's keys live once it ended, in whole seconds (at least 1).
    pub(super) fn result_ttl_secs(&self) -> u64 {
        self.result_ttl.as_secs().max(1)
    }
}
