//! Redis: the shared state of the fleet (DESIGN §6). This is the only module
//! that knows key names; the API and the worker call its operations.
//!
//! Keys, all under an optional prefix:
//! - `jobs:queue` — list of pending job ids (LPUSH by the API; a worker claims
//!   with `BLMOVE jobs:queue worker:<wid>:processing RIGHT LEFT`).
//! - `job:<id>` — hash: spec, status, attempts (starts), max attempts,
//!   worker, its Docker host, api key, timestamps, the result (JSON without
//!   its output) and its output (`out:<stage>:<stream>`, raw bytes),
//!   `requeues` (times the reaper put it back after its worker died before
//!   starting it), the late-result record (`lost_worker`, `lost_attempt`,
//!   `lost_until`, `verdict_seq`) and the counters of its budgets. Expires
//!   `RESULT_TTL` after the job ends.
//! - `job:<id>:stdin` — stream of control messages for the job's worker
//!   (`cancel`, stdin, stdin close, signals); never trimmed, every message
//!   counted against the job's budgets instead.
//! - `job:<id>:events` — stream of the job's events (see [`events`]).
//! - `apikey:<name>:stored` — hash: the bytes each live job (`j:<id>`) and
//!   idempotency record (`i:<key>`) of the key holds, and their `total`;
//!   `apikey:<name>:expiry` — sorted set: when each of them expires.
//! - `feeds:<instance>:doorbell` — a tiny stream an API process rings to
//!   wake its own events reader (expires on its own).
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
mod control;
mod events;
mod health;
mod overview;
mod reap;
mod scripts;

pub use capacity::{CapacityEntry, MAX_ENTRIES, PutOutcome};
pub use control::{Control, InputBudgets, InputOutcome};
pub use events::FeedRead;
pub use health::{RedisHealth, RedisWarning};
pub use overview::{JobSummary, LiveWorker, RECENT_JOBS_KEPT};
pub use reap::{
    Fleet, ForgetOutcome, LostJob, LostResults, ReapOutcome, ReapPolicy, Retry, RunningJob,
};
pub use scripts::{EVENT_OVERHEAD, IDEMPOTENCY_BYTES, JOB_OVERHEAD, MAX_OUTPUT_EVENTS};

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, AsyncCommands, Script};
use serde::{Deserialize, Serialize};

use crate::job::{JobResult, JobSpec, Status};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis is unavailable: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("redis command failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("cannot set up the redis pool: {0}")]
    CreatePool(#[from] deadpool_redis::CreatePoolError),
    #[error("job {id} is corrupt in redis: {message}")]
    Corrupt { id: String, message: String },
    /// A script answered something it never answers: a bug, or another
    /// version of the scripts on the same Redis.
    #[error("the {script} script gave an unexpected reply: {reply}")]
    UnexpectedReply { script: &'static str, reply: String },
}

impl StoreError {
    /// Whether Redis is simply not there (yet): nothing accepts the
    /// connection, or it timed out. Not a TLS, authentication or protocol
    /// failure, which waiting does not mend.
    pub fn is_unreachable(&self) -> bool {
        let redis_error = match self {
            StoreError::Pool(deadpool_redis::PoolError::Timeout(_)) => return true,
            StoreError::Pool(deadpool_redis::PoolError::Backend(error))
            | StoreError::Redis(error) => error,
            _ => return false,
        };
        redis_error.is_connection_refusal() || redis_error.is_timeout()
    }
}

fn unexpected(script: &'static str, reply: impl std::fmt::Debug) -> StoreError {
    StoreError::UnexpectedReply {
        script,
        reply: format!("{reply:?}"),
    }
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
    pub fn stored(&self, api_key: &str) -> String {
        format!("{}apikey:{api_key}:stored", self.prefix)
    }
    pub fn expiry(&self, api_key: &str) -> String {
        format!("{}apikey:{api_key}:expiry", self.prefix)
    }
    pub fn doorbell(&self, instance: &str) -> String {
        format!("{}feeds:{instance}:doorbell", self.prefix)
    }
}

/// A job as stored in `job:<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    pub status: Status,
    pub language: String,
    pub api_key: String,
    /// How many times the job was started (0 while it never was).
    pub attempts: u32,
    /// Most times it may be started (1: never run again after its worker
    /// was lost).
    pub max_attempts: u32,
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
    pub admission: Admission,
}

/// What a new job is admitted under: the queue and API key limits it must
/// fit, and what it may use once admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub max_queue_depth: u64,
    /// Most queued + running jobs of this API key (`None`: no limit).
    pub key_limit: Option<u64>,
    /// Most times the job may be started (see [`JobRecord::max_attempts`]).
    pub max_attempts: u32,
    /// The most output the job's stages may write, in bytes: with the size
    /// of the stored spec it makes the job's [`storage_reserve`], held
    /// against the key's budget until it ends.
    pub output_limit_bytes: u64,
    /// The API key's storage budget, in bytes.
    pub storage_budget: u64,
}

