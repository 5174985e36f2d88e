//! Release: a worker gives back a job it claimed but will not start
//! (`release.lua`). No status changes: the job stays `queued`.

use super::Jobs;
use super::script::{Reply, StepScript, script_inputs};
use crate::job::lifecycle::Step;
use crate::store::StoreError;

script_inputs! {
    struct ReleaseInputs {
        keys { queue, processing, job, tenants, tenant_turns }
        args { id: String }
    }
}

pub(super) fn script() -> StepScript<ReleaseInputs> {
    StepScript::new(Step::Release, include_str!("release.lua"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The job is back at the head of the queue.
    Requeued,
    /// The job is not queued any more (cancelled meanwhile); it was only
    /// dropped from the processing list.
    Dropped,
    /// The id was not in the worker's processing list.
    Absent,
}

impl ReleaseOutcome {
    fn from_reply(reply: &Reply) -> Result<Self, StoreError> {
        Ok(match reply.outcome() {
            "requeued" => ReleaseOutcome::Requeued,
            "dropped" => ReleaseOutcome::Dropped,
            "absent" => ReleaseOutcome::Absent,
            _ => return Err(reply.unexpected()),
        })
    }
}

impl Jobs {
    /// Gives back a job `worker` claimed but will not start (it is shutting
    /// down): in one atomic step the id leaves the processing list and, if
    /// the job is still queued, goes back to the head of the queue.
    pub async fn release(&self, id: &str, worker: &str) -> Result<ReleaseOutcome, StoreError> {
        let keys = &self.redis.keys;
        let inputs = ReleaseInputs {
            queue: keys.queue(),
            tenants: keys.tenants(),
            tenant_turns: keys.tenant_turns(),
            processing: keys.processing(worker),
            job: keys.job(id),
            id: id.to_string(),
        };
        let mut conn = self.redis.conn().await?;
        let reply = self.scripts.release.run(&mut conn, &inputs, &[]).await?;
        ReleaseOutcome::from_reply(&reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_strictly() {
        let reply = |outcome: &str| Reply {
            step: Step::Release,
            parts: vec![outcome.to_string()],
        };
        assert!(matches!(
            ReleaseOutcome::from_reply(&reply("gone")),
            Err(StoreError::UnexpectedReply {
                script: "release",
                ..
            })
        ));
        assert_eq!(
            ReleaseOutcome::from_reply(&reply("absent")).unwrap(),
            ReleaseOutcome::Absent
        );
    }
}
