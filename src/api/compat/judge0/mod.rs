//! Judge0 CE 1.13.1 (judge0/judge0 `config/routes.rb`,
//! `app/controllers/*`), under the Judge0 prefix (default `/judge0`):
//!
//! - `POST /submissions` (`?wait=true`, `?base64_encoded=true`, `?fields=`),
//!   `GET /submissions/{token}`, `POST /submissions/batch`,
//!   `GET /submissions/batch?tokens=…`;
//!   `DELETE /submissions/{token}` (authorized: `X-Auth-User`);
//! - `GET /languages`, `GET /languages/all`, `GET /languages/{id}`,
//!   `GET /statuses`, `GET /about`, `GET /config_info`;
//! - `POST /authenticate`, `POST /authorize`, `GET /system_info`,
//!   `GET /workers`, `GET /statistics` ([`info`]).
//!
//! The key is `X-Auth-Token` (the header, or the query parameter of that
//! name; or `Authorization: Bearer`), as Judge0's `AUTHN_HEADER`; without a valid one every route answers 401 with an empty
//! body, as Judge0 does. A submission is an ordinary job whose id is its
//! token; what Judge0 shows beside the job (language id, expected output,
//! limits as asked) is kept in `compat:<id>`. Errors are Judge0's:
//! `{"error": "…"}`, or `{"<field>": ["…"]}` with 422 for a submission
//! Judge0 would not save.

mod info;
mod languages;
mod request;
mod view;

use axum::Json;
use axum::body::Bytes;
use std::collections::HashMap;

use axum::Router;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value, json};

use super::{CallerRefusal, Refusal, compat_caller, new_job_id, submit};
use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::refusals::count_refusal;
use crate::api::v1::jobs::{job_id, owned_job};
use crate::api::v1::submit::{Admitted, wait_for_end};
use crate::store::job::delete::DeleteOutcome;
use languages::{judge0_name, language_for, offered};
use request::{FieldErrors, Judge0Record, submission_job};
use view::{STATUSES, requested_fields, submission_view};

/// Most submissions in one batch (Judge0's default).
const MAX_BATCH: usize = 20;
/// The Judge0 CE version whose API this is (the judge0 SDK maps its
/// language aliases by it).
const JUDGE0_VERSION: &str = "1.13.1";
const NOT_UTF8: &str = "some attributes for this submission cannot be converted to UTF-8, use base64_encoded=true query parameter";

pub(super) fn router() -> Router<ApiState> {
    Router::new()
        .route("/submissions", post(create))
        .route("/submissions/batch", post(batch_create).get(batch_show))
        .route("/submissions/{token}", get(show).delete(delete))
        .route("/languages", get(list_languages))
        .route("/languages/all", get(info::languages_all))
        .route("/languages/{id}", get(show_language))
        .route("/statuses", get(statuses))
        .route("/about", get(about))
        .route("/config_info", get(config_info))
        .route("/system_info", get(info::system_info))
        .route("/workers", get(info::workers))
        .route("/statistics", get(info::statistics))
        .route("/authenticate", post(info::authenticate))
        .route("/authorize", post(info::authorize))
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// One of our refusals as Judge0 words them (`{"error"}`), with our status
/// code and `Retry-After`.
pub(super) fn from_api_error(api_error: ApiError) -> Response {
    if let ApiError::InvalidJob(invalid) = &api_error {
        return invalid_job(invalid);
    }
    let retry_after = api_error.retry_after();
    let mut response = error(api_error.status(), api_error.to_string());
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, seconds.into());
    }
    response
}

/// A job `prepare` refused, as a Judge0 validation error on the Judge0
/// field it came from.
fn invalid_job(invalid: &crate::job::InvalidJob) -> Response {
    let field = match invalid.field.as_str() {
        "limits.cpu_ms" => "cpu_time_limit",
        "limits.wall_ms" => "wall_time_limit",
        "limits.memory_mb" => "memory_limit",
        "limits.pids" => "max_processes_and_or_threads",
        "limits.disk_mb" => "max_file_size",
        "stdin" => "stdin",
        "language" => "language_id",
        "user" => "X-Code-Runner-User",
        field if field.starts_with("args") => "command_line_arguments",
        _ => "source_code",
    };
    let errors = FieldErrors::from([(field.to_string(), vec![invalid.message.clone()])]);
    (StatusCode::UNPROCESSABLE_ENTITY, Json(errors)).into_response()
}

