//! The live events of a running job: what the sandbox reports as it happens
//! goes into the job's events stream (through [`Store::append_events`]) as
//! stage and output events, coalesced so a flood of tiny writes does not
//! become a flood of Redis commands.
//!
//! - Output after a quiet spell is written at once (leading edge), and so is
//!   output that follows input the job was sent since the last write (an
//!   interactive program answering: a ping-pong is not a flood). Otherwise,
//!   after a write, more output waits until [`FLUSH_INTERVAL`] has passed
//!   since that write, so a flood is coalesced into one `append_events` call
//!   per interval (or as soon as [`FLUSH_BYTES`] of it wait). A stage start
//!   or end goes at once, with everything before it, in order. Adjacent chunks of one stream become one event (of about
//!   [`MAX_EVENT_BYTES`] at most); an incomplete UTF-8 sequence at the end of
//!   a stream's buffer waits for the rest of the character, so text stays
//!   text, until the stage ends.
//! - One append is in flight at a time, and the channel from the sandbox
//!   is read meanwhile: a slow or absent Redis never blocks the sandbox. A
//!   failed append is retried with the worker's backoff, with whatever came
//!   meanwhile; while Redis is away, at most [`MAX_BUFFERED_BYTES`] of output
//!   are held and the rest is dropped from the stream (with one warning; the
//!   result still has it).
//! - When the job ended, [`EventStream::close`] writes what is left (and the
//!   end of a stage the sandbox never reported) before the worker writes the
//!   result, so the `exit` event is the last one. Through a Redis outage it
//!   retries as patiently as the result itself (the result cannot be written
//!   before Redis is back either), so output held through an outage reaches
//!   the stream; only when the worker gives up (at shutdown) are they given
//!   up, with a warning.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::backoff::{Backoff, sleep_unless_cancelled};
use crate::job::JobResult;
use crate::job::events::JobEvent;
use crate::sandbox::SandboxEvent;
use crate::store::Store;

/// Sandbox events buffered between the engine and the stream; the stream
/// reads them as they come, so this only absorbs bursts.
pub(super) const EVENT_BUFFER: usize = 256;
/// Shortest time between two writes of output (a flood is coalesced into
/// one write per interval; output after a quiet spell goes at once).
const FLUSH_INTERVAL: Duration = Duration::from_millis(25);
/// How long output after a quiet spell (or answering input) waits for the
/// rest of its burst: `print('x')` is two writes (`x`, then the newline) a
/// few microseconds apart, which belong in one event.
const GATHER: Duration = Duration::from_millis(2);
/// Output waiting that is written without waiting for the interval.
const FLUSH_BYTES: usize = 32 * 1024;
/// Largest output event; more output of one stream makes another event.
const MAX_EVENT_BYTES: usize = 32 * 1024;
/// Most output held while it cannot be written; more is dropped.
const MAX_BUFFERED_BYTES: usize = 4 * 1024 * 1024;
/// Longest wait for one `append_events` call.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

#[derive(Debug)]
enum Item {
    Output(Stream, Vec<u8>),
    Event(JobEvent),
}

/// When output that arrives at `now` goes out: after [`GATHER`] when it
/// answers new input or follows a quiet spell (no write within
/// [`FLUSH_INTERVAL`]), else one interval after the last write.
fn flush_due(now: Instant, last_write: Option<Instant>, answering: bool) -> Instant {
    let soon = now + GATHER;
    match last_write {
        Some(last) if !answering => soon.max(last + FLUSH_INTERVAL),
        _ => soon,
    }
}

/// How many bytes at the end of `bytes` are the start of a UTF-8 sequence
/// whose other bytes have not come yet (0 to 3).
fn incomplete_utf8_tail(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0xC0 == 0x80 {
            // A continuation byte: the lead byte is further back.
            continue;
        }
        let needed = match byte {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if back < needed { back } else { 0 };
    }
    0
}

/// The events waiting to be written, in order, with adjacent output of one
/// stream merged.
#[derive(Debug, Default)]
struct Coalescer {
    items: Vec<Item>,
    /// Per stream: an incomplete UTF-8 sequence held back at the last take,
    /// put in front of that stream's next output.
    carry: [Vec<u8>; 2],
    /// Output bytes in `items` and `carry`.
    output_bytes: usize,
}

