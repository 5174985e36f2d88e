//! `code-runner run FILE…`: the client of a running API (docs/cli.md).
//!
//! It builds the job from the files and flags exactly as `sandbox run` does
//! ([`JobArgs`]), submits it to `POST /v1/jobs` with a fresh
//! `Idempotency-Key`, then follows the job over its WebSocket
//! (`/v1/jobs/<id>/ws`, [`stream`]): the program's output is written as it
//! arrives, and on the `exit` event the client exits with
//! [`exit::for_result`] of the result. A stream that drops is resumed with
//! `?after=<seq>` (nothing lost, nothing repeated); one that keeps failing, or
//! an API without streams, is replaced by polling `GET /v1/jobs/<id>` until
//! the job is terminal, and what the stream had not shown is written from
//! the result. The compile stage's output is shown only when compilation
//! failed.
//!
//! `-i`/`--interactive` submits an interactive job: each line typed goes to
//! the program as a `stdin` frame, EOF (Ctrl-D) sends `stdin_close`, Ctrl-C
//! sends the `interrupt` signal (a second one within 2 s sends `kill`), and
//! the exit code is the program's.
//!
//! The client's own failures: a refused key or an invalid job exit 64; an API
//! that cannot be reached, stays busy (429 for longer than [`BUSY_BUDGET`]) or
//! is unavailable exits 69; Ctrl-C in a non-interactive run (or before the
//! job is submitted) cancels the job (`DELETE`) and exits 130. Each comes with
//! one `code-runner: …` line on stderr.

pub mod capacity;
mod grade;
mod job_args;
mod printer;
pub(crate) mod stream;
pub mod usage;

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use clap::Args;
use reqwest::StatusCode;
use serde::Deserialize;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit;
use crate::job::{JobResult, Status};
use crate::languages::LanguageCatalog;

pub use job_args::JobArgs;
pub(crate) use job_args::{language_for, read_source};
use printer::Printer;
use stream::{Followed, Follower};

/// How long the client keeps retrying a submission the API refuses with 429.
pub const BUSY_BUDGET: Duration = Duration::from_secs(30);
/// Longest pause between two retries of a busy submission, whatever
/// `Retry-After` says.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);
/// How long polling goes on through an API that cannot be reached or answers
/// 5xx (a restart), before giving up.
const OUTAGE_BUDGET: Duration = Duration::from_secs(15);
/// First and longest pause between two polls of the job.
const FIRST_POLL: Duration = Duration::from_millis(25);
const MAX_POLL: Duration = Duration::from_secs(1);
/// Connecting to the API, and one whole request.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long cancelling on Ctrl-C may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Interactive: each line typed goes to the program as it is entered,
    /// Ctrl-D closes its stdin, Ctrl-C interrupts it (twice: kills it).
    #[arg(short, long, conflicts_with = "stdin")]
    pub interactive: bool,
    /// Grade the program: DIR holds NAME.in (a test's stdin) and NAME.out
    /// (its expected output) pairs; prints a table of verdicts and exits 0
    /// only when every test was accepted.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["interactive", "stdin"])]
    pub tests: Option<std::path::PathBuf>,
    /// With --tests: how an output is compared (exact, trim, tokens, float).
    #[arg(long, requires = "tests", default_value = "trim")]
    pub check: String,
    /// With --tests: skip the remaining tests after the first failure.
    #[arg(long, requires = "tests")]
    pub stop_on_failure: bool,
    /// Print the job (with its full result) as JSON at the end instead of the
    /// program's output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: ApiTarget,
}

