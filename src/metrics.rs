//! Prometheus metrics. Names are part of the operator contract (a
//! fly-autoscaler query reads `code_runner_slots_used`, `code_runner_slots_max`
//! and `code_runner_queue_depth`); the others follow
//! `code_runner_<name>_<unit>[_total]`. No job ids in labels.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

/// Every metric of the process, registered in one registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Sandboxes running on this worker now.
    pub slots_used: IntGauge,
    /// Sandboxes this worker may run at once.
    pub slots_max: IntGauge,
    /// `LLEN jobs:queue`, read when /metrics is scraped.
    pub queue_depth: IntGauge,
    /// Finished jobs by language and terminal status.
    pub jobs: IntCounterVec,
    /// Submissions refused, by reason.
    pub submissions_rejected: IntCounterVec,
    /// From submit to start, by language.
    pub queue_wait: HistogramVec,
    /// From start to result, by language.
    pub run: HistogramVec,
    /// Create + attach + start until the supervisor is ready, by language.
    pub container_start: HistogramVec,
    /// What the orphan reaper cleaned up, by kind: `container` (of a dead
    /// worker), `expired_container` (past its deadline), `requeued`,
    /// `worker_lost`, `dead`, `dropped` (a finished or expired job left in a
    /// dead worker's list), `deadline_exceeded` (stuck on a live worker).
    pub reaper_orphans: IntCounterVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

impl Metrics {
    /// Creates and registers every metric. Fails only if a definition is
    /// invalid (a programming error caught by the tests).
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let gauge = IntGauge::new(name, help)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok(gauge)
        };
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let counter = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(counter.clone()))?;
                Ok(counter)
            };
        let histogram = |name: &str, help: &str| -> Result<HistogramVec, prometheus::Error> {
            let histogram = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(SECONDS_BUCKETS.to_vec()),
                &["language"],
            )?;
            registry.register(Box::new(histogram.clone()))?;
            Ok(histogram)
        };
        Ok(Self {
            slots_used: gauge(
                "code_runner_slots_used",
                "Sandboxes running on this worker now.",
            )?,
            slots_max: gauge(
                "code_runner_slots_max",
                "Sandboxes this worker may run at once.",
            )?,
            queue_depth: gauge("code_runner_queue_depth", "Jobs waiting in jobs:queue.")?,
            jobs: counter(
                "code_runner_jobs_total",
                "Finished jobs by language and status.",
                &["language", "status"],
            )?,
            submissions_rejected: counter(
                "code_runner_submissions_rejected_total",
                "Submissions refused, by reason.",
                &["reason"],
            )?,
            queue_wait: histogram(
                "code_runner_queue_wait_seconds",
                "Time from submit to start.",
            )?,
            run: histogram("code_runner_run_seconds", "Time from start to result.")?,
            container_start: histogram(
                "code_runner_container_start_seconds",
                "Time to create and start a sandbox until its supervisor is ready.",
            )?,
            reaper_orphans: counter(
                "code_runner_reaper_orphans_total",
                "Orphans the reaper cleaned up, by kind.",
                &["kind"],
            )?,
            registry,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_contract_names() {
        let metrics = Metrics::new().unwrap();
        metrics.slots_max.set(3);
        metrics
            .jobs
            .with_label_values(&["python", "succeeded"])
            .inc();
        metrics
            .submissions_rejected
            .with_label_values(&["queue_full"])
            .inc();
        metrics
            .queue_wait
            .with_label_values(&["python"])
            .observe(0.2);
        metrics
            .reaper_orphans
            .with_label_values(&["worker_lost"])
            .inc();
        let text = metrics.render();
        for line in [
            "code_runner_slots_max 3",
            "code_runner_slots_used 0",
            "code_runner_queue_depth 0",
            "code_runner_jobs_total{language=\"python\",status=\"succeeded\"} 1",
            "code_runner_submissions_rejected_total{reason=\"queue_full\"} 1",
            "code_runner_queue_wait_seconds_count{language=\"python\"} 1",
            "code_runner_reaper_orphans_total{kind=\"worker_lost\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
