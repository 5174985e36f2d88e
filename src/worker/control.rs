//! The control messages of running jobs: what clients send them through
//! `job:<id>:stdin` (stdin, stdin close, signals, and the `cancel` of a
//! DELETE), turned into what the engine understands — `cancel` kills the
//! job, stdin and signals go to the sandbox as [`JobInput`].
//!
//! One [`ControlReader`] per worker holds one dedicated Redis connection
//! and reads the control streams of all its running jobs at once (one
//! blocking `XREAD` over every stream,
//! [`Jobs::read_controls`](crate::store::Jobs::read_controls)). A job
//! starting is added to the read by ringing the worker's doorbell
//! (`worker:<wid>:doorbell`), which wakes the blocked read at once; while
//! the read is not blocked, nothing needs ringing. So a worker holds one
//! control connection however many jobs it runs (a managed Redis's client
//! limit is not spent per job, nor a TLS handshake per job on
//! `rediss://`). It is kept for [`IDLE_KEEP`] after the last job ends,
//! blocked in a read of the doorbell alone: a client blocked in a read is
//! never closed by the server's idle `timeout`, and the next job is added
//! by the same ring.
//!
//! Each job's [`ControlRelay`] takes its messages from the reader and
//! hands them to its sandbox. A sandbox that does not keep up stops its
//! stream being read (the messages stay in Redis) until it has taken most
//! of what it was given. A job's `cancel_requested` flag is read when the
//! job is added and whenever the reader (re)connects: a cancel is honoured
//! even if its message never arrives.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use deadpool_redis::redis::aio::MultiplexedConnection;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::backoff::{Backoff, sleep_unless_cancelled};
use crate::sandbox::JobInput;
use crate::store::{Control, Store, StoreError};

/// Input messages buffered between the relay and the sandbox; when full,
/// the relay waits for the sandbox.
pub(super) const INPUT_BUFFER: usize = 64;
/// Messages a job may have been given and not taken before its stream is
/// left out of the reads.
const PAUSE_AT: usize = 64;
/// Taken down to this, a paused job's stream is read again.
const RESUME_AT: usize = PAUSE_AT / 2;
/// How long the connection is kept (reading the doorbell alone) while no
/// job is followed.
const IDLE_KEEP: std::time::Duration = std::time::Duration::from_secs(30);

/// One running job, as the reader follows it.
struct Followed {
    /// The last stream id read.
    last_id: String,
    messages: mpsc::UnboundedSender<Control>,
    /// Messages given and not yet taken by the relay.
    unread: usize,
    /// Left out of the reads until the relay takes enough.
    paused: bool,
    /// Its `cancel_requested` flag is to be read before the next read.
    check_cancel: bool,
}

#[derive(Default)]
struct State {
    jobs: HashMap<String, Followed>,
    /// The reader is blocked in a read whose set of streams was fixed.
    reading: bool,
    /// The doorbell was rung for that read (once is enough).
    rung: bool,
}

impl State {
    /// The set of streams changed: whether the doorbell must ring (the
    /// reader is blocked in a read without it and nobody rang yet).
    fn ring_wanted(&mut self) -> bool {
        let ring = self.reading && !self.rung;
        if ring {
            self.rung = true;
        }
        ring
    }

    /// Gives `messages` to job `id` (if it is still followed) and moves
    /// its place in the stream to `last_id`.
    fn give(&mut self, id: &str, last_id: Option<String>, messages: Vec<Control>) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        if let Some(last_id) = last_id {
            job.last_id = last_id;
        }
        for message in messages {
            if job.messages.send(message).is_ok() {
                job.unread += 1;
            }
        }
        if job.unread >= PAUSE_AT {
            job.paused = true;
        }
    }
}

struct Inner {
    store: Store,
    worker: String,
    state: Mutex<State>,
    /// Wakes the reader when it is not blocked in Redis.
    changed: Notify,
}

/// The control reader of one worker; cheap to clone. [`ControlReader::run`]
/// reads until it is told to stop.
#[derive(Clone)]
pub(super) struct ControlReader {
    inner: Arc<Inner>,
}