/// The caller of a read (or of `/authenticate`) within its key's rate, or
/// Judge0's 401 (no body) or 429.
pub(super) fn caller(state: &ApiState, parts: &Parts) -> Result<Caller, Refusal> {
    judge0_caller(state, parts, false)
}

/// The same for a submission (`POST /submissions`, `/submissions/batch`),
/// whose refusal is counted in `submissions_rejected_total`.
fn submitter(state: &ApiState, parts: &Parts) -> Result<Caller, Refusal> {
    judge0_caller(state, parts, true)
}

fn judge0_caller(state: &ApiState, parts: &Parts, submission: bool) -> Result<Caller, Refusal> {
    compat_caller(state, parts, Some("x-auth-token"), false, submission).map_err(|refusal| {
        Refusal::from(match refusal {
            CallerRefusal::NoKey => StatusCode::UNAUTHORIZED.into_response(),
            CallerRefusal::Rate(error) => from_api_error(error),
        })
    })
}

/// The query parameters Judge0 reads.
struct Params {
    wait: bool,
    base64: bool,
    fields: Vec<&'static str>,
    tokens: Option<String>,
}

fn params(parts: &Parts) -> Result<Params, Refusal> {
    let mut query = Query::<HashMap<String, String>>::try_from_uri(&parts.uri)
        .map(|Query(query)| query)
        .map_err(|e| Refusal::from(error(StatusCode::BAD_REQUEST, e.body_text().to_lowercase())))?;
    let fields = requested_fields(query.get("fields").map(String::as_str)).map_err(|invalid| {
        Refusal::from(error(
            StatusCode::BAD_REQUEST,
            format!("invalid fields: [{}]", invalid.join(", ")),
        ))
    })?;
    let tokens = query.remove("tokens").or_else(|| {
        parts
            .headers
            .get("tokens")
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    });
    Ok(Params {
        wait: query.get("wait").is_some_and(|v| v == "true"),
        base64: query.get("base64_encoded").is_some_and(|v| v == "true"),
        fields,
        tokens,
    })
}

/// The request body as a JSON object, or Judge0's 400.
async fn body_object(
    state: &ApiState,
    parts: Parts,
    body: axum::body::Body,
) -> Result<Map<String, Value>, Response> {
    let bytes = Bytes::from_request(Request::from_parts(parts, body), &())
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                from_api_error(ApiError::TooLarge {
                    limit: state.inner.max_body_bytes,
                })
            } else {
                error(
                    StatusCode::BAD_REQUEST,
                    rejection.body_text().to_lowercase(),
                )
            }
        })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body is not a JSON object: {e}"),
        )
    })
}

/// Validates and submits one submission: its token, or what Judge0 answers
/// instead.
async fn submit_one(
    state: &ApiState,
    caller: &Caller,
    body: &Map<String, Value>,
    base64: bool,
    catalog: &crate::languages::LanguageCatalog,
) -> Result<(Admitted, Judge0Record), Response> {
    let (spec, record) =
        submission_job(body, base64, catalog, &state.inner.policy).map_err(|errors| {
            count_refusal(state, "invalid");
            (StatusCode::UNPROCESSABLE_ENTITY, Json(errors)).into_response()
        })?;
    let id = new_job_id();
    let json = serde_json::to_string(&record).unwrap_or_default();
    state
        .inner
        .store
        .compat()
        .put(&id, &json)
        .await
        .map_err(|e| from_api_error(ApiError::Unavailable(e)))?;
    let submitted = submit(state, caller, id, &spec, catalog)
        .await
        .map_err(from_api_error)?;
    Ok((submitted, record))
}

