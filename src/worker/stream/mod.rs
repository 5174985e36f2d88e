//! The live events of a running job: what the sandbox reports as it happens
//! goes into the job's events stream (through [`Jobs::append_events`](crate::store::Jobs::append_events)) as
//! stage and output events, coalesced so a flood of tiny writes does not
//! become a flood of Redis commands.
//!
//! - Output after a quiet spell is written at once (leading edge), and so is
//!   output that follows input the job was sent since the last write (an
//!   interactive program answering: a ping-pong is not a flood). Otherwise,
//!   after a write, more output waits until [`FLUSH_INTERVAL`] has passed
//!   since that write, so a flood is coalesced into one `append_events` call
//!   per interval (or as soon as [`FLUSH_BYTES`] of it wait). A stage start
//!   goes at once, with everything before it, in order; so does a stage's
//!   end, after waiting up to [`STAGE_END_HOLD`] for what follows it: the
//!   job's end, normally, and then it goes with the result (output
//!   written during the hold leaves the end held). Adjacent
//!   chunks of one stream become one event (of about [`MAX_EVENT_BYTES`] at
//!   most); an incomplete UTF-8 sequence at the end of a stream's buffer
//!   waits for the rest of the character, so text stays text, until the stage
//!   ends. This policy is [`coalesce`]; the rest of this module is the task
//!   that appends.
//! - One append is in flight at a time, and the channel from the sandbox
//!   is read meanwhile: a slow or absent Redis never blocks the sandbox. A
//!   failed append is retried with the worker's backoff, with whatever came
//!   meanwhile; while Redis is away, at most [`MAX_BUFFERED_BYTES`] of output
//!   are held and the rest is dropped from the stream (with one warning; the
//!   result still has it).
//! - When the job ended, [`EventStream::close`] hands what is left (and the
//!   end of a stage the sandbox never reported) to the worker, which writes
//!   it with the result, in one step and before the `exit` event, so that
//!   event is the last one (`Jobs::finish_with_events`). The result's write
//!   retries through a Redis outage, so output held through it reaches the
//!   stream; only when the worker gives up (at shutdown) are they given up,
//!   with the result, which is logged whole.
//!
//! [`FLUSH_INTERVAL`]: coalesce::FLUSH_INTERVAL
//! [`MAX_EVENT_BYTES`]: coalesce::MAX_EVENT_BYTES

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::backoff::Backoff;
use crate::job::JobResult;
use crate::job::events::{JobEvent, StageState};
use crate::sandbox::SandboxEvent;
use crate::store::Store;

mod coalesce;

use coalesce::{Coalescer, FLUSH_BYTES, Stream, flush_due};

/// Sandbox events buffered between the engine and the stream; the stream
/// reads them as they come, so this only absorbs bursts.
pub(super) const EVENT_BUFFER: usize = 256;
/// Most output held while it cannot be written; more is dropped.
const MAX_BUFFERED_BYTES: usize = 4 * 1024 * 1024;
/// Longest wait for one `append_events` call.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a stage's end waits for what follows it before it is written.
/// The supervisor sends `done` right after the last stage's end, so the
/// job's end comes within this (a few ms; the rest is margin for a loaded
/// machine) and both go with the result: one Redis step at the end of a
/// job instead of two, and the result sooner. A stage that another
/// follows is followed by that stage's start, which goes at once and takes
/// the end with it. So the hold never delays the result, and a stage's end
/// reaches the stream at most this late, never after the `exit` event.
const STAGE_END_HOLD: Duration = Duration::from_millis(50);

/// When an event taken into the buffer wants it written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flush {
    /// At once.
    Now,
    /// Within [`STAGE_END_HOLD`].
    Soon,
    /// As output goes ([`flush_due`]).
    AsOutput,
}

/// A batch of events on its way to Redis.
#[derive(Debug, Default)]
struct Batch {
    events: Vec<JobEvent>,
    output_bytes: usize,
}

impl Batch {
    fn extend(&mut self, other: Batch) {
        self.events.extend(other.events);
        self.output_bytes += other.output_bytes;
    }
}

enum Attempt {
    Written,
    /// The job is not running any more (the reaper took it back or settled it): nothing
    /// more can be appended.
    JobEnded,
    Failed(String),
}

type InFlight = Pin<Box<dyn Future<Output = (Batch, Attempt)> + Send>>;

