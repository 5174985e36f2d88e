//! Redis: the shared state of the fleet (DESIGN §6). This is the only module
//! that knows key names; the API and the worker call its operations.
//!
//! Keys, all under an optional prefix:
//! - `jobs:queue` — list of pending job ids (LPUSH by the API; a worker claims
//!   with `BLMOVE jobs:queue worker:<wid>:processing RIGHT LEFT`).
//! - `job:<id>` — hash: spec, status, attempts, worker, api key, timestamps,
//!   result, and `requeues` (times the reaper put it back after its worker
//!   died before starting it). Expires `RESULT_TTL` after the job ends.
//! - `job:<id>:stdin` — stream of control messages for the job's worker
//!   (`cancel`, stdin, stdin close, signals). The job hash counts the stdin
//!   stream clients sent (`stdin_bytes`).
//! - `job:<id>:events` — stream of the job's events (live output; later).
//! - `worker:<wid>:processing` — list of the ids a worker has claimed.
//! - `worker:<wid>:hb` — heartbeat, with an expiry; `workers` — set of ids.
//! - `worker:<wid>:languages` — the language ids the worker has images of
//!   (comma-separated), refreshed with its heartbeat and expiring with it.
//! - `idem:<api key name>:<idempotency key>` — hash: job id and body hash.
//! - `apikey:<name>:active` — set of the key's queued and running job ids.
//! - `jobs:dead` — dead-letter list: jobs whose workers kept dying before
//!   they started (the newest 10 000).
//! - `jobs:recent` — list of the newest submitted job ids (the newest
//!   [`RECENT_JOBS_KEPT`]), for the dashboard.
//! - `compat:<id>` — what a compatible API (Judge0) needs beside the job to
//!   answer about it (its language id, expected output, limits as given);
//!   JSON, expiring a day after the job's result would.
//! - `config:token_secret` — the secret attach tokens are signed with, when
//!   none is configured (shared by every API replica).
//! - `capacity:schedule` — hash: id → a warm capacity entry (JSON), the
//!   fleet-wide schedule of warm sandboxes (see [`capacity`]).

mod capacity;
mod overview;
mod reap;
mod scripts;

pub use capacity::{CapacityEntry, MAX_ENTRIES, PutOutcome};
pub use overview::{JobSummary, LiveWorker, RECENT_JOBS_KEPT};
pub use reap::{Fleet, ForgetOutcome, LostResults, ReapOutcome, RunningJob};

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, AsyncCommands, Script};
use serde::{Deserialize, Serialize};

use crate::job::events::{JobEvent, StoredEvent};
use crate::job::{JobResult, JobSpec, Status};

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("redis is unavailable: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("redis command failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("cannot set up the redis pool: {0}")]
    CreatePool(#[from] deadpool_redis::CreatePoolError),
    #[error("job {id} is corrupt in redis: {message}")]
    Corrupt { id: String, message: String },
}

/// Key names under the configured prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }
    pub fn queue(&self) -> String {
        format!("{}jobs:queue", self.prefix)
    }
    pub fn dead(&self) -> String {
        format!("{}jobs:dead", self.prefix)
    }
    pub fn job(&self, id: &str) -> String {
        format!("{}job:{id}", self.prefix)
    }
    pub fn stdin(&self, id: &str) -> String {
        format!("{}job:{id}:stdin", self.prefix)
    }
    pub fn events(&self, id: &str) -> String {
        format!("{}job:{id}:events", self.prefix)
    }
    pub fn processing(&self, worker: &str) -> String {
        format!("{}worker:{worker}:processing", self.prefix)
    }
    pub fn heartbeat(&self, worker: &str) -> String {
        format!("{}worker:{worker}:hb", self.prefix)
    }
    pub fn languages(&self, worker: &str) -> String {
        format!("{}worker:{worker}:languages", self.prefix)
    }
    pub fn workers(&self) -> String {
        format!("{}workers", self.prefix)
    }
    pub fn idempotency(&self, api_key: &str, key: &str) -> String {
        format!("{}idem:{api_key}:{key}", self.prefix)
    }
    pub fn active(&self, api_key: &str) -> String {
        format!("{}apikey:{api_key}:active", self.prefix)
    }
    pub fn recent(&self) -> String {
        format!("{}jobs:recent", self.prefix)
    }
    pub fn compat(&self, id: &str) -> String {
        format!("{}compat:{id}", self.prefix)
    }
    pub fn token_secret(&self) -> String {
        format!("{}config:token_secret", self.prefix)
    }
    pub fn capacity(&self) -> String {
        format!("{}capacity:schedule", self.prefix)
    }
}

