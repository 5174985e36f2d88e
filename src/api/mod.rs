//! The HTTP API (DESIGN §7): axum, JSON, under `/v1`. Knows HTTP; keeps the
//! shared state through [`crate::store`] and never names a Redis key.
//!
//! - `mod.rs`: the state, the router and the server loop.
//! - [`http::auth`]: API keys and the bearer check (constant time).
//! - [`http::tokens`]: job-scoped attach tokens (HMAC), for the streams.
//! - [`http::error`]: the one error type and its JSON answers.
//! - `jobs`: submit, status, cancel; the job view. `history`: the run
//!   history of a key (`GET /v1/jobs`). `submit`: the one
//!   submit path of `/v1/jobs` and the compatible APIs (admission, its
//!   refusals, their count, the wait for a job's end).
//! - `ops`: `/healthz`, `/readyz`, `/metrics`, `/v1/languages`.
//! - `streams`: the job's WebSocket and Server-Sent Events; `feeds`: the
//!   one Redis follower of each followed job in this process, fanned out to
//!   the streams and to `?wait=true`; `stream_caps`: caps on open streams.
//! - `ratelimit`: the per-key request rate limit (governor), for `/v1` and
//!   the compatible APIs;
//!   `server`: the HTTP server loop, with header and idle timeouts.
//! - `capacity`: the fleet-wide warm capacity schedule (admin scope).
//! - `usage`: the usage ledger per day and user (`GET /v1/usage`).
//! - [`pages`]: the browser pages (playground, dashboard) embedded in the
//!   binary; `playground` and `dashboard`: their routes under `/v1`.
//! - `compat`: the Piston v2 and Judge0 CE compatible APIs, thin adapters
//!   that submit ordinary jobs.
//!
//! Routes:
//! - `POST /v1/jobs`, `GET /v1/jobs` (the key's run history),
//!   `GET /v1/jobs/{id}`, `DELETE /v1/jobs/{id}` (API key);
//! - `GET /v1/jobs/{id}/ws`, `GET /v1/jobs/{id}/events` (API key or the
//!   job's attach token);
//! - `GET /v1/languages` (no key: the catalog is public, so an editor can
//!   show it before anyone signs in);
//! - `PUT|GET /v1/capacity`, `DELETE /v1/capacity/{id}` (an API key with
//!   the `admin` scope);
//! - `GET /v1/usage` (API key: its own usage; `key=` another's with the
//!   `admin` scope);
//! - `GET /healthz`, `GET /readyz`, `GET /metrics` (no key; operators keep
//!   them off the public network);
//! - with the pages on ([`ApiState::with_web_ui`]): the playground page
//!   (`/` by default), `GET /v1/playground` and `POST /v1/playground/jobs`
//!   (no key: the operator's shared playground key, when configured), the
//!   dashboard page (`/dashboard`), `GET /v1/dashboard` (admin key), and
//!   their files under `/ui/`.
//!
//! The streams of a job authenticate with [`http::tokens::TokenSigner::verify`]
//! (or the API key) and end on [`ApiState`]'s shutdown token like
//! `?wait=true` does.

mod compat;
pub mod http;
mod ops;
mod pages;
mod streams;
mod v1;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Layer;
use tower_http::normalize_path::NormalizePathLayer;

use crate::job::limits::LimitPolicy;
use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::store::Store;

pub use compat::CompatConfig;
pub use http::auth::{ApiKeys, Caller};
pub use http::error::ApiError;
pub use http::tokens::{AttachTokens, MIN_SECRET_BYTES, Scope, TokenError, TokenSigner};
pub use pages::{PlaygroundKey, WebUi, page_path};
pub use streams::caps::StreamLimits;

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
    pub engine: Option<crate::sandbox::SandboxEngine>,
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

/// Every `reason` of `code_runner_submissions_rejected_total`; each starts
/// at 0 so a dashboard sees the series before the first refusal.
pub const REJECTION_REASONS: &[&str] = &[
    "unauthorized",
    "invalid",
    "too_large",
    "queue_full",
    "key_limit",
    "key_storage",
    "quota_exceeded",
    "conflict",
    "malformed",
    "rate_limited",
    "user_active_limit",
    "user_rate_limit",
    "shutting_down",
    "store_unavailable",
];