/// The most a job can come to hold in Redis, reserved from its API key's
/// storage budget while it is queued or running: its spec, its output
/// twice (events and result, each capped at the stages' output limits, raw
/// bytes), the entries of its output events and the job's fixed overhead.
/// Stdin a client sends is counted as it comes, not reserved.
pub fn storage_reserve(spec_bytes: u64, output_limit_bytes: u64) -> u64 {
    spec_bytes + 2 * output_limit_bytes + MAX_OUTPUT_EVENTS * EVENT_OVERHEAD + JOB_OVERHEAD
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
    /// The key's jobs hold `held` bytes and this one, which would reserve
    /// `needed`, would take the key over its storage budget.
    KeyStorage {
        held: u64,
        needed: u64,
    },
}

impl SubmitOutcome {
    fn from_reply(outcome: &str, detail: String, reserve: u64) -> Result<Self, StoreError> {
        let number = |detail: &str| {
            detail
                .parse()
                .map_err(|_| unexpected("submit", (outcome, detail)))
        };
        Ok(match outcome {
            "accepted" => SubmitOutcome::Accepted,
            "existing" => SubmitOutcome::Existing(detail),
            "conflict" => SubmitOutcome::Conflict(detail),
            "queue_full" => SubmitOutcome::QueueFull {
                depth: number(&detail)?,
            },
            "key_limit" => SubmitOutcome::KeyLimit {
                active: number(&detail)?,
            },
            "key_storage" => SubmitOutcome::KeyStorage {
                held: number(&detail)?,
                needed: reserve,
            },
            _ => return Err(unexpected("submit", (outcome, detail))),
        })
    }
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

impl ReleaseOutcome {
    fn from_reply(reply: &str) -> Result<Self, StoreError> {
        Ok(match reply {
            "requeued" => ReleaseOutcome::Requeued,
            "dropped" => ReleaseOutcome::Dropped,
            "absent" => ReleaseOutcome::Absent,
            _ => return Err(unexpected("release", reply)),
        })
    }
}

/// What became of a result a worker wrote ([`Store::finish`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishOutcome {
    /// The result of the worker's own running attempt: it is the job's.
    Finished,
    /// The real result of an attempt the platform had given up on, within
    /// the late-result window: it replaced the verdict (or the retry).
    Late,
    /// Not this attempt's to settle any more (the job ended otherwise, or
    /// another attempt holds it); it had this status. Only dropped from the
    /// processing list.
    Stale(Status),
    /// The job is gone (expired).
    Missing,
}

