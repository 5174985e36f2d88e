//! The operator dashboard's data: `GET /v1/dashboard` (admin key) answers
//! with the live workers (slots used/max and warm sandboxes, from their
//! heartbeats), the queue depth, the users waiting in turn order, the
//! newest jobs with their statuses, and the recent history of the queue
//! depth and the jobs finished per second, which this process samples
//! ([`crate::follow::samples`]; `jobs_counted: false` in an `api`-only
//! process, which counts no jobs). The page is in [`super`].

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::v1::jobs::rfc3339;
use crate::follow::samples::{Point, SAMPLE_INTERVAL};
use crate::job::Status;
use crate::store::{JobSummary, LiveWorker, WarmFigures, now_ms};

/// How many of the newest jobs the dashboard shows.
const RECENT_JOBS_SHOWN: u64 = 50;

/// One point of a plot.
#[derive(Debug, Serialize)]
struct PointView {
    at: String,
    queue_depth: Option<u64>,
    /// Jobs finished per second since the sample before; `null` for the
    /// first.
    jobs_per_s: Option<f64>,
}

impl From<Point> for PointView {
    fn from(point: Point) -> Self {
        Self {
            at: rfc3339(point.at_ms),
            queue_depth: point.queue_depth,
            jobs_per_s: point.jobs_per_s,
        }
    }
}

#[derive(Debug, Serialize)]
struct HistoryView {
    interval_ms: u64,
    /// Whether `jobs_per_s` counts anything: only when a worker runs in
    /// this process.
    jobs_counted: bool,
    samples: Vec<PointView>,
}

/// A live worker as its heartbeat describes it. Fields a heartbeat lacks
/// are `null`.
#[derive(Debug, Serialize, PartialEq)]
struct WorkerView {
    id: String,
    slots_used: Option<u64>,
    slots_max: Option<u64>,
    version: Option<String>,
    started_at: Option<String>,
    /// Warm sandboxes per language (`{"python": {"ready": 3, "target": 4}}`),
    /// when the worker reports them.
    warm: Option<BTreeMap<String, WarmFigures>>,
    /// Whether its pool starts no sandbox for want of memory, when the
    /// worker reports it.
    warm_memory_held: Option<bool>,
}

impl WorkerView {
    fn new(worker: LiveWorker) -> Self {
        let heartbeat = worker.heartbeat;
        Self {
            slots_used: heartbeat.slots_used,
            slots_max: heartbeat.slots_max,
            version: heartbeat.version,
            started_at: heartbeat.started_ms.map(rfc3339),
            warm: heartbeat.warm,
            warm_memory_held: heartbeat.warm_memory_held,
            id: worker.id,
        }
    }
}

#[derive(Debug, Serialize)]
struct JobView {
    id: String,
    status: Status,
    language: String,
    api_key: String,
    worker: Option<String>,
    created_at: String,
    started_at: Option<String>,
    finished_at: Option<String>,
}

impl From<JobSummary> for JobView {
    fn from(job: JobSummary) -> Self {
        Self {
            id: job.id,
            status: job.status,
            language: job.language,
            api_key: job.api_key,
            worker: job.worker,
            created_at: rfc3339(job.created_ms),
            started_at: job.started_ms.map(rfc3339),
            finished_at: job.finished_ms.map(rfc3339),
        }
    }
}

/// Users with jobs waiting, in the order of their turns.
#[derive(Debug, Serialize)]
struct WaitingView {
    api_key: String,
    /// `null`: the key's anonymous user.
    user: Option<String>,
    queued: u64,
}

/// The most waiting users the dashboard lists.
const WAITING_SHOWN: usize = 50;

#[derive(Debug, Serialize)]
struct Overview {
    generated_at: String,
    queue_depth: u64,
    /// API keys with jobs waiting.
    tenants_waiting: u64,
    /// The first [`WAITING_SHOWN`] users waiting, in turn order.
    waiting: Vec<WaitingView>,
    workers: Vec<WorkerView>,
    recent_jobs: Vec<JobView>,
    history: HistoryView,
}

/// `GET /v1/dashboard` (admin key).
pub(crate) async fn overview(
    State(state): State<ApiState>,
    caller: Caller,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let web = super::settings(&state)?;
    let store = &state.inner.store;
    let (queue_depth, tenants_waiting, waiting, workers, jobs) = tokio::try_join!(
        store.jobs().queue_depth(),
        store.jobs().tenants_waiting(),
        store.jobs().waiting_tenants(WAITING_SHOWN),
        store.overview().live_workers(),
        store.overview().recent_jobs(RECENT_JOBS_SHOWN),
    )?;
    Ok(Json(Overview {
        generated_at: rfc3339(now_ms()),
        queue_depth,
        tenants_waiting,
        waiting: waiting
            .into_iter()
            .map(|(api_key, user, queued)| WaitingView {
                api_key,
                user: (!user.is_empty()).then_some(user),
                queued,
            })
            .collect(),
        workers: workers.into_iter().map(WorkerView::new).collect(),
        recent_jobs: jobs.into_iter().map(JobView::from).collect(),
        history: HistoryView {
            interval_ms: SAMPLE_INTERVAL.as_millis() as u64,
            jobs_counted: state.inner.engine.is_some(),
            samples: web
                .history
                .points()
                .into_iter()
                .map(PointView::from)
                .collect(),
        },
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Heartbeat;

    #[test]
    fn workers_are_read_from_their_heartbeats() {
        let worker = |heartbeat: &str| {
            WorkerView::new(LiveWorker {
                id: "w1".into(),
                heartbeat: Heartbeat::parse(heartbeat),
            })
        };
        let today = worker(r#"{"slots_used":1,"slots_max":4,"version":"0.1.0","started_ms":0}"#);
        assert_eq!(
            today,
            WorkerView {
                id: "w1".into(),
                slots_used: Some(1),
                slots_max: Some(4),
                version: Some("0.1.0".into()),
                started_at: Some("1970-01-01T00:00:00.000Z".into()),
                warm: None,
                warm_memory_held: None,
            }
        );
        let warm = worker(
            r#"{"slots_used":0,"slots_max":2,"warm":{"python":{"ready":3,"target":4}},"warm_memory_held":true,"extra":true}"#,
        );
        assert_eq!(
            serde_json::to_value(&warm.warm).unwrap(),
            serde_json::json!({"python": {"ready": 3, "target": 4}})
        );
        assert_eq!(warm.warm_memory_held, Some(true));
        let garbage = worker("not json");
        assert_eq!(
            (garbage.slots_used, garbage.warm, garbage.warm_memory_held),
            (None, None, None)
        );
    }

    #[test]
    fn a_point_is_shown_at_its_rfc3339_time() {
        let view = PointView::from(Point {
            at_ms: 1_000,
            queue_depth: Some(3),
            jobs_per_s: None,
        });
        assert_eq!(view.at, "1970-01-01T00:00:01.000Z");
        assert_eq!((view.queue_depth, view.jobs_per_s), (Some(3), None));
    }
}
