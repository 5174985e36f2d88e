//! One claimed job, from START to a durable result: mark it running, take
//! the prepared job the API of this process left (or check it still
//! validates here), take a warm sandbox of its class if one is ready, run it
//! with its control relay, the status a kill gives it, write the result (retrying
//! through Redis outages), count it, and only then remove its container.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::backoff::{Backoff, sleep_unless_cancelled};
use super::control::{ControlRelay, INPUT_BUFFER};
use super::removals;
use super::stream::{EVENT_BUFFER, EventStream};
use crate::job::events::JobEvent;
use crate::job::{JobResult, JobSpec, PreparedJob, StartKind, Status, prepare};
use crate::sandbox::{Cleanup, JobIo};
use crate::store::{
    FinishOutcome, ReleaseOutcome, Skipped, StartOutcome, Started, StoreError, now_ms,
};

/// Attempts to give a claimed job back to the queue at shutdown before it
/// is left in the processing list for recovery.
const RELEASE_ATTEMPTS: u32 = 5;

/// What killed a job before it ended on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kill {
    /// A client cancelled it (`DELETE /v1/jobs/<id>`).
    Client,
    /// The worker shut down and the drain timeout passed.
    Drain,
}

/// The error of a job the drain killed.
pub(super) fn drain_message(drain_timeout: Duration) -> String {
    format!(
        "the worker shut down (drain timeout of {} ms passed) while the job was running",
        drain_timeout.as_millis()
    )
}

/// The result of a job the worker killed, as it finishes it. The engine reports a killed job
/// as `cancelled` (or `error` when the kill came before the sandbox was
/// ready); a client's cancel stays `cancelled`, a drain kill is the
/// platform's doing and becomes `error` with the reason. A job that ended on
/// its own before the kill landed keeps its status.
pub(super) fn apply_kill(
    mut result: JobResult,
    kill: Option<Kill>,
    drain_timeout: Duration,
) -> JobResult {
    if !matches!(result.status, Status::Cancelled | Status::Error) {
        return result;
    }
    match kill {
        None => {}
        Some(Kill::Client) => {
            result.status = Status::Cancelled;
            result.error = None;
        }
        Some(Kill::Drain) => {
            result.status = Status::Error;
            result.error = Some(drain_message(drain_timeout));
        }
    }
    result
}

/// For a graded job whose checker program has a compile stage, whether
/// its checker started from a compile the worker kept; `None` for any
/// other job.
fn checker_cache_hit(job: &PreparedJob, result: &JobResult) -> Option<bool> {
    use crate::job::grading::PreparedCheck;
    let PreparedCheck::Program(checker) = &job.tests.as_ref()?.check else {
        return None;
    };
    checker.language.compile.is_some().then(|| {
        result
            .grading
            .as_ref()
            .and_then(|grading| grading.checker)
            .is_some_and(|checker| checker.compile_cached)
    })
}

/// Whether the result holds any output file (the job's, or a test's).
fn has_outputs(result: &JobResult) -> bool {
    !result.outputs.is_empty()
        || result
            .grading
            .as_ref()
            .is_some_and(|g| g.tests.iter().any(|t| !t.outputs.is_empty()))
}

/// The result of a job that never reached a sandbox.
fn refused(language: &str, version: Option<&str>, error: String) -> JobResult {
    JobResult::without_stages(Status::Error, language, version.unwrap_or_default())
        .with_error(error)
}

