//! `bench --scenario fairness`: does one key's big backlog hold
//! up everyone else? Two phases against one server, the same backlog each:
//!
//! 1. `alone`: key A queues `--backlog` jobs (python `time.sleep` of
//!    `--job-ms`) as its user `backlog`, and nothing else is submitted. How
//!    fast that drains is what first come, first served gives.
//! 2. `contended`: the same backlog; `--late-ms` after all of it is queued,
//!    key B (`--other-key`) submits one job and key A's user `second` one.
//!    Their queue wait, and how fast the backlog drains meanwhile, are what
//!    the fair turns give.
//!
//! Every figure comes from the job views the server keeps (`created_at`,
//! `started_at`, `finished_at`, in ms): the queue wait is started − created,
//! the drain rate is backlog jobs / (last finish − first start). The jobs
//! are followed by polling their views; after Ctrl-C the jobs not yet ended
//! are cancelled.

use std::time::{Duration, SystemTime};

use futures_util::{StreamExt as _, TryStreamExt as _};
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::report::{self, Host};
use super::stats::Summary;
use crate::client::{Api, ClientError, Submitted, job_id};
use crate::exit;
use crate::job::{Encoding, FileSpec, JobSpec, Status};

/// Backlog submissions in flight at once.
const SUBMIT_CONCURRENCY: usize = 8;
/// Pause between two rounds of polling the job views.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// Longest the benchmark waits while no job ends (at least; a job's own
/// length is added): a server that stopped working is not waited for forever.
const STALL_BUDGET: Duration = Duration::from_secs(120);
/// The user of key A whose jobs are the backlog.
const BACKLOG_USER: &str = "backlog";
/// The second user of key A, who submits one job.
const SECOND_USER: &str = "second";

/// What the scenario is asked to do.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) backlog: u32,
    pub(super) job_ms: u64,
    pub(super) late: Duration,
}

/// The program every job of the scenario runs: it sleeps `job_ms`.
fn sleeper(job_ms: u64, user: Option<&str>) -> JobSpec {
    JobSpec {
        language: "python".to_string(),
        files: vec![FileSpec {
            name: "main.py".to_string(),
            content: format!("import time\ntime.sleep({})\n", job_ms as f64 / 1000.0),
            encoding: Encoding::Utf8,
            reference: None,
        }],
        user: user.map(str::to_string),
        ..Default::default()
    }
}

/// Why the scenario stopped before its report.
#[derive(Debug, thiserror::Error)]
pub(super) enum Stopped {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error(
        "the API refused backlog job {index} with 429 ({message}); let key A queue {backlog} \
         jobs (CODE_RUNNER_API_KEYS name:key:max_active=N) or pass a smaller --backlog"
    )]
    BacklogRefused {
        index: u32,
        backlog: u32,
        message: String,
    },
    #[error("no job ended in {0} s; stopped waiting")]
    Stalled(u64),
    #[error("a job view does not parse: {0}")]
    View(String),
    #[error("interrupted; the jobs not yet ended were cancelled")]
    Interrupted,
}

impl Stopped {
    pub(super) fn exit_code(&self) -> u8 {
        match self {
            Stopped::Client(error) => error.exit_code(),
            Stopped::BacklogRefused { .. } => exit::USAGE,
            Stopped::Stalled(_) => exit::UNAVAILABLE,
            Stopped::View(_) => exit::PLATFORM_ERROR,
            Stopped::Interrupted => exit::CANCELLED,
        }
    }
}

/// One job as its view gave it at its end (times in ms since the epoch).
#[derive(Debug, Clone)]
struct Ended {
    status: Status,
    created: f64,
    started: Option<f64>,
    finished: Option<f64>,
}

