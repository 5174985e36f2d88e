//! Pre-warmed capacity for a known burst (an exam at 09:55): a fleet-wide
//! schedule of warm sandbox floors, which every live worker reads and keeps
//! its share of. Admin scope only.
//!
//! - `PUT /v1/capacity` `{"language", "warm", "from"?, "until"}` → 201 with
//!   the entry (`from` defaults to now; times are RFC 3339 UTC).
//! - `GET /v1/capacity` → the entries, and per language what the fleet
//!   holds now: the scheduled `floor`, the live workers' summed `target`
//!   and `ready` sandboxes, and `short` (with `missing`) when the targets
//!   do not reach the floor (too few workers, or their
//!   `CODE_RUNNER_WARM_MAX` too low: add machines); and how many live
//!   workers start no warm sandbox for want of memory
//!   (`memory_held_workers`: their ready ones stay below their targets).
//! - `DELETE /v1/capacity/{id}` → 204; 404 when there is no such entry.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::jobs::rfc3339;
use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::store::{CapacityEntry, Heartbeat, MAX_ENTRIES, PutOutcome, now_ms};

/// Most warm sandboxes one entry asks of the fleet.
pub const MAX_WARM: u64 = 100_000;
/// Longest window of one entry.
pub const MAX_WINDOW: Duration = Duration::from_secs(31 * 24 * 3600);

/// The body of `PUT /v1/capacity`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CapacityRequest {
    language: String,
    warm: u64,
    #[serde(default)]
    from: Option<String>,
    until: String,
    /// Ask for warm runtimes (or plain warm sandboxes) in this window.
    #[serde(default)]
    warm_runtime: Option<bool>,
}

/// An entry as the API shows it.
#[derive(Debug, Serialize)]
struct EntryView {
    id: String,
    language: String,
    warm: u64,
    from: String,
    until: String,
    active: bool,
    created_by: String,
    created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_runtime: Option<bool>,
}

impl EntryView {
    fn new(entry: CapacityEntry, now_ms: u64) -> Self {
        Self {
            active: entry.active_at(now_ms),
            from: rfc3339(entry.from_ms),
            until: rfc3339(entry.until_ms),
            created_at: rfc3339(entry.created_ms),
            id: entry.id,
            language: entry.language,
            warm: entry.warm,
            created_by: entry.created_by,
            warm_runtime: entry.warm_runtime,
        }
    }
}

/// What the fleet holds for one language now.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub(crate) struct LanguageCapacity {
    /// The active entries' total.
    floor: u64,
    /// The live workers' targets, summed.
    target: u64,
    /// Ready warm sandboxes on the live workers.
    ready: u64,
    /// The targets do not reach the floor.
    short: bool,
    /// By how many.
    missing: u64,
}

#[derive(Debug, Serialize)]
struct CapacityView {
    now: String,
    /// Live workers.
    workers: usize,
    /// Live workers whose pool starts nothing for want of memory (their
    /// heartbeat's `warm_memory_held`).
    memory_held_workers: usize,
    entries: Vec<EntryView>,
    languages: BTreeMap<String, LanguageCapacity>,
}

/// A time of the body: RFC 3339 in UTC (`2026-12-01T09:55:00Z`), as Unix ms.
fn parse_time(field: &'static str, text: &str) -> Result<u64, ApiError> {
    let time = humantime::parse_rfc3339(text).map_err(|error| ApiError::InvalidRequest {
        field,
        message: format!(
            "{text:?} is not an RFC 3339 UTC time like 2026-12-01T09:55:00Z ({error})"
        ),
    })?;
    Ok(time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64))
}

