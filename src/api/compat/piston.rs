//! Piston v2 (engineer-man/piston `api/src/api/v2.js`), under the Piston
//! prefix (default `/api/v2`):
//!
//! - `GET /runtimes` — `[{language, version, aliases, runtime?}]` of the
//!   languages on offer, named as Piston names them (`c++`, `rscript`,
//!   `sqlite3`; our id is then an alias) with a three-part version.
//! - `POST /execute` — Piston's request, run as an ordinary job and waited
//!   for; Piston's answer (`run`, and `compile` for compiled languages, each
//!   with `stdout`, `stderr`, `output`, `code`, `signal`, `message`, `status`,
//!   `cpu_time`, `wall_time`, `memory`). Errors are `{"message"}` with
//!   Piston's texts and status codes.
//! - `GET /connect` — Piston's interactive WebSocket: `init`, `data`,
//!   `signal` in; `runtime`, `stage`, `data`, `exit`, `error` out; closed
//!   with Piston's codes (4999 when the job completed).
//!
//! Piston has no keys: a key is taken from `Authorization` (raw or
//! `Bearer`), and with `CODE_RUNNER_PISTON_LOOPBACK_KEY` a keyless request
//! from a loopback address is served as that key.

use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::super::ApiState;
use super::super::auth::Caller;
use super::super::error::ApiError;
use super::super::feeds::Step;
use super::super::jobs::{wait_budget, wait_for_end};
use super::super::stream_caps::StreamPermit;
use super::{CallerRefusal, Refusal, compat_caller, new_job_id, semver3, submit};
use crate::job::events::{JobEvent, StageState};
use crate::job::limits::{CompileLimitsRequest, LimitsRequest};
use crate::job::{Encoding, FileSpec, JobResult, JobSpec, StageResult, Status};
use crate::languages::{Language, LanguageCatalog};
use crate::protocol::{Reason, SignalKind};
use crate::store::{Control, InputOutcome};

/// Our ids that Piston names otherwise, and the runtime Piston reports for
/// a language (`runtime` is only there when Piston has one).
const PISTON_NAMES: &[(&str, &str, Option<&str>)] = &[
    ("javascript", "javascript", Some("node")),
    ("c", "c", Some("gcc")),
    ("cpp", "c++", Some("gcc")),
    ("fortran", "fortran", Some("gcc")),
    ("csharp", "csharp", Some("mono")),
    ("r", "rscript", None),
    ("sql", "sqlite3", None),
];

/// How long `/connect` waits for the `init` message (Piston: 1 s).
const INIT_TIMEOUT: Duration = Duration::from_secs(1);
/// Frames waiting to be written to one WebSocket.
const OUTBOX: usize = 64;
/// Piston's signal names (globals.js); SIGINT interrupts, every other one kills.
const SIGNALS: &[&str] = &[
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];

pub(super) fn router() -> Router<ApiState> {
    Router::new()
        .route("/runtimes", get(runtimes))
        .route("/execute", post(execute))
        .route("/connect", get(connect))
}

/// Piston's name for a language, and its runtime.
fn piston_name(language: &Language) -> (&str, Option<&'static str>) {
    PISTON_NAMES
        .iter()
        .find(|(id, _, _)| *id == language.id)
        .map_or((language.id.as_str(), None), |(_, name, runtime)| {
            (*name, *runtime)
        })
}

/// An error in Piston's shape: `{"message": …}`.
fn piston_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "message": message.into() }))).into_response()
}

/// One of our errors in Piston's shape, with our status code (429 keeps its
/// `Retry-After`).
fn from_api_error(error: ApiError) -> Response {
    let status = error.status();
    let retry_after = error.retry_after();
    let mut response = piston_error(status, error.to_string());
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, seconds.into());
    }
    response
}

/// The caller of a Piston submission (`/execute`, `/connect`) within its
/// key's rate, or the 401 or 429 answer in Piston's shape.
fn piston_caller(state: &ApiState, parts: &Parts) -> Result<Caller, Refusal> {
    compat_caller(state, parts, None, true, true).map_err(|refusal| {
        Refusal::from(match refusal {
            CallerRefusal::NoKey => piston_error(
                StatusCode::UNAUTHORIZED,
                "an API key is required: send it as Authorization",
            ),
            CallerRefusal::Rate(error) => from_api_error(error),
        })
    })
}

