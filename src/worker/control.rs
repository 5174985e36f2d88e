//! The control relay of a running job: reads `job:<id>:stdin` (through the
//! queue module) on a connection of its own and turns each message into
//! something the engine understands — `cancel` kills the job, stdin and
//! signals go to the sandbox as [`JobInput`]. It also honours the job's
//! `cancel_requested` flag, read whenever it (re)connects.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_redis::redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::backoff::{Backoff, sleep_unless_cancelled};
use crate::sandbox::JobInput;
use crate::store::{Control, Store};

/// Input messages buffered between the relay and the sandbox; when full,
/// the relay stops reading Redis until the sandbox catches up.
pub(super) const INPUT_BUFFER: usize = 64;

/// One job's relay, until `done` (the job ended).
pub(super) struct ControlRelay<'a> {
    pub(super) store: &'a Store,
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
        let mut conn: Option<MultiplexedConnection> = None;
        let mut last_id = "0".to_string();
        let mut backoff = Backoff::redis();
        let mut cancelled = false;
        loop {
            let read = match conn.as_mut() {
                Some(conn) => {
                    tokio::select! {
                        biased;
                        () = self.done.cancelled() => return cancelled,
                        read = self.store.jobs().read_control(conn, self.job_id, &last_id) => read,
                    }
                }
                None => {
                    let connected = tokio::select! {
                        biased;
                        () = self.done.cancelled() => return cancelled,
                        connected = self.store.dedicated() => connected,
                    };
                    match connected {
                        // On every (re)connection, the job hash's
                        // `cancel_requested` is read too: a cancel is
                        // honoured even if its message never arrives.
                        Ok(new) => match self.store.jobs().cancel_requested(self.job_id).await {
                            Ok(requested) => {
                                conn = Some(new);
                                if requested {
                                    self.deliver(Control::Cancel, &mut cancelled).await;
                                }
                                continue;
                            }
                            Err(error) => Err(error),
                        },
                        Err(error) => Err(error),
                    }
                }
            };
            match read {
                Ok((next_id, messages)) => {
                    backoff.reset();
                    last_id = next_id;
                    for message in messages {
                        if !self.deliver(message, &mut cancelled).await {
                            return cancelled;
                        }
                    }
                }
                Err(error) => {
                    conn = None;
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        job.id = %self.job_id,
                        %error,
                        retry_ms = delay.as_millis() as u64,
                        "could not read the job's control messages; retrying"
                    );
                    if !sleep_unless_cancelled(delay, &self.done).await {
                        return cancelled;
                    }
                }
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
