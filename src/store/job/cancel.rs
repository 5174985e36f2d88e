//! Cancel: a client's DELETE (`cancel.lua`). A queued job never starts
//! (`queued` → `cancelled`); a running one is asked to stop through its
//! control stream, and its worker finishes it.

use super::Jobs;
use super::script::{Reply, StepScript, script_inputs};
use crate::job::lifecycle::Step;
use crate::job::{JobResult, Status};
use crate::store::{StoreError, now_ms, parse_status};

script_inputs! {
    struct CancelInputs {
        keys { job, queue, stdin, events, tenants, tenant_turns }
        args { id: String, now_ms: u64, ttl: u64, result: String }
    }
}

pub(super) fn script() -> StepScript<CancelInputs> {
    StepScript::new(Step::Cancel, include_str!("cancel.lua"))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// It was queued and will never start.
    Cancelled,
    /// It is running; its worker was asked to kill it.
    Requested,
    /// It had already ended with this status.
    AlreadyFinished(Status),
    NotFound,
}

impl CancelOutcome {
    fn from_reply(id: &str, reply: &Reply) -> Result<Self, StoreError> {
        Ok(match reply.outcome() {
            "cancelled" => CancelOutcome::Cancelled,
            "requested" => CancelOutcome::Requested,
            "missing" => CancelOutcome::NotFound,
            "ended" => CancelOutcome::AlreadyFinished(parse_status(id, reply.detail(0))?),
            _ => return Err(reply.unexpected()),
        })
    }
}

impl Jobs {
    /// Cancels a job: a queued one never starts (settled with `cancelled`,
    /// the result of a job cancelled before it started); a running one is
    /// killed by its worker.
    pub async fn cancel(
        &self,
        id: &str,
        cancelled: &JobResult,
    ) -> Result<CancelOutcome, StoreError> {
        let keys = &self.redis.keys;
        let inputs = CancelInputs {
            job: keys.job(id),
            queue: keys.queue(),
            tenants: keys.tenants(),
            tenant_turns: keys.tenant_turns(),
            stdin: keys.stdin(id),
            events: keys.events(id),
            id: id.to_string(),
            now_ms: now_ms(),
            ttl: self.redis.result_ttl_secs(),
            result: serde_json::to_string(cancelled).unwrap_or_default(),
        };
        let mut conn = self.redis.conn().await?;
        let reply = self.scripts.cancel.run(&mut conn, &inputs, &[]).await?;
        CancelOutcome::from_reply(id, &reply)
    }
}