#[derive(Debug, Serialize)]
struct Runtime<'a> {
    language: &'a str,
    version: String,
    aliases: Vec<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime: Option<&'a str>,
}

/// `GET /runtimes`: no key needed, like `/v1/languages`.
async fn runtimes(State(state): State<ApiState>) -> Response {
    let catalog = state.offered_catalog().await;
    let runtimes: Vec<Runtime> = catalog
        .all()
        .iter()
        .map(|language| {
            let (name, runtime) = piston_name(language);
            let aliases = std::iter::once(language.id.as_str())
                .chain(language.aliases.iter().map(String::as_str))
                .filter(|alias| *alias != name)
                .collect();
            Runtime {
                language: name,
                version: semver3(&language.version),
                aliases,
                runtime,
            }
        })
        .collect();
    Json(runtimes).into_response()
}

/// Whether a version selector (`*`, `3`, `3.x`, `3.11.0`, `^3.10.0`,
/// `~3.11.0`, `>=3.8.0`) accepts a three-part version. Piston uses node's
/// semver; this covers the selectors its clients send.
fn version_matches(selector: &str, version: &str) -> bool {
    let number = |text: &str| -> Vec<u64> {
        text.split('.')
            .map(|p| p.parse::<u64>().unwrap_or(0))
            .chain(std::iter::repeat(0))
            .take(3)
            .collect()
    };
    let have = number(version);
    let selector = selector.trim();
    if let Some(rest) = selector.strip_prefix(">=") {
        return have >= number(rest.trim());
    }
    if let Some(rest) = selector.strip_prefix('^') {
        let want = number(rest);
        return have[0] == want[0] && have >= want;
    }
    if let Some(rest) = selector.strip_prefix('~') {
        let want = number(rest);
        return have[..2] == want[..2] && have >= want;
    }
    let selector = selector.trim_start_matches(['=', 'v']);
    if selector.is_empty() {
        return true;
    }
    selector.split('.').zip(&have).all(|(part, have)| {
        matches!(part, "*" | "x" | "X") || part.parse::<u64>().ok() == Some(*have)
    })
}

