//! The connection every part of the store shares: a pool for ordinary
//! commands, and a client for the dedicated connections blocking commands
//! need (`BLMOVE`, `XREAD BLOCK`: so they never hold a pooled connection).
//!
//! The pool checks a connection (a PING) only when it was idle for
//! `CHECK_AFTER_IDLE` (1 s) or more, not before every use; a connection
//! whose command failed in a way that needs a new one marks itself and is
//! never handed out again. No connection sends `CLIENT SETINFO` (Redis
//! before 7.2 refuses it) and none keeps Nagle's algorithm on.

use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleResult};
use deadpool_redis::redis;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::keys::Keys;
use super::{BLOCK_TIMEOUT, StoreError};

#[derive(Clone)]
pub(super) struct Redis {
    pool: Pool,
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
        let timeout = Some(Duration::from_secs(2));
        let manager = Manager {
            connect: deadpool_redis::Manager::new(info.clone())?,
        };
        let pool = Pool::builder(manager)
            .max_size(pool_size)
            .wait_timeout(timeout)
            .create_timeout(timeout)
            .recycle_timeout(timeout)
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

    pub(super) async fn conn(&self) -> Result<Connection, StoreError> {
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

/// A connection used again within this of its last use is handed out as it
/// is; one idle longer is checked first (a PING), since Redis or something
/// between may have closed it meanwhile.
const CHECK_AFTER_IDLE: Duration = Duration::from_secs(1);

type Pool = managed::Pool<Manager, Connection>;

/// The pool's manager: deadpool-redis's makes the connections and checks
/// them, but only those idle for [`CHECK_AFTER_IDLE`] or longer. Its own
/// check, a PING (with an UNWATCH) before every use, was a round trip to
/// Redis on every `conn()`: 13 per warm job and 2 per line an interactive
/// job reads (docs/performance.md). A connection in use tells instead: a
/// command that failed in a way that needs a new connection (it dropped,
/// an I/O error) marks it, and a marked connection is never handed out
/// again. Nothing here uses WATCH, so no UNWATCH is due either.
struct Manager {
    connect: deadpool_redis::Manager,
}

/// A pooled connection and whether a command on it failed for good.
struct Pooled {
    conn: MultiplexedConnection,
    broken: bool,
}

impl managed::Manager for Manager {
    type Type = Pooled;
    type Error = RedisError;

    async fn create(&self) -> Result<Pooled, RedisError> {
        Ok(Pooled {
            conn: self.connect.create().await?,
            broken: false,
        })
    }

    async fn recycle(&self, pooled: &mut Pooled, metrics: &Metrics) -> RecycleResult<RedisError> {
        if pooled.broken {
            return Err(managed::RecycleError::message(
                "a command on this connection failed; it is replaced",
            ));
        }
        if metrics.last_used() < CHECK_AFTER_IDLE {
            return Ok(());
        }
        self.connect.recycle(&mut pooled.conn, metrics).await
    }
}

impl Pooled {
    fn note<T>(&mut self, reply: &Result<T, RedisError>) {
        // A dropped connection counts too (redis-rs: retry by reconnecting).
        if let Err(error) = reply
            && error.is_unrecoverable_error()
        {
            self.broken = true;
        }
    }
}

/// A connection taken from the pool; back to it when dropped.
pub(super) struct Connection(managed::Object<Manager>);

impl From<managed::Object<Manager>> for Connection {
    fn from(object: managed::Object<Manager>) -> Self {
        Self(object)
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let pooled: &'a mut Pooled = &mut self.0;
        Box::pin(async move {
            let reply = pooled.conn.req_packed_command(cmd).await;
            pooled.note(&reply);
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let pooled: &'a mut Pooled = &mut self.0;
        Box::pin(async move {
            let reply = pooled.conn.req_packed_commands(cmd, offset, count).await;
            pooled.note(&reply);
            reply
        })
    }

    fn get_db(&self) -> i64 {
        self.0.conn.get_db()
    }
}
