//! The API role's settings: listen address, keys, per-key limits, streams and tokens.

use clap::Args;

use super::{CompatSettings, ConfigError, WebSettings};
use crate::api::{ApiKeys, MIN_SECRET_BYTES};

/// The API role.
#[derive(Debug, Clone, Args)]
pub struct ApiSettings {
    /// Address the HTTP API listens on.
    #[arg(long, env = "CODE_RUNNER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,

    /// API keys: `name:key[:option]...` separated by commas (options:
    /// admin, max_active, weight, max_active_per_user, user_rate_per_minute);
    /// max_active caps the key's queued + running jobs; admin is the scope
    /// fleet-wide settings (the warm capacity schedule) need.
    #[arg(long, env = "CODE_RUNNER_API_KEYS", hide_env_values = true)]
    pub api_keys: Option<String>,

    /// Submissions are refused (429) once this many jobs are queued.
    #[arg(long, env = "CODE_RUNNER_MAX_QUEUE_DEPTH", default_value_t = 1000)]
    pub max_queue_depth: u64,

    /// Largest request body, in bytes (413 above it).
    #[arg(long, env = "CODE_RUNNER_MAX_BODY_BYTES", default_value_t = 32 << 20)]
    pub max_body_bytes: usize,

    /// Longest `?wait=true` blocks before answering with the job's status, in
    /// milliseconds.
    #[arg(long, env = "CODE_RUNNER_MAX_WAIT_MS", default_value_t = 60000)]
    pub max_wait_ms: u64,

    /// Secret for signing job attach tokens (shared by every API replica),
    /// at least 32 bytes; when unset, replicas derive one from a salt they
    /// share through Redis and their API keys.
    #[arg(long, env = "CODE_RUNNER_TOKEN_SECRET", hide_env_values = true)]
    pub token_secret: Option<String>,

    /// How long an attach token stays valid, in seconds.
    #[arg(long, env = "CODE_RUNNER_TOKEN_TTL_SECS", default_value_t = 3600)]
    pub token_ttl_secs: u64,

    /// Most times a batch job is started: when its worker is lost while it
    /// runs, it runs again on another worker until it has been started this
    /// often (1: never again, it ends `worker_lost`). A job may ask for its
    /// own `max_attempts` (1–10); interactive jobs always run at most once.
    #[arg(long, env = "CODE_RUNNER_MAX_ATTEMPTS", default_value_t = 1)]
    pub max_attempts: u32,

    /// `max_active` of a key that does not give its own: most queued +
    /// running jobs of one key.
    #[arg(long, env = "CODE_RUNNER_KEY_MAX_ACTIVE", default_value_t = 500)]
    pub key_max_active: u64,

    /// Most bytes (in MiB) one key's jobs may hold in Redis: reserved at
    /// submit for a job's worst case, its actual size once it ends, freed
    /// when it expires; a submit over it gets 429 `key_storage`. Unset: each
    /// key's `max_active` times the most a job of the language defaults
    /// holds (2.8 MiB), so a key can always have its `max_active` jobs.
    #[arg(long, env = "CODE_RUNNER_KEY_MAX_STORED_MB")]
    pub key_max_stored_mb: Option<u64>,

    /// Most MiB one file of `PUT /v1/files/{sha256}` may have (1–512 with
    /// the Redis backend, 1–4096 with S3); a larger one gets 413 naming
    /// this setting. Files count in their key's
    /// CODE_RUNNER_KEY_MAX_STORED_MB with its jobs.
    #[arg(long, env = "CODE_RUNNER_FILE_MAX_MB", default_value_t = 64)]
    pub file_max_mb: u64,

    /// How long a file is kept after its last use, in seconds: its put, a
    /// read, a check that it is there.
    #[arg(long, env = "CODE_RUNNER_FILE_KEEP_SECS", default_value_t = 86_400)]
    pub file_keep_secs: u64,

    /// The hosts each key's jobs may ask to reach through the egress proxy
    /// (docs/egress.md), as `name=host *.domain host:port;name2=host`.
    /// Unset, and for a key not named: none, and a job asking for a
    /// network is refused.
    #[arg(long, env = "CODE_RUNNER_KEY_EGRESS")]
    pub key_egress: Option<String>,

