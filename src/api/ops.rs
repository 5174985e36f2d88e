//! The operator endpoints, `/healthz`, `/readyz` and `/metrics`: served by
//! the API and, alone ([`super::serve_ops`]), by a worker or a reaper
//! process.
//!
//! `/readyz` checks that Redis answers; in a process with a worker or a
//! reaper it also pings Docker, and with a worker looks up each image of the
//! languages it offers, through the sandbox engine it was given; nothing
//! else of the API touches Docker. Its warnings name a Redis that would
//! lose jobs (no persistence, an evicting policy) without making the
//! process unready.

use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::store::Store;

/// How long one readiness check may take before it counts as failed.
const READINESS_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// The sandbox engine and the images to look for, when a worker or a
/// reaper shares the process.
#[derive(Clone)]
pub(super) struct DockerCheck {
    engine: crate::sandbox::Engine,
    images: Vec<String>,
}

impl DockerCheck {
    /// Checks Docker through `engine` and the images of `catalog`'s
    /// languages (a reaper alone runs no job: it passes none).
    pub fn new(engine: crate::sandbox::Engine, catalog: Option<&LanguageCatalog>) -> Self {
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
