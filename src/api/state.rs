//! The state every handler shares ([`ApiState`]): the configuration the
//! process was started with ([`ApiConfig`], [`ApiLimits`]) and what the
//! process keeps while it serves (its followers of the store, the stream
//! caps, the per-key rate buckets, the shutdown token).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::compat::CompatConfig;
use super::http::auth::ApiKeys;
use super::http::tokens::TokenSigner;
use super::pages::WebUi;
use super::streams::caps::StreamLimits;
use super::{http, ops, streams};
use crate::follow::feeds::Feeds;
use crate::follow::places::Places;
use crate::job::limits::LimitPolicy;
use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::store::Store;

/// Everything the API needs, validated by the caller.
pub struct ApiConfig {
    pub store: Store,
    pub catalog: LanguageCatalog,
    pub policy: LimitPolicy,
    pub keys: ApiKeys,
    pub metrics: Metrics,
    /// Submissions are refused (429) once `LLEN jobs:queue` reaches this.
    pub max_queue_depth: u64,
    /// Largest request body (413 above it).
    pub max_body_bytes: usize,
    /// Longest a `?wait=true` submit blocks.
    pub max_wait: Duration,
    pub tokens: TokenSigner,
    /// Cancelled when the process begins shutting down: submissions are then
    /// refused (503) while reads go on until the server stops.
    pub draining: CancellationToken,
    /// Set when a worker shares the process: /readyz then checks Docker too.
    pub engine: Option<crate::sandbox::Engine>,
    /// Set when a worker shares the process: accepted jobs are left here
    /// prepared, so that worker does not parse and validate them again.
    pub carried: Option<crate::job::carry::CarriedJobs>,
    pub limits: ApiLimits,
}

/// The API's limits, from configuration (see `config::ApiSettings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiLimits {
    /// `max_attempts` of a job that does not give its own.
    pub max_attempts: u32,
    /// `max_active` of a key that does not give its own.
    pub key_max_active: u64,
    /// Most bytes one key's jobs may hold in Redis; `None`: each key's
    /// `max_active` times what a job of the language defaults reserves
    /// ([`ApiState::storage_budget`]).
    pub key_storage_bytes: Option<u64>,
    /// Most bytes of one stored file (`PUT /v1/files/{sha256}`).
    pub file_max_bytes: u64,
    /// How long a stored file is kept after its last use.
    pub file_keep: Duration,
    /// Requests per second per key, and the burst above it.
    pub key_rate: u64,
    pub key_burst: u32,
    pub streams: StreamLimits,
    /// How long a client may take to send a request's headers (from its
    /// first byte; a new connection's first request from the connect).
    pub header_timeout: Duration,
    /// How long an idle keep-alive connection is kept between requests.
    pub keep_alive: Duration,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self {
            max_attempts: 1,
            key_max_active: 500,
            key_storage_bytes: None,
            file_max_bytes: 64 << 20,
            file_keep: Duration::from_secs(86_400),
            key_rate: 100,
            key_burst: 500,
            streams: StreamLimits {
                total: 10_000,
                per_key: 1000,
                per_job: 256,
            },
            header_timeout: Duration::from_secs(10),
            keep_alive: http::server::DEFAULT_KEEP_ALIVE,
        }
    }
}

/// The shared state of every handler: cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    pub(super) inner: Arc<ApiConfig>,
    pub(super) ops: ops::OpsState,
    /// Cancelled when the server shuts down: long requests (`?wait=true`,
    /// the streams) end early instead of holding the shutdown up.
    pub(super) shutdown: CancellationToken,
    /// The WebSocket sessions: upgraded connections the HTTP server no
    /// longer tracks, waited for (briefly) when it stops so each gets its
    /// close frame out.
    pub(super) sessions: TaskTracker,
    /// The browser pages, when on.
    pub(super) web: Option<Arc<WebUi>>,
    /// Where the Piston and Judge0 APIs are served, and Piston's keyless mode.
    pub(super) compat: Arc<CompatConfig>,
    /// This process's followers of jobs' events.
    pub(super) feeds: Feeds,
    /// Queued jobs' places, for their streams and views.
    pub(super) places: Places,
    pub(super) stream_caps: streams::caps::StreamCaps,
    /// The per-key request rate, shared by `/v1` and the compatible APIs.
    pub(super) key_rate: Arc<http::ratelimit::KeyRate>,
    /// What a job of the language defaults reserves at most
    /// ([`default_job_reserve`]).
    pub(super) default_job_reserve: u64,
}

/// The spec a job of the language defaults is sized with: its source and
/// stdin (a larger spec reserves more, as it is).
pub const DEFAULT_SPEC_BYTES: u64 = 64 << 10;

