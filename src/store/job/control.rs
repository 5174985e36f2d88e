//! A job's control stream (`job:<id>:stdin`): what stream clients send a
//! running job (stdin, stdin close, signals) and the `cancel` of a DELETE,
//! read by the job's worker. Stdin is stored as raw bytes. The stream is
//! never trimmed (a trim could push a `cancel` out); every message counts
//! against the job's budgets instead ([`InputBudgets`](crate::store::InputBudgets)).

use std::collections::HashMap;

use deadpool_redis::redis::{self, AsyncCommands};

use super::Jobs;
use crate::store::{BLOCK_TIMEOUT, StoreError, doorbell};

/// A control message for a running job, from `job:<id>:stdin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Cancel,
    Stdin(Vec<u8>),
    StdinClose,
    Signal(crate::protocol::SignalKind),
}

impl Jobs {
    /// Whether a running job's cancellation was asked for (and not yet
    /// acted on by its worker).
    pub async fn cancel_requested(&self, id: &str) -> Result<bool, StoreError> {
        let mut conn = self.redis.conn().await?;
        let flag: Option<String> = conn
            .hget(self.redis.keys.job(id), "cancel_requested")
            .await?;
        Ok(flag.is_some_and(|f| f == "1"))
    }

    /// Whether each job's cancellation was asked for, in the order given
    /// (one round trip).
    pub async fn cancels_requested(&self, ids: &[String]) -> Result<Vec<bool>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hget(self.redis.keys.job(id), "cancel_requested");
        }
        let mut conn = self.redis.conn().await?;
        let flags: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
        Ok(flags
            .into_iter()
            .map(|flag| flag.is_some_and(|f| f == "1"))
            .collect())
    }

    /// Reads, on `conn` (dedicated: this blocks up to [`BLOCK_TIMEOUT`]),
    /// the control messages of every job in `jobs` (id, last stream id
    /// read), and whether the
    /// doorbell of `worker` rang after `doorbell_after` (with no job, the
    /// doorbell alone). Unknown messages are skipped (their id still counts
    /// as read).
    pub async fn read_controls(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        worker: &str,
        doorbell_after: &str,
        jobs: Vec<(String, String)>,
    ) -> Result<ControlRead, StoreError> {
        let streams = jobs.into_iter().map(|(id, after)| {
            let key = self.redis.keys.stdin(&id);
            (id, key, after)
        });
        let doorbell = self.redis.keys.worker_doorbell(worker);
        let reply = doorbell::read(
            conn,
            &doorbell,
            doorbell_after,
            streams,
            READ_COUNT,
            BLOCK_TIMEOUT,
        )
        .await?;
        let mut read = ControlRead {
            doorbell: reply.doorbell,
            jobs: Vec::new(),
        };
        for (id, key) in reply.streams {
            let Some(last) = key.ids.last() else {
                continue;
            };
            let last = last.id.clone();
            let messages = key
                .ids
                .iter()
                .filter_map(|entry| control_from_entry(&entry.map))
                .collect();
            read.jobs.push((id, last, messages));
        }
        Ok(read)
    }

    /// Wakes `worker`'s control reader (its blocking read returns at once).
    pub async fn ring_control_doorbell(&self, worker: &str) -> Result<String, StoreError> {
        doorbell::ring(&self.redis, &self.redis.keys.worker_doorbell(worker)).await
    }
}

/// Most messages one read returns per job.
const READ_COUNT: usize = 100;

/// What one read of a worker's control streams gave.
#[derive(Debug, Default)]
pub struct ControlRead {
    /// The doorbell's last entry id, when it rang.
    pub doorbell: Option<String>,
    /// Per job with new messages: its id, the last stream id read and the
    /// messages, in order.
    pub jobs: Vec<(String, String, Vec<Control>)>,
}

/// The fields of a control message in `job:<id>:stdin`; stdin is raw.
pub(super) fn control_fields(control: &Control) -> Vec<(&'static str, Vec<u8>)> {
    let text = |s: &str| s.as_bytes().to_vec();
    match control {
        Control::Cancel => vec![("type", text("cancel"))],
        Control::StdinClose => vec![("type", text("stdin_close"))],
        Control::Stdin(data) => vec![("type", text("stdin")), ("data", data.clone())],
        Control::Signal(signal) => vec![
            ("type", text("signal")),
            (
                "signal",
                text(match signal {
                    crate::protocol::SignalKind::Interrupt => "interrupt",
                    crate::protocol::SignalKind::Kill => "kill",
                }),
            ),
        ],
    }
}

fn control_from_entry(map: &HashMap<String, redis::Value>) -> Option<Control> {
    let bytes = |name: &str| -> Option<Vec<u8>> {
        match map.get(name)? {
            redis::Value::BulkString(bytes) => Some(bytes.clone()),
            redis::Value::SimpleString(text) => Some(text.clone().into_bytes()),
            _ => None,
        }
    };
    let text = |name: &str| String::from_utf8(bytes(name)?).ok();
    match text("type")?.as_str() {
        "cancel" => Some(Control::Cancel),
        "stdin_close" => Some(Control::StdinClose),
        "stdin" => bytes("data").map(Control::Stdin),
        "signal" => match text("signal")?.as_str() {
            "interrupt" => Some(Control::Signal(crate::protocol::SignalKind::Interrupt)),
            "kill" => Some(Control::Signal(crate::protocol::SignalKind::Kill)),
            _ => None,
        },
        _ => None,
    }
}
