//! No stranded jobs: a worker reads its own processing list back.
//!
//! - At start ([`Shared::recover_own`]): a process restarted under the same
//!   worker id finds what its previous incarnation left. It removes every
//!   sandbox container of its id on this Docker host (nothing of this
//!   process exists yet), then reaps each id in its list as the reaper
//!   would a dead worker's: a job claimed but never started goes back to
//!   the queue; a started one runs again if it has attempts left (its
//!   sandbox is gone: it was on this host) or ends `worker_lost`.
//! - After a claim error ([`Shared::adopt_stranded`]): a `BLMOVE` whose
//!   reply was lost moved an id into the list that this process never
//!   heard of. Every id in the list that holds no slot here is taken into
//!   a slot and started like a fresh claim.

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use super::backoff::{Backoff, sleep_unless_cancelled};
use super::{Claims, Shared};
use crate::store::{LostResults, ReapOutcome, ReapPolicy, Retry};

impl Shared {
    /// Recovers what a previous process under this worker id left (see the
    /// module documentation); retries through Redis and Docker failures
    /// until done or shutdown.
    pub(super) async fn recover_own(&self) {
        let mut backoff = Backoff::redis();
        loop {
            match self.try_recover_own().await {
                Ok(()) => return,
                Err(error) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        worker.id = %self.config.id,
                        %error,
                        retry_ms = delay.as_millis() as u64,
                        "could not recover this worker's processing list; retrying"
                    );
                    if !sleep_unless_cancelled(delay, &self.shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    async fn try_recover_own(&self) -> Result<(), String> {
        let worker = self.config.id.as_str();
        let left: Vec<String> = self
            .engine
            .list_sandboxes()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|c| c.worker == worker)
            .map(|c| c.id)
            .collect();
        for container in &left {
            self.engine
                .remove_sandbox(container)
                .await
                .map_err(|e| e.to_string())?;
        }
        if !left.is_empty() {
            tracing::info!(
                worker.id = %worker,
                containers = left.len(),
                "removed the sandboxes a previous process under this worker id left"
            );
        }
        // Job ids, and the turns of claims the previous process stopped
        // halfway through (they go back to the queue).
        let ids = self
            .store
            .jobs()
            .held_by(worker)
            .await
            .map_err(|e| e.to_string())?;
        for id in ids {
            let job = self
                .store
                .jobs()
                .lost_job(&id)
                .await
                .map_err(|e| e.to_string())?;
            let version = self
                .catalog
                .find(&job.language)
                .map(|l| l.version.clone())
                .unwrap_or_default();
            let results =
                LostResults::new(worker, &job.language, &version, self.config.max_requeues);
            // Its sandbox was on this host (and is gone now), or elsewhere:
            // then there is no knowing, and it is not run again.
            let retry = Retry::decide(&job, self.engine.host_id(), false, None);
            let policy = ReapPolicy {
                max_requeues: self.config.max_requeues,
                retry,
                late_window: crate::store::LATE_RESULT_WINDOW,
                own: true,
            };
            let outcome = self
                .store
                .jobs()
                .reap(worker, &id, policy, &results)
                .await
                .map_err(|e| e.to_string())?;
            if outcome != ReapOutcome::Absent {
                tracing::info!(
                    job.id = %id,
                    worker.id = %worker,
                    outcome = ?outcome,
                    "recovered a job a previous process under this worker id left"
                );
            }
        }
        Ok(())
    }

    /// Takes every id of this worker's processing list that holds no slot
    /// here into a slot and starts it (a claim whose reply was lost).
    /// Returns `Err` when the list cannot be read (the caller tries again).
    pub(super) async fn adopt_stranded(
        self: &Arc<Self>,
        claims: &Claims,
        tracker: &TaskTracker,
    ) -> Result<(), crate::store::StoreError> {
        // Another loop that found the same jobs has started them first.
        let _adopting = claims.adopting.lock().await;
        let (ids, held) = {
            // No claim of this worker is in flight while the list is read.
            let _alone = claims.in_flight.write().await;
            // A claim whose second half failed left a turn in the list: its
            // job takes the turn's place first.
            let turns = self
                .store
                .jobs()
                .held_by(&self.config.id)
                .await?
                .into_iter()
                .filter(|entry| entry == crate::store::TURN)
                .count();
            for _ in 0..turns {
                self.store.jobs().take_turn(&self.config.id).await?;
            }
            let ids = self.store.jobs().claimed_by(&self.config.id).await?;
            (ids, self.running_ids())
        };
        for id in ids.into_iter().filter(|id| !held.contains(id)) {
            let permit = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return Ok(()),
                permit = Arc::clone(&claims.slots).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return Ok(()),
                },
            };
            tracing::warn!(
                job.id = %id,
                worker.id = %self.config.id,
                "a job was in this worker's processing list without a slot (a claim whose reply was lost); starting it"
            );
            Arc::clone(self).spawn_claimed(tracker, id, permit);
        }
        Ok(())
    }
}