/// A job as stored in `job:<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    pub status: Status,
    pub language: String,
    pub api_key: String,
    pub attempts: u32,
    pub worker: Option<String>,
    pub created_ms: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    pub result: Option<JobResult>,
    #[serde(skip)]
    pub spec: Option<String>,
}

/// A job to enqueue.
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
    pub id: &'a str,
    pub spec: &'a JobSpec,
    pub api_key: &'a str,
    pub language: &'a str,
    /// Idempotency key and the hash of the request body.
    pub idempotency: Option<(&'a str, &'a str)>,
    pub max_queue_depth: u64,
    /// Most queued + running jobs of this API key (`None`: no limit).
    pub key_limit: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    Accepted,
    /// The idempotency key was used before with the same body: that job.
    Existing(String),
    /// The idempotency key was used before with another body.
    Conflict(String),
    QueueFull {
        depth: u64,
    },
    KeyLimit {
        active: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartOutcome {
    /// The job is now running on this worker.
    Start {
        spec: String,
        created_ms: u64,
        attempts: u32,
    },
    /// The job is not queued any more (cancelled, or gone); it was dropped
    /// from the processing list.
    Skip(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The job is back at the head of the queue.
    Requeued,
    /// The job is not queued any more (cancelled meanwhile); it was only
    /// dropped from the processing list.
    Dropped,
    /// The id was not in the worker's processing list.
    Absent,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// It was queued and will never start.
    Cancelled,
    /// It is running; its worker was asked to kill it.
    Requested,
    /// It had already ended with this status.
    AlreadyFinished(Status),
    NotFound,
}

/// What became of a control message a stream client sent
/// ([`Queue::send_input`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputOutcome {
    /// On its way to the worker; `stdin_bytes` of stdin were sent so far.
    Sent { stdin_bytes: u64 },
    /// Refused whole: it would take the job's stdin past the budget, of
    /// which `stdin_bytes` are used.
    OverBudget { stdin_bytes: u64 },
    /// The job has ended with this status: nothing was sent.
    Ended(Status),
    /// The job does not exist (any more).
    Missing,
}

/// A control message for a running job, from `job:<id>:stdin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Cancel,
    Stdin(Vec<u8>),
    StdinClose,
    Signal(crate::protocol::SignalKind),
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long a blocking read waits at most before returning to its loop.
pub const BLOCK_TIMEOUT: Duration = Duration::from_secs(1);

/// Handle on the shared state: a pool for ordinary commands, and a client for
/// the dedicated connections blocking commands need (so they never hold a
/// pooled connection).
#[derive(Clone)]
pub struct Queue {
    pool: deadpool_redis::Pool,
    client: redis::Client,
    keys: Keys,
    result_ttl: Duration,
    submit: std::sync::Arc<Script>,
    start: std::sync::Arc<Script>,
    finish: std::sync::Arc<Script>,
    cancel: std::sync::Arc<Script>,
    release: std::sync::Arc<Script>,
    append_events: std::sync::Arc<Script>,
    reap_job: std::sync::Arc<Script>,
    send_input: std::sync::Arc<Script>,
    forget_worker: std::sync::Arc<Script>,
    settle_stuck: std::sync::Arc<Script>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("keys", &self.keys).finish()
    }
}

