//! The operator dashboard's data: `GET /v1/dashboard` (admin key) answers
//! with the live workers (slots used/max and warm sandboxes, from their
//! heartbeats), the queue depth, the newest jobs with their statuses, and
//! the recent history of two figures of `/metrics`: the queue depth
//! (`code_runner_queue_depth`) and the jobs finished per second (the rate of
//! `code_runner_jobs_total`). The page is in [`super`].
//!
//! The history is sampled by this process every [`SAMPLE_INTERVAL`] while
//! the server runs and kept for [`HISTORY`]: the same figures a Prometheus
//! scrape of this process reads, without a Prometheus. The queue depth is
//! the fleet's (one Redis list); `code_runner_jobs_total` counts the jobs
//! of this process's worker, so an `api`-only process reports no rate
//! (`jobs_counted: false`), and Prometheus's `sum(rate(...))` over the
//! workers remains the fleet-wide figure.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use prometheus::core::Collector;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::v1::jobs::rfc3339;
use crate::job::Status;
use crate::metrics::Metrics;
use crate::store::{JobSummary, LiveWorker, now_ms};

/// How often the history takes a sample.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// How far back the history goes.
pub const HISTORY: Duration = Duration::from_secs(15 * 60);
/// How many of the newest jobs the dashboard shows.
const RECENT_JOBS_SHOWN: u64 = 50;

/// One sample of the history.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    at_ms: u64,
    /// `None` when Redis did not answer.
    queue_depth: Option<u64>,
    /// `code_runner_jobs_total`, summed over its labels.
    jobs_total: u64,
}

/// The recent history of the plotted figures.
#[derive(Debug)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    pub fn new() -> Self {
        Self {
            samples: Mutex::new(VecDeque::new()),
        }
    }

    fn capacity() -> usize {
        (HISTORY.as_millis() / SAMPLE_INTERVAL.as_millis()) as usize + 1
    }

    fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        if samples.len() == Self::capacity() {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// The samples with the rate between each and the one before.
    fn points(&self) -> Vec<Point> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let mut points = Vec::with_capacity(samples.len());
        let mut previous: Option<&Sample> = None;
        for sample in samples.iter() {
            let jobs_per_s = previous.and_then(|before| {
                let seconds = sample.at_ms.checked_sub(before.at_ms)? as f64 / 1000.0;
                let jobs = sample.jobs_total.checked_sub(before.jobs_total)?;
                (seconds > 0.0).then(|| (jobs as f64 / seconds * 100.0).round() / 100.0)
            });
            points.push(Point {
                at: rfc3339(sample.at_ms),
                queue_depth: sample.queue_depth,
                jobs_per_s,
            });
            previous = Some(sample);
        }
        points
    }
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

/// `code_runner_jobs_total` of this process, over every label.
fn jobs_total(metrics: &Metrics) -> u64 {
    metrics
        .jobs
        .collect()
        .iter()
        .flat_map(|family| family.get_metric())
        .map(|metric| metric.get_counter().value() as u64)
        .sum()
}

/// Samples the history every [`SAMPLE_INTERVAL`] until `shutdown`; the
/// first sample at once. Updates the queue depth gauge as a scrape would.
pub(crate) async fn sample(state: ApiState, shutdown: CancellationToken) {
    let Some(web) = state.web.clone() else {
        return;
    };
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let metrics = &state.inner.metrics;
        let queue_depth = match state.inner.store.jobs().queue_depth().await {
            Ok(depth) => {
                metrics
                    .queue_depth
                    .set(i64::try_from(depth).unwrap_or(i64::MAX));
                Some(depth)
            }
            Err(error) => {
                tracing::debug!(error = %error, "cannot read the queue depth for the dashboard");
                None
            }
        };
        web.history.push(Sample {
            at_ms: now_ms(),
            queue_depth,
            jobs_total: jobs_total(metrics),
        });
    }
}

/// One point of a plot.
#[derive(Debug, Serialize)]
struct Point {
    at: String,
    queue_depth: Option<u64>,
    /// Jobs finished per second since the sample before; `null` for the
    /// first.
    jobs_per_s: Option<f64>,
}

