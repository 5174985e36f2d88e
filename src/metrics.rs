//! Prometheus metrics. Names are part of the operator contract (a
//! fly-autoscaler query reads `code_runner_slots_used`, `code_runner_slots_max`
//! and `code_runner_queue_depth`); the others follow
//! `code_runner_<name>_<unit>[_total]`. No job ids in labels.
//!
//! Every metric of the process is defined here, in one registry
//! ([`Metrics`]); the roles are handed a clone and count into it.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Every metric of the process, registered in one registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Sandboxes running on this worker now.
    pub slots_used: IntGauge,
    /// Sandboxes this worker may run at once.
    pub slots_max: IntGauge,
    /// Containers of ended jobs waiting to be removed (not holding a slot).
    pub removals_queued: IntGauge,
    /// 1 while the warm pool starts nothing for want of memory.
    pub warm_memory_held: IntGauge,
    /// `LLEN jobs:queue`, read when /metrics is scraped.
    pub queue_depth: IntGauge,
    /// API keys with jobs queued (in the fair turns' ring).
    pub queue_tenants: IntGauge,
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
    /// `retried` (a started batch job run again), `worker_lost`, `cancelled`
    /// (its cancel was asked for), `dead`, `dropped` (a finished or expired
    /// job left in a dead worker's list), `deadline_exceeded` (stuck on a
    /// live worker).
    pub reaper_orphans: IntCounterVec,
    /// Warm sandboxes ready on this worker, by language.
    pub warm_ready: IntGaugeVec,
    /// Warm sandboxes this worker means to keep ready, by language.
    pub warm_target: IntGaugeVec,
    /// Jobs started, by language and `start` (`warm`: in a sandbox started
    /// before the job came; `cold`: in one started for it).
    pub job_starts: IntCounterVec,
    /// From the claim of a job to the start of its program (its first
    /// stage), by `start`.
    pub claim_to_start: HistogramVec,
    /// Connections through jobs' egress proxies, by `verdict`: `allowed`,
    /// or why one was refused (`not_allowed`, `forbidden_address`, …).
    pub egress_connections: IntCounterVec,
    /// Bytes relayed by jobs' egress proxies, by `direction` (`up`: to the
    /// hosts, `down`: from them).
    pub egress_bytes: IntCounterVec,
    pub streams_open: IntGauge,
    pub checker_compiles: IntCounterVec,
    pub streams_refused: IntCounterVec,
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
        let gauges =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntGaugeVec, prometheus::Error> {
                let gauges = IntGaugeVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(gauges.clone()))?;
                Ok(gauges)
            };
        let histogram_by =
            |name: &str, help: &str, label: &str| -> Result<HistogramVec, prometheus::Error> {
                let histogram = HistogramVec::new(
                    HistogramOpts::new(name, help).buckets(SECONDS_BUCKETS.to_vec()),
                    &[label],
                )?;
                registry.register(Box::new(histogram.clone()))?;
                Ok(histogram)
            };
        let histogram = |name: &str, help: &str| -> Result<HistogramVec, prometheus::Error> {
            histogram_by(name, help, "language")
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
            removals_queued: gauge(
                "code_runner_removals_queued",
                "Containers of jobs that ended by themselves, waiting to be removed or being removed (they hold no slot and no process of their job).",
            )?,
            warm_memory_held: gauge(
                "code_runner_warm_memory_held",
                "1 while this worker's warm pool starts no sandbox because the machine has less memory available than its reserve.",
            )?,
            queue_depth: gauge(
                "code_runner_queue_depth",
                "Jobs waiting to be claimed (one turn each in jobs:queue).",
            )?,
            queue_tenants: gauge(
                "code_runner_queue_tenants",
                "API keys with jobs waiting (the keys taking turns).",
            )?,
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
            warm_ready: gauges(
                "code_runner_warm_ready",
                "Warm sandboxes ready on this worker, by language.",
                &["language"],
            )?,
            warm_target: gauges(
                "code_runner_warm_target",
                "Warm sandboxes this worker means to keep ready, by language.",
                &["language"],
            )?,
            job_starts: counter(
                "code_runner_job_starts_total",
                "Jobs started, by language and start kind (warm or cold).",
                &["language", "start"],
            )?,
            claim_to_start: histogram_by(
                "code_runner_claim_to_start_seconds",
                "Time from the claim of a job to the start of its program, by start kind.",
                "start",
            )?,
            egress_connections: counter(
                "code_runner_egress_connections_total",
                "Connections through jobs' egress proxies, by verdict (allowed, or the reason of a refusal).",
                &["verdict"],
            )?,
            egress_bytes: counter(
                "code_runner_egress_bytes_total",
                "Bytes relayed by jobs' egress proxies, by direction (up: to the hosts, down: from them).",
                &["direction"],
            )?,
            streams_open: gauge(
                "code_runner_streams_open",
                "Job streams (WebSocket and SSE) open on this API process.",
            )?,
            checker_compiles: counter(
                "code_runner_checker_compiles_total",
                "Graded jobs whose checker program has a compile stage, by whether it started from a compile the worker kept (hit) or not (miss).",
                &["cache"],
            )?,
            streams_refused: counter(
                "code_runner_streams_refused_total",
                "Job streams refused with 429 too_many_streams, by the cap they would pass (job, key, server).",
                &["cap"],
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
        metrics.warm_ready.with_label_values(&["python"]).set(2);
        metrics.warm_target.with_label_values(&["python"]).set(4);
        metrics.warm_memory_held.set(1);
        metrics
            .job_starts
            .with_label_values(&["python", "warm"])
            .inc();
        metrics
            .claim_to_start
            .with_label_values(&["cold"])
            .observe(0.1);
        metrics
            .egress_connections
            .with_label_values(&["not_allowed"])
            .inc();
        metrics
            .egress_bytes
            .with_label_values(&["down"])
            .inc_by(512);
        let text = metrics.render();
        for line in [
            "code_runner_slots_max 3",
            "code_runner_slots_used 0",
            "code_runner_removals_queued 0",
            "code_runner_queue_depth 0",
            "code_runner_queue_tenants 0",
            "code_runner_jobs_total{language=\"python\",status=\"succeeded\"} 1",
            "code_runner_submissions_rejected_total{reason=\"queue_full\"} 1",
            "code_runner_queue_wait_seconds_count{language=\"python\"} 1",
            "code_runner_reaper_orphans_total{kind=\"worker_lost\"} 1",
            "code_runner_warm_ready{language=\"python\"} 2",
            "code_runner_warm_target{language=\"python\"} 4",
            "code_runner_warm_memory_held 1",
            "code_runner_job_starts_total{language=\"python\",start=\"warm\"} 1",
            "code_runner_claim_to_start_seconds_count{start=\"cold\"} 1",
            "code_runner_egress_connections_total{verdict=\"not_allowed\"} 1",
            "code_runner_egress_bytes_total{direction=\"down\"} 512",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
