//! Submit: a new job is admitted (queue depth, the key's `max_active`, the
//! user's `max_active_per_user` and `user_rate_per_minute`, the key's
//! storage budget, its daily quotas against today's usage ledger), counted
//! in the ledger's `submitted`, recorded with its idempotency key and
//! pushed onto `jobs:queue`, in one step (`submit.lua`), and listed in its
//! key's run history. — → `queued`.

use super::script::{StepScript, script_inputs};
use super::{EVENT_OVERHEAD, JOB_OVERHEAD, Jobs, MAX_OUTPUT_EVENTS};
use crate::job::JobSpec;
use crate::job::lifecycle::Step;
use crate::store::overview::RECENT_JOBS_KEPT;
use crate::store::usage::{Day, Quota, Quotas};
use crate::store::{StoreError, now_ms};

script_inputs! {
    struct SubmitInputs {
        keys {
            queue, job, active, idempotency, events, recent, stored, expiry,
            tenants, tenant_weights, users, user_queue, user_active, user_rate,
            summary, key_history, user_history, usage
        }
        args {
            id: String,
            spec: String,
            api_key: String,
            user: String,
            language: String,
            now_ms: u64,
            max_depth: u64,
            key_limit: u64,
            body_hash: String,
            idempotency_ttl: u64,
            metadata: String,
            recent_last: u64,
            max_attempts: u32,
            reserve: u64,
            storage_budget: u64,
            idempotency_member: String,
            wall_budget_ms: u64,
            weight: u32,
            user_limit: u64,
            user_rate_per_minute: u64,
            history_ms: u64,
            usage_prefix: String,
            usage_ttl: u64,
            key_cpu_quota_s: String,
            user_cpu_quota_s: String,
            user_jobs_quota: String,
        }
    }
}

pub(super) fn script() -> StepScript<SubmitInputs> {
    StepScript::new(Step::Submit, include_str!("submit.lua"))
}

/// A job to enqueue.
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
    pub id: &'a str,
    pub spec: &'a JobSpec,
    pub api_key: &'a str,
    /// Who the job is for (its spec's `user`; `""`: the key's anonymous
    /// user).
    pub user: &'a str,
    pub language: &'a str,
    /// Idempotency key and the hash of the request body.
    pub idempotency: Option<(&'a str, &'a str)>,
    pub admission: Admission,
}

/// What a new job is admitted under: the queue and API key limits it must
/// fit, and what it may use once admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub max_queue_depth: u64,
    /// Most queued + running jobs of this API key (`None`: no limit).
    pub key_limit: Option<u64>,
    /// Most times the job may be started (see
    /// [`JobRecord::max_attempts`](crate::store::JobRecord::max_attempts)).
    pub max_attempts: u32,
    /// The most output the job's stages may write, in bytes: with the size
    /// of the stored spec it makes the job's [`storage_reserve`], held
    /// against the key's budget until it ends.
    pub output_limit_bytes: u64,
    /// The API key's storage budget, in bytes.
    pub storage_budget: u64,
    /// The sum of the wall limits of the job's stages, as resolved at
    /// submit ([`crate::job::PreparedJob::stages_wall_ms`]): start adds the
    /// worker's start timeout and grace to it and stores the deadline.
    pub wall_budget_ms: u64,
    /// The key's turns per round of the fair claim.
    pub weight: u32,
    /// Most queued + running jobs of the job's user (`None`: no limit).
    pub user_limit: Option<u64>,
    /// Most submissions of the job's user per minute (`None`: no limit).
    pub user_rate_per_minute: Option<u64>,
    /// The key's daily quotas, checked against today's usage ledger.
    pub quotas: Quotas,
}

