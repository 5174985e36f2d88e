//! Redis: the shared state of the fleet, and the only module
//! that names a key ([`keys`]). [`Store`] is one handle on it, made of
//! parts split by what they keep:
//!
//! - [`Store::jobs`] — the job's life ([`job`]): submit, claim, start,
//!   append events, send input, finish, cancel, release, reap, give up
//!   overdue — one file and one Lua script per step, every status change
//!   checked against the one transition table
//!   ([`crate::job::lifecycle`]) — and the reads of a job;
//! - [`Store::events`] — reading jobs' events streams ([`events`]);
//! - [`Store::workers`] — workers' presence: heartbeats, the fleet, the
//!   languages they run ([`workers`]);
//! - [`Store::tokens`] — the shared attach-token secret ([`tokens`]);
//! - [`Store::compat`] — the compatible APIs' records ([`compat`]);
//! - [`Store::capacity`] — the warm capacity schedule ([`capacity`]);
//! - [`Store::overview`] — the dashboard's reads ([`overview`]);
//! - [`Store::history`] — the run history: a key's jobs, newest first
//!   ([`history`]);
//! - [`Store::usage`] — the usage ledger's reads ([`usage`]; the steps
//!   write it);
//! - [`Store::files`] — files by digest, in the key's storage account
//!   ([`files`]);
//! - [`Store::redis_health`] and [`Store::redis_uptime`] — what the Redis
//!   in use keeps ([`health`]).
//!
//! Every part shares one connection ([`redis`]): a pool for ordinary
//! commands, dedicated connections for blocking ones.
//!
//! Keys, all under an optional prefix:
//! - `jobs:queue` — list of turns (`turn`), one per queued job, so its
//!   length is the number of queued jobs (LPUSH by submit; a worker claims
//!   with `BLMOVE jobs:queue worker:<wid>:processing RIGHT LEFT`, then the
//!   claim script puts the job whose turn it is in the turn's place; see
//!   [`job::claim`]). An entry that is a job id was queued before fair
//!   turns and is claimed as it is.
//! - `jobs:tenants` — list, the ring of API keys with queued jobs: each
//!   entry is the key's users ring; `jobs:tenants:turns` — hash: claims
//!   each key took in its current turn; `jobs:tenants:weights` — hash:
//!   each key's weight (claims per turn), set by submit.
//! - `jobs:claims` — string, a counter: jobs claimed since the store began
//!   (`claim.lua`); queued jobs' waits are estimated from its rate.
//! - `apikey:<name>:users` — list, the ring of the key's users with queued
//!   jobs: each entry is the user's queue; `apikey:<name>:queue:<user>` —
//!   list: the user's queued job ids, oldest at the claim end (`<user>` is
//!   empty for the key's anonymous user).
//! - `apikey:<name>:user_active` — hash: queued + running jobs per user;
//!   `apikey:<name>:rate:<user>` — the user's submission rate (GCRA's
//!   theoretical arrival time, expiring within a minute).
//! - `job:<id>` — hash: spec, status, attempts (starts), max attempts,
//!   worker, its Docker host, api key, timestamps, the result (JSON without
//!   its output) and its output (`out:<stage>:<stream>`, raw bytes),
//!   `requeues` (times the reaper put it back after its worker died before
//!   starting it), the late-result record (`lost_worker`, `lost_attempt`,
//!   `lost_until`, `verdict_seq`), the wall budget resolved at submit
//!   (`wall_budget_ms`) and the deadline stored at start (`deadline_ms`),
//!   who it is for (`user`, empty for the key's anonymous user) and the
//!   names of its user's queue, users ring and active count, and the
//!   counters of its budgets. Expires
//!   the counters of its budgets, where its usage goes (`usage_key`, the
//!   ledger's key without the day, and `usage_ttl`, set at submit) and
//!   what of it was counted (`counted_in`, `counted_until`,
//!   `counted_jobs`, `counted_cpu_ms`, `counted_wall_ms`,
//!   `counted_output_bytes`). Expires
//!   `RESULT_TTL` after the job ends.
//! - `job:<id>:stdin` — stream of control messages for the job's worker
//!   (`cancel`, stdin, stdin close, signals); never trimmed, every message
//!   counted against the job's budgets instead.
//! - `job:<id>:events` — stream of the job's events (see [`events`]).
//! - `apikey:<name>:stored` — hash: the bytes each live job (`j:<id>`),
//!   idempotency record (`i:<key>`) and file (`f:<sha256>`) of the key
//!   holds, and their `total`; `apikey:<name>:expiry` — sorted set: when
//!   each of them expires (`storage.lua` releases them).
//! - `file:<name>:<sha256>` — string: the bytes of a key's file, expiring
//!   when unused for its keep time (see [`files`]).
//! - `feeds:<instance>:doorbell` — a tiny stream an API process rings to
//!   wake its own events reader (expires on its own); see [`doorbell`].
//! - `worker:<wid>:doorbell` — the same for a worker's control reader.
//! - `worker:<wid>:processing` — list of the ids a worker has claimed (and
//!   the turn of a claim between its two halves).
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
//! - `apikey:<name>:history` — sorted set: the key's job ids scored by
//!   `created_ms`, the run history ([`history`]); submit adds the job and
//!   trims the set to the history window (`CODE_RUNNER_HISTORY_DAYS`),
//!   which is also its expiry. `apikey:<name>:history:<user>` — the same
//!   for one user of the key (jobs with a `user` only).
//! - `job:<id>:summary` — hash: what the history shows of a job (status,
//!   language, user, `created_ms`, `started_ms`, `finished_ms`, `reason`,
//!   `cpu_ms`, `wall_ms`), written at submit and updated by every status
//!   change after it (`note_history` in `job/lib.lua`); expires with the
//!   history window after submit, whatever the result TTL. Not counted in
//!   the key's storage budget.
//! - `usage:<api key name>:<YYYY-MM-DD>` — hash: the key's usage ledger
//!   of one UTC day: `jobs`, `cpu_ms`, `wall_ms`, `output_bytes` of the
//!   jobs that ended that day, `submitted` (jobs accepted that day), and
//!   each user's as `<figure>:<user>`; expires the usage retention after
//!   the day ends (see [`usage`]).