/// Which API a client talks to, and with which key (`run`, `bench`).
#[derive(Debug, Clone, Args)]
pub struct ApiTarget {
    /// URL of the code-runner API.
    #[arg(long, env = "CODE_RUNNER_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// API key (sent as `Authorization: Bearer`); `scripts/up` prints one.
    #[arg(
        long,
        visible_alias = "key",
        env = "CODE_RUNNER_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

impl ApiTarget {
    /// The client for this API, each request bounded by `request_timeout`;
    /// a missing key or a URL that is not `http://` is the user's mistake
    /// (exit 64), the rest the platform's.
    pub(crate) fn api(&self, request_timeout: Duration) -> Result<Api, ClientError> {
        let Some(key) = self.api_key.clone().filter(|k| !k.is_empty()) else {
            return Err(ClientError::Setting(
                "CODE_RUNNER_API_KEY is not set: it is the API key to submit with (scripts/up prints one)"
                    .to_string(),
            ));
        };
        let base = self.url.trim_end_matches('/').to_string();
        if !base.starts_with("http://") {
            return Err(ClientError::Setting(format!(
                "CODE_RUNNER_URL {:?} is not an http:// URL",
                self.url
            )));
        }
        Api::new(base, key, request_timeout).map_err(|e| ClientError::Setup(root_cause(&e)))
    }
}

/// Why the client gave up; each maps to an exit code and one line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("{0}")]
    Setting(String),
    #[error("cannot set up the HTTP client: {0}")]
    Setup(String),
    #[error("cannot reach {url}: {cause}")]
    Unreachable { url: String, cause: String },
    #[error("the API refused the key")]
    Unauthorized,
    #[error("invalid job: {0}")]
    Invalid(String),
    #[error("the API is busy ({message}); gave up after {waited_secs} s")]
    Busy { message: String, waited_secs: u64 },
    #[error("the API is unavailable: {0}")]
    Unavailable(String),
    #[error("job {0} no longer exists on the API")]
    Gone(String),
    #[error("unexpected answer from the API: {0}")]
    Protocol(String),
}

impl ClientError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            ClientError::Setting(_) | ClientError::Unauthorized | ClientError::Invalid(_) => {
                exit::USAGE
            }
            ClientError::Unreachable { .. }
            | ClientError::Busy { .. }
            | ClientError::Unavailable(_) => exit::UNAVAILABLE,
            ClientError::Setup(_) | ClientError::Gone(_) | ClientError::Protocol(_) => {
                exit::PLATFORM_ERROR
            }
        }
    }

    /// Worth trying again while polling: the API may be restarting.
    fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable { .. } | ClientError::Unavailable(_)
        )
    }
}

fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    eprintln!("code-runner: {message}");
    code
}

pub async fn run(args: RunArgs) -> u8 {
    let api = match args.api.api(REQUEST_TIMEOUT) {
        Ok(api) => api,
        Err(error) => return fail(error.exit_code(), error),
    };
    let catalog = match LanguageCatalog::embedded() {
        Ok(catalog) => catalog,
        Err(error) => return fail(exit::PLATFORM_ERROR, error),
    };
    let mut spec = match args.job.job_spec(&catalog, args.interactive).await {
        Ok(spec) => spec,
        Err(message) => return fail(exit::USAGE, message),
    };
    if let Some(dir) = &args.tests {
        match grade::tests_from_dir(dir) {
            Ok(tests) => spec.tests = Some(tests),
            Err(message) => return fail(exit::USAGE, message),
        }
        spec.check = Some(serde_json::Value::String(args.check.clone()));
        spec.stop_on_failure = args.stop_on_failure.then_some(true);
    }
    let body = match serde_json::to_vec(&spec) {
        Ok(body) => body,
        Err(error) => return fail(exit::PLATFORM_ERROR, error),
    };
    // From here on Ctrl-C cancels the job (interrupts it, once an
    // interactive job is submitted) instead of ending the process.
    let mut interrupt = match signal(SignalKind::interrupt()) {
        Ok(interrupt) => interrupt,
        Err(error) => return fail(exit::PLATFORM_ERROR, error),
    };
    let idempotency_key = uuid::Uuid::new_v4().to_string();

    let mut told = false;
    let on_busy = |refused: &Refused| {
        if !told && std::io::stderr().is_terminal() {
            eprintln!(
                "code-runner: the API is busy ({}); retrying",
                refused.message
            );
            told = true;
        }
    };
    let id = tokio::select! {
        submitted = api.submit(&body, Some(&idempotency_key), false, on_busy) => {
            match submitted.and_then(|accepted| job_id(&accepted.answer)) {
                Ok(id) => id,
                Err(error) => return fail(error.exit_code(), error),
            }
        }
        _ = interrupt.recv() => {
            // The submission may have arrived: the same Idempotency-Key and
            // body name the same job, so ask once more and cancel what it names.
            let again = tokio::time::timeout(
                CANCEL_TIMEOUT,
                api.submit_once(&body, Some(&idempotency_key), false),
            )
            .await;
            if let Ok(Ok(Submitted::Accepted(answer))) = again
                && let Ok(id) = job_id(&answer)
            {
                return cancel(&api, &id).await;
            }
            return fail(exit::CANCELLED, "interrupted before the job was submitted");
        }
    };

    let input = args.interactive.then(stream::read_terminal);
    let mut follower = Follower::new(&api.base, &id, &api.key, Printer::new(args.json), input);
    let why = match follower.follow(&mut interrupt).await {
        Followed::Exit(result) if !args.json => return finish(&mut follower.sink, &result),
        // `--json` prints the job view: the exit event says it is terminal.
        Followed::Exit(_) => None,
        Followed::Interrupted => return cancel(&api, &id).await,
        Followed::Failed(error) => return fail(error.exit_code(), error),
        Followed::Fallback(why) => Some(why),
    };
    if let Some(why) = why {
        tracing::debug!(%why, "following the job by polling");
        if args.interactive {
            eprintln!(
                "code-runner: the job's stream is unavailable ({why}); \
                 waiting for the job without sending input"
            );
        }
    }
    let view = tokio::select! {
        view = api.wait_terminal(&id) => match view {
            Ok(view) => view,
            Err(error) => return fail(error.exit_code(), error),
        },
        _ = interrupt.recv() => return cancel(&api, &id).await,
    };
    report(&view, args.json, &mut follower.sink)
}

