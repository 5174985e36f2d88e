//! Load generation: `concurrency` lanes take the next job of the run until
//! all are done; each job is submitted, followed and timed on one of three
//! paths, and becomes one [`Sample`].
//!
//! - API, WebSocket (`--via ws`): `POST /v1/jobs`, then the job's WebSocket
//!   (the `run` command's [`Follower`]). First output: the first `stdout`
//!   event; result: the `exit` event.
//! - API, `?wait=true` (`--via wait`): one `POST /v1/jobs?wait=true`; the
//!   result is its answer. No first-output figure on this path.
//! - Engine (`--engine`): `SandboxEngine::run` in this process, as `sandbox
//!   run` does. First output: the first stdout chunk; result: `run` returns.
//!
//! Every time runs from the moment the submission that was taken was sent
//! (a 429 answer is counted, waited out for its `Retry-After`, and the
//! submission sent again).

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::echo::{Echo, EchoFrame};
use super::report::Progress;
use crate::client::stream::{EventSink, Followed, Follower, NoInterrupts, Outgoing};
use crate::client::{Api, ClientError, job_id};
use crate::exit;
use crate::job::{JobResult, PreparedJob, Status};
use crate::sandbox::{DockerEngine, JobInput, JobIo, SandboxEngine as _, SandboxEvent};

/// Where the jobs go.
pub(super) enum Target<'a> {
    Api {
        api: &'a Api,
        /// The job's JSON.
        body: &'a [u8],
        /// `?wait=true` instead of the WebSocket.
        wait: bool,
    },
    Engine {
        engine: &'a DockerEngine,
        job: &'a PreparedJob,
    },
}

/// Whether a job started in a warm sandbox, as its result says (the
/// result's `start`; absent on servers without warm pools).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    Warm,
    /// A warm sandbox whose runtime was started ahead ran the job.
    WarmRuntime,
    Cold,
    Unknown,
}

impl Start {
    fn of(result: Option<&Value>) -> Self {
        match result.and_then(|r| r.get("start")).and_then(Value::as_str) {
            Some("warm") => Start::Warm,
            Some("warm_runtime") => Start::WarmRuntime,
            Some("cold") => Start::Cold,
            _ => Start::Unknown,
        }
    }
}

/// How one job ended for the benchmark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// It ran to a terminal status, which the result says; `failure` says
    /// why it did not succeed.
    Finished {
        status: Status,
        start: Start,
        failure: Option<String>,
    },
    /// No result reached the benchmark: what went wrong.
    Error(String),
}

impl Outcome {
    /// A job that ran, from its result.
    fn ran(result: &JobResult, start: Start) -> Self {
        let failure = match exit::for_result(result) {
            (0, _) => None,
            (_, Some(message)) => Some(message),
            (code, None) => Some(format!("exit code {code}")),
        };
        Outcome::Finished {
            status: result.status,
            start,
            failure,
        }
    }
}

/// How a result says it started: read from its JSON, so a field this
/// client's `JobResult` does not know yet is still seen.
fn start_of(result: &JobResult) -> Start {
    Start::of(serde_json::to_value(result).ok().as_ref())
}

/// What one job gave.
#[derive(Debug)]
pub(super) struct Sample {
    pub(super) outcome: Outcome,
    /// Submission → first stdout (`None`: none seen, or `--via wait`).
    pub(super) first_output: Option<Duration>,
    /// Submission → result (`None` when there was no result).
    pub(super) result: Option<Duration>,
    /// When the result (or the error) arrived.
    pub(super) ended: Instant,
    /// Interactive jobs: lines sent, and one duration per line echoed.
    pub(super) lines_sent: u32,
    pub(super) round_trips: Vec<Duration>,
    /// 429 answers to this job's submission, by the reason each gave.
    pub(super) busy: BTreeMap<String, u32>,
}

impl Sample {
    fn error(message: impl Into<String>, busy: BTreeMap<String, u32>) -> Self {
        Self {
            outcome: Outcome::Error(message.into()),
            first_output: None,
            result: None,
            ended: Instant::now(),
            lines_sent: 0,
            round_trips: Vec::new(),
            busy,
        }
    }
}

/// The run: jobs, how many at once, and round trips per job (interactive).
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) jobs: u32,
    pub(super) concurrency: u32,
    pub(super) round_trips: Option<u32>,
    /// A lane's wait between one job's end and its next submission.
    pub(super) pause: std::time::Duration,
}

/// What the run gave; `aborted` is set when an answer made every further
/// job pointless (a refused key, an invalid job), and then `samples` does
/// not hold every job.
pub(super) struct Run {
    pub(super) samples: Vec<Sample>,
    pub(super) started: Instant,
    pub(super) aborted: Option<ClientError>,
}

/// A refusal that every other job would get too.
fn is_fatal(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Unauthorized | ClientError::Invalid(_) | ClientError::Setting(_)
    )
}

