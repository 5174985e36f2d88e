//! Queue places: how many claims come before each queued job in the fair
//! order (`places.lua`, a read), and the fleet's claim counter the wait is
//! estimated from. One script call answers for many jobs at once and reads
//! only the rings and the queues of the users involved, never the jobs.

use deadpool_redis::redis;

use super::Jobs;
use crate::store::StoreError;

/// What [`Jobs::places`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Places {
    /// Jobs claimed since the store began (`jobs:claims`).
    pub claims: u64,
    /// Per job asked, in order: the claims before its own (0: next), or
    /// `None` when it is not queued.
    pub places: Vec<Option<u64>>,
}

pub(super) fn script() -> redis::Script {
    redis::Script::new(include_str!("places.lua"))
}

impl Jobs {
    /// The place of each of `ids` in the fair order, and the claim counter.
    pub async fn places(&self, ids: &[String]) -> Result<Places, StoreError> {
        let keys = &self.redis.keys;
        let mut invocation = self.scripts.places.prepare_invoke();
        invocation
            .key(keys.tenants())
            .key(keys.tenant_turns())
            .key(keys.tenant_weights())
            .key(keys.claims());
        for id in ids {
            invocation.key(keys.job(id));
        }
        for id in ids {
            invocation.arg(id);
        }
        let mut conn = self.redis.conn().await?;
        let reply: Vec<i64> = invocation.invoke_async(&mut conn).await?;
        let Some((claims, places)) = reply.split_first() else {
            return Err(StoreError::Corrupt {
                id: String::new(),
                message: "the places script answered nothing".into(),
            });
        };
        Ok(Places {
            claims: u64::try_from(*claims).unwrap_or(0),
            places: places
                .iter()
                .map(|place| u64::try_from(*place).ok())
                .collect(),
        })
    }

    /// The claim counter alone.
    pub async fn claims(&self) -> Result<u64, StoreError> {
        let mut conn = self.redis.conn().await?;
        let claims: Option<u64> = redis::cmd("GET")
            .arg(self.redis.keys.claims())
            .query_async(&mut conn)
            .await?;
        Ok(claims.unwrap_or(0))
    }
}
