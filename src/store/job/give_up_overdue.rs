//! Give up overdue: the reaper's guard against a job `running` on a live
//! worker past its deadline, which its worker never reported
//! (`give_up_overdue.lua`): `running` → `error` (`deadline_exceeded`).

use std::time::Duration;

use deadpool_redis::redis;

use super::Jobs;
use super::script::{StepScript, script_inputs};
use crate::job::JobResult;
use crate::job::lifecycle::Step;
use crate::store::{StoreError, now_ms};

script_inputs! {
    struct OverdueInputs {
        keys { job, processing, events, stdin }
        args {
            id: String,
            worker: String,
            started_ms: u64,
            now_ms: u64,
            ttl: u64,
            result: String,
            late_window_ms: u64,
        }
    }
}

pub(super) fn script() -> StepScript<OverdueInputs> {
    StepScript::new(Step::GiveUpOverdue, include_str!("give_up_overdue.lua"))
}

/// A job running on a live worker, as the overdue guard sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    pub id: String,
    pub language: String,
    pub started_ms: u64,
    /// When it must have ended, as start stored it (`None`: a job
    /// submitted without a wall budget).
    pub deadline_ms: Option<u64>,
}

impl Jobs {
    /// The jobs in `worker`'s processing list that are running on it.
    pub async fn running_on(&self, worker: &str) -> Result<Vec<RunningJob>, StoreError> {
        let ids = self.claimed_by(worker).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.redis.conn().await?;
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET").arg(self.redis.keys.job(id)).arg(&[
                "status",
                "worker",
                "started_ms",
                "language",
                "deadline_ms",
            ]);
        }
        type Fields = (
            Option<String>,
            Option<String>,
            Option<u64>,
            Option<String>,
            Option<u64>,
        );
        let rows: Vec<Fields> = pipe.query_async(&mut conn).await?;
        Ok(ids
            .into_iter()
            .zip(rows)
            .filter_map(|(id, (status, owner, started_ms, language, deadline_ms))| {
                let running = status.as_deref() == Some("running");
                (running && owner.as_deref() == Some(worker)).then_some(RunningJob {
                    id,
                    language: language.unwrap_or_default(),
                    started_ms: started_ms?,
                    deadline_ms,
                })
            })
            .collect())
    }

    /// Gives up on a job that outlived its deadline on a live worker with
    /// the verdict `result`, if it is still the same run; whether it gave
    /// up. The worker's real result may still replace it within
    /// `late_window`.
    pub async fn give_up_overdue(
        &self,
        worker: &str,
        job: &RunningJob,
        result: &JobResult,
        late_window: Duration,
    ) -> Result<bool, StoreError> {
        let keys = &self.redis.keys;
        let inputs = OverdueInputs {
            job: keys.job(&job.id),
            processing: keys.processing(worker),
            events: keys.events(&job.id),
            stdin: keys.stdin(&job.id),
            id: job.id.clone(),
            worker: worker.to_string(),
            started_ms: job.started_ms,
            now_ms: now_ms(),
            ttl: self.redis.result_ttl_secs(),
            result: serde_json::to_string(result).map_err(|e| StoreError::Corrupt {
                id: job.id.clone(),
                message: e.to_string(),
            })?,
            late_window_ms: late_window.as_millis() as u64,
        };
        let mut conn = self.redis.conn().await?;
        let reply = self
            .scripts
            .give_up_overdue
            .run(&mut conn, &inputs, &[])
            .await?;
        match reply.outcome() {
            "given_up" => Ok(true),
            "changed" => Ok(false),
            _ => Err(reply.unexpected()),
        }
    }
}