    /// Requests per second one key may make (jobs and capacity endpoints;
    /// a token bucket refilled at this rate), 429 `rate_limited` above it.
    #[arg(long, env = "CODE_RUNNER_KEY_RATE", default_value_t = 100)]
    pub key_rate: u64,

    /// Requests one key may make at once above its rate (the bucket's size).
    #[arg(long, env = "CODE_RUNNER_KEY_BURST", default_value_t = 500)]
    pub key_burst: u32,

    /// Most open job streams (WebSocket and SSE) of this API process.
    #[arg(long, env = "CODE_RUNNER_MAX_STREAMS", default_value_t = 10000)]
    pub max_streams: usize,

    /// Most open streams of one key's jobs (attach tokens count for the
    /// job's key).
    #[arg(long, env = "CODE_RUNNER_MAX_STREAMS_PER_KEY", default_value_t = 1000)]
    pub max_streams_per_key: usize,

    /// Most open streams of one job.
    #[arg(long, env = "CODE_RUNNER_MAX_STREAMS_PER_JOB", default_value_t = 256)]
    pub max_streams_per_job: usize,

    /// How long a client may take to send a request's headers once its
    /// first byte came (and a new connection's first request), in
    /// milliseconds.
    #[arg(
        long,
        env = "CODE_RUNNER_HTTP_HEADER_TIMEOUT_MS",
        default_value_t = 10000
    )]
    pub http_header_timeout_ms: u64,

    /// How long an idle keep-alive connection is kept between requests, in
    /// milliseconds: longer than clients' pools keep theirs (reqwest's and
    /// Go's 90 s), so the client closes it first and never sends a request
    /// on a connection the server is closing.
    #[arg(
        long,
        env = "CODE_RUNNER_HTTP_KEEP_ALIVE_MS",
        default_value_t = 120_000
    )]
    pub http_keep_alive_ms: u64,

    #[command(flatten)]
    pub web: WebSettings,

    #[command(flatten)]
    pub compat: CompatSettings,
}

impl ApiSettings {
    /// The API keys of `CODE_RUNNER_API_KEYS` (none when unset), with the
    /// hosts `CODE_RUNNER_KEY_EGRESS` lets their jobs reach.
    pub fn keys(&self) -> Result<ApiKeys, ConfigError> {
        let keys = ApiKeys::parse(self.api_keys.as_deref().unwrap_or(""))
            .map_err(|message| ConfigError::new("CODE_RUNNER_API_KEYS", message))?;
        match self.key_egress.as_deref() {
            Some(egress) => keys
                .with_egress(egress)
                .map_err(|message| ConfigError::new("CODE_RUNNER_KEY_EGRESS", message)),
            None => Ok(keys),
        }
    }

    /// The browser pages to serve, their playground key checked against
    /// `keys` (what [`Self::keys`] gave).
    pub fn web(&self, keys: &ApiKeys) -> Result<crate::api::WebUi, ConfigError> {
        self.web.build(self.api_keys.as_deref().unwrap_or(""), keys)
    }

