//! The operator endpoints (`/healthz`, `/readyz`, `/metrics`) and the public
//! language catalog (`/v1/languages`).
//!
//! `/readyz` in a process with a worker or a reaper pings Docker, and with a
//! worker looks up each image of the languages it offers, through the
//! sandbox engine it was given; nothing else of the API touches Docker.

use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::ApiState;
use crate::api::http::error::ApiError;
use crate::job::limits::{CompileLimits, Limits};
use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::store::Store;

/// How long one readiness check may take before it counts as failed.
const READINESS_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// The sandbox engine and the images to look for, when a worker or a
/// reaper shares the process.
#[derive(Clone)]
pub(super) struct DockerCheck {
    engine: crate::sandbox::SandboxEngine,
    images: Vec<String>,
}

impl DockerCheck {
    /// Checks Docker through `engine` and the images of `catalog`'s
    /// languages (a reaper alone runs no job: it passes none).
    pub fn new(engine: crate::sandbox::SandboxEngine, catalog: Option<&LanguageCatalog>) -> Self {
        let mut images: Vec<String> = catalog
            .map(|catalog| catalog.all().iter().map(|l| l.image_ref()).collect())
            .unwrap_or_default();
        images.sort();
        images.dedup();
        Self { engine, images }
    }
}

/// What the operator endpoints need.
#[derive(Clone)]
pub(super) struct OpsState {
    store: Store,
    metrics: Metrics,
    docker: Option<DockerCheck>,
}

impl OpsState {
    pub fn new(store: Store, metrics: Metrics, docker: Option<DockerCheck>) -> Self {
        Self {
            store,
            metrics,
            docker,
        }
    }
}

/// `/healthz`, `/readyz` and `/metrics`, usable under any outer state.
pub(super) fn router<S: Clone + Send + Sync + 'static>(ops: OpsState) -> Router<S> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(ops)
}

/// The process is alive.
async fn healthz() -> &'static str {
    "ok"
}

#[derive(Debug, Serialize)]
struct Readiness {
    ready: bool,
    /// Each check that failed, with why.
    failing: Vec<FailedCheck>,
    /// What works but loses jobs when something goes wrong: a Redis with
    /// no persistence (`redis_persistence`) or an evicting policy
    /// (`redis_eviction`). Warnings do not make the process unready.
    warnings: Vec<FailedCheck>,
}

#[derive(Debug, Serialize)]
struct FailedCheck {
    check: String,
    message: String,
}

async fn within_timeout<T, E: std::fmt::Display>(
    check: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(READINESS_CHECK_TIMEOUT, check).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!(
            "no answer within {} s",
            READINESS_CHECK_TIMEOUT.as_secs()
        )),
    }
}

/// Ready to take jobs: Redis answers, and with a worker in the process,
/// Docker answers and has every catalog image.
async fn readyz(State(ops): State<OpsState>) -> Response {
    let mut failing = Vec::new();
    let mut warnings = Vec::new();
    match within_timeout(ops.store.redis_health()).await {
        Ok(health) => warnings.extend(health.warnings().into_iter().map(|warning| FailedCheck {
            check: warning.check().into(),
            message: warning.to_string(),
        })),
        Err(message) => failing.push(FailedCheck {
            check: "redis".into(),
            message,
        }),
    }
    if let Some(check) = &ops.docker {
        let problems = check
            .engine
            .readiness(&check.images, READINESS_CHECK_TIMEOUT)
            .await;
        failing.extend(
            problems
                .into_iter()
                .map(|(check, message)| FailedCheck { check, message }),
        );
    }
    let ready = failing.is_empty();
    if !ready {
        tracing::debug!(failing = ?failing, "not ready");
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Readiness {
            ready,
            failing,
            warnings,
        }),
    )
        .into_response()
}

/// Prometheus text; the queue depth is read from Redis at each scrape.
async fn metrics(State(ops): State<OpsState>) -> Response {
    match ops.store.jobs().queue_depth().await {
        Ok(depth) => ops
            .metrics
            .queue_depth
            .set(i64::try_from(depth).unwrap_or(i64::MAX)),
        Err(error) => {
            tracing::warn!(error = %error, "cannot read the queue depth for /metrics; reporting the last value");
        }
    }
    match ops.store.jobs().tenants_waiting().await {
        Ok(tenants) => ops
            .metrics
            .queue_tenants
            .set(i64::try_from(tenants).unwrap_or(i64::MAX)),
        Err(error) => {
            tracing::warn!(error = %error, "cannot read the waiting tenants for /metrics; reporting the last value");
        }
    }
    (
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        ops.metrics.render(),
    )
        .into_response()
}

#[derive(Debug, Serialize)]
struct LanguageView<'a> {
    id: &'a str,
    name: &'a str,
    version: &'a str,
    aliases: &'a [String],
    extensions: &'a [String],
    compiled: bool,
    /// The limits a job of this language gets unless it asks otherwise.
    limits: Limits,
    /// The same for the compile stage, for compiled languages.
    #[serde(skip_serializing_if = "Option::is_none")]
    compile_limits: Option<CompileLimits>,
    /// The libraries the image carries (`[]`: none beyond the standard
    /// library).
    libraries: &'a [crate::languages::Library],
}

#[derive(Debug, Serialize)]
struct CatalogView<'a> {
    languages: Vec<LanguageView<'a>>,
    /// The most a job may ask for.
    maximum_limits: Limits,
    maximum_compile_limits: CompileLimits,
}

/// `GET /v1/languages`: the languages on offer (those the workers have
/// images of) with each one's default limits.
pub(super) async fn languages(State(state): State<ApiState>) -> Response {
    let policy = &state.inner.policy;
    let catalog = state.offered_catalog().await;
    let languages = catalog
        .all()
        .iter()
        .map(|language| LanguageView {
            id: &language.id,
            name: &language.name,
            version: &language.version,
            aliases: &language.aliases,
            extensions: &language.extensions,
            compiled: language.compile.is_some(),
            limits: language.limits.with_defaults(policy.defaults),
            compile_limits: language.compile.as_ref().map(|_| {
                language
                    .compile_limits
                    .with_defaults(policy.compile_defaults)
            }),
            libraries: &language.libraries,
        })
        .collect();
    Json(CatalogView {
        languages,
        maximum_limits: policy.maximum,
        maximum_compile_limits: policy.compile_maximum,
    })
    .into_response()
}

pub(super) async fn no_route() -> ApiError {
    ApiError::NotFound("no such route")
}

pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
