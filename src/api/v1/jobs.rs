//! The job endpoints: submit (`POST /v1/jobs`, optionally waiting), status
//! (`GET /v1/jobs/{id}`) and cancel (`DELETE /v1/jobs/{id}`), and the job
//! view they answer with.
//!
//! A job belongs to the API key that submitted it: any other key gets 404,
//! exactly as for a job that never existed, so ids cannot be probed.
//!
//! A submit is `prepare`, then the one submit path ([`super::submit`]); the
//! body is hashed only when an `Idempotency-Key` comes with it (to tell a
//! retry from a conflict). `?wait=true` waits on the job's events, through
//! this process's follower, until its `exit` event, for at most the job's
//! own budget capped by `max_wait`.
//! Timestamps are RFC 3339 in UTC with milliseconds
//! (`2026-05-01T09:00:00.123Z`).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::submit::{Admitted, Submission, refuse_while_draining, wait_for_end};
use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::refusals::count_rejection;
use crate::api::http::tokens::AttachTokens;
use crate::job::{JobResult, JobSpec, Status, prepare};
use crate::languages::LanguageCatalog;
use crate::store::{CancelOutcome, JobRecord};

/// Longest `Idempotency-Key` accepted.
const MAX_IDEMPOTENCY_KEY_CHARS: usize = 200;

/// Where a job and its streams are.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct JobUrls {
    #[serde(rename = "self")]
    this: String,
    ws: String,
    events: String,
}

impl JobUrls {
    fn new(id: &str) -> Self {
        Self {
            this: format!("/v1/jobs/{id}"),
            ws: format!("/v1/jobs/{id}/ws"),
            events: format!("/v1/jobs/{id}/events"),
        }
    }
}

/// A job as the API shows it. Every field is always present (`null` when
/// unknown yet); `result` is set once the job is terminal.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct JobView {
    id: String,
    status: Status,
    language: String,
    /// Who the job is for; `null`: the key's anonymous user.
    user: Option<String>,
    attempts: u32,
    max_attempts: u32,
    worker: Option<String>,
    created_at: String,
    started_at: Option<String>,
    finished_at: Option<String>,
    metadata: serde_json::Map<String, serde_json::Value>,
    result: Option<JobResult>,
    /// A running job whose cancellation its worker has not acted on yet.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    cancel_requested: bool,
    /// A queued job's place in the queue (`GET /v1/jobs/{id}` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<crate::follow::places::Place>,
    urls: JobUrls,
    /// The attach tokens, in answers to a submit: `token` is the control
    /// token (the only one answers carried at first).
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<AttachTokens>,
}

impl JobView {
    fn new(record: JobRecord) -> Self {
        let terminal = record.status.is_terminal();
        Self {
            urls: JobUrls::new(&record.id),
            id: record.id,
            status: record.status,
            language: record.language,
            user: record.user,
            attempts: record.attempts,
            max_attempts: record.max_attempts,
            worker: record.worker,
            created_at: rfc3339(record.created_ms),
            started_at: record.started_ms.map(rfc3339),
            finished_at: record.finished_ms.map(rfc3339),
            metadata: record.metadata,
            result: if terminal { record.result } else { None },
            cancel_requested: false,
            queue: None,
            token: None,
            tokens: None,
        }
    }

    fn with_tokens(mut self, tokens: AttachTokens) -> Self {
        self.token = Some(tokens.control.clone());
        self.tokens = Some(tokens);
        self
    }
}

/// The answer to an accepted submit.
#[derive(Debug, Serialize)]
struct Accepted {
    id: String,
    status: Status,
    /// The control token (also in `tokens`).
    token: String,
    tokens: AttachTokens,
    urls: JobUrls,
    /// Who the job is for; `null`: the key's anonymous user.
    user: Option<String>,
}

/// Milliseconds since the epoch as RFC 3339 UTC with milliseconds.
pub(crate) fn rfc3339(ms: u64) -> String {
    let seconds = ms / 1000;
    let (days, of_day) = (seconds / 86_400, seconds % 86_400);
    // Days to a civil date (H. Hinnant, "chrono-compatible low-level date
    // algorithms"), for the proleptic Gregorian calendar.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        ms % 1000
    )
}

/// A job id from a path: a UUID, in its canonical form. Anything else is a
/// job that does not exist.
pub(crate) fn job_id(text: &str) -> Result<String, ApiError> {
    uuid::Uuid::parse_str(text)
        .map(|id| id.hyphenated().to_string())
        .map_err(|_| ApiError::NotFound("job not found"))
}

