//! Claim: a worker takes the next job in fair turn (`claim.lua`), in two
//! commands. `jobs:queue` holds one turn per queued job; the worker's
//! `BLMOVE` moves a turn into its processing list (blocking, no polling),
//! then the script puts the job whose turn it is in the turn's place. A
//! worker that dies between the two leaves a turn in its list, which the
//! reaper gives back to `jobs:queue` (`reap.lua`); inside the script
//! nothing can stop halfway. No status changes: the job stays `queued`
//! until it starts.
//!
//! Whose turn it is: keys take turns (a key's `weight` is how many claims
//! in a row it gets per round), and within a key its users take one claim
//! each, in turn; each user's jobs go oldest first. The claim costs the
//! same two round trips however many keys and users wait. An entry of
//! `jobs:queue` that is not a turn is a job id queued before fair turns,
//! claimed as it is.

use deadpool_redis::redis::{self, AsyncCommands};

use super::Jobs;
use super::script::{Reply, StepScript, script_inputs};
use crate::job::lifecycle::Step;
use crate::store::{BLOCK_TIMEOUT, StoreError};

/// What `jobs:queue` holds for each queued job (the scripts' `TURN`).
pub const TURN: &str = "turn";

script_inputs! {
    struct ClaimInputs {
        keys { processing, tenants, tenant_turns, tenant_weights, claims }
        args {}
    }
}

pub(super) fn script() -> StepScript<ClaimInputs> {
    StepScript::new(Step::Claim, include_str!("claim.lua"))
}

/// What the second half of a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This job is in the worker's processing list now.
    Claimed(String),
    /// No job waited for the turn (a cancel took the job back while the
    /// turn was on its way): the turn is dropped.
    Spare,
    /// The worker's processing list holds no turn.
    NoTurn,
}

impl ClaimOutcome {
    fn from_reply(reply: &Reply) -> Result<Self, StoreError> {
        Ok(match reply.outcome() {
            "claimed" => ClaimOutcome::Claimed(reply.detail(0).to_string()),
            "spare" => ClaimOutcome::Spare,
            "none" => ClaimOutcome::NoTurn,
            _ => return Err(reply.unexpected()),
        })
    }
}

impl Jobs {
    /// Claims the next job in turn for `worker`, waiting up to
    /// [`BLOCK_TIMEOUT`] for a turn on `conn` (dedicated: this blocks).
    /// `None`: no job (the wait ended, or the turn was spare).
    pub async fn claim(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        worker: &str,
    ) -> Result<Option<String>, StoreError> {
        let moved: Option<String> = conn
            .blmove(
                self.redis.keys.queue(),
                self.redis.keys.processing(worker),
                redis::Direction::Right,
                redis::Direction::Left,
                BLOCK_TIMEOUT.as_secs_f64(),
            )
            .await?;
        match moved {
            None => Ok(None),
            // The second half on the same connection: the pool's are
            // shared with every running job and the API, and a burst of
            // claims waited for one longer than for the script itself.
            Some(turn) if turn == TURN => match self.take_turn_on(conn, worker).await? {
                ClaimOutcome::Claimed(id) => Ok(Some(id)),
                ClaimOutcome::Spare | ClaimOutcome::NoTurn => Ok(None),
            },
            // A job id queued before fair turns.
            Some(id) => Ok(Some(id)),
        }
    }

    /// The second half of a claim: the job whose turn it is takes the
    /// place of a turn in `worker`'s processing list. Also for a turn a
    /// claim left there when its second half failed.
    pub async fn take_turn(&self, worker: &str) -> Result<ClaimOutcome, StoreError> {
        let mut conn = self.redis.conn().await?;
        self.take_turn_on(&mut conn, worker).await
    }

    async fn take_turn_on(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        worker: &str,
    ) -> Result<ClaimOutcome, StoreError> {
        let keys = &self.redis.keys;
        let inputs = ClaimInputs {
            processing: keys.processing(worker),
            tenants: keys.tenants(),
            tenant_turns: keys.tenant_turns(),
            tenant_weights: keys.tenant_weights(),
            claims: keys.claims(),
        };
        let reply = self.scripts.claim.run(conn, &inputs, &[]).await?;
        ClaimOutcome::from_reply(&reply)
    }