impl ControlReader {
    pub(super) fn new(store: Store, worker: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                worker: worker.to_string(),
                state: Mutex::default(),
                changed: Notify::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts reading job `id`'s control stream from its beginning, until
    /// the returned handle is dropped.
    fn follow(&self, id: &str) -> Following {
        let (sender, receiver) = mpsc::unbounded_channel();
        let ring = {
            let mut state = self.lock();
            state.jobs.insert(
                id.to_string(),
                Followed {
                    last_id: "0".to_string(),
                    messages: sender,
                    unread: 0,
                    paused: false,
                    check_cancel: true,
                },
            );
            state.ring_wanted()
        };
        self.wake(ring);
        Following {
            reader: self.clone(),
            id: id.to_string(),
            messages: receiver,
        }
    }

    fn wake(&self, ring: bool) {
        self.inner.changed.notify_one();
        if ring {
            let inner = Arc::clone(&self.inner);
            tokio::spawn(async move {
                if let Err(error) = inner
                    .store
                    .jobs()
                    .ring_control_doorbell(&inner.worker)
                    .await
                {
                    // The read ends within its block timeout anyway.
                    tracing::debug!(%error, "cannot ring the control reader's doorbell");
                }
            });
        }
    }

    /// The relay of `id` took one message.
    fn took(&self, id: &str) {
        let ring = {
            let mut state = self.lock();
            let Some(job) = state.jobs.get_mut(id) else {
                return;
            };
            job.unread = job.unread.saturating_sub(1);
            if !(job.paused && job.unread <= RESUME_AT) {
                return;
            }
            job.paused = false;
            state.ring_wanted()
        };
        self.wake(ring);
    }

    fn unfollow(&self, id: &str) {
        self.lock().jobs.remove(id);
    }

    /// What the next read covers (id, last stream id), and the jobs whose
    /// cancel flag is to be read first. Marks the reader as reading when it
    /// covers a stream or `idle_read` (it reads the doorbell alone).
    fn next_read(&self, idle_read: bool) -> (Vec<(String, String)>, Vec<String>) {
        let mut state = self.lock();
        let read: Vec<(String, String)> = state
            .jobs
            .iter()
            .filter(|(_, job)| !job.paused)
            .map(|(id, job)| (id.clone(), job.last_id.clone()))
            .collect();
        let check: Vec<String> = state
            .jobs
            .iter_mut()
            .filter_map(|(id, job)| std::mem::take(&mut job.check_cancel).then(|| id.clone()))
            .collect();
        state.reading = !read.is_empty() || idle_read;
        state.rung = false;
        (read, check)
    }

    /// Reads the followed jobs' control streams until `stop` (the worker's
    /// jobs all ended). Holds a connection while it follows jobs and for
    /// [`IDLE_KEEP`] after.
    pub(super) async fn run(&self, stop: &CancellationToken) {
        let store = &self.inner.store;
        let mut conn: Option<MultiplexedConnection> = None;
        let mut doorbell = "0-0".to_string();
        let mut backoff = Backoff::redis();
        // Since when no stream was read (the connection reads the doorbell
        // alone, up to `IDLE_KEEP`).
        let mut idle_since: Option<Instant> = None;
        loop {
            let idle_read =
                conn.is_some() && idle_since.is_none_or(|since| since.elapsed() < IDLE_KEEP);
            let (read, check) = self.next_read(idle_read);
            if !check.is_empty() {
                match store.jobs().cancels_requested(&check).await {
                    Ok(flags) => {
                        let mut state = self.lock();
                        for (id, _) in check.iter().zip(flags).filter(|(_, flag)| *flag) {
                            state.give(id, None, vec![Control::Cancel]);
                        }
                    }
                    Err(error) => {
                        if !self.failed(&error, &mut conn, &mut backoff, stop).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            if read.is_empty() {
                if !idle_read {
                    conn = None;
                    idle_since = None;
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = self.inner.changed.notified() => {}
                    }
                    continue;
                }
                idle_since.get_or_insert_with(Instant::now);
            } else {
                idle_since = None;
            }
            let step = async {
                if conn.is_none() {
                    conn = Some(store.dedicated().await?);
                }
                let connection = conn.as_mut().expect("connected above");
                store
                    .jobs()
                    .read_controls(connection, &self.inner.worker, &doorbell, read)
                    .await
            };
            let outcome = tokio::select! {
                () = stop.cancelled() => return,
                outcome = step => outcome,
            };
            match outcome {
                Ok(got) => {
                    backoff.reset();
                    if let Some(rung) = got.doorbell {
                        doorbell = rung;
                    }
                    let mut state = self.lock();
                    state.reading = false;
                    for (id, last_id, messages) in got.jobs {
                        state.give(&id, Some(last_id), messages);
                    }
                }
                Err(error) => {
                    if !self.failed(&error, &mut conn, &mut backoff, stop).await {
                        return;
                    }
                }
            }
        }
    }

    /// Drops the connection, waits out the backoff; `false` at `stop`.
    async fn failed(
        &self,
        error: &StoreError,
        conn: &mut Option<MultiplexedConnection>,
        backoff: &mut Backoff,
        stop: &CancellationToken,
    ) -> bool {
        *conn = None;
        {
            // Not reading now; every cancel flag is read again first.
            let mut state = self.lock();
            state.reading = false;
            for job in state.jobs.values_mut() {
                job.check_cancel = true;
            }
        }
        let delay = backoff.next_delay();
        tracing::warn!(
            %error,
            retry_ms = delay.as_millis() as u64,
            "could not read the running jobs' control messages; retrying"
        );
        sleep_unless_cancelled(delay, stop).await
    }
}

/// One job followed by the reader, until dropped.
struct Following {
    reader: ControlReader,
    id: String,
    messages: mpsc::UnboundedReceiver<Control>,
}

impl Following {
    async fn next(&mut self) -> Option<Control> {
        let message = self.messages.recv().await?;
        self.reader.took(&self.id);
        Some(message)
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        self.reader.unfollow(&self.id);
    }
}

/// One job's relay, until `done` (the job ended).
pub(super) struct ControlRelay<'a> {
    pub(super) reader: &'a ControlReader,
    pub(super) job_id: &'a str,
    /// Cancelled when a client cancels the job.
    pub(super) cancel: CancellationToken,
    pub(super) input: mpsc::Sender<JobInput>,
    pub(super) done: CancellationToken,
    /// One more for each stdin message handed to the sandbox (the events
    /// stream writes the answer to new input at once).
    pub(super) input_marks: Arc<AtomicU64>,
}

impl ControlRelay<'_> {
    /// Relays control messages until the job ends; returns whether a client
    /// cancelled the job.
    pub(super) async fn run(self) -> bool {
        let mut following = self.reader.follow(self.job_id);
        let mut cancelled = false;
        loop {
            let message = tokio::select! {
                biased;
                () = self.done.cancelled() => return cancelled,
                message = following.next() => message,
            };
            // The reader never drops a followed job's sender.
            let Some(message) = message else {
                self.done.cancelled().await;
                return cancelled;
            };
            if !self.deliver(message, &mut cancelled).await {
                return cancelled;
            }
        }
    }

    /// Acts on one message; `false` when the job ended meanwhile.
    async fn deliver(&self, message: Control, cancelled: &mut bool) -> bool {
        let input = match message {
            Control::Cancel => {
                if !*cancelled {
                    *cancelled = true;
                    tracing::info!(job.id = %self.job_id, "a client cancelled the job; killing it");
                    self.cancel.cancel();
                }
                return true;
            }
            Control::Stdin(data) => {
                self.input_marks.fetch_add(1, Ordering::Relaxed);
                JobInput::Stdin(data)
            }
            Control::StdinClose => JobInput::StdinClose,
            Control::Signal(signal) => JobInput::Signal(signal),
        };
        tokio::select! {
            biased;
            () = self.done.cancelled() => false,
            // A closed channel means the sandbox is gone; `done` follows.
            _ = self.input.send(input) => true,
        }
    }
}