/// The `Idempotency-Key` header: at most one, 1–200 printable ASCII
/// characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let invalid = |message: &str| ApiError::InvalidRequest {
        field: "Idempotency-Key",
        message: message.to_string(),
    };
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid("give the header at most once"));
    }
    let bytes = value.as_bytes();
    if bytes.is_empty()
        || bytes.len() > MAX_IDEMPOTENCY_KEY_CHARS
        || !bytes.iter().all(|b| (0x20..=0x7e).contains(b))
    {
        return Err(invalid(&format!(
            "must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII characters"
        )));
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

#[derive(Debug, Deserialize)]
struct SubmitQuery {
    wait: Option<String>,
}

/// `?wait=true|false|1|0`; other query parameters are ignored.
fn wait_requested(uri: &Uri) -> Result<bool, ApiError> {
    let query = Query::<SubmitQuery>::try_from_uri(uri).map_err(|e| ApiError::InvalidRequest {
        field: "query",
        message: e.body_text().to_lowercase(),
    })?;
    match query.0.wait.as_deref() {
        None | Some("false" | "0") => Ok(false),
        Some("true" | "1" | "") => Ok(true),
        Some(other) => Err(ApiError::InvalidRequest {
            field: "wait",
            message: format!("{other:?} is not true or false"),
        }),
    }
}

/// The body as a job; every way it can fail is a 400 that says where.
fn parse_spec(body: &[u8]) -> Result<JobSpec, ApiError> {
    Json::<JobSpec>::from_bytes(body)
        .map(|Json(spec)| spec)
        .map_err(|rejection| {
            let detail = |error: &dyn std::error::Error| {
                error
                    .source()
                    .map_or_else(|| error.to_string(), |s| s.to_string())
            };
            let message = match &rejection {
                JsonRejection::JsonDataError(e) => {
                    format!("the body is not a valid job: {}", detail(e))
                }
                JsonRejection::JsonSyntaxError(e) => {
                    format!("the body is not valid json: {}", detail(e))
                }
                other => other.body_text().to_lowercase(),
            };
            ApiError::MalformedBody { message }
        })
}

/// The job of `id` if it exists and belongs to `caller`.
pub(crate) async fn owned_job(
    state: &ApiState,
    caller: &Caller,
    id: &str,
) -> Result<JobRecord, ApiError> {
    match state.inner.store.jobs().get(id).await? {
        Some(record) if record.api_key == caller.name => Ok(record),
        _ => Err(ApiError::NotFound("job not found")),
    }
}

/// `POST /v1/jobs`. Counts every refusal by reason.
pub(crate) async fn submit(State(state): State<ApiState>, request: Request) -> Response {
    match submit_job(&state, request).await {
        Ok(response) => response,
        Err(error) => {
            count_rejection(&state, &error);
            error.into_response()
        }
    }
}

/// Checks in order: the key (before any of the body is read), the headers,
/// the body's size, its JSON, the job, then admission in one atomic step.
async fn submit_job(state: &ApiState, request: Request) -> Result<Response, ApiError> {
    let config = &state.inner;
    let (parts, body) = request.into_parts();
    let caller = config.keys.authenticate(&parts)?;
    refuse_while_draining(state)?;
    let idempotency = idempotency_key(&parts.headers)?;
    let wait = wait_requested(&parts.uri)?;
    let body = read_body(state, Request::from_parts(parts, body)).await?;
    let spec = parse_spec(&body)?;
    let prepared = prepare(&spec, &config.catalog, &config.policy)?;
    let by_reference = super::files::check_references(state, &caller, &spec, &prepared).await?;

    // The body's hash is only needed to tell a retry from a conflict.
    let body_hash = idempotency
        .as_ref()
        .map(|_| hex::encode(Sha256::digest(&body)));
    let admitted = super::submit::submit(
        state,
        Submission {
            caller: &caller,
            id: uuid::Uuid::new_v4().to_string(),
            spec: &spec,
            prepared,
            idempotency: idempotency.as_deref().zip(body_hash.as_deref()),
            // A job whose files are stored is prepared again by the worker,
            // once it has read their bytes.
            carry: !by_reference,
            via: None,
        },
    )
    .await?;
    answer_submit(state, admitted, wait, spec.user.clone()).await
}

/// The request's body, within the configured size (413 above it).
async fn read_body(state: &ApiState, request: Request) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, &())
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge {
                    limit: state.inner.max_body_bytes,
                }
            } else {
                ApiError::MalformedBody {
                    message: format!("cannot read the request body: {rejection}").to_lowercase(),
                }
            }
        })
}