/// The most one job of the language defaults can hold in Redis: the
/// largest [`crate::store::storage_reserve`] over the catalog's languages
/// with their default output limits (a compiled language's compile output
/// too) and a spec of [`DEFAULT_SPEC_BYTES`].
pub fn default_job_reserve(catalog: &LanguageCatalog, policy: &LimitPolicy) -> u64 {
    catalog
        .all()
        .iter()
        .map(|language| {
            let run = language.limits.with_defaults(policy.defaults).output_bytes;
            let compile = language.compile.as_ref().map_or(0, |_| {
                language
                    .compile_limits
                    .with_defaults(policy.compile_defaults)
                    .output_bytes
            });
            crate::store::storage_reserve(DEFAULT_SPEC_BYTES, run + compile)
        })
        .max()
        .unwrap_or_else(|| {
            crate::store::storage_reserve(DEFAULT_SPEC_BYTES, policy.defaults.output_bytes)
        })
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("queue", &self.inner.store)
            .field("keys", &self.inner.keys)
            .finish_non_exhaustive()
    }
}

impl ApiState {
    pub fn new(config: ApiConfig) -> Self {
        http::refusals::register(&config.metrics);
        let docker = config
            .engine
            .clone()
            .map(|engine| ops::DockerCheck::new(engine, Some(&config.catalog)));
        let ops = ops::OpsState::new(config.store.clone(), config.metrics.clone(), docker);
        let shutdown = CancellationToken::new();
        let feeds = Feeds::new(config.store.clone(), shutdown.clone());
        let places = Places::new(config.store.clone(), shutdown.clone());
        let stream_caps = streams::caps::StreamCaps::new(config.limits.streams, &config.metrics);
        let key_rate = Arc::new(http::ratelimit::KeyRate::new(
            config.limits.key_rate,
            config.limits.key_burst,
        ));
        let default_job_reserve = default_job_reserve(&config.catalog, &config.policy);
        Self {
            inner: Arc::new(config),
            ops,
            shutdown,
            sessions: TaskTracker::new(),
            web: None,
            compat: Arc::new(CompatConfig::default()),
            feeds,
            places,
            stream_caps,
            key_rate,
            default_job_reserve,
        }
    }

    /// The storage budget of a key whose `max_active` is `max_active` (its
    /// entry's, else the default): the configured one, else enough for
    /// that many jobs of the language defaults.
    pub fn storage_budget(&self, max_active: Option<u64>) -> u64 {
        let limits = &self.inner.limits;
        limits.key_storage_bytes.unwrap_or_else(|| {
            max_active
                .unwrap_or(limits.key_max_active)
                .saturating_mul(self.default_job_reserve)
        })
    }

    /// What one job's stream clients may send it.
    pub(super) fn input_budgets(&self) -> crate::store::InputBudgets {
        crate::store::InputBudgets {
            stdin_bytes: self.inner.policy.max_stdin_bytes as u64,
            signals: streams::MAX_SIGNALS,
            messages: streams::MAX_CONTROL_MESSAGES,
            // Only for a job submitted before its budget was kept with it.
            key_storage: self.storage_budget(None),
        }
    }

    /// The same state, serving the browser pages `web` enables.
    pub fn with_web_ui(mut self, web: WebUi) -> Self {
        self.web = Some(Arc::new(web));
        self
    }

    /// The same state with the compatible APIs configured by `compat`.
    pub fn with_compat(mut self, compat: CompatConfig) -> Self {
        self.compat = Arc::new(compat);
        self
    }

    pub fn keys(&self) -> &ApiKeys {
        &self.inner.keys
    }

    pub fn tokens(&self) -> &TokenSigner {
        &self.inner.tokens
    }

    /// The languages jobs can run in now: the catalog's languages that the
    /// live workers advertise (`Store::advertised_languages`); the whole
    /// catalog until a worker has advertised, or when Redis cannot say.
    pub(crate) async fn offered_catalog(&self) -> LanguageCatalog {
        match self.inner.store.workers().advertised_languages().await {
            Ok(Some(ids)) => self.inner.catalog.only(|l| ids.contains(&l.id)),
            Ok(None) => self.inner.catalog.clone(),
            Err(error) => {
                tracing::warn!(error = %error, "cannot read the workers' languages; offering the whole catalog");
                self.inner.catalog.clone()
            }
        }
    }

    /// The same state, ending its long requests when `shutdown` is cancelled.
    pub(super) fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.feeds = Feeds::new(self.inner.store.clone(), shutdown.clone());
        self.places = Places::new(self.inner.store.clone(), shutdown.clone());
        self.shutdown = shutdown;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budget_holds_max_active_jobs_of_the_largest_language_default() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let policy = LimitPolicy::default();
        let reserve = default_job_reserve(&catalog, &policy);
        // A compiled language's compile output comes on top of the run's.
        let run = policy.defaults.output_bytes;
        let compile = policy.compile_defaults.output_bytes;
        assert_eq!(
            reserve,
            crate::store::storage_reserve(DEFAULT_SPEC_BYTES, run + compile)
        );
        // 2.8 MiB, as the docs say: a 64 KiB spec, 1 MiB + 256 KiB of output
        // twice, 4096 events of 64 bytes, 4 KiB.
        assert_eq!(reserve, (64 + 2 * 1280 + 256 + 4) << 10);
        // A class of 300 on one key is within the default max_active.
        assert!(ApiLimits::default().key_max_active >= 300);
    }
}
