//! The one error type of the API and how it becomes an HTTP response:
//! `{"error": {"code", "message", "field"?, "status"?}}` with the status code
//! that says whose fault it was. A client's mistake is never a 500; a Redis
//! failure is a 503.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::job::{InvalidJob, Status};
use crate::store::{Quota, StoreError};

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not a job: bad JSON, a wrong type, an unknown field.
    #[error("{message}")]
    MalformedBody { message: String },
    /// The body is a job the server will not run.
    #[error("{0}")]
    InvalidJob(InvalidJob),
    /// A header or query parameter is wrong.
    #[error("{field}: {message}")]
    InvalidRequest {
        field: &'static str,
        message: String,
    },
    #[error("{0}")]
    Unauthorized(&'static str),
    /// Authenticated, but not for this (reserved for attach tokens).
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("{0}")]
    NotFound(&'static str),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("job already finished with status {}", status.as_str())]
    AlreadyFinished { status: Status },
    #[error("idempotency key was used with another request body")]
    IdempotencyConflict,
    #[error("the job of this idempotency key has expired; use a new key")]
    IdempotencyExpired,
    #[error("request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the queue is full ({depth} jobs waiting); retry later")]
    QueueFull { depth: u64 },
    #[error("this api key already has {active} queued or running jobs, its limit")]
    KeyLimit { active: u64 },
    #[error(
        "this user already has {active} queued or running jobs, the key's max_active_per_user of {limit}; retry when one of them ends"
    )]
    UserActiveLimit { active: u64, limit: u64 },
    #[error(
        "this user submitted {limit} jobs in the last minute, the key's user_rate_per_minute of {limit}; retry after {wait_secs} s"
    )]
    UserRateLimit { limit: u64, wait_secs: u64 },
    #[error(
        "this api key's jobs hold {held} bytes in the job store and this job may need {needed} more, over the key's budget of {budget} bytes (CODE_RUNNER_KEY_MAX_STORED_MB); space comes back as finished jobs expire (CODE_RUNNER_RESULT_TTL_SECS) or as running ones end"
    )]
    KeyStorage { held: u64, needed: u64, budget: u64 },
    /// A daily quota of the key entry is used up until `resets_ms` (the
    /// next UTC midnight).
    #[error("{}", quota_message(*.quota, .user, *.limit, *.used, *.resets_ms))]
    QuotaExceeded {
        quota: Quota,
        /// The submission's user (`""`: the key's anonymous user).
        user: String,
        limit: u64,
        /// CPU ms used today for a CPU quota, jobs submitted today for
        /// the jobs quota.
        used: u64,
        resets_ms: u64,
        /// Seconds until `resets_ms` (at least 1), as of the refusal.
        retry_after_secs: u64,
    },
    #[error("{scope} has {open} open streams, the most allowed ({setting}); close one first")]
    TooManyStreams {
        scope: &'static str,
        open: usize,
        setting: &'static str,
    },
    #[error(
        "this api key sends more than {rate} requests per second (CODE_RUNNER_KEY_RATE); retry after {wait_secs} s"
    )]
    RateLimited { rate: u64, wait_secs: u64 },
    #[error("the capacity schedule holds {entries} current entries, its limit; delete one first")]
    ScheduleFull { entries: usize },
    /// The process is shutting down: it still answers reads while its worker
    /// drains, but takes no new jobs.
    #[error("this server is shutting down; submit to another one or retry later")]
    ShuttingDown,
    /// Redis failed; the detail is logged, not sent.
    #[error("the job store is unavailable; retry later")]
    Unavailable(#[source] StoreError),
}