/// The answer to a submit the store took: 202 with where the job is; with
/// `?wait=true`, the job once it ended (200) or as it is when the wait
/// ran out (202); an idempotent replay answers with the job as it is (200).
async fn answer_submit(
    state: &ApiState,
    admitted: Admitted,
    wait: bool,
    user: Option<String>,
) -> Result<Response, ApiError> {
    let Admitted {
        id,
        existing,
        wait_budget,
    } = admitted;
    let tokens = state.inner.tokens.sign_both(&id);
    if existing {
        let record = if wait {
            wait_for_end(state, &id, wait_budget).await?
        } else {
            state.inner.store.jobs().get(&id).await?
        };
        let record = record.ok_or(ApiError::IdempotencyExpired)?;
        let view = JobView::new(record).with_tokens(tokens);
        return Ok((StatusCode::OK, Json(view)).into_response());
    }
    if wait {
        match wait_for_end(state, &id, wait_budget).await {
            Ok(Some(record)) => {
                let code = if record.status.is_terminal() {
                    StatusCode::OK
                } else {
                    StatusCode::ACCEPTED
                };
                return Ok((code, Json(JobView::new(record).with_tokens(tokens))).into_response());
            }
            // The job is in; say so even if it cannot be read now,
            // so the client polls instead of submitting it again.
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(job.id = %id, error = %error, "cannot follow an accepted job; answering 202");
            }
        }
    }
    let location = format!("/v1/jobs/{id}");
    let accepted = Accepted {
        urls: JobUrls::new(&id),
        id,
        status: Status::Queued,
        token: tokens.control.clone(),
        tokens,
        user,
    };
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(accepted),
    )
        .into_response())
}

