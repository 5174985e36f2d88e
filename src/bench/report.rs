//! What `bench` shows: a progress line on a terminal while it runs, then the
//! report as text or as one JSON object (`--json`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::load::{Outcome, Sample, Start};
use super::stats::Summary;
use crate::job::{StartKind, Status};

/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Jobs done so far, for the progress line. Shown only when stderr is a
/// terminal.
pub(super) struct Progress {
    jobs: u32,
    shown: bool,
    succeeded: AtomicU32,
    failed: AtomicU32,
    errors: AtomicU32,
}

impl Progress {
    pub(super) fn new(jobs: u32) -> Self {
        Self {
            jobs,
            shown: std::io::stderr().is_terminal(),
            succeeded: AtomicU32::new(0),
            failed: AtomicU32::new(0),
            errors: AtomicU32::new(0),
        }
    }

    pub(super) fn record(&self, sample: &Sample) {
        let counter = match sample.outcome {
            Outcome::Finished {
                status: Status::Succeeded,
                ..
            } => &self.succeeded,
            Outcome::Finished { .. } => &self.failed,
            Outcome::Error(_) => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `work`, redrawing the line meanwhile; clears it at the end.
    pub(super) async fn while_running<T>(&self, work: impl Future<Output = T>) -> T {
        if !self.shown {
            return work.await;
        }
        let started = Instant::now();
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tokio::pin!(work);
        let done = loop {
            tokio::select! {
                done = &mut work => break done,
                _ = tick.tick() => self.draw(started.elapsed()),
            }
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
        done
    }

    fn draw(&self, elapsed: Duration) {
        let succeeded = self.succeeded.load(Ordering::Relaxed);
        let failed = self.failed.load(Ordering::Relaxed);
        let errors = self.errors.load(Ordering::Relaxed);
        let done = succeeded + failed + errors;
        let rate = f64::from(done) / elapsed.as_secs_f64().max(0.001);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2Kbench: {done}/{} jobs ({succeeded} succeeded, {failed} failed, {errors} errors), {rate:.1} jobs/s, {:.1} s",
            self.jobs,
            elapsed.as_secs_f64()
        );
        let _ = err.flush();
    }
}

/// What was measured and how, as `--json` writes it.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    #[serde(flatten)]
    pub(super) setup: Setup,
    /// Ctrl-C stopped the run: the jobs asked for (`counts` covers those
    /// that ran); `null` when the run was complete.
    pub(super) interrupted_of: Option<u32>,
    pub(super) counts: Counts,
    /// Jobs that ran, by the status their result gave.
    pub(super) statuses: BTreeMap<&'static str, u32>,
    /// Why the jobs counted in `counts.failed` did not succeed, most
    /// frequent first.
    pub(super) failures: Vec<Failure>,
    /// Jobs that ran, by how they started (`unknown`: the result does not say).
    pub(super) start: StartCounts,
    /// From the first submission to the last result.
    pub(super) elapsed_ms: f64,
    /// Results per second over `elapsed_ms`.
    pub(super) jobs_per_sec: f64,
    /// Submission → first stdout, of the jobs that wrote any (`null` with
    /// `--via wait`).
    pub(super) first_output_ms: Option<Summary>,
    /// Submission → result, of the jobs that ran.
    pub(super) result_ms: Option<Summary>,
    /// The same, split by how the jobs started (`null` for a kind no job
    /// had): what a warm pool buys, apart from the jobs it could not serve.
    pub(super) result_by_start_ms: ResultByStart,
    /// `--interactive`: the stdin → stdout round trips.
    pub(super) round_trips: Option<RoundTrips>,
    /// What went wrong for the jobs counted in `counts.errors`, most frequent first.
    pub(super) errors: Vec<ErrorCount>,
    /// The machine: CPUs and the load average (1, 5, 15 min) before and after.
    pub(super) host: Host,
}

/// Submission → result by start kind.
#[derive(Debug, Default, Serialize)]
pub(super) struct ResultByStart {
    pub(super) warm: Option<Summary>,
    pub(super) warm_runtime: Option<Summary>,
    pub(super) cold: Option<Summary>,
}

/// `submitted` = `succeeded` + `failed` + `errors`.
#[derive(Debug, Default, Serialize)]
pub(super) struct Counts {
    pub(super) submitted: u32,
    pub(super) succeeded: u32,
    /// Ran to any other terminal status (see `statuses`).
    pub(super) failed: u32,
    /// No result reached the benchmark (see `errors`).
    pub(super) errors: u32,
    /// 429 answers, each waited out and the submission sent again.
    pub(super) busy_retries: u32,
    /// The same, by the reason each answer gave (`key_limit`, `rate_limited`, …).
    pub(super) busy_reasons: BTreeMap<String, u32>,
}

/// `warm` + `warm_runtime` + `cold` + `unknown` = the jobs that ran
/// (`succeeded` + `failed`).
#[derive(Debug, Default, Serialize)]
pub(super) struct StartCounts {
    pub(super) warm: u32,
    pub(super) warm_runtime: u32,
    pub(super) cold: u32,
    pub(super) unknown: u32,
}

impl StartCounts {
    /// Counts one job by the result's `start`.
    pub(super) fn add(&mut self, start: Option<StartKind>) {
        *match start {
            Some(StartKind::Warm) => &mut self.warm,
            Some(StartKind::WarmRuntime) => &mut self.warm_runtime,
            Some(StartKind::Cold) => &mut self.cold,
            None => &mut self.unknown,
        } += 1;
    }

