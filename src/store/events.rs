//! A job's events stream (`job:<id>:events`), read back as [`StoredEvent`]s (the wire JSON without
//! `seq`).
//!
//! Stored forms (see `job/append_events.lua`): `event <json>` for status, stage,
//! attempt and verdict events; `t <stdout|stderr> d <raw bytes>` for output;
//! `x <json>` for an `exit` whose result is the job's stored one. Reading
//! turns each into its JSON: output is encoded for the wire only then, and
//! an `x` exit gets the job's result put in.
//!
//! An API process follows many jobs with one reader ([`Events::read_feeds`]:
//! one blocking XREAD over every followed stream), which its own doorbell
//! stream wakes when the set of followed jobs changes.

use std::collections::HashMap;
use std::time::Duration;

use deadpool_redis::redis::{self, AsyncCommands};

use super::redis::Redis;
use super::{StoreError, doorbell};
use crate::job::events::{JobEvent, StoredEvent};

/// What one read of many jobs' streams gave.
#[derive(Debug, Default)]
pub struct FeedRead {
    /// New events per job id, in order.
    pub events: Vec<(String, Vec<StoredEvent>)>,
    /// The doorbell's last entry id, when it rang.
    pub doorbell: Option<String>,
}

/// Most entries one read returns per stream.
const READ_COUNT: usize = 200;

/// A stream entry as stored.
enum Stored {
    Json(String),
    Output(bool, Vec<u8>),
    /// An `exit` to be completed with the job's stored result.
    Exit(String),
}

fn field(map: &HashMap<String, redis::Value>, name: &str) -> Option<Vec<u8>> {
    match map.get(name)? {
        redis::Value::BulkString(bytes) => Some(bytes.clone()),
        redis::Value::SimpleString(text) => Some(text.clone().into_bytes()),
        _ => None,
    }
}

fn stored(map: &HashMap<String, redis::Value>) -> Option<Stored> {
    if let Some(json) = field(map, "event") {
        return String::from_utf8(json).ok().map(Stored::Json);
    }
    if let Some(json) = field(map, "x") {
        return String::from_utf8(json).ok().map(Stored::Exit);
    }
    let kind = field(map, "t")?;
    let data = field(map, "d").unwrap_or_default();
    match kind.as_slice() {
        b"stdout" => Some(Stored::Output(false, data)),
        b"stderr" => Some(Stored::Output(true, data)),
        _ => None,
    }
}

/// The `seq` of a stream entry id (`<seq>-0`).
fn seq_of(id: &str) -> u64 {
    id.split_once('-')
        .and_then(|(seq, _)| seq.parse().ok())
        .unwrap_or(0)
}

/// Reading jobs' events streams, and the doorbells of their readers.
#[derive(Debug, Clone)]
pub struct Events {
    redis: Redis,
}

impl Events {
    pub(super) fn new(redis: Redis) -> Self {
        Self { redis }
    }

    /// The job's events after `after`, at most `count`, on the pool
    /// (never blocks): a replay.
    pub async fn since(
        &self,
        id: &str,
        after: u64,
        count: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut conn = self.redis.conn().await?;
        let reply: redis::streams::StreamRangeReply = conn
            .xrange_count(
                self.redis.keys.events(id),
                format!("({after}-0"),
                "+",
                count,
            )
            .await?;
        self.to_events(id, reply.ids).await
    }

    /// The `seq` of each job's last event (`None`: the job is gone), in
    /// the order given.
    pub async fn positions(&self, ids: &[String]) -> Result<Vec<Option<u64>>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hget(self.redis.keys.job(id), "event_seq");
        }
        let mut conn = self.redis.conn().await?;
        Ok(pipe.query_async(&mut conn).await?)
    }

    /// Reads, on `conn` (dedicated: this blocks), the new events of every
    /// job in `jobs` (id, last `seq` read), and whether the doorbell of
    /// `instance` rang after `doorbell_after`; waits up to `block` for the
    /// first.
    pub async fn read_feeds(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        instance: &str,
        doorbell_after: &str,
        jobs: &[(String, u64)],
        block: Duration,
    ) -> Result<FeedRead, StoreError> {
        let streams = jobs
            .iter()
            .map(|(id, after)| (id, self.redis.keys.events(id), format!("{after}-0")));
        let doorbell = self.redis.keys.doorbell(instance);
        let reply =
            doorbell::read(conn, &doorbell, doorbell_after, streams, READ_COUNT, block).await?;
        let mut read = FeedRead {
            doorbell: reply.doorbell,
            events: Vec::new(),
        };
        for (id, key) in reply.streams {
            let events = self.to_events(id, key.ids).await?;
            read.events.push((id.clone(), events));
        }
        Ok(read)
    }

    /// Rings the doorbell of `instance`: its reader's blocking read returns
    /// at once. Returns the entry's id.
    pub async fn ring_doorbell(&self, instance: &str) -> Result<String, StoreError> {
        doorbell::ring(&self.redis, &self.redis.keys.doorbell(instance)).await
    }

    /// Stream entries of job `id` as events; an `exit` stored without its
    /// result gets the job's stored result.
    async fn to_events(
        &self,
        id: &str,
        entries: Vec<redis::streams::StreamId>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut events = Vec::with_capacity(entries.len());
        let mut result_json: Option<String> = None;
        for entry in entries {
            let seq = seq_of(&entry.id);
            let json = match stored(&entry.map) {
                None => continue,
                Some(Stored::Json(json)) => json,
                Some(Stored::Output(stderr, bytes)) => {
                    let event = if stderr {
                        JobEvent::stderr(bytes)
                    } else {
                        JobEvent::stdout(bytes)
                    };
                    event.to_json()
                }
                Some(Stored::Exit(exit)) => {
                    if result_json.is_none() {
                        let result = super::job::record::read_result(&self.redis, id).await?;
                        result_json = Some(match result {
                            Some(result) => {
                                serde_json::to_string(&result).map_err(|e| StoreError::Corrupt {
                                    id: id.to_string(),
                                    message: e.to_string(),
                                })?
                            }
                            None => "null".to_string(),
                        });
                    }
                    let result = result_json.as_deref().unwrap_or("null");
                    match exit.strip_suffix('}') {
                        Some(head) => format!("{head},\"result\":{result}}}"),
                        None => exit,
                    }
                }
            };
            events.push(StoredEvent { seq, json });
        }
        Ok(events)
    }
}
