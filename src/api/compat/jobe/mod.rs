//! Jobe's REST API (trampgeek/jobe, the server Moodle's CodeRunner
//! question type talks to), under the Jobe prefix (default
//! `/jobe/index.php/restapi`, the path CodeRunner builds):
//!
//! - `GET languages` — `[[id, version], …]`: Jobe's ids (`c`, `cpp`,
//!   `python3`, `java`, `nodejs`, `php`, `pascal`, `octave`) of the
//!   languages on offer here.
//! - `POST runs` — `{"run_spec": {…}}`, run as an ordinary job and waited
//!   for; Jobe's result object (`run_id`, `outcome`, `cmpinfo`, `stdout`,
//!   `stderr`). Refusals are bare JSON strings in Jobe's words (400; 404
//!   when a `file_list` id is not here).
//! - `PUT files/{id}` (`{"file_contents": base64}` → 204) and `HEAD
//!   files/{id}` (204 or 404): files by id, in the file store.
//!
//! Where Jobe answers "overload" (21) because its users are busy, this
//! server queues the run and answers when it ends; 21 is the answer only
//! when the job is refused for load (the queue or the key's limits) or does
//! not end within the request's wait.
//!
//! Keys: `X-API-KEY` (or `Authorization`) carrying a code-runner key is
//! served as that key; any other request as `CODE_RUNNER_JOBE_KEY`'s key
//! when it is set (Jobe without keys), else refused with Jobe's 403.
//!
//! `request.rs` turns the run_spec into a job, `answer.rs` the result into
//! Jobe's, `files.rs` is `files/{id}`.

mod answer;
mod files;
mod request;

use axum::Json;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde_json::Value;

use super::{Refusal, new_job_id, presented_key, submit, within_rate};
use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::refusals::count_refusal;
use crate::api::v1::submit::wait_for_end;
use answer::{ResultObject, jobe_result, outcome};
use request::{JOBE_LANGUAGES, jobe_run};

/// Jobe's answer when a run names a file id that is not here.
pub const FILES_MISSING: &str = "One or more of the specified files is missing/unavailable";

pub(super) fn router() -> Router<ApiState> {
    Router::new()
        .route("/languages", get(languages))
        .route("/languages/", get(languages))
        .route("/runs", post(runs))
        .route("/runs/", post(runs))
        .route("/files/{id}", put(files::put).head(files::head))
}

/// An answer in Jobe's shape: the message as a JSON string.
fn jobe_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(Value::String(message.into()))).into_response()
}

/// The caller of a Jobe request, within its key's rate; or Jobe's 403
/// (`Missing API key`, `Unknown API key`) or 429, in Jobe's plain text.
pub(super) fn jobe_caller(state: &ApiState, parts: &Parts) -> Result<Caller, Refusal> {
    let presented = presented_key(parts, Some("x-api-key")).filter(|key| !key.is_empty());
    let keys = state.keys();
    let caller = presented
        .as_deref()
        .and_then(|key| keys.check(key))
        .or_else(|| {
            state
                .compat
                .jobe_key
                .as_deref()
                .and_then(|name| keys.caller(name))
        });
    let Some(caller) = caller else {
        let said = if presented.is_some() {
            "Unknown API key"
        } else {
            "Missing API key"
        };
        return Err((StatusCode::FORBIDDEN, said).into_response().into());
    };
    within_rate(state, parts, caller).map_err(|error| {
        let mut response = (
            StatusCode::TOO_MANY_REQUESTS,
            "Max RUN rate for this server exceeded",
        )
            .into_response();
        if let Some(seconds) = error.retry_after() {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response.into()
    })
}

/// `GET languages`: no key needed, like `/v1/languages`.
async fn languages(State(state): State<ApiState>) -> Response {
    let catalog = state.offered_catalog().await;
    let list: Vec<[&str; 2]> = JOBE_LANGUAGES
        .iter()
        .filter_map(|(jobe, ours)| {
            catalog
                .find(ours)
                .map(|language| [*jobe, language.version.as_str()])
        })
        .collect();
    Json(list).into_response()
}

/// `POST runs`.
async fn runs(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let caller = match jobe_caller(&state, &parts) {
        Ok(caller) => caller,
        Err(refusal) => {
            count_refusal(&state, "unauthorized");
            return refusal.into_response();
        }
    };
    let limit = state.inner.max_body_bytes;
    let Ok(body) = axum::body::to_bytes(body, limit).await else {
        count_refusal(&state, "too_large");
        return jobe_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request is larger than this server's limit of {limit} bytes"),
        );
    };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let catalog = state.offered_catalog().await;
    let max_cputime = state.compat.jobe_max_cputime_secs;
    let run = match jobe_run(&body, &catalog, &state.inner.policy, max_cputime) {
        Ok(run) => run,
        Err(message) => {
            count_refusal(&state, "invalid");
            return jobe_error(StatusCode::BAD_REQUEST, message);
        }
    };
    if run.overload_test {
        return Json(ResultObject::bare(
            None,
            outcome::SERVER_OVERLOAD,
            String::new(),
        ))
        .into_response();
    }
    let mut spec = run.spec;
    for (index, (id, _)) in run.file_list.iter().enumerate() {
        match files::stored(&state, &caller, id).await {
            // The source is the job's first file, then the file_list's.
            Ok(Some(digest)) => spec.files[index + 1].reference = Some(digest),
            Ok(None) => return jobe_error(StatusCode::NOT_FOUND, FILES_MISSING),
            Err(error) => return jobe_error(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
        }
    }
    let submitted = match submit(&state, &caller, new_job_id(), &spec, &catalog).await {
        Ok(submitted) => submitted,
        Err(ApiError::InvalidJob(invalid)) => {
            return jobe_error(StatusCode::BAD_REQUEST, invalid.to_string());
        }
        Err(
            error @ (ApiError::QueueFull { .. }
            | ApiError::KeyLimit { .. }
            | ApiError::UserActiveLimit { .. }
            | ApiError::UserRateLimit { .. }
            | ApiError::KeyStorage { .. }
            | ApiError::ShuttingDown),
        ) => {
            return Json(ResultObject::bare(
                None,
                outcome::SERVER_OVERLOAD,
                error.to_string(),
            ))
            .into_response();
        }
        Err(error) => return jobe_error(error.status(), error.to_string()),
    };
    let id = submitted.id;
    // Jobe's clients wait for the run whatever queues before it (a quiz's
    // burst): the whole of CODE_RUNNER_MAX_WAIT_MS, not the job's own limits
    // plus a margin as `?wait=true` does.
    let budget = state.inner.max_wait;
    let record = match wait_for_end(&state, &id, budget).await {
        Ok(record) => record,
        Err(error) => {
            return jobe_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Server exception ({error})"),
            );
        }
    };
    let answer = match record.and_then(|r| r.result.filter(|_| r.status.is_terminal())) {
        Some(result) => jobe_result(&id, &run.jobe_id, &result),
        None => ResultObject::bare(
            Some(id.clone()),
            outcome::SERVER_OVERLOAD,
            format!(
                "run {id} did not end within {} s (GET /v1/jobs/{id} follows it)",
                budget.as_secs()
            ),
        ),
    };
    Json(answer).into_response()
}