fn epoch_ms(view: &Value, field: &str) -> Result<Option<f64>, Stopped> {
    match view.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => {
            let at = humantime::parse_rfc3339(text)
                .map_err(|e| Stopped::View(format!("{field} {text:?}: {e}")))?;
            let since = at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_err(|e| Stopped::View(format!("{field} {text:?}: {e}")))?;
            Ok(Some(since.as_secs_f64() * 1000.0))
        }
        Some(other) => Err(Stopped::View(format!("{field} is {other}"))),
    }
}

impl Ended {
    /// The view of a terminal job; `None` while it has not ended.
    fn of(view: &Value) -> Result<Option<Self>, Stopped> {
        let status = view
            .get("status")
            .cloned()
            .and_then(|s| serde_json::from_value::<Status>(s).ok())
            .ok_or_else(|| Stopped::View(format!("no status in {view}")))?;
        if !status.is_terminal() {
            return Ok(None);
        }
        Ok(Some(Self {
            status,
            created: epoch_ms(view, "created_at")?
                .ok_or_else(|| Stopped::View(format!("no created_at in {view}")))?,
            started: epoch_ms(view, "started_at")?,
            finished: epoch_ms(view, "finished_at")?,
        }))
    }

    /// Queue wait: started − created.
    fn wait_ms(&self) -> Option<f64> {
        self.started.map(|s| (s - self.created).max(0.0))
    }
}

/// A submitted job, until its view says it ended.
struct Tracked<'a> {
    api: &'a Api,
    id: String,
    is_backlog: bool,
    ended: Option<Ended>,
}

/// Submits one job as it is (a 429 is waited out).
async fn submit(api: &Api, body: &[u8]) -> Result<String, ClientError> {
    let accepted = api.submit(body, None, false, |_| {}).await?;
    job_id(&accepted.answer)
}

/// Queues the backlog: each job is sent once; a 429 means the server does
/// not let key A queue it, and the scenario would not be the one asked for.
async fn submit_backlog(api: &Api, plan: Plan) -> Result<Vec<String>, Stopped> {
    let body = serde_json::to_vec(&sleeper(plan.job_ms, Some(BACKLOG_USER)))
        .map_err(|e| Stopped::View(e.to_string()))?;
    let body = &body;
    futures_util::stream::iter(0..plan.backlog)
        .map(|index| async move {
            match api.submit_once(body, None, false).await? {
                Submitted::Accepted(answer) => Ok(job_id(&answer)?),
                Submitted::Busy { refused, .. } => Err(Stopped::BacklogRefused {
                    index: index + 1,
                    backlog: plan.backlog,
                    message: refused.message,
                }),
            }
        })
        .buffered(SUBMIT_CONCURRENCY)
        .try_collect()
        .await
}