/// A request of `/execute` or `/connect`'s `init`, checked the way Piston's
/// `get_job` checks it, as a job.
fn piston_job(
    body: &Map<String, Value>,
    catalog: &LanguageCatalog,
    state: &ApiState,
    interactive: bool,
) -> Result<(JobSpec, Language), String> {
    let language = body
        .get("language")
        .and_then(Value::as_str)
        .filter(|l| !l.is_empty())
        .ok_or("language is required as a string")?;
    let version = body
        .get("version")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        .ok_or("version is required as a string")?;
    let files = body
        .get("files")
        .and_then(Value::as_array)
        .ok_or("files is required as an array")?;
    for (index, file) in files.iter().enumerate() {
        if !file.get("content").is_some_and(Value::is_string) {
            return Err(format!("files[{index}].content is required as a string"));
        }
    }
    let found = catalog
        .find(language)
        .or_else(|| {
            PISTON_NAMES
                .iter()
                .find(|(_, name, _)| *name == language)
                .and_then(|(id, _, _)| catalog.find(id))
        })
        .filter(|l| version_matches(version, &semver3(&l.version)))
        .ok_or_else(|| format!("{language}-{version} runtime is unknown"))?
        .clone();
    if !files
        .iter()
        .any(|f| matches!(encoding_of(f), None | Some("utf8")))
    {
        return Err("files must include at least one utf8 encoded file".into());
    }

    // Limits: Piston's names, checked against this server's maximum.
    let policy = &state.inner.policy;
    let compiled = found.compile.is_some();
    let mut limits = LimitsRequest::default();
    let mut compile_limits = CompileLimitsRequest::default();
    let mut memory_bytes: Option<u64> = None;
    for stage in ["compile", "run"] {
        for constraint in ["timeout", "cpu_time", "memory_limit"] {
            let name = format!("{stage}_{constraint}");
            let Some(value) = body.get(&name).filter(|v| !v.is_null()) else {
                continue;
            };
            let Some(number) = value.as_f64() else {
                return Err(format!("If specified, {name} must be a number"));
            };
            // 0 is Piston's "not given"; -1 its "no limit": ours is the default.
            if number == 0.0 || number == -1.0 {
                continue;
            }
            let maximum = match (stage, constraint) {
                ("compile", "timeout") => policy.compile_maximum.wall_ms,
                ("compile", "cpu_time") => policy.compile_maximum.cpu_ms,
                ("run", "timeout") => policy.maximum.wall_ms,
                ("run", "cpu_time") => policy.maximum.cpu_ms,
                _ => policy.maximum.memory_mb * 1024 * 1024,
            };
            if number > maximum as f64 {
                return Err(format!(
                    "{name} cannot exceed the configured limit of {maximum}"
                ));
            }
            if number < 0.0 {
                return Err(format!("{name} must be non-negative"));
            }
            let value = number.ceil() as u64;
            match (stage, constraint) {
                // Interpreted languages have no compile stage: Piston ignores
                // its limits, and so do we.
                ("compile", "timeout") if compiled => compile_limits.wall_ms = Some(value),
                ("compile", "cpu_time") if compiled => compile_limits.cpu_ms = Some(value),
                ("run", "timeout") => limits.wall_ms = Some(value),
                ("run", "cpu_time") => limits.cpu_ms = Some(value),
                // One container holds both stages: it gets the larger.
                (_, "memory_limit") => {
                    memory_bytes = Some(memory_bytes.map_or(value, |m| m.max(value)));
                }
                _ => {}
            }
        }
    }
    limits.memory_mb = memory_bytes.map(|bytes| bytes.div_ceil(1024 * 1024).max(1));

    let mut spec_files = Vec::with_capacity(files.len());
    for (index, file) in files.iter().enumerate() {
        let content = file.get("content").and_then(Value::as_str).unwrap_or("");
        let (content, encoding) = match encoding_of(file) {
            Some("base64") => (content.to_string(), Encoding::Base64),
            Some("hex") => {
                let bytes = hex::decode(content)
                    .map_err(|e| format!("files[{index}].content is not valid hex: {e}"))?;
                (STANDARD.encode(bytes), Encoding::Base64)
            }
            _ => (content.to_string(), Encoding::Utf8),
        };
        let name = match file.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => name.to_string(),
            _ if index == 0 => default_entry_name(&found, &content),
            _ => format!("file{index}.code"),
        };
        spec_files.push(FileSpec {
            name,
            content,
            encoding,
        });
    }
    // Piston runs the first UTF-8 file.
    let entry = files
        .iter()
        .position(|f| matches!(encoding_of(f), None | Some("utf8")))
        .map(|i| spec_files[i].name.clone());
    let args = match body.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(args)) => args
            .iter()
            .map(|a| match a {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        Some(_) => return Err("args must be an array".into()),
    };
    let mut stdin = match body.get("stdin") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("stdin must be a string".into()),
    };
    // Piston ends stdin with a newline when it has none.
    if !interactive && !stdin.ends_with('\n') {
        stdin.push('\n');
    }
    let mut metadata = Map::new();
    metadata.insert("via".into(), "piston".into());
    Ok((
        JobSpec {
            language: found.id.clone(),
            files: spec_files,
            entry,
            stdin,
            args,
            interactive,
            limits,
            compile_limits,
            metadata,
            ..Default::default()
        },
        found,
    ))
}

/// A Piston file's `encoding` (absent: utf8).
fn encoding_of(file: &Value) -> Option<&str> {
    file.get("encoding").and_then(Value::as_str)
}

