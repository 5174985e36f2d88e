//! Configuration shared by every role: each setting is a flag and a
//! `CODE_RUNNER_*` environment variable. Everything is validated before
//! anything connects; a bad value is one line naming the setting (exit 64).

use std::path::PathBuf;

use clap::Args;

use crate::api::tokens::MIN_SECRET_BYTES;
use crate::job::limits::{CompileLimitsRequest, LimitPolicy, LimitsRequest, parse_limit_list};
use crate::languages::LanguageCatalog;
use crate::sandbox::{Door, SandboxConfig, SeccompProfile};

/// A setting that failed validation.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {setting}: {message}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub message: String,
}

impl ConfigError {
    fn new(setting: &'static str, message: impl Into<String>) -> Self {
        Self {
            setting,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct SandboxSettings {
    /// OCI runtime for sandboxes: runc (Docker's default) or runsc (gVisor).
    /// `SANDBOX_RUNTIME` is read too.
    #[arg(long = "runtime", env = "CODE_RUNNER_SANDBOX_RUNTIME")]
    pub runtime: Option<String>,

    /// Seccomp profile (Docker JSON format); the built-in copy of
    /// seccomp/profile.json when unset.
    #[arg(long, env = "CODE_RUNNER_SECCOMP_PROFILE")]
    pub seccomp_profile: Option<PathBuf>,

    /// Kernel doors the seccomp profile may re-open, comma-separated:
    /// socket-families, compat-abi, modify_ldt. A profile that re-opens one
    /// not listed here is refused.
    #[arg(long, env = "CODE_RUNNER_SECCOMP_ALLOW")]
    pub seccomp_allow: Option<String>,

    /// Language catalog (languages.toml); the built-in copy when unset.
    #[arg(long, env = "CODE_RUNNER_LANGUAGES_FILE")]
    pub languages_file: Option<PathBuf>,

    /// CPU quota of one sandbox, in CPUs.
    #[arg(long, env = "CODE_RUNNER_SANDBOX_CPUS", default_value_t = 1.0)]
    pub sandbox_cpus: f64,

    /// Server defaults for job limits, as key=value,… (wall_ms, idle_ms, cpu_ms,
    /// memory_mb, pids, output_bytes, disk_mb, files_bytes).
    #[arg(long, env = "CODE_RUNNER_DEFAULT_LIMITS")]
    pub default_limits: Option<String>,

    /// Server maximums for job limits, as key=value,…; a job asking for more is
    /// refused.
    #[arg(long, env = "CODE_RUNNER_MAX_LIMITS")]
    pub max_limits: Option<String>,

    /// Defaults for the compile stage, as key=value,… (wall_ms, cpu_ms, output_bytes).
    #[arg(long, env = "CODE_RUNNER_COMPILE_DEFAULT_LIMITS")]
    pub compile_default_limits: Option<String>,

    /// Maximums for the compile stage, as key=value,….
    #[arg(long, env = "CODE_RUNNER_COMPILE_MAX_LIMITS")]
    pub compile_max_limits: Option<String>,

    /// First uid of the host's sandbox uids: each live sandbox runs as a uid
    /// of its own from `base` up (every process takes a range of 4096).
    #[arg(long, env = "CODE_RUNNER_SANDBOX_UID_BASE", default_value_t = crate::sandbox::DEFAULT_UID_BASE)]
    pub sandbox_uid_base: u32,

    /// Directory of the host-wide locks that hand out the uid ranges.
    #[arg(long, env = "CODE_RUNNER_UID_LOCK_DIR", default_value = crate::sandbox::DEFAULT_LOCK_DIR)]
    pub uid_lock_dir: PathBuf,
}

/// Everything the sandbox side needs, validated.
#[derive(Debug, Clone)]
pub struct SandboxSetup {
    pub sandbox: SandboxConfig,
    pub catalog: LanguageCatalog,
    pub policy: LimitPolicy,
}

impl SandboxSettings {
    /// The runtime after the `SANDBOX_RUNTIME` fallback; `None` is Docker's default.
    fn runtime(&self) -> Result<Option<String>, ConfigError> {
        let runtime = self
            .runtime
            .clone()
            .or_else(|| std::env::var("SANDBOX_RUNTIME").ok())
            .filter(|r| !r.is_empty());
        match runtime.as_deref() {
            None | Some("runc") => Ok(None),
            Some(name)
                if name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) =>
            {
                Ok(Some(name.to_string()))
            }
            Some(name) => Err(ConfigError::new(
                "CODE_RUNNER_SANDBOX_RUNTIME",
                format!("{name:?} is not a runtime name"),
            )),
        }
    }

    pub fn build(&self, worker_id: &str) -> Result<SandboxSetup, ConfigError> {
        let runtime = self.runtime()?;
        if !(self.sandbox_cpus > 0.0 && self.sandbox_cpus <= 64.0) {
            return Err(ConfigError::new(
                "CODE_RUNNER_SANDBOX_CPUS",
                format!("{} is not between 0 and 64", self.sandbox_cpus),
            ));
        }
        let doors = Door::parse_list(self.seccomp_allow.as_deref().unwrap_or(""))
            .map_err(|message| ConfigError::new("CODE_RUNNER_SECCOMP_ALLOW", message))?;
        let seccomp = SeccompProfile::load_allowing(self.seccomp_profile.as_deref(), &doors)
            .map_err(|e| ConfigError::new("CODE_RUNNER_SECCOMP_PROFILE", e.to_string()))?;
        let catalog = LanguageCatalog::load(self.languages_file.as_deref())
            .map_err(|e| ConfigError::new("CODE_RUNNER_LANGUAGES_FILE", e.to_string()))?;
        let policy = self.policy()?;
        if self.sandbox_uid_base < 1000
            || self
                .sandbox_uid_base
                .checked_add(crate::sandbox::RANGE_SIZE * crate::sandbox::uids_ranges())
                .is_none()
        {
            return Err(ConfigError::new(
                "CODE_RUNNER_SANDBOX_UID_BASE",
                format!(
                    "{} must be at least 1000 and leave room for {} ranges of {} uids below 2^32",
                    self.sandbox_uid_base,
                    crate::sandbox::uids_ranges(),
                    crate::sandbox::RANGE_SIZE
                ),
            ));
        }
        if !self.uid_lock_dir.is_absolute() {
            return Err(ConfigError::new(
                "CODE_RUNNER_UID_LOCK_DIR",
                format!("{:?} is not an absolute path", self.uid_lock_dir),
            ));
        }
        let mut sandbox = SandboxConfig::new(seccomp, worker_id);
        sandbox.runtime = runtime;
        sandbox.cpus = self.sandbox_cpus;
        sandbox.uid_base = self.sandbox_uid_base;
        sandbox.uid_lock_dir = self.uid_lock_dir.clone();
        Ok(SandboxSetup {
            sandbox,
            catalog,
            policy,
        })
    }

    fn policy(&self) -> Result<LimitPolicy, ConfigError> {
        let mut policy = LimitPolicy::default();
        let limits = |setting, text: &Option<String>| -> Result<LimitsRequest, ConfigError> {
            text.as_deref()
                .map_or(Ok(LimitsRequest::default()), |t| {
                    parse_limit_list(t, LimitsRequest::set)
                })
                .map_err(|m| ConfigError::new(setting, m))
        };
        let compile = |setting, text: &Option<String>| {
            text.as_deref()
                .map_or(Ok(CompileLimitsRequest::default()), |t| {
                    parse_limit_list(t, CompileLimitsRequest::set)
                })
                .map_err(|m| ConfigError::new(setting, m))
        };
        policy.maximum =
            limits("CODE_RUNNER_MAX_LIMITS", &self.max_limits)?.with_defaults(policy.maximum);
        policy.defaults = limits("CODE_RUNNER_DEFAULT_LIMITS", &self.default_limits)?
            .with_defaults(policy.defaults);
        policy.compile_maximum =
            compile("CODE_RUNNER_COMPILE_MAX_LIMITS", &self.compile_max_limits)?
                .with_defaults(policy.compile_maximum);
        policy.compile_defaults = compile(
            "CODE_RUNNER_COMPILE_DEFAULT_LIMITS",
            &self.compile_default_limits,
        )?
        .with_defaults(policy.compile_defaults);
        policy
            .defaults
            .check_within("default", policy.maximum)
            .map_err(|m| ConfigError::new("CODE_RUNNER_DEFAULT_LIMITS", m))?;
        policy
            .compile_defaults
            .check_within("default", policy.compile_maximum)
            .map_err(|m| ConfigError::new("CODE_RUNNER_COMPILE_DEFAULT_LIMITS", m))?;
        Ok(policy)
    }
}

/// Where the shared state lives.
#[derive(Debug, Clone, Args)]
pub struct RedisSettings {
    /// Redis URL (it may hold a password, so `--help` never shows the
    /// environment's value).
    #[arg(
        long,
        env = "CODE_RUNNER_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: String,

    /// Prefix of every Redis key (e.g. `cr:`), to share one Redis.
    #[arg(long, env = "CODE_RUNNER_REDIS_PREFIX", default_value = "")]
    pub redis_prefix: String,

    /// Connections in the Redis pool (blocking reads use their own).
    #[arg(long, env = "CODE_RUNNER_REDIS_POOL_SIZE", default_value_t = 16)]
    pub redis_pool_size: usize,

    /// How long a finished job (its key and streams) is kept, in seconds.
    #[arg(long, env = "CODE_RUNNER_RESULT_TTL_SECS", default_value_t = 3600)]
    pub result_ttl_secs: u64,
}

impl RedisSettings {
    pub fn build(&self) -> Result<crate::store::Store, ConfigError> {
        if !(self.redis_url.starts_with("redis://") || self.redis_url.starts_with("rediss://")) {
            return Err(ConfigError::new(
                "CODE_RUNNER_REDIS_URL",
                format!("{:?} is not a redis:// URL", self.redis_url),
            ));
        }
        if self.redis_pool_size == 0 || self.redis_pool_size > 1024 {
            return Err(ConfigError::new(
                "CODE_RUNNER_REDIS_POOL_SIZE",
                "must be between 1 and 1024",
            ));
        }
        if self.result_ttl_secs == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_RESULT_TTL_SECS",
                "must be at least 1",
            ));
        }
        crate::store::Store::new(
            &self.redis_url,
            &self.redis_prefix,
            std::time::Duration::from_secs(self.result_ttl_secs),
            self.redis_pool_size,
        )
        .map_err(|e| ConfigError::new("CODE_RUNNER_REDIS_URL", e.to_string()))
    }
}