/// `GET /v1/jobs/{id}`.
pub(crate) async fn show(
    State(state): State<ApiState>,
    caller: Caller,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<JobView>, ApiError> {
    let Path(id) = id.map_err(|_| ApiError::NotFound("job not found"))?;
    let id = job_id(&id)?;
    let record = owned_job(&state, &caller, &id).await?;
    let status = record.status;
    let mut view = JobView::new(record);
    match status {
        Status::Running => {
            view.cancel_requested = state.inner.store.jobs().cancel_requested(&id).await?;
        }
        Status::Queued => view.queue = state.places.place_of(&id).await?,
        _ => {}
    }
    Ok(Json(view))
}

/// The result stored for a job cancelled before it started.
fn cancelled_result(catalog: &LanguageCatalog, language: &str) -> JobResult {
    let language = catalog.find(language);
    JobResult::without_stages(
        Status::Cancelled,
        language.map_or_else(String::new, |l| l.id.clone()),
        language.map_or_else(String::new, |l| l.version.clone()),
    )
}

/// `DELETE /v1/jobs/{id}`: a queued job never starts (200, `cancelled`); a
/// running one is killed by its worker (202, `cancel_requested`).
pub(crate) async fn cancel(
    State(state): State<ApiState>,
    caller: Caller,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id.map_err(|_| ApiError::NotFound("job not found"))?;
    let id = job_id(&id)?;
    let record = owned_job(&state, &caller, &id).await?;
    let store = &state.inner.store;
    let cancelled = cancelled_result(&state.inner.catalog, &record.language);
    match store.jobs().cancel(&id, &cancelled).await? {
        CancelOutcome::Cancelled => {
            tracing::info!(job.id = %id, api_key = %caller.name, "queued job cancelled");
            let record = store
                .jobs()
                .get(&id)
                .await?
                .ok_or(ApiError::NotFound("job not found"))?;
            Ok((StatusCode::OK, Json(JobView::new(record))).into_response())
        }
        CancelOutcome::Requested => {
            tracing::info!(job.id = %id, api_key = %caller.name, "cancellation of a running job requested");
            let record = store
                .jobs()
                .get(&id)
                .await?
                .ok_or(ApiError::NotFound("job not found"))?;
            let mut view = JobView::new(record);
            view.cancel_requested = !view.status.is_terminal();
            Ok((StatusCode::ACCEPTED, Json(view)).into_response())
        }
        CancelOutcome::AlreadyFinished(status) => Err(ApiError::AlreadyFinished { status }),
        CancelOutcome::NotFound => Err(ApiError::NotFound("job not found")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }

    #[test]
    fn job_ids_are_canonical_uuids() {
        let id = "0b7c6a38-6a0e-4d2b-9f8e-2f5c3d1e4a77";
        assert_eq!(job_id(id).unwrap(), id);
        assert_eq!(job_id(&id.to_uppercase()).unwrap(), id);
        for bad in ["", "x", "../../etc", "0b7c6a38"] {
            assert!(matches!(job_id(bad), Err(ApiError::NotFound(_))));
        }
    }

    #[test]
    fn idempotency_keys_are_checked() {
        let headers = |values: &[&str]| {
            let mut map = HeaderMap::new();
            for value in values {
                map.append("idempotency-key", value.parse().unwrap());
            }
            map
        };
        assert_eq!(idempotency_key(&headers(&[])).unwrap(), None);
        assert_eq!(
            idempotency_key(&headers(&["order 42/a"])).unwrap(),
            Some("order 42/a".into())
        );
        let long = "k".repeat(201);
        for bad in [&["a", "b"][..], &[""], &[long.as_str()]] {
            assert!(matches!(
                idempotency_key(&headers(bad)),
                Err(ApiError::InvalidRequest {
                    field: "Idempotency-Key",
                    ..
                })
            ));
        }
        let mut map = HeaderMap::new();
        map.insert(
            "idempotency-key",
            axum::http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        assert!(idempotency_key(&map).is_err());
    }

    #[test]
    fn wait_parameter() {
        let wait = |uri: &str| wait_requested(&uri.parse().unwrap());
        assert!(!wait("/v1/jobs").unwrap());
        assert!(wait("/v1/jobs?wait=true").unwrap());
        assert!(wait("/v1/jobs?x=1&wait=1").unwrap());
        assert!(!wait("/v1/jobs?wait=false").unwrap());
        assert!(matches!(
            wait("/v1/jobs?wait=soon"),
            Err(ApiError::InvalidRequest { field: "wait", .. })
        ));
    }

    #[test]
    fn json_errors_say_what_is_wrong() {
        let message = |body: &str| match parse_spec(body.as_bytes()) {
            Err(ApiError::MalformedBody { message }) => message,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message("{"),
            "the body is not valid json: EOF while parsing an object at line 1 column 1"
        );
        let unknown = message(r#"{"language":"python","files":[],"colour":1}"#);
        assert!(
            unknown.starts_with("the body is not a valid job: colour: unknown field `colour`"),
            "{unknown}"
        );
        let nested =
            message(r#"{"language":"python","files":[{"name":"a","content":"","mode":1}]}"#);
        assert!(
            nested.starts_with("the body is not a valid job: files[0].mode: unknown field `mode`"),
            "{nested}"
        );
        let wrong_type = message(r#"{"language":5,"files":[]}"#);
        assert!(
            wrong_type
                .starts_with("the body is not a valid job: language: invalid type: integer `5`"),
            "{wrong_type}"
        );
        assert!(parse_spec(br#"{"language":"python","files":[]}"#).is_ok());
    }

    #[test]
    fn views_hide_results_of_unfinished_jobs() {
        let record = JobRecord {
            id: "j".into(),
            status: Status::Running,
            language: "python".into(),
            api_key: "alice".into(),
            user: Some("student-7".into()),
            attempts: 1,
            max_attempts: 1,
            worker: Some("w1".into()),
            created_ms: 1_000,
            started_ms: Some(2_000),
            finished_ms: None,
            deadline_ms: None,
            metadata: Default::default(),
            result: Some(cancelled_result(
                &LanguageCatalog::embedded().unwrap(),
                "python",
            )),
            spec: None,
        };
        let view = serde_json::to_value(JobView::new(record)).unwrap();
        assert_eq!(view["result"], serde_json::Value::Null);
        assert_eq!(view["started_at"], "1970-01-01T00:00:02.000Z");
        assert_eq!(view["finished_at"], serde_json::Value::Null);
        assert_eq!(view["urls"]["self"], "/v1/jobs/j");
        assert!(view.get("token").is_none());
        assert!(view.get("cancel_requested").is_none());
        assert!(view.get("api_key").is_none());
    }
}
