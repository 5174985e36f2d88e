//! Reading a job back: its record (`job:<id>` without the spec), its
//! result with its output, its status and last event position, its spec.

use std::collections::HashMap;

use deadpool_redis::redis::{self, AsyncCommands};
use serde::{Deserialize, Serialize};

use super::Jobs;
use crate::job::{JobResult, Status};
use crate::store::redis::Redis;
use crate::store::{StoreError, parse_status};

/// A job as stored in `job:<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    pub status: Status,
    pub language: String,
    pub api_key: String,
    /// Who the job is for (its spec's `user`); `None`: the key's anonymous
    /// user.
    #[serde(default)]
    pub user: Option<String>,
    /// How many times the job was started (0 while it never was).
    pub attempts: u32,
    /// Most times it may be started (1: never run again after its worker
    /// was lost).
    pub max_attempts: u32,
    pub worker: Option<String>,
    pub created_ms: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    /// When its running attempt must have ended, stored at start.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    pub result: Option<JobResult>,
    #[serde(skip)]
    pub spec: Option<String>,
}

impl Jobs {
    /// The bytes `api_key`'s jobs and idempotency records hold in Redis
    /// (its storage account's total: reservations of live jobs, sizes of
    /// ended ones until they expire).
    pub async fn stored_bytes(&self, api_key: &str) -> Result<u64, StoreError> {
        let mut conn = self.redis.conn().await?;
        let total: Option<i64> = conn.hget(self.redis.keys.stored(api_key), "total").await?;
        Ok(total.map_or(0, |t| t.max(0) as u64))
    }

    /// The storage budget of the job's key as it was resolved when the job
    /// was submitted (what a stored output file of the job is put under);
    /// `None` for a job that has none stored.
    pub async fn storage_budget(&self, id: &str) -> Result<Option<u64>, StoreError> {
        let mut conn = self.redis.conn().await?;
        let budget: Option<u64> = conn.hget(self.redis.keys.job(id), "storage_budget").await?;
        Ok(budget)
    }

    /// How many jobs wait in `jobs:queue`.
    pub async fn queue_depth(&self) -> Result<u64, StoreError> {
        let mut conn = self.redis.conn().await?;
        Ok(conn.llen(self.redis.keys.queue()).await?)
    }

    /// Reads a job (without its spec, which can be large and no reader of
    /// a record needs); `None` when it does not exist (never did, or
    /// expired).
    pub async fn get(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let mut conn = self.redis.conn().await?;
        let key = self.redis.keys.job(id);
        let (values, outputs): (Vec<Option<String>>, Vec<Option<Vec<u8>>>) = redis::pipe()
            .cmd("HMGET")
            .arg(&key)
            .arg(RECORD_FIELDS)
            .cmd("HMGET")
            .arg(&key)
            .arg(OUTPUT_FIELDS)
            .query_async(&mut conn)
            .await?;
        let fields: HashMap<String, String> = RECORD_FIELDS
            .iter()
            .zip(values)
            .filter_map(|(name, value)| Some((name.to_string(), value?)))
            .collect();
        if fields.is_empty() {
            return Ok(None);
        }
        record_from_fields(id, fields, outputs).map(Some)
    }

    /// A job's whole result (with its output), if it has one.
    pub async fn result(&self, id: &str) -> Result<Option<JobResult>, StoreError> {
        read_result(&self.redis, id).await
    }

    /// A job's spec as submitted (JSON); `None` when the job is gone.
    pub async fn spec(&self, id: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.redis.conn().await?;
        Ok(conn.hget(self.redis.keys.job(id), "spec").await?)
    }

    /// A job's status and the `seq` of its last event, read together (the
    /// terminal status and the `exit` event are written in one step);
    /// `None` when the job does not exist.
    pub async fn status_and_position(&self, id: &str) -> Result<Option<(Status, u64)>, StoreError> {
        let mut conn = self.redis.conn().await?;
        let (status, seq): (Option<String>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.redis.keys.job(id))
            .arg("status")
            .arg("event_seq")
            .query_async(&mut conn)
            .await?;
        match status {
            None => Ok(None),
            Some(status) => Ok(Some((parse_status(id, &status)?, seq.unwrap_or(0)))),
        }
    }
}

/// A job's whole result (with its output), if it has one: for the job
/// reads and for the events readers, which put it in an `exit` event.
pub(in crate::store) async fn read_result(
    redis: &Redis,
    id: &str,
) -> Result<Option<JobResult>, StoreError> {
    let mut conn = redis.conn().await?;
    let key = redis.keys.job(id);
    let (json, outputs): (Option<String>, Vec<Option<Vec<u8>>>) = redis::pipe()
        .hget(&key, "result")
        .cmd("HMGET")
        .arg(&key)
        .arg(OUTPUT_FIELDS)
        .query_async(&mut conn)
        .await?;
    json.map(|json| result_from_parts(id, &json, outputs))
        .transpose()
}

/// The fields of `job:<id>` a [`JobRecord`] is read from (not `spec`).
const RECORD_FIELDS: &[&str] = &[
    "status",
    "language",
    "api_key",
    "user",
    "attempts",
    "max_attempts",
    "worker",
    "created_ms",
    "started_ms",
    "finished_ms",
    "deadline_ms",
    "metadata",
    "result",
];

/// The hash fields of a result's output, in [`JobResult::split_output`]'s
/// order (the scripts' `OUT_FIELDS`).
const OUTPUT_FIELDS: &[&str] = &[
    "out:compile:stdout",
    "out:compile:stderr",
    "out:run:stdout",
    "out:run:stderr",
];

/// A result from its stored JSON and its output fields.
fn result_from_parts(
    id: &str,
    json: &str,
    outputs: Vec<Option<Vec<u8>>>,
) -> Result<JobResult, StoreError> {
    let bare: JobResult = serde_json::from_str(json).map_err(|e| StoreError::Corrupt {
        id: id.to_string(),
        message: format!("result: {e}"),
    })?;
    let mut parts: [Vec<u8>; 4] = Default::default();
    for (part, output) in parts.iter_mut().zip(outputs) {
        *part = output.unwrap_or_default();
    }
    Ok(bare.with_output(parts))
}

fn record_from_fields(
    id: &str,
    mut fields: HashMap<String, String>,
    outputs: Vec<Option<Vec<u8>>>,
) -> Result<JobRecord, StoreError> {
    let number = |value: Option<&String>| value.and_then(|v| v.parse::<u64>().ok());
    let status = parse_status(id, fields.get("status").map_or("", String::as_str))?;
    let result = match fields.get("result") {
        Some(json) => Some(result_from_parts(id, json, outputs)?),
        None => None,
    };
    let metadata = fields
        .get("metadata")
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default();
    Ok(JobRecord {
        id: id.to_string(),
        status,
        language: fields.remove("language").unwrap_or_default(),
        api_key: fields.remove("api_key").unwrap_or_default(),
        user: fields.remove("user").filter(|u| !u.is_empty()),
        attempts: number(fields.get("attempts")).unwrap_or(0) as u32,
        max_attempts: number(fields.get("max_attempts")).unwrap_or(1) as u32,
        worker: fields.remove("worker"),
        created_ms: number(fields.get("created_ms")).unwrap_or(0),
        started_ms: number(fields.get("started_ms")),
        finished_ms: number(fields.get("finished_ms")),
        deadline_ms: number(fields.get("deadline_ms")),
        metadata,
        result,
        spec: fields.remove("spec"),
    })
}
