//! Caps on the open job streams (WebSocket and SSE) of this API process:
//! per job, per API key (a stream opened with an attach token counts for
//! the job's key) and in total. A stream over a cap is refused before the
//! upgrade with 429 `too_many_streams`, naming the cap. The open streams
//! are `code_runner_streams_open`, the refusals
//! `code_runner_streams_refused_total{cap}`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::{IntCounterVec, IntGauge};

use crate::api::http::error::ApiError;
use crate::metrics::Metrics;

/// The caps, from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    pub total: usize,
    pub per_key: usize,
    pub per_job: usize,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    keys: HashMap<String, usize>,
    jobs: HashMap<String, usize>,
}

/// The open streams, counted. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct StreamCaps {
    limits: StreamLimits,
    counts: Arc<Mutex<Counts>>,
    open: IntGauge,
    refused: IntCounterVec,
}

/// Which cap a stream would pass.
#[derive(Debug, Clone, Copy)]
enum Cap {
    Job,
    Key,
    Server,
}

impl Cap {
    const ALL: [Cap; 3] = [Cap::Job, Cap::Key, Cap::Server];

    /// Its `cap` label of `code_runner_streams_refused_total`.
    fn label(self) -> &'static str {
        match self {
            Cap::Job => "job",
            Cap::Key => "key",
            Cap::Server => "server",
        }
    }

    /// Whose streams it counts, as the refusal says it.
    fn scope(self) -> &'static str {
        match self {
            Cap::Job => "this job",
            Cap::Key => "this API key",
            Cap::Server => "this server",
        }
    }
}

/// One open stream; dropping it gives its place back.
#[derive(Debug)]
pub(crate) struct StreamPermit {
    counts: Arc<Mutex<Counts>>,
    open: IntGauge,
    key: String,
    job: String,
}

impl StreamCaps {
    pub(crate) fn new(limits: StreamLimits, metrics: &Metrics) -> Self {
        for cap in Cap::ALL {
            metrics.streams_refused.with_label_values(&[cap.label()]);
        }
        Self {
            limits,
            counts: Arc::default(),
            open: metrics.streams_open.clone(),
            refused: metrics.streams_refused.clone(),
        }
    }

    /// A place for one more stream of `job` (of API key `key`), or the
    /// refusal that names the cap it would pass.
    pub(crate) fn acquire(&self, key: &str, job: &str) -> Result<StreamPermit, ApiError> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let refuse = |cap: Cap, open: usize, limit: usize, setting: &'static str| {
            self.refused.with_label_values(&[cap.label()]).inc();
            Err(ApiError::TooManyStreams {
                scope: cap.scope(),
                open,
                limit,
                setting,
            })
        };
        let of_job = counts.jobs.get(job).copied().unwrap_or(0);
        if of_job >= self.limits.per_job {
            return refuse(
                Cap::Job,
                of_job,
                self.limits.per_job,
                "CODE_RUNNER_MAX_STREAMS_PER_JOB",
            );
        }
        let of_key = counts.keys.get(key).copied().unwrap_or(0);
        if of_key >= self.limits.per_key {
            return refuse(
                Cap::Key,
                of_key,
                self.limits.per_key,
                "CODE_RUNNER_MAX_STREAMS_PER_KEY",
            );
        }
        if counts.total >= self.limits.total {
            return refuse(
                Cap::Server,
                counts.total,
                self.limits.total,
                "CODE_RUNNER_MAX_STREAMS",
            );
        }
        counts.total += 1;
        self.open.set(counts.total as i64);
        *counts.keys.entry(key.to_string()).or_default() += 1;
        *counts.jobs.entry(job.to_string()).or_default() += 1;
        Ok(StreamPermit {
            counts: Arc::clone(&self.counts),
            open: self.open.clone(),
            key: key.to_string(),
            job: job.to_string(),
        })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.total = counts.total.saturating_sub(1);
        self.open.set(counts.total as i64);
        let Counts { keys, jobs, .. } = &mut *counts;
        for (map, name) in [(keys, &self.key), (jobs, &self.job)] {
            if let Some(count) = map.get_mut(name) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    map.remove(name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cap_refuses_the_stream_past_it_and_frees_on_drop() {
        let metrics = Metrics::new().unwrap();
        let caps = StreamCaps::new(
            StreamLimits {
                total: 3,
                per_key: 2,
                per_job: 1,
            },
            &metrics,
        );
        let first = caps.acquire("a", "j1").unwrap();
        assert!(matches!(
            caps.acquire("a", "j1"),
            Err(ApiError::TooManyStreams {
                scope: "this job",
                open: 1,
                ..
            })
        ));
        let _second = caps.acquire("a", "j2").unwrap();
        assert!(matches!(
            caps.acquire("a", "j3"),
            Err(ApiError::TooManyStreams {
                scope: "this API key",
                open: 2,
                ..
            })
        ));
        let _third = caps.acquire("b", "j4").unwrap();
        assert!(matches!(
            caps.acquire("c", "j5"),
            Err(ApiError::TooManyStreams {
                scope: "this server",
                open: 3,
                ..
            })
        ));
        assert_eq!(metrics.streams_open.get(), 3);
        let refused: Vec<u64> = Cap::ALL
            .iter()
            .map(|cap| {
                metrics
                    .streams_refused
                    .with_label_values(&[cap.label()])
                    .get()
            })
            .collect();
        assert_eq!(refused, [1, 1, 1]);
        drop(first);
        assert_eq!(metrics.streams_open.get(), 2);
        assert!(caps.acquire("c", "j1").is_ok());
    }
}