/// Cancels the job after Ctrl-C; always exits 130.
async fn cancel(api: &Api, id: &str) -> u8 {
    match tokio::time::timeout(CANCEL_TIMEOUT, api.cancel(id)).await {
        Ok(Ok(())) => fail(exit::CANCELLED, "interrupted; the job was cancelled"),
        Ok(Err(error)) => fail(
            exit::CANCELLED,
            format!("interrupted; cancelling job {id} failed: {error}"),
        ),
        Err(_) => fail(
            exit::CANCELLED,
            format!("interrupted; cancelling job {id} took too long"),
        ),
    }
}

/// Prints the outcome of a terminal job and returns the exit code.
fn report(view: &serde_json::Value, json: bool, printer: &mut Printer) -> u8 {
    let result = match view.get("result").filter(|r| !r.is_null()) {
        Some(result) => match serde_json::from_value::<JobResult>(result.clone()) {
            Ok(result) => result,
            Err(error) => {
                return fail(
                    exit::PLATFORM_ERROR,
                    ClientError::Protocol(format!("the job's result does not parse: {error}")),
                );
            }
        },
        None => return report_without_result(view, json),
    };
    if json {
        let (code, _) = exit::for_result(&result);
        return print_json(view).map_or_else(|error| fail(exit::PLATFORM_ERROR, error), |()| code);
    }
    finish(printer, &result)
}

/// Writes what is left of the program's output (the compiler's, when
/// compilation failed) and the one-line explanation; returns the exit code.
fn finish(printer: &mut Printer, result: &JobResult) -> u8 {
    if let Some(grading) = &result.grading {
        return grade::finish(result, grading);
    }
    let (code, message) = exit::for_result(result);

    printer.finish(result);
    if let Some(message) = message {
        eprintln!("code-runner: {message}");
    }
    code
}

/// A terminal job with no result (the API should always give one).
fn report_without_result(view: &serde_json::Value, json: bool) -> u8 {
    let status = view.get("status").and_then(|s| s.as_str()).unwrap_or("");
    let (code, message) = match status {
        "cancelled" => (exit::CANCELLED, "the job was cancelled".to_string()),
        other => (
            exit::PLATFORM_ERROR,
            format!("the job ended {other:?} without a result"),
        ),
    };
    if json {
        return print_json(view).map_or_else(|error| fail(exit::PLATFORM_ERROR, error), |()| code);
    }
    fail(code, message)
}

fn print_json(view: &serde_json::Value) -> Result<(), serde_json::Error> {
    let text = serde_json::to_string_pretty(view)?;
    println!("{text}");
    Ok(())
}

/// The error body of the API: `{"error": {"code", "message", "field"?}}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    field: Option<String>,
    /// For a 429 or 503: the refusal's reason (e.g. `key_limit`).
    #[serde(default)]
    reason: Option<String>,
}