/// `POST /submissions`.
async fn create(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let caller = match submitter(&state, &parts) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    let params = match params(&parts) {
        Ok(params) => params,
        Err(refusal) => return refusal.into_response(),
    };
    let body = match body_object(&state, parts, body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let catalog = state.offered_catalog().await;
    let (submitted, record) =
        match submit_one(&state, &caller, &body, params.base64, &catalog).await {
            Ok(done) => done,
            Err(response) => return response,
        };
    if !params.wait {
        return (StatusCode::CREATED, Json(json!({"token": submitted.id}))).into_response();
    }
    let budget = submitted.wait_budget;
    let job = match wait_for_end(&state, &submitted.id, budget).await {
        Ok(Some(job)) => job,
        Ok(None) => return error(StatusCode::NOT_FOUND, "submission not found"),
        Err(e) => return from_api_error(ApiError::Unavailable(e)),
    };
    let job = match with_spec(&state, job, &params.fields).await {
        Ok(job) => job,
        Err(e) => return from_api_error(ApiError::Unavailable(e)),
    };
    match submission_view(&job, &record, &catalog, &params.fields, params.base64) {
        Ok(view) => (StatusCode::CREATED, Json(view)).into_response(),
        Err(()) => (
            StatusCode::CREATED,
            Json(json!({"error": NOT_UTF8, "token": submitted.id})),
        )
            .into_response(),
    }
}

/// `job` with its spec read too when `fields` show the source or the stdin
/// (a job record is read without its spec, which can be large).
async fn with_spec(
    state: &ApiState,
    mut job: crate::store::JobRecord,
    fields: &[&str],
) -> Result<crate::store::JobRecord, crate::store::StoreError> {
    if job.spec.is_none()
        && fields
            .iter()
            .any(|f| matches!(*f, "*" | "source_code" | "stdin"))
    {
        job.spec = state.inner.store.jobs().spec(&job.id).await?;
    }
    Ok(job)
}

/// A submission of `caller` with its record, if it is one; `fields` say
/// what of it will be shown.
async fn find(
    state: &ApiState,
    caller: &Caller,
    token: &str,
    fields: &[&str],
) -> Result<Option<(crate::store::JobRecord, Judge0Record)>, ApiError> {
    let Ok(id) = job_id(token) else {
        return Ok(None);
    };
    let job = match owned_job(state, caller, &id).await {
        Ok(job) => job,
        Err(ApiError::NotFound(_)) => return Ok(None),
        Err(other) => return Err(other),
    };
    let job = with_spec(state, job, fields).await?;
    let records = state.inner.store.compat().get_many(&[id]).await?;
    let record = records
        .into_iter()
        .next()
        .flatten()
        .and_then(|json| serde_json::from_str::<Judge0Record>(&json).ok());
    Ok(record.map(|record| (job, record)))
}

/// The caller's submission `token` with the query's parameters, or what
/// Judge0 answers instead: 401, 403 when `authorize` and `X-Auth-User` is
/// no admin key, 400 for bad parameters, 404.
async fn one_submission(
    state: &ApiState,
    parts: &Parts,
    token: &str,
    authorize: bool,
) -> Result<(Params, crate::store::JobRecord, Judge0Record), Response> {
    let caller = caller(state, parts).map_err(IntoResponse::into_response)?;
    if authorize && !info::authorized(state, parts) {
        return Err(StatusCode::FORBIDDEN.into_response());
    }
    let params = params(parts).map_err(IntoResponse::into_response)?;
    match find(state, &caller, token, &params.fields).await {
        Ok(Some((job, record))) => Ok((params, job, record)),
        Ok(None) => Err(error(StatusCode::NOT_FOUND, "submission not found")),
        Err(e) => Err(from_api_error(e)),
    }
}

/// `GET /submissions/{token}`.
async fn show(State(state): State<ApiState>, token: Path<String>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let (params, job, record) = match one_submission(&state, &parts, &token, false).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let catalog = &state.inner.catalog;
    match submission_view(&job, &record, catalog, &params.fields, params.base64) {
        Ok(view) => Json(view).into_response(),
        Err(()) => error(StatusCode::BAD_REQUEST, NOT_UTF8),
    }
}

/// `DELETE /submissions/{token}`, as Judge0 deletes: authorized
/// (`X-Auth-User`, an admin key; 403 with no body otherwise), only once the
/// submission has ended (400 with Judge0's message while it is queued or
/// running), answered with what it was (`fields`, always base64, as
/// Judge0 forces). The submission must be the caller's (`X-Auth-Token`).
async fn delete(State(state): State<ApiState>, token: Path<String>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let (params, job, record) = match one_submission(&state, &parts, &token, true).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let still = |status: crate::job::Status| {
        let (id, name) = if status == crate::job::Status::Running {
            STATUSES[1]
        } else {
            STATUSES[0]
        };
        error(
            StatusCode::BAD_REQUEST,
            format!("submission cannot be deleted because its status is {id} ({name})"),
        )
    };
    if !job.status.is_terminal() {
        return still(job.status);
    }
    let view = submission_view(&job, &record, &state.inner.catalog, &params.fields, true)
        .unwrap_or(Value::Null);
    let deleted = state
        .inner
        .store
        .jobs()
        .delete(&job.id, &job.api_key, job.user.as_deref())
        .await;
    match deleted {
        Ok(DeleteOutcome::Deleted) => Json(view).into_response(),
        Ok(DeleteOutcome::Active(status)) => still(status),
        Ok(DeleteOutcome::NotFound) => error(StatusCode::NOT_FOUND, "submission not found"),
        Err(e) => from_api_error(ApiError::Unavailable(e)),
    }
}

/// `POST /submissions/batch`: each submission is created on its own; the
/// answer lists a token or the errors of each, in order.
async fn batch_create(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let caller = match submitter(&state, &parts) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    let params = match params(&parts) {
        Ok(params) => params,
        Err(refusal) => return refusal.into_response(),
    };
    let body = match body_object(&state, parts, body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let submissions = body
        .get("submissions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(response) = batch_size_error(submissions.len()) {
        return response;
    }
    let catalog = state.offered_catalog().await;
    let mut answers = Vec::with_capacity(submissions.len());
    let mut created = false;
    for submission in &submissions {
        let Some(object) = submission.as_object() else {
            answers.push(
                json!({"source_code": ["can't be blank"], "language_id": ["can't be blank"]}),
            );
            continue;
        };
        match submit_one(&state, &caller, object, params.base64, &catalog).await {
            Ok((submitted, _)) => {
                created = true;
                answers.push(json!({"token": submitted.id}));
            }
            Err(response) => {
                // A refusal of the whole server (queue full, key limit,
                // shutting down) before anything was created ends the batch.
                let status = response.status();
                if !created && (status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error())
                {
                    return response;
                }
                let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                    .unwrap_or(Value::Null);
                answers.push(body);
            }
        }
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    (status, Json(answers)).into_response()
}

fn batch_size_error(count: usize) -> Option<Response> {
    if count > MAX_BATCH {
        return Some(error(
            StatusCode::BAD_REQUEST,
            format!("number of submissions in a batch should be less than or equal to {MAX_BATCH}"),
        ));
    }
    (count == 0).then(|| {
        error(
            StatusCode::BAD_REQUEST,
            "there should be at least one submission in a batch",
        )
    })
}

/// `GET /submissions/batch?tokens=a,b`: each submission, or `null`.
async fn batch_show(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let caller = match caller(&state, &parts) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    let params = match params(&parts) {
        Ok(params) => params,
        Err(refusal) => return refusal.into_response(),
    };
    let tokens: Vec<String> = params
        .tokens
        .as_deref()
        .unwrap_or("")
        .trim()
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
        .collect();
    if let Some(response) = batch_size_error(tokens.len()) {
        return response;
    }
    let catalog = &state.inner.catalog;
    let mut submissions = Vec::with_capacity(tokens.len());
    for token in &tokens {
        let found = match find(&state, &caller, token, &params.fields).await {
            Ok(found) => found,
            Err(e) => return from_api_error(e),
        };
        let Some((job, record)) = found else {
            submissions.push(Value::Null);
            continue;
        };
        match submission_view(&job, &record, catalog, &params.fields, params.base64) {
            Ok(view) => submissions.push(view),
            Err(()) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "some attributes for one or more submissions cannot be converted to UTF-8, use base64_encoded=true query parameter",
                );
            }
        }
    }
    Json(json!({ "submissions": submissions })).into_response()
}

/// `GET /languages`: `[{id, name}]` of the languages on offer.
async fn list_languages(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refusal) = caller(&state, &parts) {
        return refusal.into_response();
    }
    let catalog = state.offered_catalog().await;
    let list: Vec<Value> = offered(&catalog)
        .into_iter()
        .map(|(id, language)| json!({"id": id, "name": judge0_name(language)}))
        .collect();
    Json(list).into_response()
}

