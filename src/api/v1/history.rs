//! `GET /v1/jobs`: the run history of the calling key, newest first, one
//! page at a time (see [`crate::store::history`]).
//!
//! Parameters, each at most once, any combination:
//! - `user`: only that user's jobs (a job's `user`, 1–128 printable
//!   characters); absent: every user's, the anonymous one's included;
//! - `status`: only jobs with this status (`queued`, …, `error`);
//! - `language`: only jobs of this language (an id or alias of the
//!   catalog);
//! - `since`: only jobs created at or after this time: RFC 3339 in UTC
//!   (`2026-05-01T09:00:00Z`, milliseconds allowed) or Unix milliseconds;
//! - `limit`: most jobs on the page, 1–[`MAX_LIMIT`] (default
//!   [`DEFAULT_LIMIT`]);
//! - `cursor`: the `next_cursor` of the page before.
//!
//! Anything else, or a bad value, is a 400 that names the parameter. A key
//! sees its own jobs only; an admin key is no different here.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;

use super::jobs::rfc3339;
use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::job::{Status, check_user};
use crate::store::{HistoryEntry, HistoryPosition, HistoryQuery};

/// Jobs on a page unless `limit` says otherwise.
pub const DEFAULT_LIMIT: usize = 50;
/// Most jobs on a page.
pub const MAX_LIMIT: usize = 200;

/// A job of the history: what it was, how it ended, never its output.
#[derive(Debug, Serialize)]
struct HistoryView {
    id: String,
    status: Status,
    language: String,
    /// `null`: the key's anonymous user.
    user: Option<String>,
    created_at: String,
    started_at: Option<String>,
    finished_at: Option<String>,
    /// The error reason of an `error` (`worker_lost`, …), else the run
    /// stage's reason (`exited`, `wall_timeout`, …); `null` before the job
    /// ends or when its run stage never ran.
    reason: Option<String>,
    /// CPU and wall time of the stages that ran (compile + run).
    cpu_ms: Option<u64>,
    wall_ms: Option<u64>,
}

impl From<HistoryEntry> for HistoryView {
    fn from(entry: HistoryEntry) -> Self {
        Self {
            id: entry.id,
            status: entry.status,
            language: entry.language,
            user: entry.user,
            created_at: rfc3339(entry.created_ms),
            started_at: entry.started_ms.map(rfc3339),
            finished_at: entry.finished_ms.map(rfc3339),
            reason: entry.reason,
            cpu_ms: entry.cpu_ms,
            wall_ms: entry.wall_ms,
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct HistoryAnswer {
    jobs: Vec<HistoryView>,
    /// Where the next page starts (`cursor=`); `null`: this is the last.
    next_cursor: Option<String>,
}

/// The query's parameters, checked.
#[derive(Debug, Default, PartialEq, Eq)]
struct Params {
    user: Option<String>,
    status: Option<Status>,
    language: Option<String>,
    since_ms: Option<u64>,
    limit: Option<usize>,
    cursor: Option<HistoryPosition>,
}

fn invalid(field: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::InvalidRequest {
        field,
        message: message.into(),
    }
}

/// Checks every parameter; `language` is resolved through `find` (a
/// catalog id or alias to its id).
fn parse_params(
    pairs: Vec<(String, String)>,
    find: impl Fn(&str) -> Option<String>,
) -> Result<Params, ApiError> {
    const NAMES: &[&str] = &["user", "status", "language", "since", "limit", "cursor"];
    let mut params = Params::default();
    let mut seen: Vec<&'static str> = Vec::new();
    for (name, value) in pairs {
        let Some(field) = NAMES.iter().copied().find(|n| *n == name) else {
            return Err(invalid(
                "query",
                format!(
                    "unknown parameter {name:?}; the parameters are {}",
                    NAMES.join(", ")
                ),
            ));
        };
        if seen.contains(&field) {
            return Err(invalid(field, "give it at most once"));
        }
        seen.push(field);
        match field {
            "user" => {
                check_user(&value).map_err(|message| invalid("user", message))?;
                params.user = Some(value);
            }
            "status" => params.status = Some(parse_status(&value)?),
            "language" => {
                params.language = Some(find(&value).ok_or_else(|| {
                    invalid("language", format!("{value:?} is not a known language"))
                })?);
            }
            "since" => params.since_ms = Some(parse_since(&value)?),
            "limit" => {
                let limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        invalid(
                            "limit",
                            format!("{value:?} is not a whole number from 1 to {MAX_LIMIT}"),
                        )
                    })?;
                params.limit = Some(limit);
            }
            _ => params.cursor = Some(decode_cursor(&value)?),
        }
    }
    Ok(params)
}

fn parse_status(text: &str) -> Result<Status, ApiError> {
    Status::ALL
        .into_iter()
        .find(|s| s.as_str() == text)
        .ok_or_else(|| {
            invalid(
                "status",
                format!(
                    "{text:?} is not a status; the statuses are {}",
                    Status::ALL.map(Status::as_str).join(", ")
                ),
            )
        })
}

/// `since`: Unix milliseconds (digits only) or RFC 3339 in UTC.
fn parse_since(text: &str) -> Result<u64, ApiError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map_err(|_| {
            invalid(
                "since",
                format!("{text:?} is too large for Unix milliseconds"),
            )
        });
    }
    let time = humantime::parse_rfc3339(text).map_err(|error| {
        invalid(
            "since",
            format!(
                "{text:?} is neither Unix milliseconds nor an RFC 3339 UTC time like 2026-05-01T09:00:00Z ({error})"
            ),
        )
    })?;
    Ok(time
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64))
}