/// Per language: the floor of the active entries against what the live
/// workers say they hold (their heartbeats' `warm` figures).
pub(crate) fn fleet_capacity(
    entries: &[CapacityEntry],
    heartbeats: &[Heartbeat],
    now_ms: u64,
) -> BTreeMap<String, LanguageCapacity> {
    let mut languages: BTreeMap<String, LanguageCapacity> = BTreeMap::new();
    for entry in entries.iter().filter(|e| e.active_at(now_ms)) {
        languages.entry(entry.language.clone()).or_default().floor += entry.warm;
    }
    for warm in heartbeats.iter().filter_map(|h| h.warm.as_ref()) {
        for (language, figures) in warm {
            let capacity = languages.entry(language.clone()).or_default();
            capacity.target += figures.target;
            capacity.ready += figures.ready;
        }
    }
    for capacity in languages.values_mut() {
        capacity.missing = capacity.floor.saturating_sub(capacity.target);
        capacity.short = capacity.missing > 0;
    }
    languages.retain(|_, c| c.floor > 0 || c.target > 0 || c.ready > 0);
    languages
}

/// How many of `heartbeats` say their pool starts nothing for want of
/// memory.
fn memory_held_workers(heartbeats: &[Heartbeat]) -> usize {
    heartbeats
        .iter()
        .filter(|heartbeat| heartbeat.warm_memory_held == Some(true))
        .count()
}

/// `PUT /v1/capacity`.
pub(crate) async fn put(
    State(state): State<ApiState>,
    caller: Caller,
    body: Result<Json<CapacityRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let Json(request) = body.map_err(|rejection| ApiError::MalformedBody {
        message: format!(
            "the body is not a capacity entry: {}",
            rejection.body_text()
        )
        .to_lowercase(),
    })?;
    let now = now_ms();
    let entry = checked_entry(&state, &caller, request, now)?;
    match state.inner.store.capacity().put(&entry).await? {
        PutOutcome::Stored => {
            tracing::info!(
                capacity.id = %entry.id,
                language = %entry.language,
                warm = entry.warm,
                from = %rfc3339(entry.from_ms),
                until = %rfc3339(entry.until_ms),
                api_key = %caller.name,
                "warm capacity scheduled"
            );
            Ok((StatusCode::CREATED, Json(EntryView::new(entry, now))).into_response())
        }
        PutOutcome::Full => Err(ApiError::ScheduleFull {
            entries: MAX_ENTRIES,
        }),
    }
}

/// The entry `request` asks for, checked: a language of the catalog (with
/// a warm runtime, if it asks for one), a count within [`MAX_WARM`], a
/// window of at most [`MAX_WINDOW`] that ends after `now`.
fn checked_entry(
    state: &ApiState,
    caller: &Caller,
    request: CapacityRequest,
    now: u64,
) -> Result<CapacityEntry, ApiError> {
    let catalog = &state.inner.catalog;
    let language = catalog
        .find(&request.language)
        .ok_or_else(|| ApiError::InvalidRequest {
            field: "language",
            message: format!(
                "unknown language {:?}; known: {}",
                request.language,
                catalog.ids().join(", ")
            ),
        })?;
    if request.warm_runtime == Some(true) && language.warm_runtime.is_none() {
        let offered: Vec<&str> = catalog
            .all()
            .iter()
            .filter(|l| l.warm_runtime.is_some())
            .map(|l| l.id.as_str())
            .collect();
        return Err(ApiError::InvalidRequest {
            field: "warm_runtime",
            message: format!(
                "{} has no warm runtime; languages with one: {}",
                language.id,
                offered.join(", ")
            ),
        });
    }
    if !(1..=MAX_WARM).contains(&request.warm) {
        return Err(ApiError::InvalidRequest {
            field: "warm",
            message: format!("{} is not between 1 and {MAX_WARM}", request.warm),
        });
    }
    let (from_ms, until_ms) = window(&request, now)?;
    Ok(CapacityEntry {
        id: uuid::Uuid::new_v4().to_string(),
        language: language.id.clone(),
        warm: request.warm,
        from_ms,
        until_ms,
        created_by: caller.name.clone(),
        created_ms: now,
        warm_runtime: request.warm_runtime,
    })
}