/// `GET /languages/{id}`.
async fn show_language(
    State(state): State<ApiState>,
    id: Path<String>,
    request: Request,
) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refusal) = caller(&state, &parts) {
        return refusal.into_response();
    }
    let catalog = state.offered_catalog().await;
    let found = id
        .parse::<u32>()
        .ok()
        .and_then(|number| language_for(number, &catalog).map(|l| (number, l)));
    let Some((number, language)) = found else {
        return error(
            StatusCode::NOT_FOUND,
            format!("language with id {} doesn't exist", id.as_str()),
        );
    };
    Json(json!({
        "id": number,
        "name": judge0_name(language),
        "is_archived": false,
        "source_file": language.source_file,
        "compile_cmd": language.compile.as_ref().map(|argv| argv.join(" ")),
        "run_cmd": language.run.join(" "),
    }))
    .into_response()
}

/// `GET /statuses`.
async fn statuses(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refusal) = caller(&state, &parts) {
        return refusal.into_response();
    }
    let list: Vec<Value> = STATUSES
        .iter()
        .map(|(id, description)| json!({"id": id, "description": description}))
        .collect();
    Json(list).into_response()
}

/// `GET /about`: the Judge0 version whose API this is.
async fn about(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refusal) = caller(&state, &parts) {
        return refusal.into_response();
    }
    Json(json!({
        "version": JUDGE0_VERSION,
        "homepage": null,
        "source_code": null,
        "maintainer": format!(
            "code-runner {} (a Judge0 CE {JUDGE0_VERSION} compatible API)",
            env!("CARGO_PKG_VERSION")
        ),
    }))
    .into_response()
}