impl Shared {
    /// The task of one claimed job; `id` is in this worker's processing
    /// list, and the caller holds its slot until this returns.
    pub(super) async fn run_claimed(&self, id: &str, claimed_at: Instant) {
        let carried = self.carried.as_ref().and_then(|c| c.take(id));
        let Some(outcome) = self.start(id, carried.is_none()).await else {
            return;
        };
        let Started {
            spec,
            created_ms,
            attempts,
            deadline_ms,
            api_key,
        } = match outcome {
            StartOutcome::Start(started) => started,
            StartOutcome::Skip(skipped) => {
                tracing::debug!(job.id = %id, ?skipped, "the job is no longer queued; not starting it");
                return;
            }
        };
        let mut job = match carried {
            Some(job) => job,
            None => match self.prepare_stored(id, &spec, &api_key).await {
                Ok(job) => job,
                Err(result) => return self.conclude(id, attempts, *result, &[], None).await,
            },
        };
        // Compiled checkers are kept per API key.
        job.tenant = Some(api_key);
        let language = job.language.id.as_str();
        let waited = now_ms().saturating_sub(created_ms);
        self.metrics
            .queue_wait
            .with_label_values(&[language])
            .observe(waited as f64 / 1000.0);
        tracing::info!(
            job.id = %id,
            worker.id = %self.config.id,
            language,
            attempts,
            queue_wait_ms = waited,
            "job started"
        );
        let started = Instant::now();
        let (result, tail, mut cleanup) = self
            .execute(id, attempts, &job, deadline_ms, claimed_at)
            .await;
        if !self.removals.has_room() {
            // The container will be removed in this slot: its exit goes
            // on while the result is written, as without linger.
            cleanup.stop_lingering();
        }
        self.conclude(id, attempts, result, &tail, Some(started))
            .await;
        // The result is durable (or given up on): now the container goes,
        // still within the job's slot, unless its supervisor lingers idle
        // or it is stopping by itself, and it may wait its turn in the
        // removal queue (`removals`). A removal Docker did not answer means
        // it is down: the claim loop then asks it before claiming again.
        let others_busy = self.is_busy(self.slots_used().saturating_sub(1));
        if let Some(cleanup) = self.removals.defer(cleanup, others_busy).await {
            removals::remove(&*self.engine, cleanup).await;
        }
    }

    /// The job from the spec stored in Redis, validated here, with the
    /// bytes of the files it names by reference read from `api_key`'s
    /// files; the result to store when it cannot run.
    async fn prepare_stored(
        &self,
        id: &str,
        spec: &str,
        api_key: &str,
    ) -> Result<PreparedJob, Box<JobResult>> {
        let spec: JobSpec = serde_json::from_str(spec).map_err(|error| {
            let message = format!("the job's spec in redis cannot be read: {error}");
            tracing::warn!(job.id = %id, %message, "cannot start the job");
            Box::new(refused("unknown", None, message))
        })?;
        let spec = self.with_stored_files(id, spec, api_key).await?;
        prepare(&spec, &self.catalog, &self.policy).map_err(|invalid| {
            let message = format!("the job cannot run on this worker: {invalid}");
            Box::new(refused(&spec.language, spec.version.as_deref(), message))
        })
    }

    /// `spec` with the bytes of the files it names by reference; a file
    /// gone since the job was taken (deleted, or unused for its keep time)
    /// is the job's error, naming it.
    async fn with_stored_files(
        &self,
        id: &str,
        spec: JobSpec,
        api_key: &str,
    ) -> Result<JobSpec, Box<JobResult>> {
        let fail = |message: String| {
            tracing::warn!(job.id = %id, %message, "cannot start the job");
            Box::new(refused(&spec.language, spec.version.as_deref(), message))
        };
        let digests = crate::job::refs::references(&spec)
            .map_err(|invalid| fail(format!("the job cannot run on this worker: {invalid}")))?;
        if digests.is_empty() {
            return Ok(spec);
        }
        let mut contents = std::collections::HashMap::new();
        for digest in digests {
            match self.store.files().read(api_key, &digest).await {
                Ok(Some(bytes)) => {
                    contents.insert(digest, bytes);
                }
                Ok(None) => {
                    return Err(fail(format!(
                        "the stored file {digest} the job names is gone (deleted, or unused for its keep time) since the job was taken; put it again and resubmit"
                    )));
                }
                Err(error) => {
                    return Err(fail(format!(
                        "the stored file {digest} the job names cannot be read: {error}"
                    )));
                }
            }
        }
        crate::job::refs::with_contents(&spec, &contents).map_err(|digest| {
            fail(format!(
                "the stored file {digest} the job names was not read"
            ))
        })
    }

