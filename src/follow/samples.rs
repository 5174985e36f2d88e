//! The operator dashboard's plots: the recent history of two figures of
//! `/metrics`, the queue depth (`code_runner_queue_depth`) and the jobs
//! finished per second (the rate of `code_runner_jobs_total`), sampled by
//! this process every [`SAMPLE_INTERVAL`] while the server runs and kept
//! for [`HISTORY`]: the same figures a Prometheus scrape of this process
//! reads, without a Prometheus. The queue depth is the fleet's (one Redis
//! list); `code_runner_jobs_total` counts the jobs of this process's
//! worker, so an `api`-only process counts no jobs, and Prometheus's
//! `sum(rate(...))` over the workers remains the fleet-wide figure.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::core::Collector;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::store::{Store, now_ms};

/// How often the history takes a sample.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// How far back the history goes.
pub const HISTORY: Duration = Duration::from_secs(15 * 60);
/// One sample of the history.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    pub(crate) at_ms: u64,
    /// `None` when Redis did not answer.
    pub(crate) queue_depth: Option<u64>,
    /// `code_runner_jobs_total`, summed over its labels.
    pub(crate) jobs_total: u64,
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

    pub(crate) fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        if samples.len() == Self::capacity() {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// The samples with the rate between each and the one before.
    pub(crate) fn points(&self) -> Vec<Point> {
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
                at_ms: sample.at_ms,
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

/// One point of a plot: a sample, with the rate since the one before.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    pub(crate) at_ms: u64,
    pub(crate) queue_depth: Option<u64>,
    /// Jobs finished per second since the sample before; `None` for the
    /// first.
    pub(crate) jobs_per_s: Option<f64>,
}

/// Samples `history` every [`SAMPLE_INTERVAL`] until `shutdown`; the
/// first sample at once. Updates the queue depth gauge as a scrape would.
pub(crate) async fn sample(
    store: Store,
    metrics: Metrics,
    history: Arc<History>,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let queue_depth = match store.jobs().queue_depth().await {
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
        history.push(Sample {
            at_ms: now_ms(),
            queue_depth,
            jobs_total: jobs_total(&metrics),
        });
    }
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
        assert_eq!(points[0].at_ms, 1_000);
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