impl FinishOutcome {
    fn from_reply(id: &str, reply: &str) -> Result<Self, StoreError> {
        Ok(match reply {
            "finished" => FinishOutcome::Finished,
            "late" => FinishOutcome::Late,
            "missing" => FinishOutcome::Missing,
            _ => match reply.strip_prefix("stale:") {
                Some(status) => FinishOutcome::Stale(parse_status(id, status)?),
                None => return Err(unexpected("finish", reply)),
            },
        })
    }
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

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long the real result of an attempt the platform gave up on (a
/// `worker_lost` or `deadline_exceeded` verdict, or a retry) may still come
/// and win: its worker was alive after all (cut off from Redis, or slow).
/// After it, the verdict is final.
pub const LATE_RESULT_WINDOW: Duration = Duration::from_secs(600);

/// How long a blocking read waits at most before returning to its loop.
pub const BLOCK_TIMEOUT: Duration = Duration::from_secs(1);

/// Handle on the shared state: a pool for ordinary commands, and a client for
/// the dedicated connections blocking commands need (so they never hold a
/// pooled connection).
#[derive(Clone)]
pub struct Store {
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

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("keys", &self.keys).finish()
    }
}

impl Store {
    /// Sets up the pool; does not connect yet (the first command does).
    pub fn new(
        url: &str,
        prefix: &str,
        result_ttl: Duration,
        pool_size: usize,
    ) -> Result<Self, StoreError> {
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
                StoreError::CreatePool(deadpool_redis::CreatePoolError::Build(error))
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

    async fn conn(&self) -> Result<deadpool_redis::Connection, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// A connection of its own, for blocking commands; its response timeout
    /// leaves room for the block.
    pub async fn dedicated(&self) -> Result<redis::aio::MultiplexedConnection, StoreError> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(BLOCK_TIMEOUT + Duration::from_secs(5)));
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    pub async fn queue_depth(&self) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        Ok(conn.llen(self.keys.queue()).await?)
    }

    /// Enqueues a job, atomically with the admission checks and the
    /// idempotency record.
    pub async fn submit(&self, job: NewJob<'_>) -> Result<SubmitOutcome, StoreError> {
        let spec = serde_json::to_string(job.spec).map_err(|e| StoreError::Corrupt {
            id: job.id.to_string(),
            message: e.to_string(),
        })?;
        // The reserve counts the spec as stored: the JSON just made.
        let reserve = storage_reserve(spec.len() as u64, job.admission.output_limit_bytes);
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
            .key(self.keys.stored(job.api_key))
            .key(self.keys.expiry(job.api_key))
            .arg(job.id)
            .arg(spec)
            .arg(job.api_key)
            .arg(job.language)
            .arg(now_ms())
            .arg(job.admission.max_queue_depth)
            .arg(job.admission.key_limit.unwrap_or(0))
            .arg(body_hash)
            .arg(self.result_ttl.as_secs().max(1) * 24)
            .arg(metadata)
            .arg(RECENT_JOBS_KEPT - 1)
            .arg(job.admission.max_attempts)
            .arg(reserve)
            .arg(job.admission.storage_budget)
            .arg(format!("i:{}", job.idempotency.map_or("", |(key, _)| key)))
            .invoke_async(&mut conn)
            .await?;
        SubmitOutcome::from_reply(&outcome, detail, reserve)
    }

    /// Reads a job (without its spec, which can be large and no reader of
    /// a record needs); `None` when it does not exist (never did, or
    /// expired).
    pub async fn get(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let (values, outputs): (Vec<Option<String>>, Vec<Option<Vec<u8>>>) = redis::pipe()
            .cmd("HMGET")
            .arg(self.keys.job(id))
            .arg(RECORD_FIELDS)
            .cmd("HMGET")
            .arg(self.keys.job(id))
            .arg(OUTPUT_FIELDS)
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
        record_from_fields(id, fields, outputs).map(Some)
    }

    /// A job's whole result (with its output), if it has one.
    pub async fn result(&self, id: &str) -> Result<Option<JobResult>, StoreError> {
        let mut conn = self.conn().await?;
        let (json, outputs): (Option<String>, Vec<Option<Vec<u8>>>) = redis::pipe()
            .hget(self.keys.job(id), "result")
            .cmd("HMGET")
            .arg(self.keys.job(id))
            .arg(OUTPUT_FIELDS)
            .query_async(&mut conn)
            .await?;
        json.map(|json| result_from_parts(id, &json, outputs))
            .transpose()
    }

