//! Judge0's sessions, health and information routes (its
//! `sessions_controller.rb`, `health_controller.rb`, `info_controller.rb`
//! and `languages#all`), answered from this server's own figures:
//!
//! - `POST /authenticate`: 200 (no body) for a valid key in `X-Auth-Token`
//!   (header, or the query parameter of that name), else 401 (no body).
//! - `POST /authorize`: authenticated as above, then `X-Auth-User` (header
//!   or query parameter) must be a key with the `admin` scope: 200, else
//!   403 (no body). This server's authorization *is* the admin scope.
//! - `GET /system_info`: `lscpu`'s labels and `free`'s totals of the
//!   machine this API runs on, from `/proc`.
//! - `GET /workers`: one entry per language the fleet runs (Judge0 has one
//!   per queue): `queue` (the language id), `size` (its jobs queued),
//!   `available` (slots of the live workers that run it), `idle` (of those,
//!   free now), `working` (its jobs running), `paused` (0: a draining worker
//!   stops heartbeating its slots).
//! - `GET /statistics`: the caller's key's submissions per day (the usage
//!   ledger), and its jobs by language and by status (the run history).
//! - `GET /languages/all`: every language of the catalog under its Judge0
//!   ids, `is_archived` when no live worker offers it now.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::super::named_credential;
use super::languages::{JUDGE0_IDS, judge0_name};
use super::view::STATUSES;
use super::{caller, from_api_error};
use crate::api::ApiState;
use crate::api::http::error::ApiError;
use crate::api::v1::jobs::rfc3339;
use crate::host::MemoryTotals;
use crate::job::Status;
use crate::store::history::{HistoryPosition, HistoryQuery};
use crate::store::usage::Day;
use crate::store::{Store, StoreError, now_ms};

/// Judge0's authorization header (`AUTHZ_HEADER`'s default).
pub(super) const AUTHZ_HEADER: &str = "x-auth-user";

/// Most jobs of the run history `/statistics` reads.
pub const STATISTICS_MAX_JOBS: usize = 50_000;

/// Whether the request carries, in `X-Auth-User`, a key with the admin
/// scope (Judge0's authorization).
pub(super) fn authorized(state: &ApiState, parts: &Parts) -> bool {
    named_credential(parts, AUTHZ_HEADER)
        .and_then(|key| state.keys().check(&key))
        .is_some_and(|caller| caller.admin)
}