/// What a quota refusal says: the quota (its option in the key entry),
/// whose it is, what is used today and when it resets.
fn quota_message(quota: Quota, user: &str, limit: u64, used: u64, resets_ms: u64) -> String {
    let whose = match (quota, user) {
        (Quota::KeyCpuSeconds, _) => "this api key's".to_string(),
        (_, "") => "the key's anonymous user's".to_string(),
        (_, user) => format!("user {user:?}'s"),
    };
    let option = quota.option();
    // Always a UTC midnight.
    let resets = format!("{}T00:00:00Z", crate::store::Day::from_ms(resets_ms));
    match quota {
        Quota::KeyCpuSeconds | Quota::UserCpuSeconds => format!(
            "{whose} quota of {limit} cpu seconds per day ({option}) is used up: {}.{:03} s used today (UTC); it resets at {resets}",
            used / 1000,
            used % 1000
        ),
        Quota::UserJobs => format!(
            "{whose} quota of {limit} jobs per day ({option}) is used up: {used} jobs submitted today (UTC); it resets at {resets}"
        ),
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::Unavailable(error)
    }
}

impl From<InvalidJob> for ApiError {
    fn from(error: InvalidJob) -> Self {
        ApiError::InvalidJob(error)
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MalformedBody { .. }
            | ApiError::InvalidJob(_)
            | ApiError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::AlreadyFinished { .. }
            | ApiError::IdempotencyConflict
            | ApiError::IdempotencyExpired
            | ApiError::ScheduleFull { .. } => StatusCode::CONFLICT,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::QueueFull { .. }
            | ApiError::KeyLimit { .. }
            | ApiError::UserActiveLimit { .. }
            | ApiError::UserRateLimit { .. }
            | ApiError::KeyStorage { .. }
            | ApiError::QuotaExceeded { .. }
            | ApiError::TooManyStreams { .. }
            | ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The machine-readable `error.code`.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::MalformedBody { .. } => "invalid_json",
            ApiError::InvalidJob(_) => "invalid_job",
            ApiError::InvalidRequest { .. } => "invalid_request",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::AlreadyFinished { .. } => "already_finished",
            ApiError::IdempotencyConflict => "idempotency_conflict",
            ApiError::IdempotencyExpired => "idempotency_expired",
            ApiError::TooLarge { .. } => "too_large",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::KeyLimit { .. } => "key_limit",
            ApiError::UserActiveLimit { .. } => "user_active_limit",
            ApiError::UserRateLimit { .. } => "user_rate_limit",
            ApiError::KeyStorage { .. } => "key_storage",
            ApiError::QuotaExceeded { .. } => "quota_exceeded",
            ApiError::TooManyStreams { .. } => "too_many_streams",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::ScheduleFull { .. } => "schedule_full",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::ShuttingDown => "shutting_down",
        }
    }

    /// The `reason` label of `code_runner_submissions_rejected_total` when
    /// this error refuses a submission; `None` for failures of our own.
    pub fn rejection_reason(&self) -> Option<&'static str> {
        match self {
            ApiError::Unauthorized(_) | ApiError::Forbidden(_) => Some("unauthorized"),
            ApiError::MalformedBody { .. } => Some("malformed"),
            ApiError::InvalidJob(_) | ApiError::InvalidRequest { .. } => Some("invalid"),
            ApiError::TooLarge { .. } => Some("too_large"),
            ApiError::QueueFull { .. } => Some("queue_full"),
            ApiError::KeyLimit { .. } => Some("key_limit"),
            ApiError::UserActiveLimit { .. } => Some("user_active_limit"),
            ApiError::UserRateLimit { .. } => Some("user_rate_limit"),
            ApiError::KeyStorage { .. } => Some("key_storage"),
            ApiError::QuotaExceeded { .. } => Some("quota_exceeded"),
            ApiError::RateLimited { .. } => Some("rate_limited"),
            ApiError::IdempotencyConflict | ApiError::IdempotencyExpired => Some("conflict"),
            ApiError::NotFound(_)
            | ApiError::MethodNotAllowed
            | ApiError::ScheduleFull { .. }
            | ApiError::TooManyStreams { .. }
            | ApiError::AlreadyFinished { .. }
            | ApiError::Unavailable(_)
            | ApiError::ShuttingDown => None,
        }
    }

    /// Seconds a client should wait before retrying, for the answers that
    /// carry `Retry-After`.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::QueueFull { .. } => Some(2),
            ApiError::KeyLimit { .. } => Some(1),
            ApiError::UserActiveLimit { .. } => Some(1),
            ApiError::UserRateLimit { wait_secs, .. } => Some((*wait_secs).max(1)),
            ApiError::KeyStorage { .. } => Some(30),
            ApiError::QuotaExceeded {
                retry_after_secs, ..
            } => Some((*retry_after_secs).max(1)),
            ApiError::TooManyStreams { .. } => Some(5),
            ApiError::RateLimited { wait_secs, .. } => Some((*wait_secs).max(1)),
            ApiError::Unavailable(_) | ApiError::ShuttingDown => Some(1),
            _ => None,
        }
    }

    fn body(&self) -> ErrorBody {
        let (field, message) = match self {
            ApiError::InvalidJob(invalid) => (Some(invalid.field.clone()), invalid.message.clone()),
            ApiError::InvalidRequest { field, message } => {
                (Some((*field).to_string()), message.clone())
            }
            other => (None, other.to_string()),
        };
        ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message,
                field,
                status: match self {
                    ApiError::AlreadyFinished { status } => Some(*status),
                    _ => None,
                },
            },
        }
    }
}