/// The events stream of one running job; see the module documentation.
pub(super) struct EventStream {
    store: Store,
    job_id: String,
    /// This worker and the job's attempt it runs: only that attempt's
    /// events are appended.
    worker: String,
    attempt: u32,
    coalescer: Coalescer,
    /// Events taken from the coalescer whose append failed, first in line.
    retry: Batch,
    /// Output bytes accepted and neither written nor given up.
    held: usize,
    /// The stage that started and has not ended.
    open_stage: Option<String>,
    /// Until when a stage's end that is the last event held waits for the
    /// job's end ([`STAGE_END_HOLD`]): output written meanwhile leaves it
    /// held, so it still goes with the result.
    end_held_until: Option<Instant>,
    backoff: Backoff,
    /// Nothing more can be appended (the job is not running any more).
    ended: bool,
    /// Output was dropped because too much was held.
    dropped: bool,
    /// When the sandbox reported the start of the job's first stage.
    first_stage_at: Option<std::time::Instant>,
    /// Counts the input delivered to the job (the control relay adds one
    /// per stdin message); output after new input goes out at once.
    input_marks: Arc<AtomicU64>,
    /// The job's egress connections by verdict (`allowed` or the refusal's
    /// reason), for the metrics (the bytes are in the result's totals).
    egress_verdicts: std::collections::BTreeMap<String, u64>,
}

impl EventStream {
    pub(super) fn new(
        store: Store,
        job_id: &str,
        worker: &str,
        attempt: u32,
        input_marks: Arc<AtomicU64>,
    ) -> Self {
        Self {
            input_marks,
            store,
            job_id: job_id.to_string(),
            worker: worker.to_string(),
            attempt,
            coalescer: Coalescer::default(),
            retry: Batch::default(),
            held: 0,
            open_stage: None,
            end_held_until: None,
            backoff: Backoff::redis(),
            ended: false,
            dropped: false,
            first_stage_at: None,
            egress_verdicts: Default::default(),
        }
    }

    /// When the job's program started (its first stage), if it did.
    pub(super) fn first_stage_at(&self) -> Option<std::time::Instant> {
        self.first_stage_at
    }

    /// The job's egress connections so far, by verdict.
    pub(super) fn egress_verdicts(&self) -> &std::collections::BTreeMap<String, u64> {
        &self.egress_verdicts
    }

    /// Streams the sandbox's events until the channel closes (the job
    /// ended) and no append is in flight. What is still buffered then is for
    /// [`Self::close`].
    pub(super) async fn follow(&mut self, mut events: mpsc::Receiver<SandboxEvent>) {
        let mut open = true;
        let mut in_flight: Option<InFlight> = None;
        // When buffered output must go out.
        let mut due: Option<Instant> = None;
        // When the last write started, and the input count then.
        let mut last_write: Option<Instant> = None;
        let mut input_at_write = self.input_marks.load(Ordering::Relaxed);
        // When a failed append may be tried again.
        let mut retry_at: Option<Instant> = None;
        let mut urgent = false;
        loop {
            if in_flight.is_none() && !self.ended {
                let now = Instant::now();
                let may = retry_at.is_none_or(|at| at <= now);
                let wanted =
                    !self.retry.events.is_empty() || urgent || due.is_some_and(|at| at <= now);
                if may && wanted {
                    urgent = false;
                    due = None;
                    retry_at = None;
                    let batch = self.next_batch(false);
                    if !batch.events.is_empty() {
                        last_write = Some(now);
                        input_at_write = self.input_marks.load(Ordering::Relaxed);
                        in_flight = Some(self.attempt(batch));
                    }
                    // A stage's end kept back: written when its hold ends.
                    if !self.coalescer.is_empty() {
                        due = self.end_held_until;
                    }
                }
            }
            if !open && in_flight.is_none() {
                return;
            }
            let wake = if self.ended || in_flight.is_some() {
                None
            } else {
                retry_at.or(due)
            };
            tokio::select! {
                done = in_flight_write(&mut in_flight), if in_flight.is_some() => {
                    in_flight = None;
                    let (batch, attempt) = done;
                    if let Some(delay) = self.book_append(batch, attempt) {
                        retry_at = Some(Instant::now() + delay);
                    }
                }
                event = events.recv(), if open => match event {
                    Some(event) => {
                        match self.accept(event) {
                            Flush::Now => urgent = true,
                            // A stage's end: written when its hold ends.
                            Flush::Soon => {
                                if let Some(at) = self.end_held_until {
                                    due = Some(due.map_or(at, |due| due.min(at)));
                                }
                            }
                            Flush::AsOutput => {}
                        }
                        if due.is_none() && !self.coalescer.is_empty() {
                            let answering =
                                self.input_marks.load(Ordering::Relaxed) != input_at_write;
                            due = Some(flush_due(Instant::now(), last_write, answering));
                        }
                    }
                    None => open = false,
                },
                () = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            }
        }
    }