#[derive(Debug, Serialize)]
struct HistoryView {
    interval_ms: u64,
    /// Whether `jobs_per_s` counts anything: only when a worker runs in
    /// this process.
    jobs_counted: bool,
    samples: Vec<Point>,
}

/// A live worker as its heartbeat describes it. Fields a heartbeat lacks
/// are `null`; `warm` is passed on as the worker wrote it.
#[derive(Debug, Serialize, PartialEq)]
struct WorkerView {
    id: String,
    slots_used: Option<u64>,
    slots_max: Option<u64>,
    version: Option<String>,
    started_at: Option<String>,
    /// Warm sandboxes per language (`{"python": {"ready": 3, "target": 4}}`),
    /// when the worker reports them.
    warm: Option<serde_json::Value>,
    /// Whether its pool starts no sandbox for want of memory, when the
    /// worker reports it.
    warm_memory_held: Option<bool>,
}

impl WorkerView {
    fn new(worker: LiveWorker) -> Self {
        let value: serde_json::Value =
            serde_json::from_str(&worker.heartbeat).unwrap_or(serde_json::Value::Null);
        Self {
            slots_used: value["slots_used"].as_u64(),
            slots_max: value["slots_max"].as_u64(),
            version: value["version"].as_str().map(str::to_string),
            started_at: value["started_ms"].as_u64().map(rfc3339),
            warm: value.get("warm").filter(|w| w.is_object()).cloned(),
            warm_memory_held: value["warm_memory_held"].as_bool(),
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
            samples: web.history.points(),
        },
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_is_bounded_and_gives_rates() {
        let history = History::new();
        assert!(history.points().is_empty());
        history.push(Sample {
            at_ms: 1_000,
            queue_depth: Some(3),
            jobs_total: 10,
        });
        history.push(Sample {
            at_ms: 6_000,
            queue_depth: None,
            jobs_total: 20,
        });
        history.push(Sample {
            at_ms: 11_000,
            queue_depth: Some(0),
            jobs_total: 23,
        });
        let points = history.points();
        let figures: Vec<_> = points
            .iter()
            .map(|p| (p.queue_depth, p.jobs_per_s))
            .collect();
        assert_eq!(
            figures,
            [(Some(3), None), (None, Some(2.0)), (Some(0), Some(0.6))]
        );
        assert_eq!(points[0].at, "1970-01-01T00:00:01.000Z");
        for i in 0..History::capacity() as u64 + 10 {
            history.push(Sample {
                at_ms: 20_000 + i * 5_000,
                queue_depth: Some(i),
                jobs_total: 30,
            });
        }
        let points = history.points();
        assert_eq!(points.len(), History::capacity());
        assert_eq!(points.len(), 181);
        assert_eq!(points.last().unwrap().queue_depth, Some(190));
    }

    #[test]
    fn a_counter_reset_is_no_negative_rate() {
        let history = History::new();
        for (at_ms, jobs_total) in [(0, 50), (5_000, 0)] {
            history.push(Sample {
                at_ms,
                queue_depth: Some(0),
                jobs_total,
            });
        }
        assert_eq!(history.points()[1].jobs_per_s, None);
    }

    #[test]
    fn workers_are_read_from_their_heartbeats() {
        let worker = |heartbeat: &str| {
            WorkerView::new(LiveWorker {
                id: "w1".into(),
                heartbeat: heartbeat.into(),
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
            warm.warm,
            Some(serde_json::json!({"python": {"ready": 3, "target": 4}}))
        );
        assert_eq!(warm.warm_memory_held, Some(true));
        let garbage = worker("not json");
        assert_eq!(
            (garbage.slots_used, garbage.warm, garbage.warm_memory_held),
            (None, None, None)
        );
    }

    #[test]
    fn jobs_are_counted_over_every_label() {
        let metrics = Metrics::new().unwrap();
        assert_eq!(jobs_total(&metrics), 0);
        metrics
            .jobs
            .with_label_values(&["python", "succeeded"])
            .inc();
        metrics.jobs.with_label_values(&["c", "failed"]).inc_by(2);
        assert_eq!(jobs_total(&metrics), 3);
    }
}
