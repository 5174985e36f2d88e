//! The one submit path of `POST /v1/jobs`, Piston's `/execute` and
//! `/connect` and Judge0's `/submissions`: a job `prepare` accepted is
//! admitted and queued in one atomic `Store::submit`, and what the store
//! refuses becomes the same `ApiError` for every API (each turns it into its
//! own body). Also what a caller that waits for the job's end uses: how long
//! it waits, and the wait.

use std::time::Duration;

use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::job::{InvalidJob, JobSpec, PreparedJob, Status};
use crate::store::{Admission, JobRecord, NewJob, Quotas, StoreError, SubmitOutcome, now_ms};

/// What a waiting submit allows beyond the job's own wall limits (queueing,
/// container start, removal), before `max_wait` caps it.
const WAIT_SLACK: Duration = Duration::from_secs(30);

/// A job to submit, once `prepare` accepted it.
pub(crate) struct Submission<'a> {
    pub caller: &'a Caller,
    /// The new job's id.
    pub id: String,
    /// The job as it was asked for: what is stored, and what a worker of
    /// another process prepares again.
    pub spec: &'a JobSpec,
    pub prepared: PreparedJob,
    /// The `Idempotency-Key` and the hash of the body it came with.
    pub idempotency: Option<(&'a str, &'a str)>,
    /// Leave `prepared` to this process's worker, so it does not prepare
    /// the job again (`/v1/jobs` does; the compatible APIs do not).
    pub carry: bool,
    /// The compatible API the job came through, for the log (`None`:
    /// `/v1/jobs`).
    pub via: Option<&'a str>,
}

/// A submission the store took.
#[derive(Debug)]
pub(crate) struct Admitted {
    /// The job's id: the new one, or that of the job the same idempotency
    /// key and body made before.
    pub id: String,
    /// The job was made by an earlier submit with the same idempotency key
    /// and body.
    pub existing: bool,
    /// How long a caller that waits for the job's end waits.
    pub wait_budget: Duration,
}

/// A draining server takes no new job; every API asks before it reads or
/// checks the job, so a draining server answers 503 whatever the body.
pub(crate) fn refuse_while_draining(state: &ApiState) -> Result<(), ApiError> {
    if state.inner.draining.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    Ok(())
}

/// Admits and queues `submission` in one atomic `Store::submit` (queue
/// depth, the key's active jobs and storage, its daily quotas,
/// idempotency). A refusal is
/// the `ApiError` every API answers with; none is counted here (each
/// caller counts its refusals with
/// [`count_rejection`](crate::api::http::refusals::count_rejection), its own included).
pub(crate) async fn submit(
    state: &ApiState,
    submission: Submission<'_>,
) -> Result<Admitted, ApiError> {
    let config = &state.inner;
    let Submission {
        caller,
        id,
        spec,
        prepared,
        idempotency,
        carry,
        via,
    } = submission;
    check_egress(caller, &prepared)?;
    let language = prepared.language.id.clone();
    let wait_budget = wait_budget(state, &prepared);
    let admission = admission(state, caller, &prepared);
    let carried = config.carried.as_ref().filter(|_| carry);
    if let Some(carried) = carried {
        // Before the job is queued: this process's worker may claim it at once.
        carried.insert(&id, prepared);
    }
    let outcome = config
        .store
        .jobs()
        .submit(NewJob {
            id: &id,
            spec,
            api_key: &caller.name,
            user: spec.user.as_deref().unwrap_or(""),
            language: &language,
            idempotency,
            admission,
        })
        .await;
    if !matches!(outcome, Ok(SubmitOutcome::Accepted))
        && let Some(carried) = carried
    {
        carried.take(&id);
    }

    match outcome? {
        SubmitOutcome::Accepted => {
            // The targets are the modules that logged these lines before
            // this one existed, so log filters keep selecting them.
            match via {
                None => tracing::info!(
                    target: "code_runner::api::jobs",
                    { job.id = %id, language = %language, api_key = %caller.name },
                    "Job accepted."
                ),
                Some(via) => tracing::info!(
                    target: "code_runner::api::compat",
                    { job.id = %id, language = %language, api_key = %caller.name, via = via },
                    "Job accepted."
                ),
            }
            Ok(Admitted {
                id,
                existing: false,
                wait_budget,
            })
        }
        SubmitOutcome::Existing(id) if idempotency.is_some() => {
            tracing::debug!(
                target: "code_runner::api::jobs",
                { job.id = %id, api_key = %caller.name },
                "idempotent submit: answering with the existing job"
            );
            Ok(Admitted {
                id,
                existing: true,
                wait_budget,
            })
        }
        refused => Err(refusal(refused, &admission, caller, spec)),
    }
}

