//! The one error type of the API and how it becomes an HTTP response:
//! `{"error": {"code", "message", "field"?, "status"?}}` with the status code
//! that says whose fault it was. A client's mistake is never a 500; a Redis
//! failure is a 503.
//!
//! A 429 or 503 also names its `reason` and its `retry_after_secs` (and
//! sends `Retry-After`), a 429 the limit it hit ([`LimitDetail`]: setting,
//! value, what counted); refusals are logged once per window per reason
//! with their count ([`RefusalLog`]), so a burst of thousands is a few
//! lines.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

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
    #[error(
        "the queue is full ({depth} jobs waiting, CODE_RUNNER_MAX_QUEUE_DEPTH is {limit}); retry later"
    )]
    QueueFull { depth: u64, limit: u64 },
    #[error("this api key already has {active} queued or running jobs, its limit of {limit} ({})", key_limit_source(*.from_entry))]
    KeyLimit {
        active: u64,
        limit: u64,
        /// The limit is the key entry's `max_active` (else the server's
        /// `CODE_RUNNER_KEY_MAX_ACTIVE`).
        from_entry: bool,
    },
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
    #[error(
        "this api key's jobs and files hold {held} bytes and this file has {needed}, over the key's budget of {budget} bytes (CODE_RUNNER_KEY_MAX_STORED_MB); delete files (DELETE /v1/files/{{sha256}}), or wait for unused ones to expire (CODE_RUNNER_FILE_KEEP_SECS) and finished jobs too"
    )]
    FileStorage { held: u64, needed: u64, budget: u64 },
    #[error(
        "the file has more than {limit} bytes, the most a file may have (CODE_RUNNER_FILE_MAX_MB)"
    )]
    FileTooLarge { limit: u64 },
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
    #[error(
        "{scope} has {open} open streams, the most allowed ({setting} is {limit}); close one first"
    )]
    TooManyStreams {
        scope: &'static str,
        open: usize,
        limit: usize,
        setting: &'static str,
    },
    #[error(
        "this api key sent its burst of {burst} requests (CODE_RUNNER_KEY_BURST) and more than {rate} per second since (CODE_RUNNER_KEY_RATE); retry after {wait_secs} s"
    )]
    RateLimited {
        rate: u64,
        burst: u64,
        wait_secs: u64,
    },
    #[error("the capacity schedule holds {entries} current entries, its limit; delete one first")]
    ScheduleFull { entries: usize },
    /// The process is shutting down: it still answers reads while its worker
    /// drains, but takes no new jobs.
    #[error("this server is shutting down; submit to another one or retry later")]
    ShuttingDown,
    /// Redis failed; the detail is logged, not sent.
    #[error("the job store is unavailable; retry later")]
    Unavailable(#[source] StoreError),
    /// The file store's object storage failed (`CODE_RUNNER_FILE_BACKEND=s3`);
    /// the detail is logged, not sent.
    #[error("the file store's object storage is unavailable; retry later")]
    FilesUnavailable(#[source] StoreError),
}

/// Where a key's `max_active` comes from: its entry, else the server.
fn key_limit_setting(from_entry: bool) -> &'static str {
    if from_entry {
        "max_active"
    } else {
        "CODE_RUNNER_KEY_MAX_ACTIVE"
    }
}