    /// The job ids in `worker`'s processing list: the jobs it claimed (a
    /// turn whose job it has not taken yet is not one).
    pub async fn claimed_by(&self, worker: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .held_by(worker)
            .await?
            .into_iter()
            .filter(|entry| entry != TURN)
            .collect())
    }

    /// Everything in `worker`'s processing list: job ids and turns.
    pub async fn held_by(&self, worker: &str) -> Result<Vec<String>, StoreError> {
        let mut conn = self.redis.conn().await?;
        Ok(conn
            .lrange(self.redis.keys.processing(worker), 0, -1)
            .await?)
    }

    /// The queued job ids, key by key in the order of their turns, each
    /// user's oldest first (for tests and the dashboard; a claim's order
    /// also rotates users within a key).
    pub async fn queued_ids(&self) -> Result<Vec<String>, StoreError> {
        let keys = &self.redis.keys;
        let mut conn = self.redis.conn().await?;
        let rings: Vec<String> = conn.lrange(keys.tenants(), 0, -1).await?;
        let mut ids = Vec::new();
        for ring in rings {
            let queues: Vec<String> = conn.lrange(&ring, 0, -1).await?;
            for queue in queues {
                let mut queued: Vec<String> = conn.lrange(&queue, 0, -1).await?;
                queued.reverse();
                ids.extend(queued);
            }
        }
        // Jobs queued before fair turns wait in jobs:queue itself.
        let legacy: Vec<String> = conn.lrange(keys.queue(), 0, -1).await?;
        ids.extend(legacy.into_iter().rev().filter(|entry| entry != TURN));
        Ok(ids)
    }

    /// The keys and users with queued jobs, in the order of their turns:
    /// (API key, user, jobs queued); `""` is a key's anonymous user. At
    /// most `limit` of them (each is a round trip).
    pub async fn waiting_tenants(
        &self,
        limit: usize,
    ) -> Result<Vec<(String, String, u64)>, StoreError> {
        let keys = &self.redis.keys;
        let mut conn = self.redis.conn().await?;
        let rings: Vec<String> = conn.lrange(keys.tenants(), 0, -1).await?;
        let mut tenants = Vec::new();
        for ring in rings {
            let queues: Vec<String> = conn.lrange(&ring, 0, -1).await?;
            for queue in queues {
                if tenants.len() >= limit {
                    return Ok(tenants);
                }
                let queued: u64 = conn.llen(&queue).await?;
                if let Some((api_key, user)) = keys.tenant_of_user_queue(&queue) {
                    tenants.push((api_key.to_string(), user.to_string(), queued));
                }
            }
        }
        Ok(tenants)
    }

    /// How many keys have jobs queued (the length of the turns' ring).
    pub async fn tenants_waiting(&self) -> Result<u64, StoreError> {
        let mut conn = self.redis.conn().await?;
        Ok(conn.llen(self.redis.keys.tenants()).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_strictly() {
        let reply = |parts: &[&str]| Reply {
            step: Step::Claim,
            parts: parts.iter().map(|p| p.to_string()).collect(),
        };
        assert_eq!(
            ClaimOutcome::from_reply(&reply(&["claimed", "j1"])).unwrap(),
            ClaimOutcome::Claimed("j1".into())
        );
        assert_eq!(
            ClaimOutcome::from_reply(&reply(&["spare"])).unwrap(),
            ClaimOutcome::Spare
        );
        assert!(matches!(
            ClaimOutcome::from_reply(&reply(&["later"])),
            Err(StoreError::UnexpectedReply {
                script: "claim",
                ..
            })
        ));
    }

    #[test]
    fn the_scripts_turn_is_the_rust_turn() {
        assert!(include_str!("lib.lua").contains(&format!("local TURN = '{TURN}'\n")));
    }
}
