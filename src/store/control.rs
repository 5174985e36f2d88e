//! A job's control stream (`job:<id>:stdin`): what stream clients send a
//! running job (stdin, stdin close, signals) and the `cancel` of a DELETE,
//! read by the job's worker. Stdin is stored as raw bytes. The stream is
//! never trimmed (a trim could push a `cancel` out); every message counts
//! against the job's budgets instead ([`InputBudgets`]).

use std::collections::HashMap;

use deadpool_redis::redis::{self, AsyncCommands};

use super::{BLOCK_TIMEOUT, Store, StoreError, parse_status, unexpected};
use crate::job::Status;

/// A control message for a running job, from `job:<id>:stdin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Cancel,
    Stdin(Vec<u8>),
    StdinClose,
    Signal(crate::protocol::SignalKind),
}

/// What one job may be sent through its control stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputBudgets {
    /// Bytes of stdin, over every connection.
    pub stdin_bytes: u64,
    /// Signals (`interrupt`, `kill`).
    pub signals: u64,
    /// Messages of any kind (stdin frames, stdin close, signals).
    pub messages: u64,
    /// The API key's storage budget, which stdin counts against.
    pub key_storage: u64,
}

/// What became of a control message a stream client sent
/// ([`Store::send_input`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputOutcome {
    /// On its way to the worker; `stdin_bytes` of stdin were sent so far.
    Sent { stdin_bytes: u64 },
    /// Refused whole: it would take the job's stdin past the budget, of
    /// which `stdin_bytes` are used.
    OverBudget { stdin_bytes: u64 },
    /// Refused: the job was sent its most signals already.
    TooManySignals { signals: u64 },
    /// Refused: the job was sent its most control messages already.
    TooManyMessages { messages: u64 },
    /// Refused: the job's API key holds its whole storage budget.
    KeyStorage { held: u64 },
    /// The job has ended with this status: nothing was sent.
    Ended(Status),
    /// The job does not exist (any more).
    Missing,
}

impl Store {
    /// Sends a stream client's control message (stdin, stdin close, a
    /// signal) to the worker running the job, through `job:<id>:stdin`
    /// (messages sent while the job is queued wait there and are delivered
    /// in order once it starts), only while the job is queued or running
    /// and within its budgets
    /// (counted in the job hash, so every connection and every API replica
    /// shares them): one atomic step.
    pub async fn send_input(
        &self,
        id: &str,
        control: &Control,
        budgets: InputBudgets,
    ) -> Result<InputOutcome, StoreError> {
        let bytes = match control {
            Control::Stdin(data) => data.len() as u64,
            _ => 0,
        };
        let kind = match control {
            Control::Signal(_) => "signal",
            _ => "other",
        };
        let mut invocation = self.send_input.key(self.keys.job(id));
        invocation
            .key(self.keys.stdin(id))
            .arg(id)
            .arg(budgets.stdin_bytes)
            .arg(bytes)
            .arg(kind)
            .arg(budgets.signals)
            .arg(budgets.messages)
            .arg(budgets.key_storage);
        for (name, value) in control_fields(control) {
            invocation.arg(name).arg(value);
        }
        let mut conn = self.conn().await?;
        let (outcome, detail): (String, String) = invocation.invoke_async(&mut conn).await?;
        let number = || {
            detail
                .parse::<u64>()
                .map_err(|_| unexpected("send_input", (&outcome, &detail)))
        };
        Ok(match outcome.as_str() {
            "sent" => InputOutcome::Sent {
                stdin_bytes: number()?,
            },
            "over" => InputOutcome::OverBudget {
                stdin_bytes: number()?,
            },
            "signals" => InputOutcome::TooManySignals { signals: number()? },
            "messages" => InputOutcome::TooManyMessages {
                messages: number()?,
            },
            "storage" => InputOutcome::KeyStorage { held: number()? },
            "ended" => InputOutcome::Ended(parse_status(id, &detail)?),
            "missing" => InputOutcome::Missing,
            _ => return Err(unexpected("send_input", (outcome, detail))),
        })
    }

    /// Whether a running job's cancellation was asked for (and not yet
    /// acted on by its worker).
    pub async fn cancel_requested(&self, id: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn().await?;
        let flag: Option<String> = conn.hget(self.keys.job(id), "cancel_requested").await?;
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
            .xread_options(&[self.keys.stdin(id)], &[after], &options)
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
fn control_fields(control: &Control) -> Vec<(&'static str, Vec<u8>)> {
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