    /// Marks the job running, retrying through Redis failures; `None` when
    /// the worker shut down meanwhile (the job was given back).
    async fn start(&self, id: &str, with_spec: bool) -> Option<StartOutcome> {
        let mut backoff = Backoff::redis();
        let mut retried = false;
        loop {
            let host = self.engine.host_id();
            let slack = self.engine.budget().slack();
            let started = self
                .store
                .jobs()
                .start(id, &self.config.id, host, with_spec, slack)
                .await;
            let error = match started {
                Ok(StartOutcome::Skip(Skipped::RunningHere)) if retried => {
                    // An earlier start may have run with its reply lost: a
                    // job running on this worker is ours to run.
                    let spec = async {
                        if with_spec {
                            Ok(self.store.jobs().spec(id).await?.unwrap_or_default())
                        } else {
                            Ok(String::new())
                        }
                    };
                    match (self.store.jobs().get(id).await, spec.await) {
                        (Ok(Some(record)), Ok(spec))
                            if record.worker.as_deref() == Some(&self.config.id) =>
                        {
                            return Some(StartOutcome::Start(Started {
                                spec,
                                created_ms: record.created_ms,
                                attempts: record.attempts,
                                deadline_ms: record.deadline_ms,
                                api_key: record.api_key,
                            }));
                        }
                        (Err(error), _) | (_, Err(error)) => error,
                        (Ok(_), Ok(_)) => return Some(StartOutcome::Skip(Skipped::RunningHere)),
                    }
                }
                Ok(outcome) => return Some(outcome),
                Err(error) => error,
            };
            retried = true;
            let delay = backoff.next_delay();
            tracing::warn!(
                job.id = %id,
                %error,
                retry_ms = delay.as_millis() as u64,
                "could not mark the claimed job running; retrying"
            );
            if !sleep_unless_cancelled(delay, &self.shutdown).await
                || !self.reannounce(&self.shutdown).await
            {
                self.release(id).await;
                return None;
            }
        }
    }

