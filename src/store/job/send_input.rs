//! Send input: a stream client's stdin, stdin close or signal goes into
//! the job's control stream for its worker, within the job's budgets
//! (`send_input.lua`). No status changes.

use super::Jobs;
use super::control::{Control, control_fields};
use super::script::{StepScript, script_inputs};
use crate::job::Status;
use crate::job::lifecycle::Step;
use crate::store::{StoreError, parse_status};

script_inputs! {
    struct SendInputs {
        keys { job, stdin }
        args {
            id: String,
            max_stdin_bytes: u64,
            stdin_bytes: u64,
            kind: &'static str,
            max_signals: u64,
            max_messages: u64,
            storage_budget: u64,
        }
    }
}

pub(super) fn script() -> StepScript<SendInputs> {
    StepScript::new(Step::SendInput, include_str!("send_input.lua"))
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
/// ([`Jobs::send_input`](crate::store::Jobs::send_input)).
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

impl Jobs {
    /// Sends a stream client's control message (stdin, stdin close, a
    /// signal) to the worker running the job, through `job:<id>:stdin`
    /// (messages sent while the job is queued wait there and are delivered
    /// in order once it starts), only while the job is queued or running
    /// and within its budgets (counted in the job hash, so every connection
    /// and every API replica shares them): one atomic step.
    pub async fn send_input(
        &self,
        id: &str,
        control: &Control,
        budgets: InputBudgets,
    ) -> Result<InputOutcome, StoreError> {
        let keys = &self.redis.keys;
        let inputs = SendInputs {
            job: keys.job(id),
            stdin: keys.stdin(id),
            id: id.to_string(),
            max_stdin_bytes: budgets.stdin_bytes,
            stdin_bytes: match control {
                Control::Stdin(data) => data.len() as u64,
                _ => 0,
            },
            kind: match control {
                Control::Signal(_) => "signal",
                _ => "other",
            },
            max_signals: budgets.signals,
            max_messages: budgets.messages,
            storage_budget: budgets.key_storage,
        };
        let fields = control_fields(control);
        let rest: Vec<&[u8]> = fields
            .iter()
            .flat_map(|(name, value)| [name.as_bytes(), value.as_slice()])
            .collect();
        let mut conn = self.redis.conn().await?;
        let reply = self
            .scripts
            .send_input
            .run(&mut conn, &inputs, &rest)
            .await?;
        Ok(match reply.outcome() {
            "sent" => InputOutcome::Sent {
                stdin_bytes: reply.number(0)?,
            },
            "over" => InputOutcome::OverBudget {
                stdin_bytes: reply.number(0)?,
            },
            "signals" => InputOutcome::TooManySignals {
                signals: reply.number(0)?,
            },
            "messages" => InputOutcome::TooManyMessages {
                messages: reply.number(0)?,
            },
            "storage" => InputOutcome::KeyStorage {
                held: reply.number(0)?,
            },
            "ended" => InputOutcome::Ended(parse_status(id, reply.detail(0))?),
            "missing" => InputOutcome::Missing,
            _ => return Err(reply.unexpected()),
        })
    }
}