/// Runs the plan against the target; `progress` hears of every job. Once
/// `stop` is cancelled (Ctrl-C) no further job starts; jobs in the engine
/// are cancelled (their containers removed), jobs on a server are followed
/// to their end.
pub(super) async fn run(
    target: &Target<'_>,
    plan: Plan,
    progress: &Progress,
    stop: &CancellationToken,
) -> Run {
    let next = AtomicU32::new(0);
    let aborted = OnceLock::new();
    let started = Instant::now();
    let lanes = (0..plan.concurrency.min(plan.jobs)).map(|_| async {
        let mut samples = Vec::new();
        while aborted.get().is_none() && !stop.is_cancelled() {
            let index = next.fetch_add(1, Ordering::Relaxed);
            if index >= plan.jobs {
                break;
            }
            if index >= plan.concurrency && !plan.pause.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(plan.pause) => {}
                    () = stop.cancelled() => break,
                }
            }
            match one_job(target, index, plan.round_trips, stop).await {
                Ok(sample) => {
                    progress.record(&sample);
                    samples.push(sample);
                }
                Err(error) => {
                    let _ = aborted.set(error);
                }
            }
        }
        samples
    });
    let work = join_all(lanes);
    let samples = progress
        .while_running(work)
        .await
        .into_iter()
        .flatten()
        .collect();
    Run {
        samples,
        started,
        aborted: aborted.into_inner(),
    }
}

/// One job on the target's path; `Err` only for a fatal refusal.
async fn one_job(
    target: &Target<'_>,
    index: u32,
    round_trips: Option<u32>,
    stop: &CancellationToken,
) -> Result<Sample, ClientError> {
    match target {
        Target::Api {
            api,
            body,
            wait: true,
        } => through_wait(api, body).await,
        Target::Api {
            api,
            body,
            wait: false,
        } => through_websocket(api, body, index, round_trips).await,
        Target::Engine { engine, job } => {
            Ok(through_engine(engine, job, index, round_trips, stop.child_token()).await)
        }
    }
}

/// `POST /v1/jobs?wait=true`.
async fn through_wait(api: &Api, body: &[u8]) -> Result<Sample, ClientError> {
    let mut busy = BTreeMap::new();
    // No Idempotency-Key: the plain submission is what is measured, and a
    // benchmark never sends a job again after a transport error.
    let accepted = match api
        .submit(body, None, true, |refused| {
            *busy.entry(refused.reason.clone()).or_default() += 1;
        })
        .await
    {
        Ok(accepted) => accepted,
        Err(error) if is_fatal(&error) => return Err(error),
        Err(error) => return Ok(Sample::error(error.to_string(), busy)),
    };
    let ended = Instant::now();
    let status = accepted
        .answer
        .get("status")
        .cloned()
        .and_then(|s| serde_json::from_value::<Status>(s).ok());
    let result = accepted.answer.get("result").filter(|r| !r.is_null());
    let parsed = result.and_then(|r| serde_json::from_value::<JobResult>(r.clone()).ok());
    let outcome = match (status, parsed) {
        (Some(status), Some(parsed)) if status.is_terminal() => {
            Outcome::ran(&parsed, Start::of(result))
        }
        (Some(status), None) if status.is_terminal() => Outcome::Finished {
            status,
            start: Start::Unknown,
            failure: (status != Status::Succeeded)
                .then(|| format!("the job ended {} without a result", status.as_str())),
        },
        (Some(status), _) => Outcome::Error(format!(
            "?wait=true answered before the job ended (status {})",
            status.as_str()
        )),
        (None, _) => Outcome::Error(format!(
            "the ?wait=true answer has no status: {}",
            accepted.answer
        )),
    };
    let finished = matches!(outcome, Outcome::Finished { .. });
    Ok(Sample {
        outcome,
        first_output: None,
        result: finished.then(|| ended.duration_since(accepted.sent)),
        ended,
        lines_sent: 0,
        round_trips: Vec::new(),
        busy,
    })
}

/// What the WebSocket showed of one job, as it came.
struct Timing {
    first_output: Option<Instant>,
    exited: Option<Instant>,
    echo: Option<Echo>,
    /// Where the echo's frames go (to the follower's input).
    input: Option<mpsc::Sender<Outgoing>>,
}

impl EventSink for Timing {
    fn stage_started(&mut self, _stage: &str) {}

    fn output(&mut self, stderr: bool, bytes: Vec<u8>) {
        if stderr {
            return;
        }
        let now = Instant::now();
        self.first_output.get_or_insert(now);
        let Some(frame) = self.echo.as_mut().and_then(|e| e.output(&bytes, now)) else {
            return;
        };
        let outgoing = match frame {
            EchoFrame::Line(line) => Outgoing::Stdin(line),
            EchoFrame::Close => Outgoing::StdinClose,
        };
        // One frame is on its way at a time, so the channel has room.
        if let Some(input) = &self.input
            && input.try_send(outgoing).is_err()
        {
            tracing::warn!("the benchmark's stdin frame could not be queued");
        }
    }

    fn exited(&mut self) {
        self.exited = Some(Instant::now());
    }
}

