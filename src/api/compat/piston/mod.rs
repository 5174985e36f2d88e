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
//!
//! `request.rs` turns Piston's request into a job, `answer.rs` our result
//! into Piston's answer, `connect.rs` is the `/connect` WebSocket; the
//! routes are here.

mod answer;
mod connect;
mod request;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::{CallerRefusal, Refusal, compat_caller, new_job_id, semver3, submit};
use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::refusals::count_refusal;
use crate::api::v1::submit::wait_for_end;
use crate::languages::Language;
use answer::piston_answer;
use request::piston_job;

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
        .route("/connect", get(connect::connect))
        .route(
            "/packages",
            get(packages).post(change_packages).delete(change_packages),
        )
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

/// The caller of a Piston request within its key's rate, or the 401 or 429
/// answer in Piston's shape; a refused `submission` (`/execute`,
/// `/connect`) is counted.
fn piston_caller(state: &ApiState, parts: &Parts, submission: bool) -> Result<Caller, Refusal> {
    compat_caller(state, parts, None, true, submission).map_err(|refusal| {
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

/// `GET /packages`: the languages on offer as Piston's packages, every one
/// installed (`[{language, language_version, installed}]`). No key, like
/// `/runtimes`.
async fn packages(State(state): State<ApiState>) -> Response {
    let catalog = state.offered_catalog().await;
    let packages: Vec<Value> = catalog
        .all()
        .iter()
        .map(|language| {
            json!({
                "language": piston_name(language).0,
                "language_version": semver3(&language.version),
                "installed": true,
            })
        })
        .collect();
    Json(packages).into_response()
}

/// What `POST` and `DELETE /packages` answer: languages are installed by
/// the operator here (runner images, `scripts/build-images`), never
/// through the API.
pub const PACKAGES_BY_OPERATOR: &str = "packages are installed by the operator on this server: languages and their libraries come from runner-images/languages.toml and scripts/build-images, not from the API; GET /api/v2/packages lists what is installed";

/// `POST /packages` and `DELETE /packages`: 501, in Piston's shape. The
/// caller's key is checked first (an unknown caller learns nothing more);
/// Piston's own check of the content type comes before everything, as in
/// Piston.
async fn change_packages(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let json_body = parts
        .headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_body {
        return piston_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "requests must be of type application/json",
        );
    }
    if let Err(refusal) = piston_caller(&state, &parts, false) {
        return refusal.into_response();
    }
    piston_error(StatusCode::NOT_IMPLEMENTED, PACKAGES_BY_OPERATOR)
}

/// `POST /execute`.
async fn execute(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let caller = match piston_caller(&state, &parts, true) {
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
            count_refusal(state, "invalid");
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
    let budget = submitted.wait_budget;
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
