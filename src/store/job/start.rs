//! Start: a worker that holds a job's claim marks it running on itself and
//! stores its deadline (`start.lua`). `queued` → `running`.

use std::time::Duration;

use super::Jobs;
use super::script::{Reply, StepScript, script_inputs};
use crate::job::Status;
use crate::job::lifecycle::Step;
use crate::store::{StoreError, now_ms, parse_status};

script_inputs! {
    struct StartInputs {
        keys { job, processing, events }
        args {
            id: String,
            worker: String,
            now_ms: u64,
            with_spec: &'static str,
            host: String,
            slack_ms: u64,
        }
    }
}

pub(super) fn script() -> StepScript<StartInputs> {
    StepScript::new(Step::Start, include_str!("start.lua"))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartOutcome {
    /// The job is now running on this worker.
    Start(Started),
    /// Not started: the job is not queued any more (see [`Skipped`]).
    Skip(Skipped),
}

/// What start gives the worker of a job it now runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// The job's spec (JSON), when asked for; else empty.
    pub spec: String,
    pub created_ms: u64,
    /// This attempt's number (1 for the first start).
    pub attempts: u32,
    /// When the job must have ended (ms since the epoch), as stored; `None`
    /// for a job submitted without a wall budget.
    pub deadline_ms: Option<u64>,
    /// The API key the job was submitted with.
    pub api_key: String,
}

/// Why a claimed job was not started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// The id is not in this worker's processing list (a reaper took it
    /// back while this worker stalled).
    NotClaimed,
    /// This worker started it already (a retried start whose first reply
    /// was lost); it stays claimed.
    RunningHere,
    /// It has this other status (cancelled while queued, or running
    /// elsewhere); the id left the processing list.
    Status(Status),
    /// The job is gone; the id left the processing list.
    Missing,
}

impl StartOutcome {
    fn from_reply(id: &str, reply: &Reply) -> Result<Self, StoreError> {
        match reply.outcome() {
            "start" => Ok(StartOutcome::Start(Started {
                spec: reply.detail(0).to_string(),
                created_ms: reply.number(1)?,
                attempts: reply.number(2)?,
                deadline_ms: match reply.detail(3) {
                    "" => None,
                    _ => Some(reply.number(3)?),
                },
                api_key: reply.detail(4).to_string(),
            })),
            "skip" => Ok(StartOutcome::Skip(match reply.detail(0) {
                "not_claimed" => Skipped::NotClaimed,
                "running" => Skipped::RunningHere,
                "missing" => Skipped::Missing,
                status => Skipped::Status(parse_status(id, status)?),
            })),
            _ => Err(reply.unexpected()),
        }
    }
}

impl Jobs {
    /// Marks a claimed job running on `worker` (its Docker host `host`), if
    /// it is still queued, and stores its deadline: now + `slack` (the
    /// worker's start timeout and grace) + the job's wall budget. The spec
    /// comes back only `with_spec` (a worker that has the prepared job
    /// already does not read it again).
    pub async fn start(
        &self,
        id: &str,
        worker: &str,
        host: &str,
        with_spec: bool,
        slack: Duration,
    ) -> Result<StartOutcome, StoreError> {
        let keys = &self.redis.keys;
        let inputs = StartInputs {
            job: keys.job(id),
            processing: keys.processing(worker),
            events: keys.events(id),
            id: id.to_string(),
            worker: worker.to_string(),
            now_ms: now_ms(),
            with_spec: if with_spec { "1" } else { "0" },
            host: host.to_string(),
            slack_ms: slack.as_millis() as u64,
        };
        let mut conn = self.redis.conn().await?;
        let reply = self.scripts.start.run(&mut conn, &inputs, &[]).await?;
        StartOutcome::from_reply(id, &reply)
    }
}