pub mod capacity;
pub mod compat;
mod doorbell;
pub mod events;
pub mod files;
pub mod health;
pub mod history;
pub mod job;
mod keys;
pub mod overview;
mod redis;
pub mod tokens;
pub mod usage;
pub mod workers;

pub use capacity::{Capacity, CapacityEntry, MAX_ENTRIES, PutOutcome};
pub use events::{Events, FeedRead};
pub use files::{ByteStream, FileBackend, FilePut, Files, PutFailure, StreamError};
pub use health::{RedisHealth, RedisWarning};
pub use history::{History, HistoryEntry, HistoryPage, HistoryPosition, HistoryQuery};
pub use job::cancel::CancelOutcome;
pub use job::claim::{ClaimOutcome, TURN};
pub use job::control::{Control, ControlRead};
pub use job::finish::FinishOutcome;
pub use job::give_up_overdue::RunningJob;
pub use job::places::Places;
pub use job::reap::{LostJob, LostResults, ReapOutcome, ReapPolicy, Retry};
pub use job::record::JobRecord;
pub use job::release::ReleaseOutcome;
pub use job::send_input::{InputBudgets, InputOutcome};
pub use job::start::{Skipped, StartOutcome, Started};
pub use job::submit::{Admission, NewJob, SubmitOutcome, storage_reserve};
pub use job::{EVENT_OVERHEAD, IDEMPOTENCY_BYTES, JOB_OVERHEAD, Jobs, MAX_OUTPUT_EVENTS};
pub use keys::Keys;
pub use overview::{JobSummary, LiveWorker, Overview, RECENT_JOBS_KEPT};
pub use tokens::Tokens;
pub use usage::{Day, DayUsage, Figures, Quota, Quotas, Usage};
pub use workers::{Fleet, ForgetOutcome, Heartbeat, WarmFigures, Workers};

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis as redis_crate;