    /// The API's limits, checked; a file may have at most `file_max_mb`,
    /// what its backend holds.
    pub fn limits(&self, file_max_mb: u64) -> Result<crate::api::ApiLimits, ConfigError> {
        if !(1..=crate::job::MAX_ATTEMPTS_LIMIT).contains(&self.max_attempts) {
            return Err(ConfigError::new(
                "CODE_RUNNER_MAX_ATTEMPTS",
                format!("must be between 1 and {}", crate::job::MAX_ATTEMPTS_LIMIT),
            ));
        }
        if self.key_max_active == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_KEY_MAX_ACTIVE",
                "must be at least 1",
            ));
        }
        if self
            .key_max_stored_mb
            .is_some_and(|mb| !(1..=1 << 20).contains(&mb))
        {
            return Err(ConfigError::new(
                "CODE_RUNNER_KEY_MAX_STORED_MB",
                "must be between 1 and 1048576",
            ));
        }
        if !(1..=file_max_mb).contains(&self.file_max_mb) {
            return Err(ConfigError::new(
                "CODE_RUNNER_FILE_MAX_MB",
                if file_max_mb == super::files::MAX_FILE_MB_REDIS {
                    "must be between 1 and 512 (the most a Redis value holds; up to 4096 with CODE_RUNNER_FILE_BACKEND=s3)".to_string()
                } else {
                    format!("must be between 1 and {file_max_mb}")
                },
            ));
        }
        if !(1..=31_536_000).contains(&self.file_keep_secs) {
            return Err(ConfigError::new(
                "CODE_RUNNER_FILE_KEEP_SECS",
                "must be between 1 and 31536000 (a year)",
            ));
        }
        if self.key_rate == 0 || self.key_rate > 1_000_000 {
            return Err(ConfigError::new(
                "CODE_RUNNER_KEY_RATE",
                "must be between 1 and 1000000",
            ));
        }
        if self.key_burst == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_KEY_BURST",
                "must be at least 1",
            ));
        }
        for (setting, value) in [
            ("CODE_RUNNER_MAX_STREAMS", self.max_streams),
            ("CODE_RUNNER_MAX_STREAMS_PER_KEY", self.max_streams_per_key),
            ("CODE_RUNNER_MAX_STREAMS_PER_JOB", self.max_streams_per_job),
        ] {
            if value == 0 || value > 1_000_000 {
                return Err(ConfigError::new(setting, "must be between 1 and 1000000"));
            }
        }
        if !(100..=600_000).contains(&self.http_header_timeout_ms) {
            return Err(ConfigError::new(
                "CODE_RUNNER_HTTP_HEADER_TIMEOUT_MS",
                "must be between 100 and 600000",
            ));
        }
        if !(100..=3_600_000).contains(&self.http_keep_alive_ms) {
            return Err(ConfigError::new(
                "CODE_RUNNER_HTTP_KEEP_ALIVE_MS",
                "must be between 100 and 3600000",
            ));
        }
        Ok(crate::api::ApiLimits {
            max_attempts: self.max_attempts,
            key_max_active: self.key_max_active,
            key_storage_bytes: self.key_max_stored_mb.map(|mb| mb << 20),
            file_max_bytes: self.file_max_mb << 20,
            file_keep: std::time::Duration::from_secs(self.file_keep_secs),
            key_rate: self.key_rate,
            key_burst: self.key_burst,
            streams: crate::api::StreamLimits {
                total: self.max_streams,
                per_key: self.max_streams_per_key,
                per_job: self.max_streams_per_job,
            },
            header_timeout: std::time::Duration::from_millis(self.http_header_timeout_ms),
            keep_alive: std::time::Duration::from_millis(self.http_keep_alive_ms),
        })
    }

    /// The configured token secret: `None` when unset or empty, an error
    /// (naming the setting, never showing the value) when shorter than
    /// [`MIN_SECRET_BYTES`]; also checks the token lifetime.
    pub fn token_secret(&self) -> Result<Option<&str>, ConfigError> {
        if self.token_ttl_secs == 0 || self.token_ttl_secs > MAX_TOKEN_TTL_SECS {
            return Err(ConfigError::new(
                "CODE_RUNNER_TOKEN_TTL_SECS",
                format!(
                    "{} is not between 1 and {MAX_TOKEN_TTL_SECS}",
                    self.token_ttl_secs
                ),
            ));
        }
        match self.token_secret.as_deref().filter(|s| !s.is_empty()) {
            None => Ok(None),
            Some(secret) if secret.len() < MIN_SECRET_BYTES => Err(ConfigError::new(
                "CODE_RUNNER_TOKEN_SECRET",
                format!(
                    "must be at least {MIN_SECRET_BYTES} bytes, it is {} (for example: openssl rand -hex 32)",
                    secret.len()
                ),
            )),
            Some(secret) => Ok(Some(secret)),
        }
    }
}

/// The longest an attach token may be valid: a day.
pub const MAX_TOKEN_TTL_SECS: u64 = 86_400;