/// The worker role.
#[derive(Debug, Clone, Args)]
pub struct WorkerSettings {
    /// This worker's id (in heartbeats, processing lists and container
    /// labels); unique per process. Default: hostname and a random suffix.
    #[arg(long, env = "CODE_RUNNER_WORKER_ID")]
    pub worker_id: Option<String>,

    /// Most sandboxes this worker runs at once.
    #[arg(long, env = "CODE_RUNNER_WORKER_MAX_SANDBOXES", default_value_t = 4)]
    pub worker_max_sandboxes: usize,

    /// How often the heartbeat is refreshed, in milliseconds.
    #[arg(
        long,
        env = "CODE_RUNNER_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5000
    )]
    pub heartbeat_interval_ms: u64,

    /// On SIGTERM: how long running jobs may go on before they are killed, in
    /// milliseconds.
    #[arg(long, env = "CODE_RUNNER_DRAIN_TIMEOUT_MS", default_value_t = 30000)]
    pub drain_timeout_ms: u64,

    /// Address of the worker role's own /metrics and /healthz (the `worker`
    /// command; `serve` uses the API's address).
    #[arg(
        long,
        env = "CODE_RUNNER_WORKER_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    pub worker_listen: std::net::SocketAddr,

    /// Warm sandboxes to keep ready per language when no capacity schedule
    /// says otherwise, as language=count,… (e.g. `python=4,javascript=2`).
    #[arg(long, env = "CODE_RUNNER_WARM", default_value = "")]
    pub warm: String,

    /// Most warm sandboxes this worker keeps (0: no warm pool). They are
    /// never counted as free slots.
    #[arg(long, env = "CODE_RUNNER_WARM_MAX", default_value_t = 0)]
    pub warm_max: usize,

    /// A warm sandbox older than this is replaced (images change), in
    /// seconds.
    #[arg(long, env = "CODE_RUNNER_WARM_LIFETIME_SECS", default_value_t = 600)]
    pub warm_lifetime_secs: u64,
}