    /// Gives a claimed job that will not start back to the queue (a few
    /// attempts). If Redis stays down it stays in the processing list, and
    /// the worker does not retire, so the reaper finds it after the
    /// heartbeat expired.
    pub(super) async fn release(&self, id: &str) {
        let mut backoff = Backoff::redis();
        for attempt in 1..=RELEASE_ATTEMPTS {
            match self.store.jobs().release(id, &self.config.id).await {
                Ok(ReleaseOutcome::Requeued) => {
                    tracing::info!(job.id = %id, "gave the claimed job back to the queue");
                    return;
                }
                Ok(outcome) => {
                    tracing::debug!(job.id = %id, ?outcome, "the claimed job was not queued any more; nothing to give back");
                    return;
                }
                Err(error) if attempt < RELEASE_ATTEMPTS => {
                    tracing::warn!(job.id = %id, %error, "could not give the claimed job back; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(error) => {
                    self.mark_abandoned();
                    tracing::error!(
                        job.id = %id,
                        %error,
                        "could not give the claimed job back; it stays in this worker's processing list for recovery"
                    );
                }
            }
        }
    }

    /// Runs the job in a sandbox (a warm one of its class when the pool has
    /// one ready) with its control relay and its events stream; the finished
    /// result, the job's events not appended yet (they go with the result,
    /// before its `exit` event, which so stays the last one), and the
    /// container still to remove.
    async fn execute(
        &self,
        id: &str,
        attempt: u32,
        job: &PreparedJob,
        deadline_ms: Option<u64>,
        claimed_at: Instant,
    ) -> (JobResult, Vec<JobEvent>, Cleanup) {
        let cancel = self.drain_kill.child_token();
        let (input, input_rx) = mpsc::channel(INPUT_BUFFER);
        let (events, events_rx) = mpsc::channel(EVENT_BUFFER);
        let io = JobIo {
            events: Some(events),
            input: Some(input_rx),
            cancel: cancel.clone(),
            deadline_ms,
        };
        let input_marks = Arc::new(AtomicU64::new(0));
        let mut stream = EventStream::new(
            self.store.clone(),
            id,
            &self.config.id,
            attempt,
            Arc::clone(&input_marks),
        );
        let done = CancellationToken::new();
        let relay = ControlRelay {
            reader: &self.controls,
            job_id: id,
            cancel,
            input,
            done: done.clone(),
            input_marks,
        };
        let warm = match &self.pool {
            Some(pool) => pool.claim(job).await,
            None => None,
        };
        let run = async {
            let outcome = self.engine.run_job(id, job, io, warm).await;
            done.cancel();
            outcome
        };
        // The engine drops the events sender when the job ends, which ends
        // `follow`.
        let (outcome, client_cancelled, ()) =
            tokio::join!(run, relay.run(), stream.follow(events_rx));
        let kill = if client_cancelled {
            Some(Kill::Client)
        } else if self.drain_kill.is_cancelled() {
            Some(Kill::Drain)
        } else {
            None
        };
        let result = apply_kill(outcome.result, kill, self.config.drain_timeout);
        let start = result.start.unwrap_or(StartKind::Cold);
        self.metrics
            .job_starts
            .with_label_values(&[&job.language.id, start.as_str()])
            .inc();
        if let Some(program_started) = stream.first_stage_at() {
            self.metrics
                .claim_to_start
                .with_label_values(&[start.as_str()])
                .observe(program_started.duration_since(claimed_at).as_secs_f64());
        }
        for (verdict, count) in stream.egress_verdicts() {
            self.metrics
                .egress_connections
                .with_label_values(&[verdict])
                .inc_by(*count);
        }
        if let Some(totals) = &result.egress {
            for (direction, bytes) in [("up", totals.bytes_up), ("down", totals.bytes_down)] {
                self.metrics
                    .egress_bytes
                    .with_label_values(&[direction])
                    .inc_by(bytes);
            }
        }
        if let Some(hit) = checker_cache_hit(job, &result) {
            self.metrics
                .checker_compiles
                .with_label_values(&[if hit { "hit" } else { "miss" }])
                .inc();
        }
        tracing::debug!(job.id = %id, container = %outcome.container, start = start.as_str(), "the job's sandbox is done");
        let mut result = result;
        if has_outputs(&result) {
            let budget = match self.store.jobs().storage_budget(id).await {
                Ok(budget) => budget,
                Err(error) => {
                    tracing::warn!(job.id = %id, %error, "cannot read the job's storage budget; its large output files are not stored");
                    None
                }
            };
            let storage = super::outputs::Storage {
                files: self.store.files(),
                api_key: job.tenant.as_deref().unwrap_or_default(),
                budget,
            };
            super::outputs::settle(&mut result, &self.config.outputs, &storage).await;
        }
        let tail = stream.close(&result);
        (result, tail, outcome.cleanup)
    }

    /// Writes the result, then counts and logs the job.
    async fn conclude(
        &self,
        id: &str,
        attempt: u32,
        result: JobResult,
        tail: &[JobEvent],
        started: Option<Instant>,
    ) {
        let language = result.language.as_str();
        if let Some(started) = started {
            self.metrics
                .run
                .with_label_values(&[language])
                .observe(started.elapsed().as_secs_f64());
            if result.timings.container_start_ms > 0 {
                self.metrics
                    .container_start
                    .with_label_values(&[language])
                    .observe(result.timings.container_start_ms as f64 / 1000.0);
            }
        }
        self.metrics
            .jobs
            .with_label_values(&[language, result.status.as_str()])
            .inc();
        let written = self.write_result(id, attempt, &result, tail).await;
        let status = result.status.as_str();
        let total_ms = result.timings.total_ms;
        match (&result.error, result.status) {
            (Some(error), _) => {
                tracing::warn!(job.id = %id, status, %error, written, "job ended with an error")
            }
            (None, Status::Cancelled) => {
                tracing::info!(job.id = %id, status, total_ms, written, "job cancelled")
            }
            (None, _) => tracing::info!(job.id = %id, status, total_ms, written, "job finished"),
        }
    }

    /// Records the result durably (FINISH drops the id from the processing
    /// list only after the result is stored), retrying with backoff through
    /// Redis failures until it works or the worker gives up at exit; a result
    /// given up is logged whole at error, never dropped silently. After a
    /// failure the worker re-announces itself (its heartbeat) before it
    /// tries again, so a reaper never finds it silent once Redis is back.
    async fn write_result(
        &self,
        id: &str,
        attempt: u32,
        result: &JobResult,
        tail: &[JobEvent],
    ) -> bool {
        let mut backoff = Backoff::redis();
        loop {
            let error = match self
                .store
                .jobs()
                .finish_with_events(id, &self.config.id, attempt, result, tail)
                .await
            {
                Ok(FinishOutcome::Finished) => return true,
                Ok(FinishOutcome::Late) => {
                    tracing::info!(
                        job.id = %id,
                        attempt,
                        status = result.status.as_str(),
                        "the job's result came after the platform gave up on this attempt; it replaced the verdict"
                    );
                    return true;
                }
                Ok(FinishOutcome::Stale(status)) => {
                    tracing::warn!(
                        job.id = %id,
                        attempt,
                        status = status.as_str(),
                        ours = result.status.as_str(),
                        "the job had ended otherwise (or runs as another attempt); this attempt's result was not recorded"
                    );
                    return true;
                }
                Ok(FinishOutcome::Missing) => {
                    tracing::warn!(job.id = %id, "the job expired before its result could be written");
                    return true;
                }
                Err(error @ StoreError::Corrupt { .. }) => {
                    self.give_up_result(id, result, tail.len(), &error);
                    return false;
                }
                Err(error) => error,
            };
            let delay = backoff.next_delay();
            tracing::warn!(
                job.id = %id,
                %error,
                retry_ms = delay.as_millis() as u64,
                "could not write the job's result; retrying"
            );
            if !sleep_unless_cancelled(delay, &self.give_up).await
                || !self.reannounce(&self.give_up).await
            {
                self.give_up_result(id, result, tail.len(), &error);
                return false;
            }
        }
    }

    /// Logs a result given up on, whole; the events that were to go with it
    /// are not in the stream either (the result has their output).
    fn give_up_result(&self, id: &str, result: &JobResult, events: usize, error: &StoreError) {
        self.mark_abandoned();
        let result = serde_json::to_string(result).unwrap_or_default();
        tracing::error!(
            job.id = %id,
            worker.id = %self.config.id,
            %error,
            %result,
            events,
            "gave up writing the job's result and its last events; the job stays in this worker's processing list"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: Status, error: Option<&str>) -> JobResult {
        JobResult {
            status,
            error: error.map(str::to_string),
            ..refused("python", Some("3.12"), String::new())
        }
    }

    const DRAIN: Duration = Duration::from_millis(300);

    #[test]
    fn a_drain_kill_finishes_as_error_with_the_reason() {
        let finished = apply_kill(result(Status::Cancelled, None), Some(Kill::Drain), DRAIN);
        assert_eq!(finished.status, Status::Error);
        assert_eq!(
            finished.error.as_deref(),
            Some("the worker shut down (drain timeout of 300 ms passed) while the job was running")
        );
        // Killed before the sandbox was ready: the engine says error, with
        // its own message; the drain is the real reason.
        let finished = apply_kill(
            result(Status::Error, Some("the sandbox did not start within 30 s")),
            Some(Kill::Drain),
            DRAIN,
        );
        assert_eq!(finished.error, Some(drain_message(DRAIN)));
    }

    #[test]
    fn a_client_cancel_stays_cancelled() {
        let finished = apply_kill(result(Status::Cancelled, None), Some(Kill::Client), DRAIN);
        assert_eq!(finished.status, Status::Cancelled);
        assert_eq!(finished.error, None);
        let finished = apply_kill(
            result(Status::Error, Some("the sandbox did not start within 30 s")),
            Some(Kill::Client),
            DRAIN,
        );
        assert_eq!(finished.status, Status::Cancelled);
        assert_eq!(finished.error, None);
    }

    #[test]
    fn a_job_that_ended_on_its_own_keeps_its_status() {
        for status in [Status::Succeeded, Status::Failed, Status::TimedOut] {
            for kill in [None, Some(Kill::Client), Some(Kill::Drain)] {
                assert_eq!(apply_kill(result(status, None), kill, DRAIN).status, status);
            }
        }
        let error = result(Status::Error, Some("docker could not create the sandbox"));
        assert_eq!(apply_kill(error.clone(), None, DRAIN), error);
    }
}