impl Coalescer {
    fn push_output(&mut self, stream: Stream, data: Vec<u8>) {
        self.output_bytes += data.len();
        let carry = std::mem::take(&mut self.carry[stream.index()]);
        let data = if carry.is_empty() {
            data
        } else {
            let mut joined = carry;
            joined.extend_from_slice(&data);
            joined
        };
        self.append(stream, data);
    }

    /// Adds output after the last item, merging it into that item when it
    /// is output of the same stream with room left.
    fn append(&mut self, stream: Stream, mut data: Vec<u8>) {
        if data.is_empty() {
            return;
        }
        if let Some(Item::Output(last, bytes)) = self.items.last_mut()
            && *last == stream
        {
            if bytes.len() < MAX_EVENT_BYTES {
                bytes.extend_from_slice(&data);
                return;
            }
            // Full: a new event, which starts with the character the full
            // one would otherwise end in the middle of.
            let tail = incomplete_utf8_tail(bytes);
            if tail > 0 && tail < bytes.len() {
                let mut start = bytes.split_off(bytes.len() - tail);
                start.extend_from_slice(&data);
                data = start;
            }
        }
        self.items.push(Item::Output(stream, data));
    }

    /// A stage event: it ends what came before it, so the held-back bytes
    /// go out first.
    fn push_event(&mut self, event: JobEvent) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let carry = std::mem::take(&mut self.carry[stream.index()]);
            self.append(stream, carry);
        }
        self.items.push(Item::Event(event));
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The events to write now and how many output bytes they carry. Unless
    /// `last`, an incomplete UTF-8 sequence at the end of a stream's output
    /// is held back for its next output.
    fn take(&mut self, last: bool) -> (Vec<JobEvent>, usize) {
        if last {
            for stream in [Stream::Stdout, Stream::Stderr] {
                let carry = std::mem::take(&mut self.carry[stream.index()]);
                self.append(stream, carry);
            }
        } else {
            // Output before a stage event is complete: that stage ended.
            let first = self
                .items
                .iter()
                .rposition(|item| matches!(item, Item::Event(_)))
                .map_or(0, |p| p + 1);
            for stream in [Stream::Stdout, Stream::Stderr] {
                let position = self.items[first..]
                    .iter()
                    .rposition(|item| matches!(item, Item::Output(s, _) if *s == stream));
                let Some(position) = position.map(|p| p + first) else {
                    continue;
                };
                let Item::Output(_, bytes) = &mut self.items[position] else {
                    continue;
                };
                let tail = incomplete_utf8_tail(bytes);
                if tail == 0 {
                    continue;
                }
                self.carry[stream.index()] = bytes.split_off(bytes.len() - tail);
                if bytes.is_empty() {
                    self.items.remove(position);
                }
            }
        }
        let held: usize = self.carry.iter().map(Vec::len).sum();
        let taken = self.output_bytes - held;
        self.output_bytes = held;
        let mut events = Vec::with_capacity(self.items.len());
        let mut pending: Option<(Stream, Vec<u8>)> = None;
        let output = |stream, bytes| match stream {
            Stream::Stdout => JobEvent::stdout(bytes),
            Stream::Stderr => JobEvent::stderr(bytes),
        };
        for item in self.items.drain(..) {
            match item {
                // Removing a held-back item can leave two of one stream
                // next to each other: they merge.
                Item::Output(stream, bytes) => match &mut pending {
                    Some((last, merged))
                        if *last == stream && merged.len() + bytes.len() <= MAX_EVENT_BYTES =>
                    {
                        merged.extend_from_slice(&bytes);
                    }
                    _ => {
                        if let Some((last, merged)) = pending.replace((stream, bytes)) {
                            events.push(output(last, merged));
                        }
                    }
                },
                Item::Event(event) => {
                    if let Some((last, merged)) = pending.take() {
                        events.push(output(last, merged));
                    }
                    events.push(event);
                }
            }
        }
        if let Some((last, merged)) = pending {
            events.push(output(last, merged));
        }
        (events, taken)
    }
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
    /// The job is not running any more (the reaper settled it): nothing
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
            backoff: Backoff::redis(),
            ended: false,
            dropped: false,
            first_stage_at: None,
        }
    }

    /// When the job's program started (its first stage), if it did.
    pub(super) fn first_stage_at(&self) -> Option<std::time::Instant> {
        self.first_stage_at
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
                done = async { in_flight.as_mut().expect("checked").await }, if in_flight.is_some() => {
                    in_flight = None;
                    let (batch, attempt) = done;
                    if let Some(delay) = self.settle(batch, attempt, true) {
                        retry_at = Some(Instant::now() + delay);
                    }
                }
                event = events.recv(), if open => match event {
                    Some(event) => {
                        urgent |= self.accept(event);
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

    /// Takes one sandbox event into the buffer; `true` when it should be
    /// written at once.
    fn accept(&mut self, event: SandboxEvent) -> bool {
        if matches!(event, SandboxEvent::StageStart { .. }) && self.first_stage_at.is_none() {
            self.first_stage_at = Some(std::time::Instant::now());
        }
        if self.ended {
            return false;
        }
        match event {
            SandboxEvent::Ready => false,
            SandboxEvent::StageStart { stage } => {
                self.coalescer.push_event(JobEvent::stage_start(&stage));
                self.open_stage = Some(stage);
                true
            }
            SandboxEvent::StageEnd { stage, result } => {
                self.coalescer
                    .push_event(JobEvent::stage_end(&stage, &result));
                self.open_stage = None;
                true
            }
            SandboxEvent::Stdout(data) => self.output(Stream::Stdout, data),
            SandboxEvent::Stderr(data) => self.output(Stream::Stderr, data),
        }
    }

    fn output(&mut self, stream: Stream, data: Vec<u8>) -> bool {
        if self.held + data.len() > MAX_BUFFERED_BYTES {
            if !self.dropped {
                self.dropped = true;
                tracing::warn!(
                    job.id = %self.job_id,
                    held_bytes = self.held,
                    "redis is not taking the job's events; dropping output from its events stream (the result keeps it)"
                );
            }
            return false;
        }
        self.held += data.len();
        self.coalescer.push_output(stream, data);
        self.coalescer.output_bytes >= FLUSH_BYTES
    }

    /// The failed batch (if any) followed by what the coalescer holds.
    fn next_batch(&mut self, last: bool) -> Batch {
        let mut batch = std::mem::take(&mut self.retry);
        let (events, output_bytes) = self.coalescer.take(last);
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
    fn settle(&mut self, batch: Batch, attempt: Attempt, running: bool) -> Option<Duration> {
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
                if running {
                    tracing::warn!(
                        job.id = %self.job_id,
                        %error,
                        events = self.retry.events.len(),
                        retry_ms = delay.as_millis() as u64,
                        "could not append the job's events; retrying (the job keeps running)"
                    );
                }
                Some(delay)
            }
        }
    }

    /// Writes what is left once the job ended, with the end of a stage the
    /// sandbox never reported (killed mid-stage) taken from `result`; a few
    /// attempts, none after `give_up`.
    /// Before every retry the worker re-announces itself (its heartbeat
    /// goes first when Redis is back); nothing more is tried once the
    /// worker gives up (`give_up`, at shutdown).
    pub(super) async fn close(mut self, result: &JobResult, worker: &super::Shared) {
        let give_up = &worker.give_up;
        if self.ended {
            return;
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
        let mut batch = self.next_batch(true);
        // Quick attempts at first, whatever the backoff reached while the
        // job ran: the result waits for this.
        self.backoff.reset();
        let mut attempts = 0;
        while !batch.events.is_empty() {
            let (returned, attempt) = self.attempt(batch).await;
            attempts += 1;
            let error = match &attempt {
                Attempt::Failed(error) => error.clone(),
                _ => return,
            };
            let count = returned.events.len();
            let Some(delay) = self.settle(returned, attempt, false) else {
                return;
            };
            if !sleep_unless_cancelled(delay, give_up).await || !worker.reannounce(give_up).await {
                tracing::warn!(
                    job.id = %self.job_id,
                    %error,
                    events = count,
                    attempts,
                    "gave up appending the job's last events; its events stream misses them (the result has the output)"
                );
                return;
            }
            tracing::warn!(
                job.id = %self.job_id,
                %error,
                events = count,
                retry_ms = delay.as_millis() as u64,
                "could not append the job's last events; retrying"
            );
            batch = std::mem::take(&mut self.retry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(event: &JobEvent) -> (&'static str, Vec<u8>) {
        let kind = match event {
            JobEvent::Stdout { .. } => "stdout",
            JobEvent::Stderr { .. } => "stderr",
            _ => "other",
        };
        (kind, event.output_bytes().unwrap_or_default())
    }

    #[test]
    fn output_after_quiet_goes_at_once_and_a_flood_waits_for_the_interval() {
        let start = Instant::now();
        assert_eq!(
            flush_due(start, None, false),
            start + GATHER,
            "the first output"
        );
        let quiet = start + FLUSH_INTERVAL * 3;
        assert_eq!(
            flush_due(quiet, Some(start), false),
            quiet + GATHER,
            "after a quiet spell"
        );
        let flood = start + FLUSH_INTERVAL / 5;
        assert_eq!(
            flush_due(flood, Some(start), false),
            start + FLUSH_INTERVAL,
            "right after a write"
        );
        assert_eq!(
            flush_due(flood, Some(start), true),
            flood + GATHER,
            "answering new input"
        );
    }

    #[test]
    fn adjacent_output_of_a_stream_merges_and_streams_keep_their_order() {
        let mut c = Coalescer::default();
        c.push_output(Stream::Stdout, b"a".to_vec());
        c.push_output(Stream::Stdout, b"b".to_vec());
        c.push_output(Stream::Stderr, b"c".to_vec());
        c.push_output(Stream::Stdout, b"d".to_vec());
        c.push_event(JobEvent::stage_start("x"));
        c.push_output(Stream::Stdout, b"e".to_vec());
        let (events, bytes) = c.take(false);
        assert_eq!(bytes, 5);
        assert_eq!(
            events.iter().map(data).collect::<Vec<_>>(),
            [
                ("stdout", b"ab".to_vec()),
                ("stderr", b"c".to_vec()),
                ("stdout", b"d".to_vec()),
                ("other", vec![]),
                ("stdout", b"e".to_vec()),
            ]
        );
        assert!(c.is_empty());
        assert_eq!(c.output_bytes, 0);
    }

    #[test]
    fn an_incomplete_character_waits_for_the_rest() {
        let euro = "€".as_bytes(); // 3 bytes
        let mut c = Coalescer::default();
        c.push_output(Stream::Stdout, [b"price: ".as_slice(), &euro[..2]].concat());
        let (events, bytes) = c.take(false);
        assert_eq!(events, [JobEvent::stdout(b"price: ".to_vec())]);
        assert_eq!(bytes, 7);
        assert_eq!(c.output_bytes, 2);
        // Only the incomplete character: nothing to write yet.
        let (events, _) = c.take(false);
        assert!(events.is_empty());
        c.push_output(Stream::Stdout, [&euro[2..], b"!"].concat());
        let (events, bytes) = c.take(false);
        assert_eq!(events, [JobEvent::stdout("€!".as_bytes().to_vec())]);
        assert_eq!(bytes, 4);
        // At the end, what never completed goes out as it is.
        c.push_output(Stream::Stderr, vec![0xE2]);
        assert!(c.take(false).0.is_empty());
        c.push_event(JobEvent::stage_start("y"));
        let (events, bytes) = c.take(false);
        assert_eq!(events[0], JobEvent::stderr(vec![0xE2]));
        assert_eq!(bytes, 1);
        c.push_output(Stream::Stderr, vec![0xF0, 0x9F]);
        let (events, _) = c.take(true);
        assert_eq!(events, [JobEvent::stderr(vec![0xF0, 0x9F])]);
    }

    #[test]
    fn the_tail_check_knows_complete_and_incomplete_sequences() {
        assert_eq!(incomplete_utf8_tail(b""), 0);
        assert_eq!(incomplete_utf8_tail(b"abc"), 0);
        assert_eq!(incomplete_utf8_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_utf8_tail("€".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&"€".as_bytes()[..2]), 2);
        assert_eq!(incomplete_utf8_tail(&"😀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_utf8_tail("😀".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&[0xff]), 0);
        assert_eq!(incomplete_utf8_tail(&[0x80, 0x80, 0x80]), 0);
    }

    #[test]
    fn events_stay_under_the_largest_size_without_splitting_characters() {
        let mut c = Coalescer::default();
        let text = "é".repeat(MAX_EVENT_BYTES); // 2 bytes each
        for chunk in text.as_bytes().chunks(1001) {
            c.push_output(Stream::Stdout, chunk.to_vec());
        }
        let (events, bytes) = c.take(true);
        assert_eq!(bytes, text.len());
        assert!(events.len() >= 2, "{}", events.len());
        let mut joined = Vec::new();
        for event in &events {
            let JobEvent::Stdout { encoding, .. } = event else {
                panic!("{event:?}")
            };
            assert_eq!(*encoding, crate::job::Encoding::Utf8);
            let bytes = event.output_bytes().unwrap();
            assert!(bytes.len() <= MAX_EVENT_BYTES + 1001);
            joined.extend(bytes);
        }
        assert_eq!(joined, text.as_bytes());
    }
}