impl WorkerSettings {
    /// The per-language warm floors of `CODE_RUNNER_WARM`, checked against
    /// the catalog and `CODE_RUNNER_WARM_MAX`.
    pub fn warm_floors(
        &self,
        catalog: &LanguageCatalog,
    ) -> Result<std::collections::BTreeMap<String, usize>, ConfigError> {
        let error = |message: String| ConfigError::new("CODE_RUNNER_WARM", message);
        if self.warm_max > 1024 {
            return Err(ConfigError::new(
                "CODE_RUNNER_WARM_MAX",
                "must be between 0 and 1024",
            ));
        }
        if self.warm_lifetime_secs < 10 {
            return Err(ConfigError::new(
                "CODE_RUNNER_WARM_LIFETIME_SECS",
                "must be at least 10",
            ));
        }
        let mut floors = std::collections::BTreeMap::new();
        for entry in self
            .warm
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (name, count) = entry
                .split_once('=')
                .ok_or_else(|| error(format!("{entry:?} is not language=count")))?;
            let language = catalog.find(name.trim()).ok_or_else(|| {
                error(format!(
                    "unknown language {:?}; known: {}",
                    name.trim(),
                    catalog.ids().join(", ")
                ))
            })?;
            let count: usize = count
                .trim()
                .parse()
                .map_err(|_| error(format!("{:?} is not a count", count.trim())))?;
            if floors.insert(language.id.clone(), count).is_some() {
                return Err(error(format!("{} is given twice", language.id)));
            }
        }
        let total: usize = floors.values().sum();
        if total > self.warm_max {
            return Err(error(format!(
                "asks for {total} warm sandboxes but CODE_RUNNER_WARM_MAX is {}",
                self.warm_max
            )));
        }
        Ok(floors)
    }

    /// The worker's id, with the settings checked; `heartbeat_ttl_ms` is
    /// the reaper settings' (every process with a worker runs a reaper).
    pub fn validate(&self, heartbeat_ttl_ms: u64) -> Result<String, ConfigError> {
        if self.worker_max_sandboxes == 0 || self.worker_max_sandboxes > 1024 {
            return Err(ConfigError::new(
                "CODE_RUNNER_WORKER_MAX_SANDBOXES",
                "must be between 1 and 1024",
            ));
        }
        if self.heartbeat_interval_ms == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_HEARTBEAT_INTERVAL_MS",
                "must be at least 1",
            ));
        }
        if heartbeat_ttl_ms < self.heartbeat_interval_ms * 2 {
            return Err(ConfigError::new(
                "CODE_RUNNER_HEARTBEAT_TTL_MS",
                format!(
                    "{} is less than twice the heartbeat interval ({})",
                    heartbeat_ttl_ms, self.heartbeat_interval_ms
                ),
            ));
        }
        let id = match &self.worker_id {
            Some(id) => id.clone(),
            None => {
                let host = nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .unwrap_or_else(|| "worker".into());
                let suffix = uuid::Uuid::new_v4().simple().to_string();
                format!("{host}-{}", &suffix[..8])
            }
        };
        if id.is_empty()
            || id.len() > 64
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(ConfigError::new(
                "CODE_RUNNER_WORKER_ID",
                format!("{id:?} must be 1-64 letters, digits, '-', '_' or '.'"),
            ));
        }
        Ok(id)
    }
}

