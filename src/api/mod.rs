//! The HTTP API: axum, JSON. Knows HTTP; keeps the shared state through
//! [`crate::store`] and never names a Redis key; follows jobs through this
//! process's followers ([`crate::follow`]); asks Docker nothing but
//! `/readyz`'s question, through the sandbox engine.
//!
//! Where things are:
//! - here: the map of the routes ([`router`]) and the two servers
//!   ([`serve`]: the API; [`serve_ops`]: the operator endpoints alone, for
//!   a worker or a reaper process);
//! - [`state`]: [`ApiState`], what every handler shares, and the
//!   configuration it is made from;
//! - [`http`]: the plumbing under every route: the server loop and its
//!   connection timers, the one error type, API keys and attach tokens,
//!   the per-key request rate, the count of refused submissions;
//! - [`v1`]: the native JSON API under `/v1`, and the one submit path the
//!   compatible APIs share;
//! - [`streams`]: a job's WebSocket and Server-Sent Events, and the caps
//!   on open streams;
//! - [`pages`]: the browser pages (playground, dashboard) and their data
//!   routes under `/v1`;
//! - [`compat`]: the Piston v2 and Judge0 CE compatible APIs, adapters that
//!   submit ordinary jobs;
//! - [`ops`]: `/healthz`, `/readyz`, `/metrics`.
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
//!   their files under `/ui/`;
//! - Piston's routes under its prefix (`/api/v2` by default) and Judge0's
//!   under its own (`/judge0`), each listed in its module of [`compat`].
//!
//! Every route answers the same with a trailing slash. The streams of a
//! job authenticate with [`http::tokens::TokenSigner::verify`] (or the API
//! key) and end on [`ApiState`]'s shutdown token like `?wait=true` does.

mod compat;
pub mod http;
mod ops;
mod pages;
mod state;
mod streams;
mod v1;

use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;
use tower::Layer;
use tower_http::normalize_path::NormalizePathLayer;

use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::store::Store;

pub use compat::{CompatConfig, CorsOrigins};
pub use http::auth::{ApiKeys, Caller};
pub use http::error::ApiError;
pub use http::refusals::REJECTION_REASONS;
pub use http::tokens::{AttachTokens, MIN_SECRET_BYTES, Scope, TokenError, TokenSigner};
pub use pages::{PlaygroundKey, WebUi, page_path};
pub use state::{ApiConfig, ApiLimits, ApiState, DEFAULT_SPEC_BYTES, default_job_reserve};
pub use streams::caps::StreamLimits;

/// The whole API as a router.
pub fn router(state: ApiState) -> Router {
    let body_limit = state.inner.max_body_bytes;
    // The native API's routes that take an API key, rate limited per key.
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
        // A file's body has a limit of its own (CODE_RUNNER_FILE_MAX_MB),
        // counted by its handler as the bytes come (they are streamed to
        // the backend): the API's limit is off on its route.
        .route(
            "/v1/files/{sha256}",
            axum::routing::put(v1::files::put)
                .get(v1::files::get)
                .head(v1::files::head)
                .delete(v1::files::delete)
                .layer(DefaultBodyLimit::disable()),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            http::ratelimit::limit,
        ));
    // The streams (a key or an attach token) and the public catalog.
    let open = Router::new()
        .route("/v1/jobs/{id}/ws", get(streams::websocket))
        .route("/v1/jobs/{id}/events", get(streams::events))
        .route("/v1/languages", get(v1::languages::languages));
    // The pages and the compatible APIs, where configuration puts them.
    let pages = state.web.as_deref().map(pages::routes).unwrap_or_default();
    let compat = compat::router(&state.compat);
    let app = Router::new()
        .merge(keyed)
        .merge(open)
        .merge(pages)
        .merge(compat)
        .merge(ops::router(state.ops.clone()))
        .fallback(http::no_route)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn(http::log_request))
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
    if let Some(web) = state.web.as_ref().filter(|w| w.dashboard_path.is_some()) {
        tokio::spawn(crate::follow::samples::sample(
            state.inner.store.clone(),
            state.inner.metrics.clone(),
            web.history.clone(),
            shutdown.clone(),
        ));
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
    engine: Option<crate::sandbox::Engine>,
    offered: Option<&LanguageCatalog>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    if let Ok(address) = listener.local_addr() {
        tracing::info!(address = %address, "the metrics endpoint is listening");
    }
    let docker = engine.map(|engine| ops::DockerCheck::new(engine, offered));
    let app = ops::router(ops::OpsState::new(store, metrics, docker))
        .fallback(http::no_route)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(middleware::from_fn(http::log_request));
    http::server::serve(listener, app, shutdown, http::server::OPS_TIMERS).await
}