/// A position as the opaque `next_cursor`.
fn encode_cursor(position: &HistoryPosition) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{}", position.created_ms, position.id))
}

fn decode_cursor(text: &str) -> Result<HistoryPosition, ApiError> {
    let bad = || invalid("cursor", "is not a next_cursor this server gave");
    let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (created_ms, id) = text.split_once(':').ok_or_else(bad)?;
    let id = uuid::Uuid::parse_str(id).map_err(|_| bad())?;
    Ok(HistoryPosition {
        created_ms: created_ms.parse().map_err(|_| bad())?,
        id: id.hyphenated().to_string(),
    })
}

/// `GET /v1/jobs`.
pub(crate) async fn list(
    State(state): State<ApiState>,
    caller: Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<HistoryAnswer>, ApiError> {
    let Query(pairs) =
        query.map_err(|rejection| invalid("query", rejection.body_text().to_lowercase()))?;
    let catalog = &state.inner.catalog;
    let params = parse_params(pairs, |name| catalog.find(name).map(|l| l.id.clone()))?;
    let page = state
        .inner
        .store
        .history()
        .list(&HistoryQuery {
            api_key: &caller.name,
            user: params.user.as_deref(),
            status: params.status,
            language: params.language.as_deref(),
            since_ms: params.since_ms,
            limit: params.limit.unwrap_or(DEFAULT_LIMIT),
            after: params.cursor,
        })
        .await?;
    Ok(Json(HistoryAnswer {
        jobs: page.jobs.into_iter().map(HistoryView::from).collect(),
        next_cursor: page.next.as_ref().map(encode_cursor),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(query: &[(&str, &str)]) -> Result<Params, ApiError> {
        let pairs = query
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        parse_params(pairs, |name| match name {
            "python" | "py" => Some("python".into()),
            _ => None,
        })
    }

    fn field_of(error: ApiError) -> &'static str {
        match error {
            ApiError::InvalidRequest { field, .. } => field,
            other => panic!("not an invalid request: {other:?}"),
        }
    }

    #[test]
    fn every_parameter_is_checked() {
        let cursor = encode_cursor(&HistoryPosition {
            created_ms: 1_700_000_000_123,
            id: "0b7c6a38-6a0e-4d2b-9f8e-2f5c3d1e4a77".into(),
        });
        let params = parse(&[
            ("user", "tab 1"),
            ("status", "timed_out"),
            ("language", "py"),
            ("since", "2023-11-14T22:13:20.123Z"),
            ("limit", "200"),
            ("cursor", &cursor),
        ])
        .unwrap();
        assert_eq!(
            params,
            Params {
                user: Some("tab 1".into()),
                status: Some(Status::TimedOut),
                language: Some("python".into()),
                since_ms: Some(1_700_000_000_123),
                limit: Some(200),
                cursor: Some(HistoryPosition {
                    created_ms: 1_700_000_000_123,
                    id: "0b7c6a38-6a0e-4d2b-9f8e-2f5c3d1e4a77".into(),
                }),
            }
        );
        assert_eq!(
            parse(&[("since", "1700000000123")]).unwrap().since_ms,
            Some(1_700_000_000_123)
        );
        assert_eq!(parse(&[]).unwrap(), Params::default());
    }

    #[test]
    fn a_bad_parameter_is_named() {
        let not_a_uuid = URL_SAFE_NO_PAD.encode("12:not-a-uuid");
        for (query, field) in [
            (&[("user", "")][..], "user"),
            (&[("user", "a\tb")][..], "user"),
            (&[("status", "done")][..], "status"),
            (&[("language", "cobol")][..], "language"),
            (&[("since", "yesterday")][..], "since"),
            (&[("since", "2026-05-01T09:00:00+02:00")][..], "since"),
            (&[("since", "99999999999999999999999")][..], "since"),
            (&[("limit", "0")][..], "limit"),
            (&[("limit", "201")][..], "limit"),
            (&[("limit", "ten")][..], "limit"),
            (&[("cursor", "nope")][..], "cursor"),
            (&[("cursor", not_a_uuid.as_str())][..], "cursor"),
            (&[("status", "queued"), ("status", "running")][..], "status"),
            (&[("page", "2")][..], "query"),
        ] {
            assert_eq!(field_of(parse(query).unwrap_err()), field, "{query:?}");
        }
    }
}