/// The name of a nameless first file: the language's entry file name; for
/// Java, the public class's file (Piston runs Java with the single-file
/// launcher, which takes any class name).
fn default_entry_name(language: &Language, content: &str) -> String {
    if language.id == "java" {
        let mut words = content.split_whitespace().peekable();
        while let Some(word) = words.next() {
            if word == "public"
                && words.peek() == Some(&"class")
                && let Some(name) = words.nth(1)
            {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                    .collect();
                if !name.is_empty() {
                    return format!("{name}.java");
                }
            }
        }
    }
    language.source_file.clone()
}

/// A stage as Piston reports it.
#[derive(Debug, Serialize)]
struct PistonStage {
    stdout: String,
    stderr: String,
    output: String,
    code: Option<i32>,
    signal: Option<String>,
    message: Option<String>,
    status: Option<&'static str>,
    cpu_time: u64,
    wall_time: u64,
    memory: u64,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Our stage result as Piston's: isolate's status letters (`RE` non-zero
/// exit, `SG` signal, `TO` time limit, `OL`/`EL` output limit) and messages.
fn piston_stage(stage: &StageResult, output: Option<String>) -> PistonStage {
    let stdout = text(stage.stdout.as_bytes());
    let stderr = text(stage.stderr.as_bytes());
    let output = output.unwrap_or_else(|| format!("{stdout}{stderr}"));
    let killed = || Some("SIGKILL".to_string());
    let (code, signal, status, message) = match stage.reason {
        Reason::Exited => match (stage.exit_code, &stage.signal) {
            (Some(0), _) => (Some(0), None, None, None),
            (Some(code), _) => (
                Some(code),
                None,
                Some("RE"),
                Some(format!("Exited with error status {code}")),
            ),
            (None, signal) => {
                let number = signal
                    .as_deref()
                    .and_then(|s| SIGNALS.iter().position(|n| *n == s))
                    .map_or(0, |i| i + 1);
                (
                    None,
                    signal.clone(),
                    Some("SG"),
                    Some(format!("Caught fatal signal {number}")),
                )
            }
        },
        Reason::WallTimeout | Reason::IdleTimeout => (
            None,
            killed(),
            Some("TO"),
            Some("Time limit exceeded (wall clock)".into()),
        ),
        Reason::CpuTimeout => (
            None,
            killed(),
            Some("TO"),
            Some("Time limit exceeded".into()),
        ),
        Reason::MemoryLimit => (
            None,
            killed(),
            Some("SG"),
            Some("Memory limit exceeded".into()),
        ),
        Reason::OutputLimit => {
            if stdout.len() >= stderr.len() {
                (
                    None,
                    killed(),
                    Some("OL"),
                    Some("stdout length exceeded".into()),
                )
            } else {
                (
                    None,
                    killed(),
                    Some("EL"),
                    Some("stderr length exceeded".into()),
                )
            }
        }
        Reason::Killed => (
            None,
            killed(),
            Some("SG"),
            Some("Caught fatal signal 9".into()),
        ),
    };
    PistonStage {
        stdout,
        stderr,
        output,
        code,
        signal,
        message,
        status,
        cpu_time: stage.cpu_ms,
        wall_time: stage.wall_ms,
        memory: stage.memory_peak_bytes,
    }
}

/// Stdout and stderr of each stage interleaved as they were written, from
/// the job's events stream; `None` where it cannot be read.
async fn interleaved_output(state: &ApiState, id: &str) -> Option<(String, String)> {
    let store = &state.inner.store;
    let (mut compile, mut run) = (String::new(), String::new());
    let mut stage = "";
    let mut after = 0;
    loop {
        let events = store.events().since(id, after, 1000).await.ok()?;
        let Some(last) = events.last() else { break };
        after = last.seq;
        for stored in &events {
            match stored.event().ok()? {
                JobEvent::Stage {
                    stage: name,
                    state: StageState::Start,
                    ..
                } => stage = if name == "compile" { "compile" } else { "run" },
                JobEvent::Stdout { data, encoding } | JobEvent::Stderr { data, encoding } => {
                    let bytes = match encoding {
                        Encoding::Utf8 => data.into_bytes(),
                        Encoding::Base64 => STANDARD.decode(data).ok()?,
                    };
                    let into = if stage == "compile" {
                        &mut compile
                    } else {
                        &mut run
                    };
                    into.push_str(&text(&bytes));
                }
                _ => {}
            }
        }
    }
    Some((compile, run))
}

/// `POST /execute`.
async fn execute(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let caller = match piston_caller(&state, &parts) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    // Piston's own clients send JSON without a JSON content type
    // (piston-client posts text/plain): any body that parses is taken.
    let body = match Bytes::from_request(Request::from_parts(parts, body), &()).await {
        Ok(body) => body,
        Err(rejection) => {
            return if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                from_api_error(ApiError::TooLarge {
                    limit: state.inner.max_body_bytes,
                })
            } else {
                piston_error(StatusCode::BAD_REQUEST, rejection.body_text())
            };
        }
    };
    let body: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(error) => {
            return piston_error(
                StatusCode::BAD_REQUEST,
                format!("the body is not a JSON object: {error}"),
            );
        }
    };
    run_and_answer(&state, &caller, &body).await
}