/// The same, as a refusal's message says it.
fn key_limit_source(from_entry: bool) -> String {
    let setting = key_limit_setting(from_entry);
    if from_entry {
        format!("the key entry's {setting}")
    } else {
        setting.to_string()
    }
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
        match error {
            StoreError::Objects(_) => ApiError::FilesUnavailable(error),
            _ => ApiError::Unavailable(error),
        }
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
            ApiError::TooLarge { .. } | ApiError::FileTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::QueueFull { .. }
            | ApiError::KeyLimit { .. }
            | ApiError::UserActiveLimit { .. }
            | ApiError::UserRateLimit { .. }
            | ApiError::KeyStorage { .. }
            | ApiError::FileStorage { .. }
            | ApiError::QuotaExceeded { .. }
            | ApiError::TooManyStreams { .. }
            | ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::FilesUnavailable(_) | ApiError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
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
            ApiError::TooLarge { .. } | ApiError::FileTooLarge { .. } => "too_large",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::KeyLimit { .. } => "key_limit",
            ApiError::UserActiveLimit { .. } => "user_active_limit",
            ApiError::UserRateLimit { .. } => "user_rate_limit",
            ApiError::KeyStorage { .. } | ApiError::FileStorage { .. } => "key_storage",
            ApiError::QuotaExceeded { .. } => "quota_exceeded",
            ApiError::TooManyStreams { .. } => "too_many_streams",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::ScheduleFull { .. } => "schedule_full",
            ApiError::Unavailable(_) | ApiError::FilesUnavailable(_) => "unavailable",
            ApiError::ShuttingDown => "shutting_down",
        }
    }

    /// The `reason` label of `code_runner_submissions_rejected_total` when
    /// this error refuses a submission (also the `reason` of every 429 and
    /// 503 body); `None` for answers that are not refusals.
    pub fn rejection_reason(&self) -> Option<&'static str> {
        match self {
            ApiError::Unauthorized(_) | ApiError::Forbidden(_) => Some("unauthorized"),
            ApiError::MalformedBody { .. } => Some("malformed"),
            ApiError::InvalidJob(_) | ApiError::InvalidRequest { .. } => Some("invalid"),
            ApiError::TooLarge { .. } | ApiError::FileTooLarge { .. } => Some("too_large"),
            ApiError::QueueFull { .. } => Some("queue_full"),
            ApiError::KeyLimit { .. } => Some("key_limit"),
            ApiError::UserActiveLimit { .. } => Some("user_active_limit"),
            ApiError::UserRateLimit { .. } => Some("user_rate_limit"),
            ApiError::KeyStorage { .. } | ApiError::FileStorage { .. } => Some("key_storage"),
            ApiError::QuotaExceeded { .. } => Some("quota_exceeded"),
            ApiError::RateLimited { .. } => Some("rate_limited"),
            ApiError::TooManyStreams { .. } => Some("too_many_streams"),
            ApiError::IdempotencyConflict | ApiError::IdempotencyExpired => Some("conflict"),
            ApiError::ShuttingDown => Some("shutting_down"),
            ApiError::Unavailable(_) => Some("store_unavailable"),
            ApiError::FilesUnavailable(_) => Some("files_unavailable"),
            ApiError::NotFound(_)
            | ApiError::MethodNotAllowed
            | ApiError::ScheduleFull { .. }
            | ApiError::AlreadyFinished { .. } => None,
        }
    }

    /// The `reason` of a 429 or 503 body.
    fn refusal_reason(&self) -> Option<&'static str> {
        let status = self.status();
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            self.rejection_reason()
        } else {
            None
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
            ApiError::KeyStorage { .. } | ApiError::FileStorage { .. } => Some(30),
            ApiError::QuotaExceeded {
                retry_after_secs, ..
            } => Some((*retry_after_secs).max(1)),
            ApiError::TooManyStreams { .. } => Some(5),
            ApiError::RateLimited { wait_secs, .. } => Some((*wait_secs).max(1)),
            ApiError::Unavailable(_) | ApiError::FilesUnavailable(_) | ApiError::ShuttingDown => {
                Some(1)
            }
            _ => None,
        }
    }

    /// The limit a 429 names: where it is set, its value, and what
    /// counted against it when the request came.
    pub fn limit(&self) -> Option<LimitDetail> {
        let detail = |setting: &'static str, unit: &'static str, value: u64, counted: u64| {
            Some(LimitDetail {
                setting,
                unit,
                value,
                counted,
            })
        };
        match self {
            ApiError::QueueFull { depth, limit } => detail(
                "CODE_RUNNER_MAX_QUEUE_DEPTH",
                "jobs waiting in the queue",
                *limit,
                *depth,
            ),
            ApiError::KeyLimit {
                active,
                limit,
                from_entry,
            } => detail(
                key_limit_setting(*from_entry),
                "queued or running jobs of the api key",
                *limit,
                *active,
            ),
            ApiError::UserActiveLimit { active, limit } => detail(
                "max_active_per_user",
                "queued or running jobs of the user",
                *limit,
                *active,
            ),
            ApiError::UserRateLimit { limit, .. } => detail(
                "user_rate_per_minute",
                "submissions of the user in the last minute",
                *limit,
                *limit,
            ),
            ApiError::KeyStorage {
                held,
                needed,
                budget,
            } => detail(
                "CODE_RUNNER_KEY_MAX_STORED_MB",
                "bytes the api key's jobs hold in the job store (with this job's)",
                *budget,
                held + needed,
            ),
            ApiError::FileStorage {
                held,
                needed,
                budget,
            } => detail(
                "CODE_RUNNER_KEY_MAX_STORED_MB",
                "bytes the api key's jobs and files hold (with this file's)",
                *budget,
                held + needed,
            ),
            ApiError::QuotaExceeded {
                quota, limit, used, ..
            } => match quota {
                Quota::KeyCpuSeconds | Quota::UserCpuSeconds => detail(
                    quota.option(),
                    "cpu milliseconds used today (UTC)",
                    limit.saturating_mul(1000),
                    *used,
                ),
                Quota::UserJobs => {
                    detail(quota.option(), "jobs submitted today (UTC)", *limit, *used)
                }
            },
            ApiError::TooManyStreams {
                open,
                limit,
                setting,
                ..
            } => detail(setting, "open streams", *limit as u64, *open as u64),
            ApiError::RateLimited { rate, burst, .. } => detail(
                "CODE_RUNNER_KEY_RATE",
                "requests of the api key: a burst, then this many per second",
                *rate,
                *burst,
            ),
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
                reason: self.refusal_reason(),
                limit: self.limit(),
                retry_after_secs: self.retry_after(),
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
    /// For a 429 or 503: why, as the `reason` label of
    /// `code_runner_submissions_rejected_total`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// For a 429 past a limit: the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitDetail>,
    /// The `Retry-After` header's seconds, in the body too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
}

/// The limit a refusal names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitDetail {
    /// Where it is set: a server setting (`CODE_RUNNER_…`) or an option of
    /// the api key's entry (`max_active_per_user`, …).
    pub setting: &'static str,
    /// What `value` and `counted` count.
    pub unit: &'static str,
    /// The limit.
    pub value: u64,
    /// What counted against it when the request came.
    pub counted: u64,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let refused = self
            .refusal_reason()
            .map(|reason| (reason, REFUSAL_LOG.count(reason, Instant::now())));
        match (&self, refused) {
            // Counted, but not this time's to log.
            (_, Some((_, None))) => {}
            (ApiError::Unavailable(error), Some((reason, Some(refused)))) => {
                tracing::warn!(error = %error, reason, refused, "Redis failed; answering 503.");
            }
            (ApiError::FilesUnavailable(error), Some((reason, Some(refused)))) => {
                tracing::warn!(error = %error, reason, refused, "The object storage failed; answering 503.");
            }
            (other, Some((reason, Some(refused)))) => tracing::info!(
                status = status.as_u16(),
                reason,
                refused,
                message = %other,
                "Requests refused."
            ),
            (other, None) => tracing::debug!(
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

/// How often each kind of refusal (429 and 503, by reason) is logged at
/// most: the first of a quiet spell at once, then one line per window with
/// how many there were, so a burst of thousands is a few lines.
const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(10);

static REFUSAL_LOG: RefusalLog = RefusalLog::new(REFUSAL_LOG_WINDOW);

/// Counts refusals by reason; [`RefusalLog::count`] says when to log.
struct RefusalLog {
    window: Duration,
    /// By reason: when it was last logged and the refusals since.
    seen: Mutex<BTreeMap<&'static str, (Instant, u64)>>,
}

impl RefusalLog {
    const fn new(window: Duration) -> Self {
        Self {
            window,
            seen: Mutex::new(BTreeMap::new()),
        }
    }

    /// Counts one refusal for `reason`; `Some(n)` when it is to be logged
    /// now, with the `n` refusals (this one included) since the last line.
    fn count(&self, reason: &'static str, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match seen.get_mut(reason) {
            Some((logged, since)) if now.duration_since(*logged) < self.window => {
                *since += 1;
                None
            }
            Some((logged, since)) => {
                let refused = *since + 1;
                *logged = now;
                *since = 0;
                Some(refused)
            }
            None => {
                seen.insert(reason, (now, 0));
                Some(1)
            }
        }
    }
}

#[cfg(test)]
mod tests;