/// The most a job can come to hold in Redis, reserved from its API key's
/// storage budget while it is queued or running: its spec, its output
/// twice (events and result, each capped at the stages' output limits, raw
/// bytes), the entries of its output events (at most one per byte of
/// output, at most [`MAX_OUTPUT_EVENTS`]) and the job's fixed overhead.
/// Stdin a client sends is counted as it comes, not reserved.
pub fn storage_reserve(spec_bytes: u64, output_limit_bytes: u64) -> u64 {
    let events = MAX_OUTPUT_EVENTS.min(output_limit_bytes);
    spec_bytes + 2 * output_limit_bytes + events * EVENT_OVERHEAD + JOB_OVERHEAD
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    Accepted,
    /// The idempotency key was used before with the same body: that job.
    Existing(String),
    /// The idempotency key was used before with another body.
    Conflict(String),
    QueueFull {
        depth: u64,
    },
    KeyLimit {
        active: u64,
    },
    /// The job's user has `active` jobs queued or running, its limit.
    UserActiveLimit {
        active: u64,
    },
    /// The job's user submitted its rate's worth; the next submission is
    /// admitted in `retry_ms`.
    UserRateLimit {
        retry_ms: u64,
    },
    /// The key's jobs hold `held` bytes and this one, which would reserve
    /// `needed`, would take the key over its storage budget.
    KeyStorage {
        held: u64,
        needed: u64,
    },
    /// A daily quota of the key is used up: `used` today (CPU ms for the
    /// CPU quotas, submissions for the jobs quota) against its `limit`,
    /// until the next UTC midnight, `resets_ms`.
    QuotaExceeded {
        quota: Quota,
        limit: u64,
        used: u64,
        resets_ms: u64,
    },
}

impl SubmitOutcome {
    fn from_reply(
        reply: &super::script::Reply,
        reserve: u64,
        quotas: &Quotas,
        now_ms: u64,
    ) -> Result<Self, StoreError> {
        Ok(match reply.outcome() {
            "accepted" => SubmitOutcome::Accepted,
            "existing" => SubmitOutcome::Existing(reply.detail(0).to_string()),
            "conflict" => SubmitOutcome::Conflict(reply.detail(0).to_string()),
            "queue_full" => SubmitOutcome::QueueFull {
                depth: reply.number(0)?,
            },
            "key_limit" => SubmitOutcome::KeyLimit {
                active: reply.number(0)?,
            },
            "user_active_limit" => SubmitOutcome::UserActiveLimit {
                active: reply.number(0)?,
            },
            "user_rate_limit" => SubmitOutcome::UserRateLimit {
                retry_ms: reply.number(0)?,
            },
            "key_storage" => SubmitOutcome::KeyStorage {
                held: reply.number(0)?,
                needed: reserve,
            },
            "quota_exceeded" => {
                let quota =
                    Quota::from_option(reply.detail(0)).ok_or_else(|| reply.unexpected())?;
                SubmitOutcome::QuotaExceeded {
                    quota,
                    limit: quota.limit(quotas).ok_or_else(|| reply.unexpected())?,
                    used: reply.number(1)?,
                    resets_ms: Day::from_ms(now_ms).plus(1).start_ms(),
                }
            }
            _ => return Err(reply.unexpected()),
        })
    }
}