/// The `ApiError` of a submission the store did not take, with the limit
/// it hit.
fn refusal(
    outcome: SubmitOutcome,
    admission: &Admission,
    caller: &Caller,
    spec: &JobSpec,
) -> ApiError {
    match outcome {
        // `submit` answers an acceptance and an idempotent replay itself.
        // Without an idempotency key the store answers neither an existing
        // job nor a conflict; were it to, the submit is refused, never
        // answered with another job.
        SubmitOutcome::Accepted | SubmitOutcome::Existing(_) | SubmitOutcome::Conflict(_) => {
            ApiError::IdempotencyConflict
        }
        SubmitOutcome::QueueFull { depth } => ApiError::QueueFull {
            depth,
            limit: admission.max_queue_depth,
        },
        SubmitOutcome::KeyLimit { active } => ApiError::KeyLimit {
            active,
            limit: admission.key_limit.unwrap_or(active),
            from_entry: caller.max_active.is_some(),
        },
        SubmitOutcome::UserActiveLimit { active } => ApiError::UserActiveLimit {
            active,
            limit: admission.user_limit.unwrap_or(active),
        },
        SubmitOutcome::UserRateLimit { retry_ms } => ApiError::UserRateLimit {
            limit: admission.user_rate_per_minute.unwrap_or(0),
            wait_secs: retry_ms.div_ceil(1000),
        },
        SubmitOutcome::KeyStorage { held, needed } => ApiError::KeyStorage {
            held,
            needed,
            budget: admission.storage_budget,
        },
        SubmitOutcome::QuotaExceeded {
            quota,
            limit,
            used,
            resets_ms,
        } => ApiError::QuotaExceeded {
            quota,
            user: spec.user.clone().unwrap_or_default(),
            limit,
            used,
            resets_ms,
            retry_after_secs: resets_ms.saturating_sub(now_ms()).div_ceil(1000),
        },
    }
}

/// A job may reach only hosts its key allows: a 400 naming the first entry
/// of its `network.allow` that the key's allowlist does not cover.
fn check_egress(caller: &Caller, prepared: &PreparedJob) -> Result<(), ApiError> {
    let Some(allow) = &prepared.egress else {
        return Ok(());
    };
    if caller.egress.is_empty() {
        return Err(InvalidJob::new(
            "network.allow",
            format!(
                "the api key {:?} allows no outbound network (CODE_RUNNER_KEY_EGRESS)",
                caller.name
            ),
        )
        .into());
    }
    allow
        .check_subset(&caller.egress)
        .map_err(|message| InvalidJob::new("network.allow", message).into())
}

/// The store and key limits of a new job, its attempts, and the output that
/// sizes the storage reserved for it.
fn admission(state: &ApiState, caller: &Caller, prepared: &PreparedJob) -> Admission {
    let config = &state.inner;
    Admission {
        max_queue_depth: config.max_queue_depth,
        key_limit: caller.max_active.or(Some(config.limits.key_max_active)),
        max_attempts: prepared.max_attempts(config.limits.max_attempts),
        output_limit_bytes: prepared.record_limit_bytes(),
        storage_budget: state.storage_budget(caller.max_active),
        wall_budget_ms: prepared.stages_wall_ms(),
        weight: caller.tenancy.weight,
        user_limit: caller.tenancy.max_active_per_user,
        user_rate_per_minute: caller.tenancy.user_rate_per_minute,
        quotas: Quotas {
            key_cpu_seconds: caller.tenancy.cpu_seconds_per_day,
            user_cpu_seconds: caller.tenancy.user_cpu_seconds_per_day,
            user_jobs: caller.tenancy.user_jobs_per_day,
        },
    }
}

/// How long a waiting submit waits for `prepared` to end while it is still
/// queued: the wall budget submit stores for it and a slack, at most
/// `max_wait`. Once the job has started, [`wait_for_end`] goes by the
/// deadline the store keeps for it.
fn wait_budget(state: &ApiState, prepared: &PreparedJob) -> Duration {
    state
        .inner
        .max_wait
        .min(Duration::from_millis(prepared.stages_wall_ms()) + WAIT_SLACK)
}

/// How long after its stored deadline a running job's waiter keeps waiting:
/// the worker reports within its grace, the reaper settles after its own.
const PAST_DEADLINE_SLACK: Duration = Duration::from_secs(5);

/// Waits until the job is terminal (woken by its `exit` event, not a
/// timer), `budget` has passed or the server shuts down; returns the job as
/// it is then (`None`: the job is gone). A job that is running when
/// `budget` ends is waited for until its stored deadline (and a slack), at
/// most `max_wait` from the call.
pub(crate) async fn wait_for_end(
    state: &ApiState,
    id: &str,
    budget: Duration,
) -> Result<Option<JobRecord>, StoreError> {
    let called = tokio::time::Instant::now();
    let latest = called + state.inner.max_wait;
    let mut within = budget;
    loop {
        tokio::select! {
            ended = state.feeds.await_exit(id, within) => {
                if ended? {
                    break;
                }
            }
            () = state.shutdown.cancelled() => break,
        }
        let Some(record) = state.inner.store.jobs().get(id).await? else {
            return Ok(None);
        };
        let until = match record.deadline_ms {
            Some(deadline_ms) if record.status == Status::Running => {
                let left = Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
                (tokio::time::Instant::now() + left + PAST_DEADLINE_SLACK).min(latest)
            }
            _ => return Ok(Some(record)),
        };
        let now = tokio::time::Instant::now();
        if until <= now {
            return Ok(Some(record));
        }
        within = until - now;
    }
    state.inner.store.jobs().get(id).await
}