impl Queue {
    /// Sets up the pool; does not connect yet (the first command does).
    pub fn new(
        url: &str,
        prefix: &str,
        result_ttl: Duration,
        pool_size: usize,
    ) -> Result<Self, QueueError> {
        // Nagle's algorithm off (redis-rs leaves it on): a command written
        // while an earlier one's reply is outstanding must not wait for a
        // delayed ACK (40 ms) on the hot path.
        let info = redis::IntoConnectionInfo::into_connection_info(url)?
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
                QueueError::CreatePool(deadpool_redis::CreatePoolError::Build(error))
            })?;
        let client = redis::Client::open(info)?;
        Ok(Self {
            pool,
            client,
            keys: Keys::new(prefix),
            result_ttl,
            submit: Script::new(scripts::SUBMIT).into(),
            start: Script::new(scripts::START).into(),
            finish: Script::new(scripts::FINISH).into(),
            cancel: Script::new(scripts::CANCEL).into(),
            release: Script::new(scripts::RELEASE).into(),
            append_events: Script::new(scripts::APPEND_EVENTS).into(),
            reap_job: Script::new(scripts::REAP_JOB).into(),
            send_input: Script::new(scripts::SEND_INPUT).into(),
            forget_worker: Script::new(scripts::FORGET_WORKER).into(),
            settle_stuck: Script::new(scripts::SETTLE_STUCK).into(),
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn result_ttl(&self) -> Duration {
        self.result_ttl
    }

    async fn conn(&self) -> Result<deadpool_redis::Connection, QueueError> {
        Ok(self.pool.get().await?)
    }

    /// A connection of its own, for blocking commands; its response timeout
    /// leaves room for the block.
    pub async fn dedicated(&self) -> Result<redis::aio::MultiplexedConnection, QueueError> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(BLOCK_TIMEOUT + Duration::from_secs(5)));
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    pub async fn ping(&self) -> Result<(), QueueError> {
        let mut conn = self.conn().await?;
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    pub async fn queue_depth(&self) -> Result<u64, QueueError> {
        let mut conn = self.conn().await?;
        Ok(conn.llen(self.keys.queue()).await?)
    }

    /// Enqueues a job, atomically with the admission checks and the
    /// idempotency record.
    pub async fn submit(&self, job: NewJob<'_>) -> Result<SubmitOutcome, QueueError> {
        let spec = serde_json::to_string(job.spec).map_err(|e| QueueError::Corrupt {
            id: job.id.to_string(),
            message: e.to_string(),
        })?;
        let metadata = serde_json::to_string(&job.spec.metadata).unwrap_or_else(|_| "{}".into());
        let (idem_key, body_hash) = match job.idempotency {
            Some((key, hash)) => (self.keys.idempotency(job.api_key, key), hash.to_string()),
            None => (String::new(), String::new()),
        };
        let mut conn = self.conn().await?;
        let (outcome, detail): (String, String) = self
            .submit
            .key(self.keys.queue())
            .key(self.keys.job(job.id))
            .key(self.keys.active(job.api_key))
            .key(idem_key)
            .key(self.keys.events(job.id))
            .key(self.keys.recent())
            .arg(job.id)
            .arg(spec)
            .arg(job.api_key)
            .arg(job.language)
            .arg(now_ms())
            .arg(job.max_queue_depth)
            .arg(job.key_limit.unwrap_or(0))
            .arg(body_hash)
            .arg(self.result_ttl.as_secs().max(1) * 24)
            .arg(metadata)
            .arg(RECENT_JOBS_KEPT - 1)
            .invoke_async(&mut conn)
            .await?;
        Ok(match outcome.as_str() {
            "accepted" => SubmitOutcome::Accepted,
            "existing" => SubmitOutcome::Existing(detail),
            "conflict" => SubmitOutcome::Conflict(detail),
            "queue_full" => SubmitOutcome::QueueFull {
                depth: detail.parse().unwrap_or(0),
            },
            _ => SubmitOutcome::KeyLimit {
                active: detail.parse().unwrap_or(0),
            },
        })
    }

    /// Reads a job (without its spec, which can be large and no reader of
    /// a record needs); `None` when it does not exist (never did, or
    /// expired).
    pub async fn get(&self, id: &str) -> Result<Option<JobRecord>, QueueError> {
        let mut conn = self.conn().await?;
        let values: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(self.keys.job(id))
            .arg(RECORD_FIELDS)
            .query_async(&mut conn)
            .await?;
        let fields: HashMap<String, String> = RECORD_FIELDS
            .iter()
            .zip(values)
            .filter_map(|(name, value)| Some((name.to_string(), value?)))
            .collect();
        if fields.is_empty() {
            return Ok(None);
        }
        record_from_fields(id, fields).map(Some)
    }

    /// Waits until job `id` is terminal (its `exit` event is in its events
    /// stream), at most `within`, blocking on the stream on `conn` (a
    /// dedicated connection): nothing waits on a timer. `true` when it is
    /// terminal or gone, `false` when `within` passed first.
    pub async fn await_exit(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        id: &str,
        within: Duration,
    ) -> Result<bool, QueueError> {
        let deadline = tokio::time::Instant::now() + within;
        // The status and the last event's seq in one read: the terminal
        // status and the `exit` event are written in one step, so either
        // the status is terminal or the exit event comes after `seq`.
        let (status, seq): (Option<String>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.keys.job(id))
            .arg("status")
            .arg("event_seq")
            .query_async(conn)
            .await?;
        let Some(status) = status else {
            return Ok(true);
        };
        if parse_status(id, &status)?.is_terminal() {
            return Ok(true);
        }
        let mut after = seq.unwrap_or(0);
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let block = (deadline - now)
                .min(BLOCK_TIMEOUT)
                .max(Duration::from_millis(1));
            let events = self.read_events(conn, id, after, 512, Some(block)).await?;
            if events.iter().any(StoredEvent::is_exit) {
                return Ok(true);
            }
            if let Some(last) = events.last() {
                after = last.seq;
            } else if self.status(id).await?.is_none_or(|s| s.is_terminal()) {
                // Expired or settled without a readable exit event.
                return Ok(true);
            }
        }
    }

    /// Cancels a job: a queued one never starts; a running one is killed by
    /// its worker.
    pub async fn cancel(
        &self,
        id: &str,
        cancelled: &JobResult,
    ) -> Result<CancelOutcome, QueueError> {
        let result = serde_json::to_string(cancelled).unwrap_or_default();
        let mut conn = self.conn().await?;
        let outcome: String = self
            .cancel
            .key(self.keys.job(id))
            .key(self.keys.queue())
            .key(self.keys.stdin(id))
            .key(self.keys.events(id))
            .arg(id)
            .arg(now_ms())
            .arg(self.result_ttl.as_secs().max(1))
            .arg(result)
            .invoke_async(&mut conn)
            .await?;
        Ok(match outcome.as_str() {
            "cancelled" => CancelOutcome::Cancelled,
            "requested" => CancelOutcome::Requested,
            "missing" => CancelOutcome::NotFound,
            other => CancelOutcome::AlreadyFinished(parse_status(
                id,
                other.strip_prefix("finished:").unwrap_or(other),
            )?),
        })
    }

    /// Whether a running job's cancellation was asked for (and not yet
    /// acted on by its worker).
    pub async fn cancel_requested(&self, id: &str) -> Result<bool, QueueError> {
        let mut conn = self.conn().await?;
        let flag: Option<String> = conn.hget(self.keys.job(id), "cancel_requested").await?;
        Ok(flag.is_some_and(|f| f == "1"))
    }

    /// The secret attach tokens are signed with: `candidate` if no API
    /// replica stored one before, else the stored one (`SET NX`, then `GET`,
    /// in one transaction), so every replica signs with the same secret.
    pub async fn shared_token_secret(&self, candidate: &str) -> Result<String, QueueError> {
        let key = self.keys.token_secret();
        let mut conn = self.conn().await?;
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

    /// Claims the next job for `worker`, waiting up to [`BLOCK_TIMEOUT`], on a
    /// dedicated connection. The id moves to the worker's processing list in
    /// the same command, so a worker that dies now does not lose it.
    pub async fn claim(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        worker: &str,
    ) -> Result<Option<String>, QueueError> {
        Ok(conn
            .blmove(
                self.keys.queue(),
                self.keys.processing(worker),
                redis::Direction::Right,
                redis::Direction::Left,
                BLOCK_TIMEOUT.as_secs_f64(),
            )
            .await?)
    }

    /// Marks a claimed job running on `worker`, if it is still queued. The
    /// spec comes back only `with_spec` (a worker that has the prepared job
    /// already does not read it again); else it is empty.
    pub async fn start(
        &self,
        id: &str,
        worker: &str,
        with_spec: bool,
    ) -> Result<StartOutcome, QueueError> {
        let mut conn = self.conn().await?;
        let reply: Vec<String> = self
            .start
            .key(self.keys.job(id))
            .key(self.keys.processing(worker))
            .key(self.keys.events(id))
            .arg(id)
            .arg(worker)
            .arg(now_ms())
            .arg(if with_spec { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await?;
        match reply.as_slice() {
            [start, spec, created, attempts] if start == "start" => Ok(StartOutcome::Start {
                spec: spec.clone(),
                created_ms: created.parse().unwrap_or(0),
                attempts: attempts.parse().unwrap_or(1),
            }),
            [_, status] => Ok(StartOutcome::Skip(status.clone())),
            _ => Err(QueueError::Corrupt {
                id: id.to_string(),
                message: format!("unexpected reply to start: {reply:?}"),
            }),
        }
    }

    /// Records a job's result, sets its keys to expire, then drops it from
    /// the worker's processing list (in one atomic step).
    pub async fn finish(
        &self,
        id: &str,
        worker: &str,
        result: &JobResult,
    ) -> Result<(), QueueError> {
        let json = serde_json::to_string(result).map_err(|e| QueueError::Corrupt {
            id: id.to_string(),
            message: e.to_string(),
        })?;
        let mut conn = self.conn().await?;
        let _: String = self
            .finish
            .key(self.keys.job(id))
            .key(self.keys.processing(worker))
            .key(self.keys.events(id))
            .key(self.keys.stdin(id))
            .arg(id)
            .arg(result.status.as_str())
            .arg(json)
            .arg(now_ms())
            .arg(self.result_ttl.as_secs().max(1))
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Gives back a job `worker` claimed but will not start (it is shutting
    /// down): in one atomic step the id leaves the processing list and, if
    /// the job is still queued, goes back to the head of the queue.
    pub async fn release(&self, id: &str, worker: &str) -> Result<ReleaseOutcome, QueueError> {
        let mut conn = self.conn().await?;
        let outcome: String = self
            .release
            .key(self.keys.queue())
            .key(self.keys.processing(worker))
            .key(self.keys.job(id))
            .arg(id)
            .invoke_async(&mut conn)
            .await?;
        Ok(match outcome.as_str() {
            "requeued" => ReleaseOutcome::Requeued,
            "dropped" => ReleaseOutcome::Dropped,
            _ => ReleaseOutcome::Absent,
        })
    }

    /// Refreshes a worker's heartbeat (and records the worker id).
    pub async fn heartbeat(
        &self,
        worker: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), QueueError> {
        let mut conn = self.conn().await?;
        redis::pipe()
            .pset_ex(
                self.keys.heartbeat(worker),
                value,
                (ttl.as_millis() as u64).max(1),
            )
            .ignore()
            .sadd(self.keys.workers(), worker)
            .ignore()
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Stores what a compatible API needs beside job `id` (written before
    /// the job is submitted). It outlives the job's own keys by a day, so a
    /// job that waited long in the queue still has it.
    pub async fn put_compat_record(&self, id: &str, json: &str) -> Result<(), QueueError> {
        let ttl = self.result_ttl.as_secs().max(1) * 2 + 86_400;
        let mut conn = self.conn().await?;
        let _: () = conn.set_ex(self.keys.compat(id), json, ttl).await?;
        Ok(())
    }

    /// The compat records of `ids`, in order (`None` where there is none).
    pub async fn compat_records(&self, ids: &[String]) -> Result<Vec<Option<String>>, QueueError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids.iter().map(|id| self.keys.compat(id)).collect();
        let mut conn = self.conn().await?;
        Ok(redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?)
    }

    /// Says which languages `worker` can run (it has their images), for as
    /// long as its heartbeat lives.
    pub async fn advertise_languages(
        &self,
        worker: &str,
        languages: &[&str],
        ttl: Duration,
    ) -> Result<(), QueueError> {
        let mut conn = self.conn().await?;
        let _: () = conn
            .pset_ex(
                self.keys.languages(worker),
                languages.join(","),
                (ttl.as_millis() as u64).max(1),
            )
            .await?;
        Ok(())
    }

    /// The languages the live workers can run: the union of what each
    /// advertised, or `None` when no live worker has said.
    pub async fn advertised_languages(
        &self,
    ) -> Result<Option<std::collections::BTreeSet<String>>, QueueError> {
        let mut conn = self.conn().await?;
        let workers: Vec<String> = conn.smembers(self.keys.workers()).await?;
        if workers.is_empty() {
            return Ok(None);
        }
        let keys: Vec<String> = workers.iter().map(|w| self.keys.languages(w)).collect();
        let lists: Vec<Option<String>> =
            redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
        let mut any = false;
        let mut languages = std::collections::BTreeSet::new();
        for list in lists.into_iter().flatten() {
            any = true;
            languages.extend(list.split(',').filter(|l| !l.is_empty()).map(String::from));
        }
        Ok(any.then_some(languages))
    }

    /// Removes a worker's heartbeat at a clean shutdown.
    pub async fn retire(&self, worker: &str) -> Result<(), QueueError> {
        let mut conn = self.conn().await?;
        redis::pipe()
            .del(self.keys.heartbeat(worker))
            .ignore()
            .srem(self.keys.workers(), worker)
            .ignore()
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Appends a running job's events (in order); returns the last `seq`, or
    /// `None` when the job is no longer running (nothing was appended).
    pub async fn append_events(
        &self,
        id: &str,
        events: &[JobEvent],
    ) -> Result<Option<u64>, QueueError> {
        if events.is_empty() {
            return Ok(None);
        }
        let mut invocation = self.append_events.key(self.keys.job(id));
        invocation.key(self.keys.events(id));
        for event in events {
            invocation.arg(event.to_json());
        }
        let mut conn = self.conn().await?;
        let seq: u64 = invocation.invoke_async(&mut conn).await?;
        Ok((seq > 0).then_some(seq))
    }

    /// The job's events after `after` (a `seq`), at most `count`; with
    /// `block`, waits that long for the first one (use a dedicated
    /// connection then). Empty when there are none (yet).
    pub async fn read_events(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        id: &str,
        after: u64,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<StoredEvent>, QueueError> {
        let mut options = redis::streams::StreamReadOptions::default().count(count);
        if let Some(block) = block {
            options = options.block(block.as_millis() as usize);
        }
        let start = format!("{after}-0");
        let reply: Option<redis::streams::StreamReadReply> = conn
            .xread_options(&[self.keys.events(id)], &[start.as_str()], &options)
            .await?;
        let mut events = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                let seq = entry
                    .id
                    .split_once('-')
                    .and_then(|(seq, _)| seq.parse().ok())
                    .unwrap_or(0);
                let json = match entry.map.get("event") {
                    Some(redis::Value::BulkString(bytes)) => {
                        String::from_utf8_lossy(bytes).into_owned()
                    }
                    _ => continue,
                };
                events.push(StoredEvent { seq, json });
            }
        }
        Ok(events)
    }

    /// Sends a control message (stdin, stdin close, a signal) to the worker
    /// running the job, through `job:<id>:stdin`. Messages sent while the job
    /// is queued wait there and are delivered in order once it starts.
    pub async fn send_control(&self, id: &str, control: &Control) -> Result<(), QueueError> {
        let fields = control_fields(control);
        let mut conn = self.conn().await?;
        let _: String = conn
            .xadd_maxlen(
                self.keys.stdin(id),
                redis::streams::StreamMaxlen::Approx(10_000),
                "*",
                &fields,
            )
            .await?;
        Ok(())
    }

    /// Sends a stream client's control message like [`Queue::send_control`],
    /// but only while the job is queued or running, and with its stdin
    /// counted against `max_stdin_bytes` per job (in the job hash, so every
    /// connection and every API replica shares the count): one atomic step.
    pub async fn send_input(
        &self,
        id: &str,
        control: &Control,
        max_stdin_bytes: u64,
    ) -> Result<InputOutcome, QueueError> {
        let bytes = match control {
            Control::Stdin(data) => data.len() as u64,
            _ => 0,
        };
        let mut invocation = self.send_input.key(self.keys.job(id));
        invocation
            .key(self.keys.stdin(id))
            .arg(max_stdin_bytes)
            .arg(bytes);
        for (name, value) in control_fields(control) {
            invocation.arg(name).arg(value);
        }
        let mut conn = self.conn().await?;
        let (outcome, detail): (String, String) = invocation.invoke_async(&mut conn).await?;
        Ok(match outcome.as_str() {
            "sent" => InputOutcome::Sent {
                stdin_bytes: detail.parse().unwrap_or(0),
            },
            "over" => InputOutcome::OverBudget {
                stdin_bytes: detail.parse().unwrap_or(0),
            },
            "ended" => InputOutcome::Ended(parse_status(id, &detail)?),
            _ => InputOutcome::Missing,
        })
    }

    /// A job's status alone; `None` when the job does not exist.
    pub async fn status(&self, id: &str) -> Result<Option<Status>, QueueError> {
        let mut conn = self.conn().await?;
        let status: Option<String> = conn.hget(self.keys.job(id), "status").await?;
        status.map(|s| parse_status(id, &s)).transpose()
    }

    /// Reads control messages for a job after stream id `after`, waiting up
    /// to [`BLOCK_TIMEOUT`] on a dedicated connection. Returns the last id
    /// read and the messages (unknown ones are skipped).
    pub async fn read_control(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        id: &str,
        after: &str,
    ) -> Result<(String, Vec<Control>), QueueError> {
        let options = redis::streams::StreamReadOptions::default()
            .block(BLOCK_TIMEOUT.as_millis() as usize)
            .count(100);
        let reply: Option<redis::streams::StreamReadReply> = conn
            .xread_options(&[self.keys.stdin(id)], &[after], &options)
            .await?;
        let mut last = after.to_string();
        let mut messages = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                last = entry.id.clone();
                if let Some(control) = control_from_entry(&entry.map) {
                    messages.push(control);
                }
            }
        }
        Ok((last, messages))
    }
}

/// The fields of a control message in `job:<id>:stdin`.
fn control_fields(control: &Control) -> Vec<(&'static str, String)> {
    use base64::Engine as _;
    match control {
        Control::Cancel => vec![("type", "cancel".into())],
        Control::StdinClose => vec![("type", "stdin_close".into())],
        Control::Stdin(data) => vec![
            ("type", "stdin".into()),
            (
                "data",
                base64::engine::general_purpose::STANDARD.encode(data),
            ),
        ],
        Control::Signal(signal) => vec![
            ("type", "signal".into()),
            (
                "signal",
                match signal {
                    crate::protocol::SignalKind::Interrupt => "interrupt",
                    crate::protocol::SignalKind::Kill => "kill",
                }
                .into(),
            ),
        ],
    }
}

fn control_from_entry(map: &HashMap<String, redis::Value>) -> Option<Control> {
    use base64::Engine as _;
    let text = |name: &str| -> Option<String> {
        match map.get(name)? {
            redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            redis::Value::SimpleString(text) => Some(text.clone()),
            _ => None,
        }
    };
    match text("type")?.as_str() {
        "cancel" => Some(Control::Cancel),
        "stdin_close" => Some(Control::StdinClose),
        "stdin" => base64::engine::general_purpose::STANDARD
            .decode(text("data")?)
            .ok()
            .map(Control::Stdin),
        "signal" => match text("signal")?.as_str() {
            "interrupt" => Some(Control::Signal(crate::protocol::SignalKind::Interrupt)),
            "kill" => Some(Control::Signal(crate::protocol::SignalKind::Kill)),
            _ => None,
        },
        _ => None,
    }
}

fn parse_status(id: &str, text: &str) -> Result<Status, QueueError> {
    serde_json::from_value(serde_json::Value::String(text.to_string())).map_err(|_| {
        QueueError::Corrupt {
            id: id.to_string(),
            message: format!("unknown status {text:?}"),
        }
    })
}

/// The fields of `job:<id>` a [`JobRecord`] is read from (not `spec`).
const RECORD_FIELDS: &[&str] = &[
    "status",
    "language",
    "api_key",
    "attempts",
    "worker",
    "created_ms",
    "started_ms",
    "finished_ms",
    "metadata",
    "result",
];

fn record_from_fields(
    id: &str,
    mut fields: HashMap<String, String>,
) -> Result<JobRecord, QueueError> {
    let corrupt = |message: String| QueueError::Corrupt {
        id: id.to_string(),
        message,
    };
    let number = |value: Option<&String>| value.and_then(|v| v.parse::<u64>().ok());
    let status = parse_status(id, fields.get("status").map_or("", String::as_str))?;
    let result = match fields.get("result") {
        Some(json) => {
            Some(serde_json::from_str(json).map_err(|e| corrupt(format!("result: {e}")))?)
        }
        None => None,
    };
    let metadata = fields
        .get("metadata")
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default();
    Ok(JobRecord {
        id: id.to_string(),
        status,
        language: fields.remove("language").unwrap_or_default(),
        api_key: fields.remove("api_key").unwrap_or_default(),
        attempts: number(fields.get("attempts")).unwrap_or(0) as u32,
        worker: fields.remove("worker"),
        created_ms: number(fields.get("created_ms")).unwrap_or(0),
        started_ms: number(fields.get("started_ms")),
        finished_ms: number(fields.get("finished_ms")),
        metadata,
        result,
        spec: fields.remove("spec"),
    })
}