    /// `3 warm, 2 on a warm runtime, 1 cold, 0 unknown`, and why there are
    /// unknown ones.
    pub(super) fn describe(&self) -> String {
        let unknown = if self.unknown > 0 {
            " (the result does not say)"
        } else {
            ""
        };
        format!(
            "{} warm, {} on a warm runtime, {} cold, {} unknown{unknown}",
            self.warm, self.warm_runtime, self.cold, self.unknown
        )
    }
}

#[derive(Debug, Serialize)]
pub(super) struct RoundTrips {
    pub(super) per_job: u32,
    pub(super) sent: u32,
    pub(super) echoed: u32,
    pub(super) ms: Option<Summary>,
}

#[derive(Debug, Serialize)]
pub(super) struct Failure {
    pub(super) status: &'static str,
    /// What the result says (the platform's error, the limit hit, the exit code).
    pub(super) reason: String,
    pub(super) count: u32,
}

#[derive(Debug, Serialize)]
pub(super) struct ErrorCount {
    pub(super) message: String,
    pub(super) count: u32,
}

#[derive(Debug, Serialize)]
pub(super) struct Host {
    pub(super) cpus: usize,
    pub(super) load_before: Option<[f64; 3]>,
    pub(super) load_after: Option<[f64; 3]>,
}

impl Host {
    /// This machine now, after a run that began with `load_before`.
    pub(super) fn after(load_before: Option<[f64; 3]>) -> Self {
        Self {
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            load_before,
            load_after: load_average(),
        }
    }