    /// Takes one sandbox event into the buffer; when it wants the buffer
    /// written.
    fn accept(&mut self, event: SandboxEvent) -> Flush {
        if matches!(event, SandboxEvent::StageStart { .. }) && self.first_stage_at.is_none() {
            self.first_stage_at = Some(std::time::Instant::now());
        }
        if let SandboxEvent::Egress(connection) = &event {
            let verdict = match &connection.reason {
                Some(reason) if !connection.allowed => reason.as_str(),
                _ => "allowed",
            };
            *self.egress_verdicts.entry(verdict.to_string()).or_default() += 1;
        }
        if self.ended {
            return Flush::AsOutput;
        }
        match event {
            SandboxEvent::Ready => Flush::AsOutput,
            SandboxEvent::StageStart { stage } => {
                self.coalescer.push_event(JobEvent::stage_start(&stage));
                self.open_stage = Some(stage);
                Flush::Now
            }
            SandboxEvent::StageEnd { stage, result } => {
                self.coalescer
                    .push_event(JobEvent::stage_end(&stage, &result));
                self.open_stage = None;
                self.end_held_until = Some(Instant::now() + STAGE_END_HOLD);
                Flush::Soon
            }
            SandboxEvent::TestStart { index, name } => {
                self.coalescer.push_event(JobEvent::Test {
                    index,
                    name,
                    state: StageState::Start,
                    outcome: None,
                });
                Flush::Now
            }
            SandboxEvent::TestEnd(test) => {
                let test = *test;
                self.coalescer.push_event(JobEvent::Test {
                    index: test.index,
                    name: test.name,
                    state: StageState::End,
                    outcome: Some(Box::new(test.outcome)),
                });
                Flush::Now
            }
            SandboxEvent::Stdout(data) => self.output(Stream::Stdout, data),
            SandboxEvent::Stderr(data) => self.output(Stream::Stderr, data),
            SandboxEvent::InputWanted => {
                // After the output before it (the coalescer keeps the order),
                // and at once: the student is looking at the prompt.
                self.coalescer.push_event(JobEvent::InputWanted);
                Flush::Now
            }
            SandboxEvent::Egress(connection) => {
                self.coalescer.push_event(JobEvent::Egress(connection));
                Flush::Now
            }
        }
    }

    fn output(&mut self, stream: Stream, data: Vec<u8>) -> Flush {
        if self.held + data.len() > MAX_BUFFERED_BYTES {
            if !self.dropped {
                self.dropped = true;
                tracing::warn!(
                    job.id = %self.job_id,
                    held_bytes = self.held,
                    "redis is not taking the job's events; dropping output from its events stream (the result keeps it)"
                );
            }
            return Flush::AsOutput;
        }
        self.held += data.len();
        self.coalescer.push_output(stream, data);
        if self.coalescer.output_bytes >= FLUSH_BYTES {
            Flush::Now
        } else {
            Flush::AsOutput
        }
    }

    /// The failed batch (if any) followed by what the coalescer holds
    /// (but a stage's end still in its hold, unless `last`).
    fn next_batch(&mut self, last: bool) -> Batch {
        let mut batch = std::mem::take(&mut self.retry);
        let holding = !last && self.end_held_until.is_some_and(|at| Instant::now() < at);
        let (events, output_bytes) = if holding {
            self.coalescer.take_holding_stage_end()
        } else {
            self.coalescer.take(last)
        };
        batch.extend(Batch {
            events,
            output_bytes,
        });
        batch
    }

    fn attempt(&self, batch: Batch) -> InFlight {
        let store = self.store.clone();
        let id = self.job_id.clone();
        let (worker, job_attempt) = (self.worker.clone(), self.attempt);
        Box::pin(async move {
            let attempt = match tokio::time::timeout(
                ATTEMPT_TIMEOUT,
                store
                    .jobs()
                    .append_events(&id, &worker, job_attempt, &batch.events),
            )
            .await
            {
                Ok(Ok(Some(_))) => Attempt::Written,
                Ok(Ok(None)) => Attempt::JobEnded,
                Ok(Err(error)) => Attempt::Failed(error.to_string()),
                Err(_) => Attempt::Failed(format!(
                    "no answer within {} ms",
                    ATTEMPT_TIMEOUT.as_millis()
                )),
            };
            (batch, attempt)
        })
    }