/// The API role.
#[derive(Debug, Clone, Args)]
pub struct ApiSettings {
    /// Address the HTTP API listens on.
    #[arg(long, env = "CODE_RUNNER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,

    /// API keys: `name:key[:max_active][:admin]` separated by commas;
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
    #[arg(long, env = "CODE_RUNNER_KEY_MAX_ACTIVE", default_value_t = 64)]
    pub key_max_active: u64,

    /// Most bytes (in MiB) one key's jobs may hold in Redis: reserved at
    /// submit for a job's worst case, its actual size once it ends, freed
    /// when it expires; a submit over it gets 429 `key_storage`.
    #[arg(long, env = "CODE_RUNNER_KEY_MAX_STORED_MB", default_value_t = 512)]
    pub key_max_stored_mb: u64,

    /// Requests per second one key may make (jobs and capacity endpoints;
    /// a token bucket refilled at this rate), 429 `rate_limited` above it.
    #[arg(long, env = "CODE_RUNNER_KEY_RATE", default_value_t = 100)]
    pub key_rate: u64,

    /// Requests one key may make at once above its rate (the bucket's size).
    #[arg(long, env = "CODE_RUNNER_KEY_BURST", default_value_t = 200)]
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

    /// How long a client may take to send a request's headers, and how long
    /// an idle keep-alive connection is kept, in milliseconds.
    #[arg(
        long,
        env = "CODE_RUNNER_HTTP_HEADER_TIMEOUT_MS",
        default_value_t = 10000
    )]
    pub http_header_timeout_ms: u64,

    #[command(flatten)]
    pub web: WebSettings,

    #[command(flatten)]
    pub compat: CompatSettings,
}