impl ErrorDetail {
    /// `field: message`, or whatever the API said.
    fn describe(&self, status: StatusCode) -> String {
        match (&self.field, self.message.is_empty()) {
            (Some(field), false) => format!("{field}: {}", self.message),
            (None, false) => self.message.clone(),
            _ if !self.code.is_empty() => self.code.clone(),
            _ => status.to_string(),
        }
    }
}

/// What one submission attempt gave.
pub(crate) enum Submitted {
    /// The API took the job; its answer (`{id, status, token, urls}`, or with
    /// `?wait=true` the job with its result).
    Accepted(serde_json::Value),
    /// 429: try again after this long.
    Busy {
        retry_after: Duration,
        refused: Refused,
    },
}

/// A 429 answer to a submission.
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    /// The body's `reason` (else its `code`): which limit refused it.
    pub(crate) reason: String,
    pub(crate) message: String,
}

/// A submission the API took.
pub(crate) struct Accepted {
    pub(crate) answer: serde_json::Value,
    /// When the attempt the API took was sent (earlier ones got 429).
    pub(crate) sent: Instant,
}

/// The job id in a submit answer.
pub(crate) fn job_id(answer: &serde_json::Value) -> Result<String, ClientError> {
    answer
        .get("id")
        .and_then(|id| id.as_str())
        .map(str::to_string)
        .ok_or_else(|| ClientError::Protocol(format!("the submit answer has no id: {answer}")))
}

pub(crate) struct Api {
    http: reqwest::Client,
    /// `http://host:port`, no trailing slash.
    pub(crate) base: String,
    pub(crate) key: String,
}

impl Api {
    /// The HTTP client, for the routes of the compatible APIs.
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    fn new(base: String, key: String, request_timeout: Duration) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(request_timeout)
            .user_agent(concat!("code-runner/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { http, base, key })
    }

    fn transport(&self, error: reqwest::Error) -> ClientError {
        if error.is_connect() || error.is_timeout() || error.is_request() {
            ClientError::Unreachable {
                url: self.base.clone(),
                cause: root_cause(&error),
            }
        } else {
            ClientError::Protocol(root_cause(&error))
        }
    }

    /// The error an unsuccessful answer stands for.
    async fn refusal(&self, response: reqwest::Response) -> ClientError {
        let status = response.status();
        let detail = response
            .json::<ErrorBody>()
            .await
            .map(|b| b.error)
            .unwrap_or_default();
        let text = detail.describe(status);
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ClientError::Unauthorized,
            StatusCode::BAD_REQUEST
            | StatusCode::CONFLICT
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::UNPROCESSABLE_ENTITY => ClientError::Invalid(text),
            StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::BAD_GATEWAY
            | StatusCode::GATEWAY_TIMEOUT => ClientError::Unavailable(text),
            _ => ClientError::Protocol(format!("{status}: {text}")),
        }
    }

    /// Submits (with `?wait=true` when `wait`), retrying while the API
    /// answers 429 (for up to [`BUSY_BUDGET`]); `on_busy` hears of each 429.
    pub(crate) async fn submit(
        &self,
        body: &[u8],
        idempotency_key: Option<&str>,
        wait: bool,
        mut on_busy: impl FnMut(&Refused),
    ) -> Result<Accepted, ClientError> {
        let started = Instant::now();
        loop {
            let sent = Instant::now();
            match self.submit_once(body, idempotency_key, wait).await? {
                Submitted::Accepted(answer) => return Ok(Accepted { answer, sent }),
                Submitted::Busy {
                    retry_after,
                    refused,
                } => {
                    on_busy(&refused);
                    let waited = started.elapsed();
                    if waited + retry_after > BUSY_BUDGET {
                        return Err(ClientError::Busy {
                            message: refused.message,
                            waited_secs: waited.as_secs(),
                        });
                    }
                    tokio::time::sleep(retry_after).await;
                }
            }
        }
    }

    pub(crate) async fn submit_once(
        &self,
        body: &[u8],
        idempotency_key: Option<&str>,
        wait: bool,
    ) -> Result<Submitted, ClientError> {
        let url = if wait {
            format!("{}/v1/jobs?wait=true", self.base)
        } else {
            format!("{}/v1/jobs", self.base)
        };
        let mut request = self
            .http
            .post(url)
            .bearer_auth(&self.key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.map_err(|e| self.transport(e))?;
        let status = response.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            let retry_after = retry_after(&response);
            let detail = response
                .json::<ErrorBody>()
                .await
                .map(|b| b.error)
                .unwrap_or_default();
            return Ok(Submitted::Busy {
                retry_after,
                refused: Refused {
                    reason: detail.reason.clone().unwrap_or_else(|| detail.code.clone()),
                    message: detail.describe(status),
                },
            });
        }
        if !status.is_success() {
            return Err(self.refusal(response).await);
        }
        let answer = response
            .json()
            .await
            .map_err(|e| ClientError::Protocol(format!("the submit answer: {e}")))?;
        Ok(Submitted::Accepted(answer))
    }