/// The request's window, Unix ms: `from` (default `now`) before `until`,
/// `until` after `now`, at most [`MAX_WINDOW`] long.
fn window(request: &CapacityRequest, now: u64) -> Result<(u64, u64), ApiError> {
    let invalid = |message: String| ApiError::InvalidRequest {
        field: "until",
        message,
    };
    let from_ms = match &request.from {
        Some(text) => parse_time("from", text)?,
        None => now,
    };
    let until_ms = parse_time("until", &request.until)?;
    if until_ms <= from_ms {
        return Err(invalid("must be after from".into()));
    }
    if until_ms <= now {
        return Err(invalid("is in the past".into()));
    }
    if until_ms - from_ms > MAX_WINDOW.as_millis() as u64 {
        return Err(invalid(format!(
            "the window is longer than {} days",
            MAX_WINDOW.as_secs() / 86_400
        )));
    }
    Ok((from_ms, until_ms))
}

/// `GET /v1/capacity`.
pub(crate) async fn list(
    State(state): State<ApiState>,
    caller: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    caller.require_admin()?;
    let store = &state.inner.store;
    let entries = store.capacity().schedule().await?;
    let workers = store.overview().live_workers().await?;
    let now = now_ms();
    let heartbeats: Vec<Heartbeat> = workers.iter().map(|w| w.heartbeat.clone()).collect();
    let languages = fleet_capacity(&entries, &heartbeats, now);
    let view = CapacityView {
        now: rfc3339(now),
        workers: workers.len(),
        memory_held_workers: memory_held_workers(&heartbeats),
        entries: entries
            .into_iter()
            .map(|entry| EntryView::new(entry, now))
            .collect(),
        languages,
    };
    Ok(Json(serde_json::to_value(view).unwrap_or_default()))
}

/// `DELETE /v1/capacity/{id}`.
pub(crate) async fn delete(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require_admin()?;
    if state.inner.store.capacity().delete(&id).await? {
        tracing::info!(capacity.id = %id, api_key = %caller.name, "warm capacity entry ended");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound("capacity entry not found"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(language: &str, warm: u64, from_ms: u64, until_ms: u64) -> CapacityEntry {
        CapacityEntry::sample(language, warm, from_ms, until_ms)
    }

    /// Heartbeats as workers write them, read as the store reads them.
    fn heartbeats<const N: usize>(values: [serde_json::Value; N]) -> Vec<Heartbeat> {
        values
            .iter()
            .map(|value| Heartbeat::parse(&value.to_string()))
            .collect()
    }

    #[test]
    fn the_fleet_is_short_when_its_targets_do_not_reach_the_floor() {
        let entries = [
            entry("python", 30, 0, 100),
            entry("python", 10, 0, 100),
            entry("c", 5, 200, 300),
        ];
        let heartbeats = heartbeats([
            serde_json::json!({"slots_max": 4, "warm": {"python": {"ready": 8, "target": 10}}}),
            serde_json::json!({"slots_max": 4, "warm": {"python": {"ready": 10, "target": 10}}}),
            serde_json::json!({"slots_max": 4}),
        ]);
        let languages = fleet_capacity(&entries, &heartbeats, 50);
        assert_eq!(
            languages["python"],
            LanguageCapacity {
                floor: 40,
                target: 20,
                ready: 18,
                short: true,
                missing: 20
            }
        );
        assert!(!languages.contains_key("c"), "not active yet");
        let held = fleet_capacity(&entries[2..], &heartbeats, 250);
        assert_eq!(held["c"].missing, 5);
    }

    #[test]
    fn workers_held_for_memory_are_counted() {
        let heartbeats = heartbeats([
            serde_json::json!({"warm": {"python": {"ready": 0, "target": 10}}, "warm_memory_held": true}),
            serde_json::json!({"warm": {"python": {"ready": 10, "target": 10}}, "warm_memory_held": false}),
            serde_json::json!({"slots_max": 4}),
            serde_json::Value::Null,
        ]);
        assert_eq!(memory_held_workers(&heartbeats), 1);
        assert_eq!(memory_held_workers(&heartbeats[1..]), 0);
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(
            parse_time("from", "2026-12-01T09:55:00Z").unwrap(),
            1_796_118_900_000
        );
        assert!(matches!(
            parse_time("until", "tomorrow"),
            Err(ApiError::InvalidRequest { field: "until", .. })
        ));
    }
}