    /// `N CPUs; load average a b c before, a b c after`, for the text reports.
    pub(super) fn describe(&self) -> String {
        let load = |l: &Option<[f64; 3]>| {
            l.map_or("unknown".to_string(), |[a, b, c]| {
                format!("{a:.2} {b:.2} {c:.2}")
            })
        };
        format!(
            "{} CPUs; load average {} before, {} after",
            self.cpus,
            load(&self.load_before),
            load(&self.load_after)
        )
    }
}

/// The load average from `/proc/loadavg` (Linux); `None` elsewhere.
pub(super) fn load_average() -> Option<[f64; 3]> {
    parse_load_average(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn parse_load_average(text: &str) -> Option<[f64; 3]> {
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

/// How the run was set up: the first fields of the report.
#[derive(Debug, Serialize)]
pub(super) struct Setup {
    /// `api` or `engine`.
    pub(super) target: &'static str,
    /// Through the API: `ws` or `wait`.
    pub(super) via: Option<&'static str>,
    pub(super) url: Option<String>,
    /// The engine's OCI runtime (`runc` or `runsc`).
    pub(super) runtime: Option<String>,
    pub(super) language: String,
    /// `built-in …` or the file given with `--program`.
    pub(super) program: String,
    pub(super) interactive: bool,
    /// Jobs in flight at once.
    pub(super) concurrency: u32,
    /// A lane's pause between jobs (`--pause-ms`).
    pub(super) pause_ms: u64,
    /// Round trips per interactive job (reported under `round_trips`).
    #[serde(skip)]
    pub(super) round_trips: Option<u32>,
    /// Reported under `host`.
    #[serde(skip)]
    pub(super) load_before: Option<[f64; 3]>,
}

impl Report {
    /// The report of a run's samples; `started` is when the first job was
    /// submitted.
    pub(super) fn new(
        setup: Setup,
        samples: &[Sample],
        started: Instant,
        interrupted_of: Option<u32>,
    ) -> Self {
        let mut counts = Counts {
            submitted: u32::try_from(samples.len()).unwrap_or(u32::MAX),
            ..Default::default()
        };
        let mut statuses = BTreeMap::new();
        let mut start = StartCounts::default();
        let mut errors: BTreeMap<&str, u32> = BTreeMap::new();
        let mut failures: BTreeMap<(&'static str, &str), u32> = BTreeMap::new();
        let mut first_output = Vec::new();
        let mut result = Vec::new();
        let (mut warm_result, mut cold_result) = (Vec::new(), Vec::new());
        let mut runtime_result = Vec::new();
        let mut trips = Vec::new();
        let mut sent = 0;
        let mut last = started;
        for sample in samples {
            for (reason, count) in &sample.busy {
                counts.busy_retries += count;
                *counts.busy_reasons.entry(reason.clone()).or_default() += count;
            }
            last = last.max(sample.ended);
            match &sample.outcome {
                Outcome::Finished {
                    status,
                    start: how,
                    failure,
                } => {
                    if *status == Status::Succeeded {
                        counts.succeeded += 1;
                    } else {
                        counts.failed += 1;
                        let reason = failure.as_deref().unwrap_or("the result does not say");
                        *failures.entry((status.as_str(), reason)).or_insert(0) += 1;
                    }
                    *statuses.entry(status.as_str()).or_insert(0) += 1;
                    *match how {
                        Start::Warm => &mut start.warm,
                        Start::WarmRuntime => &mut start.warm_runtime,
                        Start::Cold => &mut start.cold,
                        Start::Unknown => &mut start.unknown,
                    } += 1;
                    match how {
                        Start::Warm => warm_result.extend(sample.result),
                        Start::WarmRuntime => runtime_result.extend(sample.result),
                        Start::Cold => cold_result.extend(sample.result),
                        Start::Unknown => {}
                    }
                }
                Outcome::Error(message) => {
                    counts.errors += 1;
                    *errors.entry(message.as_str()).or_insert(0) += 1;
                }
            }
            first_output.extend(sample.first_output);
            result.extend(sample.result);
            sent += sample.lines_sent;
            trips.extend_from_slice(&sample.round_trips);
        }
        let mut errors: Vec<ErrorCount> = errors
            .into_iter()
            .map(|(message, count)| ErrorCount {
                message: message.to_string(),
                count,
            })
            .collect();
        errors.sort_by_key(|e| std::cmp::Reverse(e.count));
        let mut failures: Vec<Failure> = failures
            .into_iter()
            .map(|((status, reason), count)| Failure {
                status,
                reason: reason.to_string(),
                count,
            })
            .collect();
        failures.sort_by_key(|f| std::cmp::Reverse(f.count));
        let elapsed = last.duration_since(started);
        let ran = counts.succeeded + counts.failed;
        let load_before = setup.load_before;
        let per_job = setup.round_trips;
        Self {
            setup,
            interrupted_of,
            counts,
            statuses,
            failures,
            start,
            elapsed_ms: (elapsed.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
            jobs_per_sec: if elapsed.is_zero() {
                0.0
            } else {
                (f64::from(ran) / elapsed.as_secs_f64() * 100.0).round() / 100.0
            },
            first_output_ms: Summary::of(first_output),
            result_ms: Summary::of(result),
            result_by_start_ms: ResultByStart {
                warm: Summary::of(warm_result),
                warm_runtime: Summary::of(runtime_result),
                cold: Summary::of(cold_result),
            },
            round_trips: per_job.map(|per_job| RoundTrips {
                per_job,
                sent,
                echoed: u32::try_from(trips.len()).unwrap_or(u32::MAX),
                ms: Summary::of(trips),
            }),
            errors,
            host: Host::after(load_before),
        }
    }

    /// Whether every job succeeded (and every line came back).
    pub(super) fn all_succeeded(&self) -> bool {
        self.counts.succeeded == self.counts.submitted
            && self.round_trips.as_ref().is_none_or(|r| r.echoed == r.sent)
    }

    /// The report for people.
    pub(super) fn text(&self) -> String {
        let mut out = String::new();
        let setup = &self.setup;
        let path = match (setup.target, setup.via) {
            ("engine", _) => format!(
                "the sandbox engine ({}, no Redis, no API)",
                setup.runtime.as_deref().unwrap_or("runc")
            ),
            (_, Some("wait")) => format!(
                "{} (POST /v1/jobs?wait=true)",
                setup.url.as_deref().unwrap_or("")
            ),
            _ => format!(
                "{} (POST /v1/jobs + WebSocket)",
                setup.url.as_deref().unwrap_or("")
            ),
        };
        let kind = if setup.interactive {
            "interactive "
        } else {
            ""
        };
        let pause = if setup.pause_ms > 0 {
            format!(", {} ms between a lane's jobs", setup.pause_ms)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{} {kind}{} jobs ({}) through {path}, {} at a time{pause}",
            self.counts.submitted, setup.language, setup.program, setup.concurrency
        );
        let c = &self.counts;
        if let Some(asked) = self.interrupted_of {
            let _ = writeln!(
                out,
                "interrupted  by Ctrl-C after {} of {asked} jobs",
                c.submitted
            );
        }
        let reasons = if c.busy_reasons.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = c
                .busy_reasons
                .iter()
                .map(|(reason, count)| format!("{reason} {count}"))
                .collect();
            format!(" ({})", list.join(", "))
        };
        let _ = writeln!(
            out,
            "jobs         {} succeeded, {} failed, {} errors; {} answers 429 retried{reasons}",
            c.succeeded, c.failed, c.errors, c.busy_retries
        );
        for failure in &self.failures {
            let _ = writeln!(
                out,
                "failed       {} × {}: {}",
                failure.count, failure.status, failure.reason
            );
        }
        for error in &self.errors {
            let _ = writeln!(out, "error        {} × {}", error.count, error.message);
        }
        let _ = writeln!(out, "start        {}", self.start.describe());
        let _ = writeln!(
            out,
            "throughput   {:.1} jobs/s ({} results in {:.2} s)",
            self.jobs_per_sec,
            c.succeeded + c.failed,
            self.elapsed_ms / 1000.0
        );
        let _ = writeln!(
            out,
            "latency (ms)      p50      p95      p99      min      max   samples"
        );
        let row = |out: &mut String, name: &str, summary: &Option<Summary>, none: &str| {
            let _ = match summary {
                Some(s) => writeln!(
                    out,
                    "{name:<13}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>10}",
                    s.p50, s.p95, s.p99, s.min, s.max, s.samples
                ),
                None => writeln!(out, "{name:<13}{none}"),
            };
        };
        let no_output = if setup.via == Some("wait") {
            "     not measured with --via wait (one request; use --via ws)"
        } else {
            "     no stdout seen"
        };
        row(&mut out, "first output", &self.first_output_ms, no_output);
        row(&mut out, "result", &self.result_ms, "     no results");
        for (name, summary) in [
            ("  warm start", &self.result_by_start_ms.warm),
            ("  on runtime", &self.result_by_start_ms.warm_runtime),
            ("  cold start", &self.result_by_start_ms.cold),
        ] {
            if summary.is_some() && self.start.warm + self.start.warm_runtime > 0 {
                row(&mut out, name, summary, "");
            }
        }
        if let Some(trips) = &self.round_trips {
            row(&mut out, "round trip", &trips.ms, "     none echoed");
            let _ = writeln!(
                out,
                "             {} lines sent ({} per job), {} echoed",
                trips.sent, trips.per_job, trips.echoed
            );
        }
        let _ = writeln!(out, "host         {}", self.host.describe());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_counts_count_each_kind_and_say_why_some_are_unknown() {
        let mut counts = StartCounts::default();
        for start in [
            Some(StartKind::WarmRuntime),
            Some(StartKind::Cold),
            Some(StartKind::WarmRuntime),
            None,
        ] {
            counts.add(start);
        }
        assert_eq!(
            counts.describe(),
            "0 warm, 2 on a warm runtime, 1 cold, 1 unknown (the result does not say)"
        );
        counts.unknown = 0;
        assert_eq!(
            counts.describe(),
            "0 warm, 2 on a warm runtime, 1 cold, 0 unknown"
        );
    }

    fn sample(outcome: Outcome, result_ms: Option<u64>) -> Sample {
        Sample {
            outcome,
            first_output: result_ms.map(|ms| Duration::from_millis(ms / 2)),
            result: result_ms.map(Duration::from_millis),
            ended: Instant::now(),
            lines_sent: 0,
            round_trips: Vec::new(),
            busy: BTreeMap::from([("key_limit".to_string(), 1)]),
        }
    }

    fn setup() -> Setup {
        Setup {
            target: "api",
            via: Some("ws"),
            url: Some("http://127.0.0.1:8080".into()),
            runtime: None,
            language: "python".into(),
            program: "built-in".into(),
            interactive: false,
            concurrency: 2,
            pause_ms: 0,
            round_trips: None,
            load_before: None,
        }
    }

    #[test]
    fn counts_add_up_and_errors_are_listed() {
        let started = Instant::now();
        let finished = |status, start, failure: Option<&str>| Outcome::Finished {
            status,
            start,
            failure: failure.map(str::to_string),
        };
        let samples = vec![
            sample(finished(Status::Succeeded, Start::Warm, None), Some(10)),
            sample(finished(Status::Succeeded, Start::Cold, None), Some(30)),
            sample(
                finished(
                    Status::TimedOut,
                    Start::Unknown,
                    Some("program exceeded its wall time limit"),
                ),
                Some(20),
            ),
            sample(Outcome::Error("cannot reach it".into()), None),
            sample(Outcome::Error("cannot reach it".into()), None),
        ];
        let report = Report::new(setup(), &samples, started, None);
        let c = &report.counts;
        assert_eq!(
            (c.submitted, c.succeeded, c.failed, c.errors, c.busy_retries),
            (5, 2, 1, 2, 5)
        );
        assert_eq!(
            c.busy_reasons,
            BTreeMap::from([("key_limit".to_string(), 5)])
        );
        assert!(
            report
                .text()
                .contains("5 answers 429 retried (key_limit 5)"),
            "{}",
            report.text()
        );
        assert_eq!(
            (report.start.warm, report.start.cold, report.start.unknown),
            (1, 1, 1)
        );
        assert_eq!(report.statuses.get("timed_out"), Some(&1));
        assert_eq!(report.failures.len(), 1);
        assert_eq!(report.failures[0].status, "timed_out");
        assert_eq!(
            report.failures[0].reason,
            "program exceeded its wall time limit"
        );
        assert_eq!(report.errors.len(), 1);
        assert_eq!(report.errors[0].message, "cannot reach it");
        assert_eq!(report.errors[0].count, 2);
        let result = report.result_ms.as_ref().unwrap();
        assert_eq!((result.samples, result.p50, result.max), (3, 20.0, 30.0));
        // By start kind: the unknown one is in neither.
        let warm = report.result_by_start_ms.warm.as_ref().unwrap();
        let cold = report.result_by_start_ms.cold.as_ref().unwrap();
        assert_eq!(
            (warm.samples, warm.p50, cold.samples, cold.p50),
            (1, 10.0, 1, 30.0)
        );
        assert!(!report.all_succeeded());
        let text = report.text();
        assert!(text.contains("2 succeeded, 1 failed, 2 errors"), "{text}");
        assert!(text.contains("error        2 × cannot reach it"), "{text}");
        assert!(
            text.contains("1 warm, 0 on a warm runtime, 1 cold, 1 unknown"),
            "{text}"
        );
        assert!(text.contains("  warm start      10.0"), "{text}");
        assert!(text.contains("  cold start      30.0"), "{text}");
        assert!(
            text.contains("failed       1 × timed_out: program exceeded its wall time limit"),
            "{text}"
        );
    }

    #[test]
    fn unanswered_lines_mean_not_all_succeeded() {
        let mut one = sample(
            Outcome::Finished {
                status: Status::Succeeded,
                start: Start::Unknown,
                failure: None,
            },
            Some(5),
        );
        one.lines_sent = 3;
        one.round_trips = vec![Duration::from_millis(1), Duration::from_millis(2)];
        let mut interactive = setup();
        interactive.round_trips = Some(3);
        let report = Report::new(interactive, &[one], Instant::now(), None);
        let trips = report.round_trips.as_ref().unwrap();
        assert_eq!((trips.sent, trips.echoed), (3, 2));
        assert!(!report.all_succeeded());
    }

    #[test]
    fn the_load_average_parses() {
        assert_eq!(
            parse_load_average("0.52 1.03 0.98 2/412 31337\n"),
            Some([0.52, 1.03, 0.98])
        );
        assert_eq!(parse_load_average("0.52 x"), None);
    }
}