impl ApiSettings {
    /// The API's limits, checked.
    pub fn limits(&self) -> Result<crate::api::ApiLimits, ConfigError> {
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
        if !(1..=1 << 20).contains(&self.key_max_stored_mb) {
            return Err(ConfigError::new(
                "CODE_RUNNER_KEY_MAX_STORED_MB",
                "must be between 1 and 1048576",
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
        Ok(crate::api::ApiLimits {
            max_attempts: self.max_attempts,
            key_max_active: self.key_max_active,
            key_storage_bytes: self.key_max_stored_mb << 20,
            key_rate: self.key_rate,
            key_burst: self.key_burst,
            streams: crate::api::StreamLimits {
                total: self.max_streams,
                per_key: self.max_streams_per_key,
                per_job: self.max_streams_per_job,
            },
            header_timeout: std::time::Duration::from_millis(self.http_header_timeout_ms),
        })
    }
}

/// The browser pages of the API role.
#[derive(Debug, Clone, Args)]
pub struct WebSettings {
    /// Path of the browser playground (e.g. `/` or `/playground`); `off`
    /// serves none.
    #[arg(long, env = "CODE_RUNNER_PLAYGROUND_PATH", default_value = "/")]
    pub playground_path: String,

    /// Path of the operator dashboard (its data needs an admin key); `off`
    /// serves none.
    #[arg(long, env = "CODE_RUNNER_DASHBOARD_PATH", default_value = "/dashboard")]
    pub dashboard_path: String,

    /// Name of one of the configured API keys that the playground submits
    /// with for visitors who have no key; it needs a low max_active and no
    /// admin scope. Unset: visitors enter their own key.
    #[arg(long, env = "CODE_RUNNER_PLAYGROUND_KEY")]
    pub playground_key: Option<String>,
}

impl WebSettings {
    /// The pages to serve, with the playground key checked against the
    /// configured keys (`api_keys`, as configured, and parsed into `keys`).
    pub fn build(
        &self,
        api_keys: &str,
        keys: &crate::api::ApiKeys,
    ) -> Result<crate::api::WebUi, ConfigError> {
        let playground = crate::api::page_path(&self.playground_path)
            .map_err(|m| ConfigError::new("CODE_RUNNER_PLAYGROUND_PATH", m))?;
        let dashboard = crate::api::page_path(&self.dashboard_path)
            .map_err(|m| ConfigError::new("CODE_RUNNER_DASHBOARD_PATH", m))?;
        if playground.is_some() && playground == dashboard {
            return Err(ConfigError::new(
                "CODE_RUNNER_DASHBOARD_PATH",
                format!(
                    "{:?} is also the playground's path",
                    self.dashboard_path.trim()
                ),
            ));
        }
        let key = match self.playground_key.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(_) if playground.is_none() => {
                return Err(ConfigError::new(
                    "CODE_RUNNER_PLAYGROUND_KEY",
                    "is set but the playground is off (CODE_RUNNER_PLAYGROUND_PATH=off)",
                ));
            }
            Some(name) => Some(
                crate::api::PlaygroundKey::from_config(name, api_keys, keys)
                    .map_err(|m| ConfigError::new("CODE_RUNNER_PLAYGROUND_KEY", m))?,
            ),
        };
        Ok(crate::api::WebUi::new(playground, dashboard, key))
    }
}

/// The Piston- and Judge0-compatible APIs (`src/api/compat/`).
#[derive(Debug, Clone, Args)]
pub struct CompatSettings {
    /// Where the Piston v2 API is served (`off`: not at all).
    #[arg(long, env = "CODE_RUNNER_PISTON_PREFIX", default_value = "/api/v2")]
    pub piston_prefix: String,

    /// Piston has no keys: with the name of a configured API key here, a
    /// Piston request without a key that comes from a loopback address
    /// (127.0.0.0/8, ::1) is served as that key (its limits apply). Requests
    /// from elsewhere still need a key.
    #[arg(long, env = "CODE_RUNNER_PISTON_LOOPBACK_KEY")]
    pub piston_loopback_key: Option<String>,

    /// Where the Judge0 CE API is served (`off`: not at all).
    #[arg(long, env = "CODE_RUNNER_JUDGE0_PREFIX", default_value = "/judge0")]
    pub judge0_prefix: String,
}

impl CompatSettings {
    /// The checked settings; `keys` are the configured API key names.
    pub fn validate<'a>(
        &self,
        mut keys: impl Iterator<Item = &'a str>,
    ) -> Result<crate::api::CompatConfig, ConfigError> {
        let prefix = |setting: &'static str, text: &str| -> Result<Option<String>, ConfigError> {
            if text == "off" {
                return Ok(None);
            }
            let valid = text.starts_with('/')
                && !text.ends_with('/')
                && text.len() > 1
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
                && !text.contains("//");
            if !valid {
                return Err(ConfigError::new(
                    setting,
                    format!("{text:?} is not a path like /api/v2 (or off)"),
                ));
            }
            if ["/v1", "/healthz", "/readyz", "/metrics"]
                .iter()
                .any(|taken| text == *taken || text.starts_with(&format!("{taken}/")))
            {
                return Err(ConfigError::new(
                    setting,
                    format!("{text} is taken by code-runner's own API"),
                ));
            }
            Ok(Some(text.to_string()))
        };
        let piston = prefix("CODE_RUNNER_PISTON_PREFIX", &self.piston_prefix)?;
        let judge0 = prefix("CODE_RUNNER_JUDGE0_PREFIX", &self.judge0_prefix)?;
        if piston.is_some() && piston == judge0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_JUDGE0_PREFIX",
                "the Piston and Judge0 APIs cannot share a prefix",
            ));
        }
        if let Some(name) = &self.piston_loopback_key
            && !keys.any(|k| k == name)
        {
            return Err(ConfigError::new(
                "CODE_RUNNER_PISTON_LOOPBACK_KEY",
                format!("{name:?} is not the name of a key in CODE_RUNNER_API_KEYS"),
            ));
        }
        Ok(crate::api::CompatConfig {
            piston_prefix: piston,
            piston_loopback_key: self.piston_loopback_key.clone(),
            judge0_prefix: judge0,
        })
    }
}