/// Polls every job's view until each has ended: the late jobs every round,
/// the backlog in order up to its first job still going (its later ones
/// have mostly not ended either, and are asked again next round).
async fn settle(jobs: &mut [Tracked<'_>], backlog: usize, stall: Duration) -> Result<(), Stopped> {
    let mut last_change = tokio::time::Instant::now();
    loop {
        let mut changed = false;
        let (queued, late) = jobs.split_at_mut(backlog);
        for job in late.iter_mut().chain(queued.iter_mut()) {
            if job.ended.is_some() {
                continue;
            }
            let Some(ended) = Ended::of(&job.api.get(&job.id).await?)? else {
                if job.is_backlog {
                    break;
                }
                continue;
            };
            job.ended = Some(ended);
            changed = true;
        }
        if jobs.iter().all(|j| j.ended.is_some()) {
            return Ok(());
        }
        if changed {
            last_change = tokio::time::Instant::now();
        } else if last_change.elapsed() > stall {
            return Err(Stopped::Stalled(stall.as_secs()));
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Cancels the jobs that have not ended (after Ctrl-C), best effort.
async fn cancel_unended(jobs: &[Tracked<'_>]) {
    let unended = jobs.iter().filter(|j| j.ended.is_none());
    let cancels = unended.map(|j| async move {
        if let Err(error) = j.api.cancel(&j.id).await {
            tracing::warn!(job.id = %j.id, %error, "the benchmark could not cancel its job");
        }
    });
    futures_util::future::join_all(cancels).await;
}

/// How a backlog drained.
#[derive(Debug, Serialize)]
pub(super) struct Drain {
    pub(super) jobs: u32,
    pub(super) succeeded: u32,
    /// From the first backlog job's start to the last one's finish.
    pub(super) drain_ms: Option<f64>,
    /// `jobs` / `drain_ms`.
    pub(super) jobs_per_sec: Option<f64>,
    /// The backlog jobs' own queue waits (started − created).
    pub(super) wait_ms: Option<Summary>,
}

impl Drain {
    fn of(backlog: &[Ended]) -> Self {
        let first = backlog.iter().filter_map(|e| e.started).reduce(f64::min);
        let last = backlog.iter().filter_map(|e| e.finished).reduce(f64::max);
        let drain_ms = first.zip(last).map(|(a, b)| (b - a).max(0.0));
        let jobs = u32::try_from(backlog.len()).unwrap_or(u32::MAX);
        let waits = backlog
            .iter()
            .filter_map(Ended::wait_ms)
            .map(|ms| Duration::from_secs_f64(ms / 1000.0))
            .collect();
        Self {
            jobs,
            succeeded: count_succeeded(backlog),
            drain_ms: drain_ms.map(round3),
            jobs_per_sec: drain_ms
                .filter(|ms| *ms > 0.0)
                .map(|ms| round2(f64::from(jobs) / (ms / 1000.0))),
            wait_ms: Summary::of(waits),
        }
    }
}

/// One job submitted while the backlog was queued.
#[derive(Debug, Serialize)]
pub(super) struct LateJob {
    pub(super) status: &'static str,
    /// started − created.
    pub(super) wait_ms: Option<f64>,
    /// Backlog jobs that started after this one did (under first come,
    /// first served: none).
    pub(super) backlog_started_after: u32,
    /// Whether it started before the last backlog job finished.
    pub(super) started_before_backlog_done: bool,
}

impl LateJob {
    fn of(job: &Ended, backlog: &[Ended]) -> Self {
        let started_after = job.started.map_or(0, |at| {
            backlog
                .iter()
                .filter(|b| b.started.is_some_and(|s| s > at))
                .count()
        });
        let done = backlog.iter().filter_map(|e| e.finished).reduce(f64::max);
        Self {
            status: job.status.as_str(),
            wait_ms: job.wait_ms().map(round3),
            backlog_started_after: u32::try_from(started_after).unwrap_or(u32::MAX),
            started_before_backlog_done: job.started.zip(done).is_some_and(|(s, d)| s < d),
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct Contended {
    pub(super) backlog: Drain,
    /// Key B's job.
    pub(super) other_key: LateJob,
    /// The job of key A's second user.
    pub(super) second_user: LateJob,
}

/// The scenario's report, as `--json` writes it.
#[derive(Debug, Serialize)]
pub(super) struct FairnessReport {
    pub(super) scenario: &'static str,
    pub(super) target: &'static str,
    pub(super) url: String,
    pub(super) language: &'static str,
    pub(super) program: String,
    pub(super) backlog: u32,
    pub(super) job_ms: u64,
    /// After the backlog was queued, when key B and the second user submitted.
    pub(super) late_ms: u64,
    /// The backlog with nothing else (first come, first served).
    pub(super) alone: Drain,
    /// The backlog with key B's and the second user's job.
    pub(super) contended: Contended,
    /// `contended.backlog.jobs_per_sec` / `alone.jobs_per_sec`.
    pub(super) drain_ratio: Option<f64>,
    pub(super) host: Host,
}

impl FairnessReport {
    /// Whether every job of both phases succeeded.
    pub(super) fn all_succeeded(&self) -> bool {
        let c = &self.contended;
        self.alone.succeeded == self.alone.jobs
            && c.backlog.succeeded == c.backlog.jobs
            && c.other_key.status == Status::Succeeded.as_str()
            && c.second_user.status == Status::Succeeded.as_str()
    }

    /// The report for people.
    pub(super) fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "fairness: key A queues {} python jobs ({}) as user {BACKLOG_USER:?} through {}; \
             {} ms after, key B and key A's user {SECOND_USER:?} submit one each",
            self.backlog, self.program, self.url, self.late_ms
        );
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ms"));
        let drain = |out: &mut String, name: &str, d: &Drain| {
            let _ = writeln!(
                out,
                "{name:<12}{} of {} backlog jobs succeeded, drained in {}: {} jobs/s; backlog wait p50 {}, max {}",
                d.succeeded,
                d.jobs,
                d.drain_ms
                    .map_or("-".to_string(), |v| format!("{:.2} s", v / 1000.0)),
                d.jobs_per_sec
                    .map_or("-".to_string(), |v| format!("{v:.2}")),
                ms(d.wait_ms.as_ref().map(|s| s.p50)),
                ms(d.wait_ms.as_ref().map(|s| s.max)),
            );
        };
        drain(&mut out, "alone", &self.alone);
        drain(&mut out, "contended", &self.contended.backlog);
        if let Some(ratio) = self.drain_ratio {
            let _ = writeln!(out, "            drain rate {ratio:.2} × alone");
        }
        for (name, job) in [
            ("key B", &self.contended.other_key),
            ("2nd user", &self.contended.second_user),
        ] {
            let _ = writeln!(
                out,
                "{name:<12}{}, waited {}; {} backlog jobs started after it",
                job.status,
                ms(job.wait_ms),
                job.backlog_started_after
            );
        }
        let _ = writeln!(out, "host        {}", self.host.describe());
        out
    }
}

fn count_succeeded(jobs: &[Ended]) -> u32 {
    let n = jobs
        .iter()
        .filter(|e| e.status == Status::Succeeded)
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// What one phase gave: the backlog, then the late jobs (contended only).
struct Phase {
    backlog: Vec<Ended>,
    late: Vec<Ended>,
}

/// One phase: the backlog, and with `other` the two late jobs.
async fn phase(
    a: &Api,
    other: Option<&Api>,
    plan: Plan,
    stop: &CancellationToken,
) -> Result<Phase, Stopped> {
    let stall = STALL_BUDGET + Duration::from_millis(plan.job_ms);
    let ids = tokio::select! {
        ids = submit_backlog(a, plan) => ids?,
        // The backlog jobs accepted so far are not known; they run out.
        () = stop.cancelled() => return Err(Stopped::Interrupted),
    };
    let mut jobs: Vec<Tracked> = ids
        .into_iter()
        .map(|id| Tracked {
            api: a,
            id,
            is_backlog: true,
            ended: None,
        })
        .collect();
    let backlog = jobs.len();
    let work = async {
        if let Some(b) = other {
            tokio::time::sleep(plan.late).await;
            let other_body = serde_json::to_vec(&sleeper(plan.job_ms, None))
                .map_err(|e| Stopped::View(e.to_string()))?;
            let second_body = serde_json::to_vec(&sleeper(plan.job_ms, Some(SECOND_USER)))
                .map_err(|e| Stopped::View(e.to_string()))?;
            let (other_id, second_id) =
                tokio::join!(submit(b, &other_body), submit(a, &second_body));
            for (api, id) in [(b, other_id?), (a, second_id?)] {
                jobs.push(Tracked {
                    api,
                    id,
                    is_backlog: false,
                    ended: None,
                });
            }
        }
        settle(&mut jobs, backlog, stall).await
    };
    let settled = tokio::select! {
        settled = work => Some(settled),
        () = stop.cancelled() => None,
    };
    match settled {
        Some(Ok(())) => {}
        Some(Err(error)) => return Err(error),
        None => {
            cancel_unended(&jobs).await;
            return Err(Stopped::Interrupted);
        }
    }
    let mut ended = jobs.into_iter().filter_map(|j| j.ended);
    let backlog_ended = ended.by_ref().take(backlog).collect();
    Ok(Phase {
        backlog: backlog_ended,
        late: ended.collect(),
    })
}

/// Both phases, and the report.
pub(super) async fn run(
    a: &Api,
    b: &Api,
    plan: Plan,
    stop: &CancellationToken,
) -> Result<FairnessReport, Stopped> {
    let load_before = report::load_average();
    let alone = phase(a, None, plan, stop).await?;
    let contended = phase(a, Some(b), plan, stop).await?;
    let (Some(other), Some(second)) = (contended.late.first(), contended.late.get(1)) else {
        return Err(Stopped::View("the late jobs were not followed".to_string()));
    };
    let alone = Drain::of(&alone.backlog);
    let contended = Contended {
        other_key: LateJob::of(other, &contended.backlog),
        second_user: LateJob::of(second, &contended.backlog),
        backlog: Drain::of(&contended.backlog),
    };
    let drain_ratio = alone
        .jobs_per_sec
        .zip(contended.backlog.jobs_per_sec)
        .map(|(alone, contended)| round2(contended / alone));
    Ok(FairnessReport {
        scenario: "fairness",
        target: "api",
        url: a.base.clone(),
        language: "python",
        program: format!("built-in sleep of {} ms", plan.job_ms),
        backlog: plan.backlog,
        job_ms: plan.job_ms,
        late_ms: u64::try_from(plan.late.as_millis()).unwrap_or(u64::MAX),
        alone,
        contended,
        drain_ratio,
        host: Host::after(load_before),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(created: f64, started: f64, finished: f64) -> Ended {
        Ended {
            status: Status::Succeeded,
            created,
            started: Some(started),
            finished: Some(finished),
        }
    }

    #[test]
    fn a_view_gives_its_times_once_it_ended() {
        let view = serde_json::json!({
            "status": "succeeded",
            "created_at": "2026-01-01T00:00:00.250Z",
            "started_at": "2026-01-01T00:00:01.000Z",
            "finished_at": "2026-01-01T00:00:01.500Z",
        });
        let job = Ended::of(&view).unwrap().unwrap();
        assert_eq!(job.wait_ms(), Some(750.0));
        assert_eq!(job.finished.unwrap() - job.started.unwrap(), 500.0);
        let queued = serde_json::json!({"status": "queued", "created_at": "2026-01-01T00:00:00Z"});
        assert!(Ended::of(&queued).unwrap().is_none());
        let cancelled = serde_json::json!({
            "status": "cancelled", "created_at": "2026-01-01T00:00:00Z", "started_at": null,
        });
        assert_eq!(Ended::of(&cancelled).unwrap().unwrap().wait_ms(), None);
        assert!(Ended::of(&serde_json::json!({"status": "succeeded"})).is_err());
    }

    #[test]
    fn the_drain_rate_runs_from_the_first_start_to_the_last_finish() {
        let backlog = [
            ended(0.0, 100.0, 600.0),
            ended(0.0, 100.0, 600.0),
            ended(0.0, 600.0, 1100.0),
            ended(0.0, 600.0, 1100.0),
        ];
        let drain = Drain::of(&backlog);
        assert_eq!(drain.drain_ms, Some(1000.0));
        assert_eq!(drain.jobs_per_sec, Some(4.0));
        assert_eq!(drain.succeeded, 4);
        assert_eq!(drain.wait_ms.as_ref().map(|w| w.max), Some(600.0));

        let late = LateJob::of(&ended(300.0, 600.0, 1100.0), &backlog);
        assert_eq!(late.wait_ms, Some(300.0));
        assert_eq!(late.backlog_started_after, 0);
        assert!(late.started_before_backlog_done);
        let first = LateJob::of(&ended(50.0, 90.0, 590.0), &backlog);
        assert_eq!(first.backlog_started_after, 4);
    }
}
