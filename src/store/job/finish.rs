//! Finish: the worker records the result of its attempt, sets every key of
//! the job to expire and drops the id from its processing list, in that
//! order and in one step (`finish.lua`); or a late result of a given-up
//! attempt replaces the verdict. `running` → terminal; `error` (a
//! verdict), `queued` or `running` (a retry) → a late result's status.

use super::Jobs;
use super::append_events::EventArgs;
use super::script::{Reply, StepScript, script_inputs};
use crate::job::events::JobEvent;
use crate::job::lifecycle::Step;
use crate::job::{JobResult, Status};
use crate::store::{StoreError, now_ms, parse_status};

script_inputs! {
    struct FinishInputs {
        keys { job, processing, events, stdin, queue, tenants, tenant_turns }
        args {
            id: String,
            status: &'static str,
            result: String,
            now_ms: u64,
            ttl: u64,
            worker: String,
            attempt: u32,
        }
    }
}

pub(super) fn script() -> StepScript<FinishInputs> {
    StepScript::new(Step::Finish, include_str!("finish.lua"))
}

/// What became of a result a worker wrote ([`Jobs::finish`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishOutcome {
    /// The result of the worker's own running attempt: it is the job's.
    Finished,
    /// The real result of an attempt the platform had given up on, within
    /// the late-result window: it replaced the verdict (or the retry).
    Late,
    /// Not this attempt's to finish any more (the job ended otherwise, or
    /// another attempt holds it); it had this status. Only dropped from the
    /// processing list.
    Stale(Status),
    /// The job is gone (expired).
    Missing,
}

impl FinishOutcome {
    fn from_reply(id: &str, reply: &Reply) -> Result<Self, StoreError> {
        Ok(match reply.outcome() {
            "finished" => FinishOutcome::Finished,
            "late" => FinishOutcome::Late,
            "missing" => FinishOutcome::Missing,
            "stale" => FinishOutcome::Stale(parse_status(id, reply.detail(0))?),
            _ => return Err(reply.unexpected()),
        })
    }
}

impl Jobs {
    /// Records the result of `worker`'s `attempt` at a job, sets its keys
    /// to expire, then drops it from the worker's processing list (in one
    /// atomic step); see [`FinishOutcome`] for a result that comes late.
    pub async fn finish(
        &self,
        id: &str,
        worker: &str,
        attempt: u32,
        result: &JobResult,
    ) -> Result<FinishOutcome, StoreError> {
        self.finish_with_events(id, worker, attempt, result, &[])
            .await
    }

    /// [`Self::finish`], with the attempt's last events: they are appended
    /// in the same step, before the `exit` event, when the result is the
    /// job's ([`FinishOutcome::Finished`]); otherwise they are left out, as
    /// [`Self::append_events`] leaves out events of an attempt that is not
    /// running. The job's last stage end so goes with its result: one write
    /// instead of two at the end of every job.
    pub async fn finish_with_events(
        &self,
        id: &str,
        worker: &str,
        attempt: u32,
        result: &JobResult,
        events: &[JobEvent],
    ) -> Result<FinishOutcome, StoreError> {
        let (bare, outputs) = result.split_output();
        let json = serde_json::to_string(&bare).map_err(|e| StoreError::Corrupt {
            id: id.to_string(),
            message: e.to_string(),
        })?;
        let keys = &self.redis.keys;
        let inputs = FinishInputs {
            job: keys.job(id),
            processing: keys.processing(worker),
            events: keys.events(id),
            stdin: keys.stdin(id),
            queue: keys.queue(),
            tenants: keys.tenants(),
            tenant_turns: keys.tenant_turns(),
            id: id.to_string(),
            status: result.status.as_str(),
            result: json,
            now_ms: now_ms(),
            ttl: self.redis.result_ttl_secs(),
            worker: worker.to_string(),
            attempt,
        };
        let args = EventArgs::of(events);
        let rest: Vec<&[u8]> = outputs
            .iter()
            .map(Vec::as_slice)
            .chain(args.slices())
            .collect();
        let mut conn = self.redis.conn().await?;
        let reply = self.scripts.finish.run(&mut conn, &inputs, &rest).await?;
        FinishOutcome::from_reply(id, &reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_strictly() {
        let reply = |parts: &[&str]| Reply {
            step: Step::Finish,
            parts: parts.iter().map(|p| p.to_string()).collect(),
        };
        assert!(FinishOutcome::from_reply("j", &reply(&["weird"])).is_err());
        assert_eq!(
            FinishOutcome::from_reply("j", &reply(&["stale", "succeeded"])).unwrap(),
            FinishOutcome::Stale(Status::Succeeded)
        );
        assert!(FinishOutcome::from_reply("j", &reply(&["stale", "nonsense"])).is_err());
    }
}