/// `POST /authenticate`.
pub(super) async fn authenticate(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    match caller(&state, &parts) {
        Ok(_) => StatusCode::OK.into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// `POST /authorize`.
pub(super) async fn authorize(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refusal) = caller(&state, &parts) {
        return refusal.into_response();
    }
    if authorized(&state, &parts) {
        StatusCode::OK.into_response()
    } else {
        StatusCode::FORBIDDEN.into_response()
    }
}

/// `GET /system_info`.
pub(super) async fn system_info(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refusal) = caller(&state, &parts) {
        return refusal.into_response();
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    Json(machine_info(
        std::env::consts::ARCH,
        &cpuinfo,
        MemoryTotals::read(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    ))
    .into_response()
}

/// `lscpu`-like labels from `/proc/cpuinfo`, and `Mem`/`Swap` as `free -h`
/// prints their totals.
fn machine_info(arch: &str, cpuinfo: &str, memory: MemoryTotals, usable_cpus: usize) -> Value {
    let first_cpu: BTreeMap<&str, &str> = cpuinfo
        .split("\n\n")
        .next()
        .unwrap_or("")
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let cpus = cpuinfo
        .lines()
        .filter(|line| {
            line.split(':')
                .next()
                .is_some_and(|k| k.trim() == "processor")
        })
        .count();
    let mut info = serde_json::Map::new();
    info.insert("Architecture".into(), json!(arch));
    info.insert("CPU(s)".into(), json!(cpus.max(usable_cpus).to_string()));
    for (label, key) in [
        ("Vendor ID", "vendor_id"),
        ("Model name", "model name"),
        ("CPU family", "cpu family"),
        ("Model", "model"),
        ("Stepping", "stepping"),
        ("CPU MHz", "cpu MHz"),
        ("BogoMIPS", "bogomips"),
        ("L3 cache", "cache size"),
    ] {
        if let Some(value) = first_cpu.get(key) {
            info.insert(label.into(), json!(value));
        }
    }
    for (label, bytes) in [("Mem", memory.memory_bytes), ("Swap", memory.swap_bytes)] {
        if let Some(bytes) = bytes {
            info.insert(label.into(), json!(human_size(bytes / 1024)));
        }
    }
    Value::Object(info)
}

/// A size in KiB as `free -h` writes it: `7.7G`, `512M`, `0B`.
fn human_size(kib: u64) -> String {
    if kib == 0 {
        return "0B".into();
    }
    let mut value = kib as f64;
    for unit in ["K", "M", "G", "T"] {
        if value < 1024.0 {
            return if value < 10.0 {
                format!("{:.1}{unit}", (value * 10.0).round() / 10.0)
            } else {
                format!("{}{unit}", value.round())
            };
        }
        value /= 1024.0;
    }
    format!("{}P", value.round())
}

/// Bytes as Postgres's `pg_size_pretty` writes them (Judge0's `database`
/// figures come from it): `512 bytes`, `8157 kB`, `12 MB`.
fn pg_size_pretty(bytes: u64) -> String {
    let mut value = bytes;
    for unit in ["bytes", "kB", "MB", "GB"] {
        if value < 10 * 1024 {
            return format!("{value} {unit}");
        }
        value = (value + 512) / 1024;
    }
    format!("{value} TB")
}

/// `GET /workers`.
pub(super) async fn workers(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refusal) = caller(&state, &parts) {
        return refusal.into_response();
    }
    let names: Vec<&str> = state.keys().names().collect();
    let loads = match state.inner.store.overview().load_by_language(&names).await {
        Ok(loads) => loads,
        Err(error) => return from_api_error(ApiError::Unavailable(error)),
    };
    let list: Vec<Value> = loads
        .into_iter()
        .map(|(language, load)| {
            json!({
                "queue": language,
                "size": load.queued,
                "available": load.slots,
                "idle": load.free,
                "working": load.running,
                "paused": 0,
            })
        })
        .collect();
    Json(list).into_response()
}

/// A job's status as Judge0 counts it (its id and name in [`STATUSES`]),
/// from what the run history keeps (its status and reason; not its
/// output, so a run that exited 0 is Accepted, never Wrong Answer).
fn history_status(status: Status, reason: Option<&str>) -> (u32, &'static str) {
    let id = match (status, reason) {
        (Status::Queued, _) => 1,
        (Status::Running, _) => 2,
        (Status::Succeeded, _) => 3,
        (Status::TimedOut, _) => 5,
        // Failed with no run stage: its compilation failed.
        (Status::Failed, None) => 6,
        (Status::Failed, Some("output_limit")) => 8,
        (Status::Failed, Some("exited")) => 11,
        (Status::Failed, Some(_)) => 12,
        (Status::Cancelled | Status::Error, _) => 13,
    };
    STATUSES
        .iter()
        .copied()
        .find(|(known, _)| *known == id)
        .unwrap_or((13, "Internal Error"))
}

/// The Judge0 id a language is counted under: its newest (highest).
fn judge0_id(language: &str) -> Option<u32> {
    JUDGE0_IDS
        .iter()
        .filter(|(_, ours)| *ours == language)
        .map(|(id, _)| *id)
        .max()
}

/// `GET /statistics` (`invalidate_cache` is accepted; nothing is cached).
pub(super) async fn statistics(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let caller = match caller(&state, &parts) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    let store = &state.inner.store;
    let now = now_ms();
    let today = Day::from_ms(now);
    let usage = store.usage();
    let read = async {
        let days = usage
            .days(&caller.name, usage.earliest(today), today)
            .await?;
        let counts = history_counts(store, &caller.name).await?;
        let stored = store.jobs().stored_bytes(&caller.name).await?;
        Ok::<_, StoreError>((days, counts, stored))
    };
    let (days, (by_language, by_status), stored) = match read.await {
        Ok(read) => read,
        Err(error) => return from_api_error(ApiError::Unavailable(error)),
    };
    let submitted: BTreeMap<Day, u64> = days.iter().map(|d| (d.day, d.total.submitted)).collect();
    let last_30_days: serde_json::Map<String, Value> = (1..=30)
        .map(|back| {
            let day = today.plus(-back);
            (
                day.to_string(),
                json!(submitted.get(&day).copied().unwrap_or(0)),
            )
        })
        .collect();
    let catalog = &state.inner.catalog;
    let languages = by_count(by_language.into_iter().filter_map(|(ours, count)| {
        let language = catalog.find(&ours)?;
        let id = judge0_id(&language.id)?;
        Some((
            count,
            json!({"language": {"id": id, "name": judge0_name(language)}, "count": count}),
        ))
    }));
    let statuses = by_count(by_status.into_iter().map(|((id, name), count)| {
        (
            count,
            json!({"status": {"id": id, "name": name}, "count": count}),
        )
    }));
    let created = rfc3339(now);
    Json(json!({
        "created_at": created,
        "cached_until": created,
        "submissions": {
            "total": submitted.values().sum::<u64>(),
            "today": submitted.get(&today).copied().unwrap_or(0),
            "last_30_days": last_30_days,
        },
        "languages": languages,
        "statuses": statuses,
        "database": {
            "size_pretty": pg_size_pretty(stored),
            "size_in_bytes": stored,
        },
    }))
    .into_response()
}

/// Jobs of `key`'s run history by language and by Judge0 status, over its
/// newest [`STATISTICS_MAX_JOBS`].
type HistoryCounts = (BTreeMap<String, u64>, BTreeMap<(u32, &'static str), u64>);

/// Counts `key`'s run history, a page at a time.
async fn history_counts(store: &Store, key: &str) -> Result<HistoryCounts, StoreError> {
    let mut by_language: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_status: BTreeMap<(u32, &'static str), u64> = BTreeMap::new();
    let mut after: Option<HistoryPosition> = None;
    let mut read = 0;
    while read < STATISTICS_MAX_JOBS {
        let query = HistoryQuery {
            api_key: key,
            user: None,
            status: None,
            language: None,
            since_ms: None,
            limit: 1000,
            after: after.take(),
        };
        let page = store.history().list(&query).await?;
        read += page.jobs.len().max(1);
        for job in &page.jobs {
            *by_language.entry(job.language.clone()).or_default() += 1;
            *by_status
                .entry(history_status(job.status, job.reason.as_deref()))
                .or_default() += 1;
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    Ok((by_language, by_status))
}

/// The values, most counted first (ties in the order given).
fn by_count(counted: impl Iterator<Item = (u64, Value)>) -> Vec<Value> {
    let mut counted: Vec<(u64, Value)> = counted.collect();
    counted.sort_by_key(|(count, _)| std::cmp::Reverse(*count));
    counted.into_iter().map(|(_, value)| value).collect()
}

/// `GET /languages/all`: by name, as Judge0 orders them.
pub(super) async fn languages_all(State(state): State<ApiState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refusal) = caller(&state, &parts) {
        return refusal.into_response();
    }
    let offered = state.offered_catalog().await;
    let catalog = &state.inner.catalog;
    let mut list: Vec<(String, u32, bool)> = JUDGE0_IDS
        .iter()
        .filter_map(|(id, ours)| {
            let language = catalog.find(ours)?;
            Some((judge0_name(language), *id, offered.find(ours).is_none()))
        })
        .collect();
    list.sort();
    Json(
        list.into_iter()
            .map(|(name, id, archived)| json!({"id": id, "name": name, "is_archived": archived}))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_free_h_writes_them() {
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(512), "512K");
        assert_eq!(human_size(8_074_472), "7.7G");
        assert_eq!(human_size(24 * 1024 * 1024), "24G");
        assert_eq!(human_size(1536), "1.5M");
    }

    #[test]
    fn database_sizes_read_as_postgres_writes_them() {
        assert_eq!(pg_size_pretty(0), "0 bytes");
        assert_eq!(pg_size_pretty(10_239), "10239 bytes");
        assert_eq!(pg_size_pretty(8_352_815), "8157 kB");
        assert_eq!(pg_size_pretty(8 << 20), "8192 kB");
        assert_eq!(pg_size_pretty(12 << 20), "12 MB");
        assert_eq!(pg_size_pretty(512 << 20), "512 MB");
    }

    #[test]
    fn machine_info_has_lscpus_labels_and_the_memory_totals() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU @ 2.20GHz\n\
                       cpu MHz\t\t: 2200.000\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n";
        let meminfo = "MemTotal:       8074472 kB\nMemFree:  1 kB\nSwapTotal:             0 kB\n";
        assert_eq!(
            machine_info("x86_64", cpuinfo, MemoryTotals::parse(meminfo), 1),
            json!({
                "Architecture": "x86_64",
                "CPU(s)": "2",
                "Vendor ID": "GenuineIntel",
                "Model name": "Test CPU @ 2.20GHz",
                "CPU MHz": "2200.000",
                "Mem": "7.7G",
                "Swap": "0B",
            })
        );
    }

    #[test]
    fn history_statuses_are_judge0s() {
        assert_eq!(
            history_status(Status::Succeeded, Some("exited")),
            (3, "Accepted")
        );
        assert_eq!(
            history_status(Status::Failed, None),
            (6, "Compilation Error")
        );
        assert_eq!(
            history_status(Status::Failed, Some("exited")),
            (11, "Runtime Error (NZEC)")
        );
        assert_eq!(
            history_status(Status::Failed, Some("memory_limit")),
            (12, "Runtime Error (Other)")
        );
        assert_eq!(
            history_status(Status::Failed, Some("output_limit")),
            (8, "Runtime Error (SIGXFSZ)")
        );
        assert_eq!(
            history_status(Status::TimedOut, Some("wall_timeout")),
            (5, "Time Limit Exceeded")
        );
        assert_eq!(
            history_status(Status::Error, Some("worker_lost")),
            (13, "Internal Error")
        );
        assert_eq!(history_status(Status::Queued, None), (1, "In Queue"));
        assert_eq!(history_status(Status::Running, None), (2, "Processing"));
        assert_eq!(judge0_id("c"), Some(50));
        assert_eq!(judge0_id("python"), Some(71));
        assert_eq!(judge0_id("nope"), None);
    }
}