/// `GET /config_info`: Judge0's configuration keys with this server's
/// values (seconds and KB, as Judge0 counts).
async fn config_info(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refusal) = caller(&state, &parts) {
        return refusal.into_response();
    }
    let policy = &state.inner.policy;
    let (defaults, max) = (policy.defaults, policy.maximum);
    let seconds = |ms: u64| ms as f64 / 1000.0;
    Json(json!({
        "maintenance_mode": false,
        "enable_wait_result": true,
        "enable_compiler_options": false,
        "allowed_languages_for_compile_options": [],
        "enable_command_line_arguments": true,
        "enable_submission_delete": true,
        "enable_callbacks": false,
        "callbacks_max_tries": 0,
        "callbacks_timeout": 0.0,
        "enable_additional_files": false,
        "max_queue_size": state.inner.max_queue_depth,
        "cpu_time_limit": seconds(defaults.cpu_ms),
        "max_cpu_time_limit": seconds(max.cpu_ms),
        "cpu_extra_time": 0.0,
        "max_cpu_extra_time": 5.0,
        "wall_time_limit": seconds(defaults.wall_ms),
        "max_wall_time_limit": seconds(max.wall_ms),
        "memory_limit": defaults.memory_mb * 1024,
        "max_memory_limit": max.memory_mb * 1024,
        "stack_limit": 0,
        "max_stack_limit": max.memory_mb * 1024,
        "max_processes_and_or_threads": defaults.pids,
        "max_max_processes_and_or_threads": max.pids,
        "enable_per_process_and_thread_time_limit": false,
        "allow_enable_per_process_and_thread_time_limit": false,
        "enable_per_process_and_thread_memory_limit": false,
        "allow_enable_per_process_and_thread_memory_limit": false,
        "max_file_size": defaults.disk_mb * 1024,
        "max_max_file_size": max.disk_mb * 1024,
        "number_of_runs": 1,
        "max_number_of_runs": 1,
        "redirect_stderr_to_stdout": false,
        "max_extract_size": 0,
        "enable_batched_submissions": true,
        "max_submission_batch_size": MAX_BATCH,
        "submission_cache_duration": 0.0,
        "use_docs_as_homepage": false,
        "allow_enable_network": false,
        "enable_network": false,
    }))
    .into_response()
}