use crate::job::Status;
pub use compat::CompatRecords;
use redis::Redis;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis is unavailable: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("redis command failed: {0}")]
    Redis(#[from] redis_crate::RedisError),
    #[error("cannot set up the redis pool: {0}")]
    CreatePool(#[from] deadpool_redis::CreatePoolError),
    #[error("job {id} is corrupt in redis: {message}")]
    Corrupt { id: String, message: String },
    /// The object storage of the file store's S3 backend failed.
    #[error("the file store's object storage failed: {0}")]
    Objects(String),
    /// A script answered something it never answers: a bug, or another
    /// version of the scripts on the same Redis.
    #[error("the {script} script gave an unexpected reply: {reply}")]
    UnexpectedReply { script: &'static str, reply: String },
    /// A step tried a status move the job's transition table does not
    /// allow; the script wrote nothing.
    #[error("the {step} step may not move a job from {from} to {to}; nothing was written")]
    Refused {
        step: &'static str,
        from: String,
        to: String,
    },
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

/// Handle on the shared state; see the module documentation. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Store {
    redis: Redis,
    jobs: Jobs,
    events: Events,
    workers: Workers,
    tokens: Tokens,
    compat: CompatRecords,
    capacity: Capacity,
    overview: Overview,
    history: History,
    usage: Usage,
    files: Files,
}

impl Store {
    /// Sets up the pool; does not connect yet (the first command does).
    pub fn new(
        url: &str,
        prefix: &str,
        result_ttl: Duration,
        pool_size: usize,
    ) -> Result<Self, StoreError> {
        Ok(Self::from_redis(Redis::new(
            url, prefix, result_ttl, pool_size,
        )?))
    }

    fn from_redis(redis: Redis) -> Self {
        Self {
            jobs: Jobs::new(redis.clone()),
            events: Events::new(redis.clone()),
            workers: Workers::new(redis.clone()),
            tokens: Tokens::new(redis.clone()),
            compat: CompatRecords::new(redis.clone()),
            capacity: Capacity::new(redis.clone()),
            overview: Overview::new(redis.clone()),
            history: History::new(redis.clone()),
            usage: Usage::new(redis.clone()),
            files: Files::new(Arc::new(files::redis::RedisFiles::new(redis.clone()))),
            redis,
        }
    }

    /// The same store, listing jobs in the run history for `window`
    /// (default [`history::DEFAULT_WINDOW`]) instead: what submit writes
    /// and what the history reads.
    pub fn with_history_window(self, window: Duration) -> Self {
        let mut redis = self.redis;
        redis.history_window = window;
        Self::from_redis(redis)
    }

    /// The same store, keeping each day of the usage ledger `retention`
    /// after it ends (default [`usage::DEFAULT_RETENTION_DAYS`]); a job
    /// takes the retention of the store it was submitted through.
    pub fn with_usage_retention(self, retention: Duration) -> Self {
        let mut redis = self.redis;
        redis.usage_retention = retention;
        Self::from_redis(redis)
    }

    /// The job's life and the reads of a job.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// Jobs' events streams.
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// Workers' presence.
    pub fn workers(&self) -> &Workers {
        &self.workers
    }

    /// The shared attach-token secret.
    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// The compatible APIs' records.
    pub fn compat(&self) -> &CompatRecords {
        &self.compat
    }

    /// The warm capacity schedule.
    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    /// The dashboard's reads.
    pub fn overview(&self) -> &Overview {
        &self.overview
    }

    /// The run history's reads.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The same store, keeping files' bytes in S3-compatible object
    /// storage (`CODE_RUNNER_FILE_BACKEND=s3`) instead of Redis.
    pub fn with_s3_files(self, objects: files::s3::Objects) -> Self {
        let files = Files::new(Arc::new(files::s3::S3Files::new(
            self.redis.clone(),
            objects,
        )));
        Self { files, ..self }
    }

    /// The usage ledger's reads.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// Files by digest.
    pub fn files(&self) -> &Files {
        &self.files
    }

    pub fn keys(&self) -> &Keys {
        &self.redis.keys
    }

    pub fn result_ttl(&self) -> Duration {
        self.redis.result_ttl
    }

    /// How long the run history lists a job.
    pub fn history_window(&self) -> Duration {
        self.redis.history_window
    }

    /// A connection of its own, for blocking commands (claims, control
    /// and events reads); its response timeout leaves room for the block.
    pub async fn dedicated(&self) -> Result<redis_crate::aio::MultiplexedConnection, StoreError> {
        self.redis.dedicated().await
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