impl Jobs {
    /// Enqueues a job, atomically with the admission checks and the
    /// idempotency record.
    pub async fn submit(&self, job: NewJob<'_>) -> Result<SubmitOutcome, StoreError> {
        let spec = serde_json::to_string(job.spec).map_err(|e| StoreError::Corrupt {
            id: job.id.to_string(),
            message: e.to_string(),
        })?;
        // The reserve counts the spec as stored: the JSON just made.
        let reserve = storage_reserve(spec.len() as u64, job.admission.output_limit_bytes);
        let metadata = serde_json::to_string(&job.spec.metadata).unwrap_or_else(|_| "{}".into());
        let keys = &self.redis.keys;
        let now = now_ms();
        let quota = |q: Option<u64>| q.map_or(String::new(), |n| n.to_string());
        let quotas = job.admission.quotas;
        let (idempotency, body_hash) = match job.idempotency {
            Some((key, hash)) => (keys.idempotency(job.api_key, key), hash.to_string()),
            None => (String::new(), String::new()),
        };
        let inputs = SubmitInputs {
            queue: keys.queue(),
            job: keys.job(job.id),
            active: keys.active(job.api_key),
            idempotency,
            events: keys.events(job.id),
            recent: keys.recent(),
            stored: keys.stored(job.api_key),
            expiry: keys.expiry(job.api_key),
            tenants: keys.tenants(),
            tenant_weights: keys.tenant_weights(),
            users: keys.users(job.api_key),
            user_queue: keys.user_queue(job.api_key, job.user),
            user_active: keys.user_active(job.api_key),
            user_rate: keys.user_rate(job.api_key, job.user),
            summary: keys.summary(job.id),
            key_history: keys.history(job.api_key),
            user_history: match job.user {
                "" => String::new(),
                user => keys.user_history(job.api_key, user),
            },
            usage: keys.usage(job.api_key, &Day::from_ms(now).to_string()),
            id: job.id.to_string(),
            spec,
            api_key: job.api_key.to_string(),
            user: job.user.to_string(),
            language: job.language.to_string(),
            now_ms: now,
            max_depth: job.admission.max_queue_depth,
            key_limit: job.admission.key_limit.unwrap_or(0),
            body_hash,
            idempotency_ttl: self.redis.result_ttl_secs() * 24,
            metadata,
            recent_last: RECENT_JOBS_KEPT - 1,
            max_attempts: job.admission.max_attempts,
            reserve,
            storage_budget: job.admission.storage_budget,
            idempotency_member: format!("i:{}", job.idempotency.map_or("", |(key, _)| key)),
            wall_budget_ms: job.admission.wall_budget_ms,
            weight: job.admission.weight.max(1),
            user_limit: job.admission.user_limit.unwrap_or(0),
            user_rate_per_minute: job.admission.user_rate_per_minute.unwrap_or(0),
            history_ms: self.redis.history_window_ms(),
            usage_prefix: keys.usage_prefix(job.api_key),
            usage_ttl: self.redis.usage_retention.as_secs().max(1),
            key_cpu_quota_s: quota(quotas.key_cpu_seconds),
            user_cpu_quota_s: quota(quotas.user_cpu_seconds),
            user_jobs_quota: quota(quotas.user_jobs),
        };
        let mut conn = self.redis.conn().await?;
        let reply = self.scripts.submit.run(&mut conn, &inputs, &[]).await?;
        SubmitOutcome::from_reply(&reply, reserve, &quotas, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::job::script::Reply;

    fn reply(parts: &[&str]) -> Reply {
        Reply {
            step: Step::Submit,
            parts: parts.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn unexpected_replies_are_errors() {
        assert!(matches!(
            SubmitOutcome::from_reply(&reply(&["nonsense"]), 0, &Quotas::default(), 0),
            Err(StoreError::UnexpectedReply {
                script: "submit",
                ..
            })
        ));
        assert!(matches!(
            SubmitOutcome::from_reply(&reply(&["key_limit", "lots"]), 0, &Quotas::default(), 0),
            Err(StoreError::UnexpectedReply { .. })
        ));
        assert_eq!(
            SubmitOutcome::from_reply(&reply(&["key_limit", "3"]), 0, &Quotas::default(), 0)
                .unwrap(),
            SubmitOutcome::KeyLimit { active: 3 }
        );
        assert_eq!(
            SubmitOutcome::from_reply(&reply(&["key_storage", "77"]), 1024, &Quotas::default(), 0)
                .unwrap(),
            SubmitOutcome::KeyStorage {
                held: 77,
                needed: 1024
            }
        );
    }

    #[test]
    fn a_quota_refusal_names_its_quota_and_the_next_utc_midnight() {
        let quotas = Quotas {
            user_jobs: Some(5),
            ..Quotas::default()
        };
        let refusal = |parts: &[&str]| {
            SubmitOutcome::from_reply(&reply(parts), 0, &quotas, 1_796_118_900_000)
        };
        assert_eq!(
            refusal(&["quota_exceeded", "user_jobs_per_day", "5"]).unwrap(),
            SubmitOutcome::QuotaExceeded {
                quota: Quota::UserJobs,
                limit: 5,
                used: 5,
                // 2026-12-01T09:55Z: the next midnight is 2026-12-02T00:00Z.
                resets_ms: 1_796_169_600_000,
            }
        );
        // A quota the key does not have, or an unknown one, is a bug.
        assert!(refusal(&["quota_exceeded", "cpu_seconds_per_day", "5"]).is_err());
        assert!(refusal(&["quota_exceeded", "nonsense", "5"]).is_err());
    }

    #[test]
    fn a_reserve_covers_the_output_twice_and_the_overheads() {
        assert_eq!(
            storage_reserve(100, 1 << 20),
            100 + (2 << 20) + MAX_OUTPUT_EVENTS * EVENT_OVERHEAD + JOB_OVERHEAD
        );
        // A job that may print 100 bytes has at most 100 output events.
        assert_eq!(
            storage_reserve(100, 100),
            100 + 200 + 100 * EVENT_OVERHEAD + JOB_OVERHEAD
        );
    }
}
