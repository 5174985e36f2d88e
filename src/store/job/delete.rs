//! Delete: an ended job's keys removed before they expire (`delete.lua`),
//! for Judge0's `DELETE /submissions/{token}`. No status moves; a queued
//! or running job is refused and left as it is.

use super::Jobs;
use super::script::{Reply, StepScript, script_inputs};
use crate::job::Status;
use crate::job::lifecycle::Step;
use crate::store::{StoreError, parse_status};

script_inputs! {
    struct DeleteInputs {
        keys { job, events, stdin, compat, history, user_history }
        args { id: String }
    }
}

pub(super) fn script() -> StepScript<DeleteInputs> {
    StepScript::new(Step::Delete, include_str!("delete.lua"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    /// Not ended yet (`queued` or `running`): nothing was removed.
    Active(Status),
    NotFound,
}

impl DeleteOutcome {
    fn from_reply(id: &str, reply: &Reply) -> Result<Self, StoreError> {
        Ok(match reply.outcome() {
            "deleted" => DeleteOutcome::Deleted,
            "missing" => DeleteOutcome::NotFound,
            "active" => DeleteOutcome::Active(parse_status(id, reply.detail(0))?),
            _ => return Err(reply.unexpected()),
        })
    }
}

impl Jobs {
    /// Deletes the ended job `id` of `api_key` (whose end user is `user`)
    /// with everything kept of it, but its usage.
    pub async fn delete(
        &self,
        id: &str,
        api_key: &str,
        user: Option<&str>,
    ) -> Result<DeleteOutcome, StoreError> {
        let keys = &self.redis.keys;
        let history = keys.history(api_key);
        let inputs = DeleteInputs {
            job: keys.job(id),
            events: keys.events(id),
            stdin: keys.stdin(id),
            compat: keys.compat(id),
            user_history: user.map_or_else(|| history.clone(), |u| keys.user_history(api_key, u)),
            history,
            id: id.to_string(),
        };
        let mut conn = self.redis.conn().await?;
        let reply = self.scripts.delete.run(&mut conn, &inputs, &[]).await?;
        DeleteOutcome::from_reply(id, &reply)
    }
}