/// The shared state of every handler: cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    inner: Arc<ApiConfig>,
    ops: ops::OpsState,
    /// Cancelled when the server shuts down: long requests (`?wait=true`,
    /// the streams) end early instead of holding the shutdown up.
    shutdown: CancellationToken,
    /// The WebSocket sessions: upgraded connections the HTTP server no
    /// longer tracks, waited for (briefly) when it stops so each gets its
    /// close frame out.
    sessions: TaskTracker,
    /// The browser pages, when on.
    web: Option<Arc<WebUi>>,
    /// Where the Piston and Judge0 APIs are served, and Piston's keyless mode.
    compat: Arc<CompatConfig>,
    /// This process's followers of jobs' events.
    feeds: crate::follow::feeds::Feeds,
    /// Queued jobs' places, for their streams and views.
    places: crate::follow::places::Places,
    stream_caps: streams::caps::StreamCaps,
    /// The per-key request rate, shared by `/v1` and the compatible APIs.
    key_rate: Arc<http::ratelimit::KeyRate>,
    /// What a job of the language defaults reserves at most
    /// ([`default_job_reserve`]).
    default_job_reserve: u64,
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
        for reason in REJECTION_REASONS {
            config
                .metrics
                .submissions_rejected
                .with_label_values(&[*reason]);
        }
        let docker = config
            .engine
            .clone()
            .map(|engine| ops::DockerCheck::new(engine, Some(&config.catalog)));
        let ops = ops::OpsState::new(config.store.clone(), config.metrics.clone(), docker);
        let shutdown = CancellationToken::new();
        let feeds = crate::follow::feeds::Feeds::new(config.store.clone(), shutdown.clone());
        let places = crate::follow::places::Places::new(config.store.clone(), shutdown.clone());
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
    fn input_budgets(&self) -> crate::store::InputBudgets {
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
    fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.feeds = crate::follow::feeds::Feeds::new(self.inner.store.clone(), shutdown.clone());
        self.places =
            crate::follow::places::Places::new(self.inner.store.clone(), shutdown.clone());
        self.shutdown = shutdown;
        self
    }
}

/// The whole API as a router.
pub fn router(state: ApiState) -> Router {
    let body_limit = state.inner.max_body_bytes;
    let pages = state.web.as_deref().map(pages::routes).unwrap_or_default();
    // The routes that take an API key, rate limited per key.
    let keyed = Router::new()
        .route("/v1/jobs", post(v1::jobs::submit).get(v1::history::list))
        .route(
            "/v1/jobs/{id}",
            get(v1::jobs::show).delete(v1::jobs::cancel),
        )
        .route(
            "/v1/capacity",
            get(v1::capacity::list).put(v1::capacity::put),
        )
        .route(
            "/v1/capacity/{id}",
            axum::routing::delete(v1::capacity::delete),
        )
        .route("/v1/usage", get(v1::usage::show))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            http::ratelimit::limit,
        ));
    let app = Router::new()
        .merge(pages)
        .merge(keyed)
        .route("/v1/jobs/{id}/ws", get(streams::websocket))
        .route("/v1/jobs/{id}/events", get(streams::events))
        .route("/v1/languages", get(ops::languages))
        .merge(compat::router(&state.compat))
        .merge(ops::router(state.ops.clone()))
        .fallback(ops::no_route)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn(log_request))
        .with_state(state);
    // Every route answers the same with a trailing slash (Piston's and
    // Judge0's clients put one on every path; their servers accept it):
    // one layer before routing, not a second route per path.
    Router::new().fallback_service(NormalizePathLayer::trim_trailing_slash().layer(app))
}

/// Serves the API until `shutdown` is cancelled, then lets requests in
/// flight finish (waiting submits answer at once with the job's status).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    if let Ok(address) = listener.local_addr() {
        tracing::info!(address = %address, "the API is listening");
    }
    let sessions = state.sessions.clone();
    if state
        .web
        .as_ref()
        .is_some_and(|w| w.dashboard_path.is_some())
    {
        tokio::spawn(pages::dashboard::sample(state.clone(), shutdown.clone()));
    }
    let timers = http::server::Timers {
        header: state.inner.limits.header_timeout,
        keep_alive: state.inner.limits.keep_alive,
    };
    let app = router(state.with_shutdown(shutdown.clone()));
    let served = http::server::serve(listener, app, shutdown.clone(), timers).await;
    // A failed listener: stop the long requests too.
    shutdown.cancel();
    // The WebSocket sessions saw the same token: each sends its close (1001)
    // and waits a moment for the client's answer.
    sessions.close();
    if tokio::time::timeout(SESSIONS_GRACE, sessions.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            sessions = sessions.len(),
            "WebSocket sessions did not close in time"
        );
    }
    served
}

/// Longest the server waits for its WebSocket sessions to close at shutdown.
const SESSIONS_GRACE: Duration = Duration::from_secs(5);

/// Serves /metrics, /healthz and /readyz for a process without the API (a
/// worker, a reaper). `/readyz` checks Redis and Docker through `engine`,
/// and with `offered` (a worker's languages) their images.
pub async fn serve_ops(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    store: Store,
    engine: Option<crate::sandbox::SandboxEngine>,
    offered: Option<&LanguageCatalog>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    if let Ok(address) = listener.local_addr() {
        tracing::info!(address = %address, "the metrics endpoint is listening");
    }
    let docker = engine.map(|engine| ops::DockerCheck::new(engine, offered));
    let app = ops::router(ops::OpsState::new(store, metrics, docker))
        .fallback(ops::no_route)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(middleware::from_fn(log_request));
    http::server::serve(listener, app, shutdown, http::server::OPS_TIMERS).await
}

/// One debug line per request: method, path, status, time taken.
async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::debug!(
        http.method = %method,
        http.path = %path,
        http.status = response.status().as_u16(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "request served"
    );
    response
}

#[cfg(test)]
mod storage_tests {
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