    /// Cancels a job: a queued one never starts; a running one is killed by
    /// its worker.
    pub async fn cancel(
        &self,
        id: &str,
        cancelled: &JobResult,
    ) -> Result<CancelOutcome, StoreError> {
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
            other => match other.strip_prefix("finished:") {
                Some(status) => CancelOutcome::AlreadyFinished(parse_status(id, status)?),
                None => return Err(unexpected("cancel", other)),
            },
        })
    }

    /// The secret attach tokens are signed with: `candidate` if no API
    /// replica stored one before, else the stored one (`SET NX`, then `GET`,
    /// in one transaction), so every replica signs with the same secret.
    pub async fn shared_token_secret(&self, candidate: &str) -> Result<String, StoreError> {
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
    ) -> Result<Option<String>, StoreError> {
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
        host: &str,
        with_spec: bool,
    ) -> Result<StartOutcome, StoreError> {
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
            .arg(host)
            .invoke_async(&mut conn)
            .await?;
        match reply.as_slice() {
            [start, spec, created, attempts] if start == "start" => Ok(StartOutcome::Start {
                spec: spec.clone(),
                created_ms: created.parse().map_err(|_| unexpected("start", &reply))?,
                attempts: attempts.parse().map_err(|_| unexpected("start", &reply))?,
            }),
            [skip, status] if skip == "skip" => Ok(StartOutcome::Skip(status.clone())),
            _ => Err(unexpected("start", reply)),
        }
    }

    /// Records the result of `worker`'s `attempt` at a job, sets its keys
    /// to expire, then drops it from the worker's processing list (in one
    /// atomic step); see [`FinishOutcome`] for a result that comes late.
    pub async fn finish(
        &self,
        id: &str,
        worker: &str,
        attempt: u32,
        result: &JobResult,
    ) -> Result<FinishOutcome, StoreError> {
        let (bare, outputs) = result.split_output();
        let json = serde_json::to_string(&bare).map_err(|e| StoreError::Corrupt {
            id: id.to_string(),
            message: e.to_string(),
        })?;
        let mut conn = self.conn().await?;
        let mut invocation = self.finish.key(self.keys.job(id));
        invocation
            .key(self.keys.processing(worker))
            .key(self.keys.events(id))
            .key(self.keys.stdin(id))
            .key(self.keys.queue())
            .arg(id)
            .arg(result.status.as_str())
            .arg(json)
            .arg(now_ms())
            .arg(self.result_ttl.as_secs().max(1))
            .arg(worker)
            .arg(attempt);
        for output in &outputs {
            invocation.arg(output.as_slice());
        }
        let reply: String = invocation.invoke_async(&mut conn).await?;
        FinishOutcome::from_reply(id, &reply)
    }

    /// Gives back a job `worker` claimed but will not start (it is shutting
    /// down): in one atomic step the id leaves the processing list and, if
    /// the job is still queued, goes back to the head of the queue.
    pub async fn release(&self, id: &str, worker: &str) -> Result<ReleaseOutcome, StoreError> {
        let mut conn = self.conn().await?;
        let outcome: String = self
            .release
            .key(self.keys.queue())
            .key(self.keys.processing(worker))
            .key(self.keys.job(id))
            .arg(id)
            .invoke_async(&mut conn)
            .await?;
        ReleaseOutcome::from_reply(&outcome)
    }

    /// Refreshes a worker's heartbeat (and records the worker id).
    pub async fn heartbeat(
        &self,
        worker: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
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
    pub async fn put_compat_record(&self, id: &str, json: &str) -> Result<(), StoreError> {
        let ttl = self.result_ttl.as_secs().max(1) * 2 + 86_400;
        let mut conn = self.conn().await?;
        let _: () = conn.set_ex(self.keys.compat(id), json, ttl).await?;
        Ok(())
    }

    /// The compat records of `ids`, in order (`None` where there is none).
    pub async fn compat_records(&self, ids: &[String]) -> Result<Vec<Option<String>>, StoreError> {
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
    ) -> Result<(), StoreError> {
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
    ) -> Result<Option<std::collections::BTreeSet<String>>, StoreError> {
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

    /// A job's status and the `seq` of its last event, read together (the
    /// terminal status and the `exit` event are written in one step);
    /// `None` when the job does not exist.
    pub async fn status_and_position(&self, id: &str) -> Result<Option<(Status, u64)>, StoreError> {
        let mut conn = self.conn().await?;
        let (status, seq): (Option<String>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.keys.job(id))
            .arg("status")
            .arg("event_seq")
            .query_async(&mut conn)
            .await?;
        match status {
            None => Ok(None),
            Some(status) => Ok(Some((parse_status(id, &status)?, seq.unwrap_or(0)))),
        }
    }

    /// Removes a worker's heartbeat at a clean shutdown.
    pub async fn retire(&self, worker: &str) -> Result<(), StoreError> {
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
}

fn parse_status(id: &str, text: &str) -> Result<Status, StoreError> {
    serde_json::from_value(serde_json::Value::String(text.to_string())).map_err(|_| {
        StoreError::Corrupt {
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
    "max_attempts",
    "worker",
    "created_ms",
    "started_ms",
    "finished_ms",
    "metadata",
    "result",
];

/// The hash fields of a result's output, in [`JobResult::split_output`]'s
/// order (the scripts' `OUT_FIELDS`).
const OUTPUT_FIELDS: &[&str] = &[
    "out:compile:stdout",
    "out:compile:stderr",
    "out:run:stdout",
    "out:run:stderr",
];

/// A result from its stored JSON and its output fields.
fn result_from_parts(
    id: &str,
    json: &str,
    outputs: Vec<Option<Vec<u8>>>,
) -> Result<JobResult, StoreError> {
    let bare: JobResult = serde_json::from_str(json).map_err(|e| StoreError::Corrupt {
        id: id.to_string(),
        message: format!("result: {e}"),
    })?;
    let mut parts: [Vec<u8>; 4] = Default::default();
    for (part, output) in parts.iter_mut().zip(outputs) {
        *part = output.unwrap_or_default();
    }
    Ok(bare.with_output(parts))
}

fn record_from_fields(
    id: &str,
    mut fields: HashMap<String, String>,
    outputs: Vec<Option<Vec<u8>>>,
) -> Result<JobRecord, StoreError> {
    let number = |value: Option<&String>| value.and_then(|v| v.parse::<u64>().ok());
    let status = parse_status(id, fields.get("status").map_or("", String::as_str))?;
    let result = match fields.get("result") {
        Some(json) => Some(result_from_parts(id, json, outputs)?),
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
        max_attempts: number(fields.get("max_attempts")).unwrap_or(1) as u32,
        worker: fields.remove("worker"),
        created_ms: number(fields.get("created_ms")).unwrap_or(0),
        started_ms: number(fields.get("started_ms")),
        finished_ms: number(fields.get("finished_ms")),
        metadata,
        result,
        spec: fields.remove("spec"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unexpected_script_replies_are_errors() {
        assert!(matches!(
            SubmitOutcome::from_reply("nonsense", String::new(), 0),
            Err(StoreError::UnexpectedReply {
                script: "submit",
                ..
            })
        ));
        assert!(matches!(
            SubmitOutcome::from_reply("key_limit", "lots".into(), 0),
            Err(StoreError::UnexpectedReply { .. })
        ));
        assert_eq!(
            SubmitOutcome::from_reply("key_limit", "3".into(), 0).unwrap(),
            SubmitOutcome::KeyLimit { active: 3 }
        );
        assert_eq!(
            SubmitOutcome::from_reply("key_storage", "77".into(), 1024).unwrap(),
            SubmitOutcome::KeyStorage {
                held: 77,
                needed: 1024
            }
        );
        assert!(matches!(
            ReleaseOutcome::from_reply("gone"),
            Err(StoreError::UnexpectedReply {
                script: "release",
                ..
            })
        ));
        assert_eq!(
            ReleaseOutcome::from_reply("absent").unwrap(),
            ReleaseOutcome::Absent
        );
        assert!(FinishOutcome::from_reply("j", "weird").is_err());
        assert_eq!(
            FinishOutcome::from_reply("j", "stale:succeeded").unwrap(),
            FinishOutcome::Stale(Status::Succeeded)
        );
    }

    #[test]
    fn a_reserve_covers_the_output_twice_and_the_overheads() {
        assert_eq!(
            storage_reserve(100, 1 << 20),
            100 + (2 << 20) + MAX_OUTPUT_EVENTS * EVENT_OVERHEAD + JOB_OVERHEAD
        );
    }
}