    /// The job's view; a 429 (the key's request rate) is waited out for up
    /// to [`BUSY_BUDGET`], as a submission's is.
    pub(crate) async fn get(&self, id: &str) -> Result<serde_json::Value, ClientError> {
        let started = Instant::now();
        let response = loop {
            let response = self
                .http
                .get(format!("{}/v1/jobs/{id}", self.base))
                .bearer_auth(&self.key)
                .send()
                .await
                .map_err(|e| self.transport(e))?;
            if response.status() != StatusCode::TOO_MANY_REQUESTS {
                break response;
            }
            let wait = retry_after(&response);
            if started.elapsed() + wait > BUSY_BUDGET {
                break response;
            }
            tokio::time::sleep(wait).await;
        };
        match response.status() {
            status if status.is_success() => response
                .json()
                .await
                .map_err(|e| ClientError::Protocol(format!("the job view: {e}"))),
            StatusCode::NOT_FOUND => Err(ClientError::Gone(id.to_string())),
            _ => Err(self.refusal(response).await),
        }
    }

    /// Polls the job until it is terminal; rides out an API outage of up to
    /// [`OUTAGE_BUDGET`].
    async fn wait_terminal(&self, id: &str) -> Result<serde_json::Value, ClientError> {
        let mut pause = FIRST_POLL;
        let mut outage: Option<Instant> = None;
        loop {
            match self.get(id).await {
                Ok(view) => {
                    outage = None;
                    let status = view
                        .get("status")
                        .cloned()
                        .and_then(|s| serde_json::from_value::<Status>(s).ok())
                        .ok_or_else(|| {
                            ClientError::Protocol(format!("the job view has no status: {view}"))
                        })?;
                    if status.is_terminal() {
                        return Ok(view);
                    }
                }
                Err(error) if error.is_transient() => {
                    let since = *outage.get_or_insert_with(Instant::now);
                    if since.elapsed() > OUTAGE_BUDGET {
                        return Err(error);
                    }
                }
                Err(error) => return Err(error),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 3 / 2).min(MAX_POLL);
        }
    }

    pub(crate) async fn cancel(&self, id: &str) -> Result<(), ClientError> {
        let response = self
            .http
            .delete(format!("{}/v1/jobs/{id}", self.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(self.refusal(response).await)
        }
    }
}

/// How long a 429 answer asks to wait (`Retry-After`, 1 s when it does
/// not say), between 200 ms and [`MAX_RETRY_AFTER`].
fn retry_after(response: &reqwest::Response) -> Duration {
    response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(1), Duration::from_secs)
        .clamp(Duration::from_millis(200), MAX_RETRY_AFTER)
}

/// The innermost cause of an error: "Connection refused (os error 111)"
/// rather than "error sending request".
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}

/// A successful API answer's body as JSON, or why not (the platform's fault).
pub(crate) fn answer_json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|error| format!("the API's answer does not parse: {error}"))
}

/// The exit code and the one-line message for an API answer that is not a
/// success: the error's field and message when the body has them; 503 is
/// "unavailable", another 4xx a usage error, anything else the platform's.
pub(crate) fn refusal(status: StatusCode, body: &str) -> (u8, String) {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let error = &value["error"];
    let message = match (error["field"].as_str(), error["message"].as_str()) {
        (Some(field), Some(message)) => format!("{field}: {message}"),
        (None, Some(message)) => message.to_string(),
        _ => status.to_string(),
    };
    let code = match status {
        StatusCode::SERVICE_UNAVAILABLE => exit::UNAVAILABLE,
        s if s.is_client_error() => exit::USAGE,
        _ => exit::PLATFORM_ERROR,
    };
    (
        code,
        format!("the API answered {}: {message}", status.as_u16()),
    )
}

#[cfg(test)]
mod tests;