/// `POST /v1/jobs`, then the job's WebSocket to its `exit` event.
async fn through_websocket(
    api: &Api,
    body: &[u8],
    index: u32,
    round_trips: Option<u32>,
) -> Result<Sample, ClientError> {
    let mut busy = BTreeMap::new();
    let accepted = match api
        .submit(body, None, false, |refused| {
            *busy.entry(refused.reason.clone()).or_default() += 1;
        })
        .await
    {
        Ok(accepted) => accepted,
        Err(error) if is_fatal(&error) => return Err(error),
        Err(error) => return Ok(Sample::error(error.to_string(), busy)),
    };
    let id = match job_id(&accepted.answer) {
        Ok(id) => id,
        Err(error) => return Ok(Sample::error(error.to_string(), busy)),
    };
    let (input, frames) = match round_trips {
        Some(_) => {
            let (input, frames) = mpsc::channel(4);
            (Some(input), Some(frames))
        }
        None => (None, None),
    };
    let timing = Timing {
        first_output: None,
        exited: None,
        echo: round_trips.map(|n| Echo::new(index, n)),
        input,
    };
    let mut follower = Follower::new(&api.base, &id, &api.key, timing, frames);
    let followed = follower.follow(&mut NoInterrupts).await;
    let timing = follower.sink;
    let ended = timing.exited.unwrap_or_else(Instant::now);
    let (lines_sent, round_trips) = timing
        .echo
        .map_or((0, Vec::new()), |e| (e.sent(), e.into_round_trips()));
    let outcome = match followed {
        Followed::Exit(result) => Outcome::ran(&result, start_of(&result)),
        Followed::Failed(error) if is_fatal(&error) => return Err(error),
        Followed::Failed(error) => Outcome::Error(format!("job {id}: {error}")),
        Followed::Fallback(why) => {
            Outcome::Error(format!("job {id}: the job's stream is unavailable: {why}"))
        }
        Followed::Interrupted => Outcome::Error(format!("job {id}: interrupted")),
    };
    let finished = matches!(outcome, Outcome::Finished { .. });
    Ok(Sample {
        outcome,
        first_output: timing.first_output.map(|t| t.duration_since(accepted.sent)),
        result: finished.then(|| ended.duration_since(accepted.sent)),
        ended,
        lines_sent,
        round_trips,
        busy,
    })
}

/// `SandboxEngine::run`, in this process.
async fn through_engine(
    engine: &DockerEngine,
    job: &PreparedJob,
    index: u32,
    round_trips: Option<u32>,
    cancel: CancellationToken,
) -> Sample {
    let (events_tx, mut events) = mpsc::channel(256);
    let (input_tx, input_rx) = mpsc::channel(4);
    let mut echo = round_trips.map(|n| Echo::new(index, n));
    let io = JobIo {
        events: Some(events_tx),
        input: echo.is_some().then_some(input_rx),
        cancel,
        deadline_ms: None,
    };
    let job_id = uuid::Uuid::new_v4().to_string();
    let submitted = Instant::now();
    let run = async {
        let result = engine.run(&job_id, job, io).await;
        (result, Instant::now())
    };
    let watch = async {
        let mut first_output = None;
        // Ends when the run ends: it drops the events' sender.
        while let Some(event) = events.recv().await {
            let SandboxEvent::Stdout(bytes) = event else {
                continue;
            };
            let now = Instant::now();
            first_output.get_or_insert(now);
            let frame = match echo.as_mut().and_then(|e| e.output(&bytes, now)) {
                Some(EchoFrame::Line(line)) => JobInput::Stdin(line),
                Some(EchoFrame::Close) => JobInput::StdinClose,
                None => continue,
            };
            // The job may have ended meanwhile; then nothing is waiting.
            let _ = input_tx.send(frame).await;
        }
        first_output
    };
    let ((result, ended), first_output) = tokio::join!(run, watch);
    let (lines_sent, round_trips) =
        echo.map_or((0, Vec::new()), |e| (e.sent(), e.into_round_trips()));
    Sample {
        outcome: Outcome::ran(&result, start_of(&result)),
        first_output: first_output.map(|t| t.duration_since(submitted)),
        result: Some(ended.duration_since(submitted)),
        ended,
        lines_sent,
        round_trips,
        busy: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_is_read_from_the_result_and_unknown_when_absent() {
        let result = |start: &str| serde_json::json!({"status": "succeeded", "start": start});
        assert_eq!(Start::of(Some(&result("warm"))), Start::Warm);
        assert_eq!(Start::of(Some(&result("cold"))), Start::Cold);
        assert_eq!(Start::of(Some(&result("warm_runtime"))), Start::WarmRuntime);
        assert_eq!(Start::of(Some(&result("lukewarm"))), Start::Unknown);
        assert_eq!(
            Start::of(Some(&serde_json::json!({"status": "succeeded"}))),
            Start::Unknown
        );
        assert_eq!(Start::of(None), Start::Unknown);
    }
}
