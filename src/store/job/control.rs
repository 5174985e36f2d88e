//! A job's control stream (`job:<id>:stdin`): what stream clients send a
//! running job (stdin, stdin close, signals) and the `cancel` of a DELETE,
//! read by the job's worker. Stdin is stored as raw bytes. The stream is
//! never trimmed (a trim could push a `cancel` out); every message counts
//! against the job's budgets instead ([`InputBudgets`](crate::store::InputBudgets)).

use std::collections::HashMap;

use deadpool_redis::redis::{self, AsyncCommands};

use super::Jobs;
use crate::store::{BLOCK_TIMEOUT, StoreError};

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

    /// Reads control messages for a job after stream id `after`, waiting up
    /// to [`BLOCK_TIMEOUT`] on a dedicated connection. Returns the last id
    /// read and the messages (unknown ones are skipped).
    pub async fn read_control(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        id: &str,
        after: &str,
    ) -> Result<(String, Vec<Control>), StoreError> {
        let options = redis::streams::StreamReadOptions::default()
            .block(BLOCK_TIMEOUT.as_millis() as usize)
            .count(100);
        let reply: Option<redis::streams::StreamReadReply> = conn
            .xread_options(&[self.redis.keys.stdin(id)], &[after], &options)
            .await?;
        let mut last = after.to_string();
        let mut messages = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                last = entry.id.clone();
                if let Some(control) = control_from_entry(&entry.map) {
                    messages.push(control);
                }
            }
        }
        Ok((last, messages))
    }
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