    /// Books the outcome of an append; the delay before the next attempt
    /// when it failed (the batch is then first in line again).
    fn book_append(&mut self, batch: Batch, attempt: Attempt) -> Option<Duration> {
        match attempt {
            Attempt::Written => {
                self.backoff.reset();
                self.held = self.held.saturating_sub(batch.output_bytes);
                if self.dropped && self.held == 0 {
                    self.dropped = false;
                }
                None
            }
            Attempt::JobEnded => {
                tracing::debug!(
                    job.id = %self.job_id,
                    "the job is no longer running; not appending its events"
                );
                self.ended = true;
                self.held = 0;
                self.coalescer = Coalescer::default();
                None
            }
            Attempt::Failed(error) => {
                let mut retry = batch;
                retry.extend(std::mem::take(&mut self.retry));
                self.retry = retry;
                let delay = self.backoff.next_delay();
                tracing::warn!(
                    job.id = %self.job_id,
                    %error,
                    events = self.retry.events.len(),
                    retry_ms = delay.as_millis() as u64,
                    "could not append the job's events; retrying (the job keeps running)"
                );
                Some(delay)
            }
        }
    }

    /// What is left to write once the job ended, with the end of a stage
    /// the sandbox never reported (killed mid-stage) taken from `result`:
    /// the worker writes it with the result (nothing once the job is not
    /// running this attempt any more).
    pub(super) fn close(mut self, result: &JobResult) -> Vec<JobEvent> {
        if self.ended {
            return Vec::new();
        }
        if let Some(stage) = self.open_stage.take() {
            let stage_result = match stage.as_str() {
                "compile" => result.compile.as_ref(),
                _ => result.run.as_ref(),
            };
            if let Some(stage_result) = stage_result {
                self.coalescer
                    .push_event(JobEvent::stage_end(&stage, stage_result));
            }
        }
        self.next_batch(true).events
    }
}

/// The write in flight's end; never resolves when none is (the loop's
/// `select!` polls it only when one is).
async fn in_flight_write<F: Future + Unpin>(in_flight: &mut Option<F>) -> F::Output {
    match in_flight {
        Some(write) => write.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::StageResult;

    fn run() -> StageResult {
        StageResult::exited_with(b"42\n")
    }

    /// A stream whose store is never reached: these tests only batch.
    fn stream() -> EventStream {
        let store = Store::new("redis://127.0.0.1:1/", "unused", Duration::from_secs(60), 1)
            .expect("a pool, not connected");
        EventStream::new(store, "job", "worker", 1, Arc::default())
    }

    /// Output and the run's end taken together (an append was in flight
    /// while both came): the output goes, the end waits for the result,
    /// and once its hold is over it goes on its own.
    #[tokio::test(start_paused = true)]
    async fn output_written_during_a_stage_ends_hold_leaves_the_end_for_the_result() {
        let mut stream = stream();
        stream.accept(SandboxEvent::StageStart {
            stage: "run".into(),
        });
        let _ = stream.next_batch(false);
        stream.accept(SandboxEvent::Stdout(b"42\n".to_vec()));
        assert_eq!(
            stream.accept(SandboxEvent::StageEnd {
                stage: "run".into(),
                result: Box::new(run()),
            }),
            Flush::Soon
        );
        let batch = stream.next_batch(false);
        assert_eq!(batch.events, [JobEvent::stdout(b"42\n".to_vec())]);
        assert_eq!(
            stream.close(&JobResult::without_stages(
                crate::job::Status::Succeeded,
                "python",
                "3.11"
            )),
            [JobEvent::stage_end("run", &run())],
            "the end goes with the result"
        );

        let mut stream = self::stream();
        stream.accept(SandboxEvent::Stdout(b"42\n".to_vec()));
        stream.accept(SandboxEvent::StageEnd {
            stage: "run".into(),
            result: Box::new(run()),
        });
        tokio::time::advance(STAGE_END_HOLD).await;
        let batch = stream.next_batch(false);
        assert_eq!(
            batch.events,
            [
                JobEvent::stdout(b"42\n".to_vec()),
                JobEvent::stage_end("run", &run())
            ],
            "after its hold, the end goes"
        );
    }
}