async fn run_and_answer(state: &ApiState, caller: &Caller, body: &Map<String, Value>) -> Response {
    let catalog = state.offered_catalog().await;
    let (spec, language) = match piston_job(body, &catalog, state, false) {
        Ok(job) => job,
        Err(message) => {
            state
                .inner
                .metrics
                .submissions_rejected
                .with_label_values(&["invalid"])
                .inc();
            return piston_error(StatusCode::BAD_REQUEST, message);
        }
    };
    let submitted = match submit(state, caller, new_job_id(), &spec, &catalog).await {
        Ok(submitted) => submitted,
        Err(ApiError::InvalidJob(invalid)) => {
            return piston_error(StatusCode::BAD_REQUEST, invalid.to_string());
        }
        Err(error) => return from_api_error(error),
    };
    let budget = wait_budget(state, &submitted.prepared);
    let record = match wait_for_end(state, &submitted.id, budget).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            return piston_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("job {} disappeared before it ended", submitted.id),
            );
        }
        Err(error) => return from_api_error(ApiError::Unavailable(error)),
    };
    let Some(result) = record.result.filter(|_| record.status.is_terminal()) else {
        return piston_error(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "job {} did not end within {} s; it is {} (GET /v1/jobs/{} follows it)",
                submitted.id,
                budget.as_secs(),
                record.status.as_str(),
                submitted.id
            ),
        );
    };
    piston_answer(state, &submitted.id, &language, &result).await
}

async fn piston_answer(
    state: &ApiState,
    id: &str,
    language: &Language,
    result: &JobResult,
) -> Response {
    let Some(first) = result.compile.as_ref().or(result.run.as_ref()) else {
        return platform_failed(result);
    };
    if result.status == Status::Error {
        return platform_failed(result);
    }
    let (compile_output, run_output) = match interleaved_output(state, id).await {
        Some((compile, run)) => (Some(compile), Some(run)),
        None => (None, None),
    };
    let compile = result
        .compile
        .as_ref()
        .map(|stage| piston_stage(stage, compile_output.clone()));
    // Piston: when the run stage never started, `run` is the compile stage.
    let run = match &result.run {
        Some(stage) => piston_stage(stage, run_output),
        None => piston_stage(first, compile_output),
    };
    let (name, _) = piston_name(language);
    let mut answer = json!({
        "language": name,
        "version": semver3(&language.version),
        "run": run,
    });
    if let Some(compile) = compile {
        answer["compile"] = serde_json::to_value(compile).unwrap_or(Value::Null);
    }
    Json(answer).into_response()
}

/// The platform failed the job: Piston answers 500 then.
fn platform_failed(result: &JobResult) -> Response {
    let message = result
        .error
        .clone()
        .unwrap_or_else(|| format!("the job ended as {}", result.status.as_str()));
    piston_error(StatusCode::INTERNAL_SERVER_ERROR, message)
}

// ---------------------------------------------------------------------------
// /connect
// ---------------------------------------------------------------------------

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

fn frame(value: Value) -> Message {
    Message::text(value.to_string())
}