impl ApiSettings {
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

/// The orphan reaper (every worker process runs it; `code-runner reaper`
/// runs only it).
#[derive(Debug, Clone, Args)]
pub struct ReaperSettings {
    /// How often the reaper looks for dead workers and expired containers,
    /// in milliseconds.
    #[arg(long, env = "CODE_RUNNER_REAPER_INTERVAL_MS", default_value_t = 5000)]
    pub reaper_interval_ms: u64,

    /// Grace before the reaper touches a container: one of a dead worker is
    /// left alone this long after it was created, and any container this
    /// long past its deadline is removed, in milliseconds.
    #[arg(long, env = "CODE_RUNNER_REAPER_GRACE_MS", default_value_t = 30000)]
    pub reaper_grace_ms: u64,

    /// How many times a job claimed by a worker that died before starting
    /// it is put back in the queue; after that it ends as `error`
    /// (`worker_lost`) and goes to `jobs:dead`.
    #[arg(long, env = "CODE_RUNNER_MAX_REQUEUES", default_value_t = 3)]
    pub max_requeues: u32,

    /// How long a worker's heartbeat lives without a refresh, in
    /// milliseconds (the worker's setting; the reaper waits this long of
    /// healthy Redis after any failure before it judges a worker dead).
    #[arg(long, env = "CODE_RUNNER_HEARTBEAT_TTL_MS", default_value_t = 15000)]
    pub heartbeat_ttl_ms: u64,

    /// Address of the `reaper` command's own /healthz and /metrics.
    #[arg(
        long,
        env = "CODE_RUNNER_REAPER_LISTEN",
        default_value = "127.0.0.1:8082"
    )]
    pub reaper_listen: std::net::SocketAddr,
}

impl ReaperSettings {
    /// The reaper's configuration; `own_worker` is the worker of the same
    /// process, if any.
    pub fn validate(
        &self,
        own_worker: Option<String>,
    ) -> Result<crate::reaper::ReaperConfig, ConfigError> {
        if self.reaper_interval_ms == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_REAPER_INTERVAL_MS",
                "must be at least 1",
            ));
        }
        if self.max_requeues > 1000 {
            return Err(ConfigError::new(
                "CODE_RUNNER_MAX_REQUEUES",
                "must be at most 1000",
            ));
        }
        if self.heartbeat_ttl_ms == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_HEARTBEAT_TTL_MS",
                "must be at least 1",
            ));
        }
        Ok(crate::reaper::ReaperConfig {
            interval: std::time::Duration::from_millis(self.reaper_interval_ms),
            grace: std::time::Duration::from_millis(self.reaper_grace_ms),
            max_requeues: self.max_requeues,
            heartbeat_ttl: std::time::Duration::from_millis(self.heartbeat_ttl_ms),
            own_worker,
        })
    }
}