/// The JSON of an error answer.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail {
    pub code: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For `already_finished`: the status the job ended with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            ApiError::Unavailable(error) => {
                tracing::warn!(error = %error, "Redis failed; answering 503");
            }
            other => tracing::debug!(
                status = status.as_u16(),
                code = other.code(),
                message = %other,
                "request refused"
            ),
        }
        let mut response = (status, Json(self.body())).into_response();
        let headers = response.headers_mut();
        if let Some(seconds) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if matches!(self, ApiError::Unauthorized(_)) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_of(error: ApiError) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
        let body = serde_json::to_value(error.body()).unwrap();
        let response = error.into_response();
        (response.status(), response.headers().clone(), body)
    }

    #[test]
    fn every_error_maps_to_its_status_and_code() {
        let cases: Vec<(ApiError, u16, &str)> = vec![
            (
                ApiError::MalformedBody {
                    message: "x".into(),
                },
                400,
                "invalid_json",
            ),
            (
                ApiError::InvalidJob(InvalidJob::new("language", "unknown")),
                400,
                "invalid_job",
            ),
            (
                ApiError::InvalidRequest {
                    field: "wait",
                    message: "x".into(),
                },
                400,
                "invalid_request",
            ),
            (ApiError::Unauthorized("missing"), 401, "unauthorized"),
            (ApiError::Forbidden("other job"), 403, "forbidden"),
            (ApiError::NotFound("job not found"), 404, "not_found"),
            (ApiError::MethodNotAllowed, 405, "method_not_allowed"),
            (
                ApiError::AlreadyFinished {
                    status: Status::Succeeded,
                },
                409,
                "already_finished",
            ),
            (ApiError::IdempotencyConflict, 409, "idempotency_conflict"),
            (ApiError::IdempotencyExpired, 409, "idempotency_expired"),
            (ApiError::TooLarge { limit: 10 }, 413, "too_large"),
            (ApiError::QueueFull { depth: 3 }, 429, "queue_full"),
            (ApiError::KeyLimit { active: 2 }, 429, "key_limit"),
            (
                ApiError::UserActiveLimit {
                    active: 2,
                    limit: 2,
                },
                429,
                "user_active_limit",
            ),
            (
                ApiError::UserRateLimit {
                    limit: 5,
                    wait_secs: 3,
                },
                429,
                "user_rate_limit",
            ),
            (
                ApiError::KeyStorage {
                    held: 1,
                    needed: 2,
                    budget: 2,
                },
                429,
                "key_storage",
            ),
            (
                ApiError::QuotaExceeded {
                    quota: Quota::UserJobs,
                    user: "ann".into(),
                    limit: 3,
                    used: 3,
                    resets_ms: 86_400_000,
                    retry_after_secs: 60,
                },
                429,
                "quota_exceeded",
            ),
            (
                ApiError::TooManyStreams {
                    scope: "this job",
                    open: 1,
                    setting: "X",
                },
                429,
                "too_many_streams",
            ),
            (
                ApiError::RateLimited {
                    rate: 1,
                    wait_secs: 1,
                },
                429,
                "rate_limited",
            ),
            (
                ApiError::Unavailable(StoreError::Corrupt {
                    id: "j".into(),
                    message: "m".into(),
                }),
                503,
                "unavailable",
            ),
        ];
        for (error, status, code) in cases {
            let (got_status, _, body) = json_of(error);
            assert_eq!(got_status.as_u16(), status, "{code}");
            assert_eq!(body["error"]["code"], code);
            let message = body["error"]["message"].as_str().unwrap();
            assert!(!message.ends_with('.'), "{message:?} ends with a period");
            assert_eq!(
                message.chars().next().map(char::is_uppercase),
                Some(false),
                "{message:?} starts with a capital"
            );
        }
    }

    #[test]
    fn invalid_job_names_the_field() {
        let (_, _, body) = json_of(ApiError::InvalidJob(InvalidJob::new(
            "files[0].name",
            "\"../x\" contains \"..\"",
        )));
        assert_eq!(
            body,
            serde_json::json!({"error": {
                "code": "invalid_job",
                "field": "files[0].name",
                "message": "\"../x\" contains \"..\"",
            }})
        );
    }

    #[test]
    fn retry_after_and_www_authenticate_are_set() {
        let (_, headers, _) = json_of(ApiError::QueueFull { depth: 3 });
        assert_eq!(headers[header::RETRY_AFTER], "2");
        let (_, headers, _) = json_of(ApiError::KeyLimit { active: 2 });
        assert_eq!(headers[header::RETRY_AFTER], "1");
        let (_, headers, _) = json_of(ApiError::Unauthorized("missing"));
        assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
        assert!(!headers.contains_key(header::RETRY_AFTER));
    }

    #[test]
    fn a_quota_refusal_says_which_quota_what_is_used_and_when_it_resets() {
        let refusal = |quota, user: &str, used| ApiError::QuotaExceeded {
            quota,
            user: user.into(),
            limit: 60,
            used,
            resets_ms: 1_796_169_600_000,
            retry_after_secs: 50_700,
        };
        let (_, headers, body) = json_of(refusal(Quota::UserCpuSeconds, "ann", 61_234));
        assert_eq!(headers[header::RETRY_AFTER], "50700");
        assert_eq!(
            body["error"]["message"],
            "user \"ann\"'s quota of 60 cpu seconds per day (user_cpu_seconds_per_day) is used up: 61.234 s used today (UTC); it resets at 2026-12-02T00:00:00Z"
        );
        assert_eq!(
            refusal(Quota::KeyCpuSeconds, "ann", 60_000).to_string(),
            "this api key's quota of 60 cpu seconds per day (cpu_seconds_per_day) is used up: 60.000 s used today (UTC); it resets at 2026-12-02T00:00:00Z"
        );
        assert_eq!(
            refusal(Quota::UserJobs, "", 60).to_string(),
            "the key's anonymous user's quota of 60 jobs per day (user_jobs_per_day) is used up: 60 jobs submitted today (UTC); it resets at 2026-12-02T00:00:00Z"
        );
    }

    #[test]
    fn already_finished_carries_the_status() {
        let (_, _, body) = json_of(ApiError::AlreadyFinished {
            status: Status::TimedOut,
        });
        assert_eq!(body["error"]["status"], "timed_out");
        assert_eq!(
            body["error"]["message"],
            "job already finished with status timed_out"
        );
    }

    #[test]
    fn only_submission_refusals_have_a_reason() {
        assert_eq!(
            ApiError::QueueFull { depth: 1 }.rejection_reason(),
            Some("queue_full")
        );
        assert_eq!(ApiError::NotFound("x").rejection_reason(), None);
        assert_eq!(
            ApiError::Unavailable(StoreError::Corrupt {
                id: "j".into(),
                message: "m".into()
            })
            .rejection_reason(),
            None
        );
    }
}