/// `GET /connect`: the key is checked before the upgrade (401 otherwise).
async fn connect(State(state): State<ApiState>, request: Request) -> Response {
    let (mut parts, _) = request.into_parts();
    let caller = match piston_caller(&state, &parts) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &state).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return piston_error(rejection.status(), rejection.body_text()),
    };
    // The job's id is chosen now, so the connection counts against the
    // stream caps before the upgrade, as `/v1/jobs/{id}/ws` does.
    let id = new_job_id();
    let permit = match state.stream_caps.acquire(&caller.name, &id) {
        Ok(permit) => permit,
        Err(error) => return from_api_error(error),
    };
    let sessions = state.sessions.clone();
    upgrade
        .on_upgrade(move |socket| sessions.track_future(session(socket, state, caller, id, permit)))
        .into_response()
}

/// One Piston WebSocket: `init` submits an interactive job; its events go
/// out as Piston's messages; `data` and `signal` go to the job.
async fn session(
    socket: WebSocket,
    state: ApiState,
    caller: Caller,
    id: String,
    _permit: StreamPermit,
) {
    let (mut sink, mut incoming) = socket.split();
    let (outbox, mut frames) = mpsc::channel::<Message>(OUTBOX);
    let writer = tokio::spawn(async move {
        while let Some(message) = frames.recv().await {
            let last = matches!(message, Message::Close(_));
            if sink.send(message).await.is_err() || last {
                break;
            }
        }
    });
    let mut job: Option<String> = None;
    let mut follower: Option<tokio::task::JoinHandle<()>> = None;
    let init_deadline = tokio::time::sleep(INIT_TIMEOUT);
    tokio::pin!(init_deadline);
    loop {
        let message = tokio::select! {
            message = incoming.next() => message,
            () = &mut init_deadline, if job.is_none() => {
                let _ = outbox.send(close(4001, "Initialization Timeout")).await;
                break;
            }
            () = outbox.closed() => break,
        };
        let text = match message {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
            Some(Ok(Message::Text(text))) => text.to_string(),
            Some(Ok(Message::Binary(bytes))) => String::from_utf8_lossy(&bytes).into_owned(),
            Some(Ok(_)) => continue,
        };
        let outcome = handle_message(&state, &caller, &id, &text, &mut job, &outbox).await;
        match outcome {
            Ok(Some(id)) => {
                follower = Some(tokio::spawn(follow(state.clone(), id, outbox.clone())));
            }
            Ok(None) => {}
            Err(close_message) => {
                let _ = outbox.send(close_message).await;
                break;
            }
        }
    }
    if let Some(follower) = follower {
        follower.abort();
    }
    drop(outbox);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

/// Acts on one client message; `id` is the job an `init` submits.
/// `Ok(Some(id))`: the job was started;
/// `Err(close)`: the socket closes with that frame.
async fn handle_message(
    state: &ApiState,
    caller: &Caller,
    id: &str,
    text: &str,
    job: &mut Option<String>,
    outbox: &mpsc::Sender<Message>,
) -> Result<Option<String>, Message> {
    let notify = async |message: String| {
        let _ = outbox
            .send(frame(json!({"type": "error", "message": message})))
            .await;
        close(4002, "Notified Error")
    };
    let message: Map<String, Value> = match serde_json::from_str(text) {
        Ok(message) => message,
        Err(error) => return Err(notify(error.to_string()).await),
    };
    match message.get("type").and_then(Value::as_str) {
        Some("init") => {
            if job.is_some() {
                return Err(close(4000, "Already Initialized"));
            }
            let catalog = state.offered_catalog().await;
            let (mut spec, language) = match piston_job(&message, &catalog, state, true) {
                Ok(job) => job,
                Err(error) => return Err(notify(error).await),
            };
            // Initial stdin is delivered first, then what `data` sends.
            let initial = std::mem::take(&mut spec.stdin);
            let submitted = match submit(state, caller, id.to_string(), &spec, &catalog).await {
                Ok(submitted) => submitted,
                Err(error) => return Err(notify(error.to_string()).await),
            };
            *job = Some(submitted.id.clone());
            let (name, _) = piston_name(&language);
            let _ = outbox
                .send(frame(json!({
                    "type": "runtime",
                    "language": name,
                    "version": semver3(&language.version),
                })))
                .await;
            if !initial.is_empty() {
                send_control(state, &submitted.id, Control::Stdin(initial.into_bytes())).await?;
            }
            Ok(Some(submitted.id))
        }
        Some("data") => {
            let Some(id) = job.as_deref() else {
                return Err(close(4003, "Not yet initialized"));
            };
            if message.get("stream").and_then(Value::as_str) != Some("stdin") {
                return Err(close(4004, "Can only write to stdin"));
            }
            let data = message.get("data").and_then(Value::as_str).unwrap_or("");
            send_control(state, id, Control::Stdin(data.as_bytes().to_vec())).await?;
            Ok(None)
        }
        Some("signal") => {
            let Some(id) = job.as_deref() else {
                return Err(close(4003, "Not yet initialized"));
            };
            let signal = message.get("signal").and_then(Value::as_str).unwrap_or("");
            if !SIGNALS.contains(&signal) {
                return Err(close(4005, "Invalid signal"));
            }
            let kind = if signal == "SIGINT" {
                SignalKind::Interrupt
            } else {
                SignalKind::Kill
            };
            send_control(state, id, Control::Signal(kind)).await?;
            Ok(None)
        }
        // Piston ignores other types.
        _ => Ok(None),
    }
}

/// Passes stdin or a signal to the job; a job that has ended takes nothing
/// more (its `exit` is on its way).
async fn send_control(state: &ApiState, id: &str, control: Control) -> Result<(), Message> {
    let budgets = state.input_budgets();
    match state
        .inner
        .store
        .jobs()
        .send_input(id, &control, budgets)
        .await
    {
        Ok(InputOutcome::Sent { .. } | InputOutcome::Ended(_)) => Ok(()),
        Ok(InputOutcome::OverBudget { stdin_bytes }) => {
            Err(over_budget(stdin_bytes, budgets.stdin_bytes))
        }
        Ok(
            refused @ (InputOutcome::TooManySignals { .. }
            | InputOutcome::TooManyMessages { .. }
            | InputOutcome::KeyStorage { .. }),
        ) => {
            tracing::debug!(job.id = %id, ?refused, "A Piston session's input was refused.");
            Err(close(4002, "Notified Error"))
        }
        Ok(InputOutcome::Missing) => Err(close(4002, "Notified Error")),
        Err(error) => {
            tracing::warn!(job.id = %id, error = %error, "Cannot pass Piston stdin on.");
            Err(close(1011, "the job store is unavailable"))
        }
    }
}

fn over_budget(used: u64, max: u64) -> Message {
    tracing::debug!(used, max, "A Piston session went over its stdin budget.");
    close(4002, "Notified Error")
}

/// Turns the job's events into Piston's messages until it ends.
async fn follow(state: ApiState, id: String, outbox: mpsc::Sender<Message>) {
    let mut follower = state.feeds.subscribe(&id, 0);
    loop {
        let events = match follower.next().await {
            Step::Events(events) => events,
            Step::Ended => break,
            Step::Gone | Step::Shutdown | Step::Failed(_) => {
                let _ = outbox
                    .send(frame(json!({"type": "error", "message": "the job could not be followed to its end"})))
                    .await;
                let _ = outbox.send(close(4002, "Notified Error")).await;
                return;
            }
        };
        for stored in events {
            let Ok(event) = stored.event() else { continue };
            let message = match event {
                JobEvent::Stage {
                    stage,
                    state: StageState::Start,
                    ..
                } => json!({"type": "stage", "stage": stage}),
                JobEvent::Stage {
                    stage,
                    state: StageState::End,
                    exit_code,
                    signal,
                    ..
                } => json!({"type": "exit", "stage": stage, "code": exit_code, "signal": signal}),
                JobEvent::Stdout { data, encoding } => {
                    json!({"type": "data", "stream": "stdout", "data": decoded(data, encoding)})
                }
                JobEvent::Stderr { data, encoding } => {
                    json!({"type": "data", "stream": "stderr", "data": decoded(data, encoding)})
                }
                JobEvent::Exit { status, result, .. } => {
                    if status == Status::Error {
                        let message = result.error.unwrap_or_else(|| "the platform failed".into());
                        let _ = outbox
                            .send(frame(json!({"type": "error", "message": message})))
                            .await;
                        let _ = outbox.send(close(4002, "Notified Error")).await;
                        return;
                    }
                    continue;
                }
                // An interactive job is never run again, so never has an
                // `attempt` event.
                JobEvent::Status { .. } | JobEvent::Error { .. } | JobEvent::Attempt { .. } => {
                    continue;
                }
            };
            if outbox.send(frame(message)).await.is_err() {
                return;
            }
        }
    }
    let _ = outbox.send(close(4999, "Job Completed")).await;
}

fn decoded(data: String, encoding: Encoding) -> String {
    match encoding {
        Encoding::Utf8 => data,
        Encoding::Base64 => STANDARD.decode(&data).map_or(data, |bytes| text(&bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_selectors_match_like_piston() {
        assert!(version_matches("*", "3.11.0"));
        assert!(version_matches("3", "3.11.0"));
        assert!(version_matches("3.x", "3.11.0"));
        assert!(version_matches("3.11", "3.11.0"));
        assert!(version_matches("3.11.0", "3.11.0"));
        assert!(!version_matches("3.10.0", "3.11.0"));
        assert!(!version_matches("2", "3.11.0"));
        assert!(version_matches("^3.8.0", "3.11.0"));
        assert!(!version_matches("^4.0.0", "3.11.0"));
        assert!(version_matches("~3.11.0", "3.11.0"));
        assert!(!version_matches("~3.10.0", "3.11.0"));
        assert!(version_matches(">=3.0.0", "3.11.0"));
    }

    #[test]
    fn a_nameless_java_file_is_named_after_its_public_class() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let java = catalog.find("java").unwrap();
        assert_eq!(
            default_entry_name(java, "import x;\npublic class Hello {\n}"),
            "Hello.java"
        );
        assert_eq!(default_entry_name(java, "class Hidden {}"), "Main.java");
        let python = catalog.find("python").unwrap();
        assert_eq!(default_entry_name(python, "public class X"), "main.py");
    }

    fn stage(reason: Reason, exit_code: Option<i32>, signal: Option<&str>) -> StageResult {
        StageResult {
            stdout: crate::job::Output(b"out".to_vec()),
            stderr: crate::job::Output(b"e".to_vec()),
            truncated: false,
            exit_code,
            signal: signal.map(String::from),
            reason,
            wall_ms: 5,
            cpu_ms: 3,
            memory_peak_bytes: 1024,
        }
    }

    #[test]
    fn stages_map_to_isolate_statuses() {
        let ok = piston_stage(&stage(Reason::Exited, Some(0), None), None);
        assert_eq!(
            (ok.code, ok.status, ok.output.as_str()),
            (Some(0), None, "oute")
        );
        let re = piston_stage(&stage(Reason::Exited, Some(3), None), None);
        assert_eq!(re.status, Some("RE"));
        assert_eq!(re.message.as_deref(), Some("Exited with error status 3"));
        let sg = piston_stage(&stage(Reason::Exited, None, Some("SIGSEGV")), None);
        assert_eq!(
            (sg.code, sg.signal.as_deref(), sg.status),
            (None, Some("SIGSEGV"), Some("SG"))
        );
        assert_eq!(sg.message.as_deref(), Some("Caught fatal signal 11"));
        let to = piston_stage(&stage(Reason::WallTimeout, None, Some("SIGKILL")), None);
        assert_eq!(
            (to.status, to.signal.as_deref()),
            (Some("TO"), Some("SIGKILL"))
        );
        let ol = piston_stage(&stage(Reason::OutputLimit, None, None), None);
        assert_eq!(ol.status, Some("OL"));
        assert_eq!((ol.cpu_time, ol.wall_time, ol.memory), (3, 5, 1024));
    }
}
