//! Removing finished jobs' containers without fighting the running jobs.
//!
//! A container's exit and removal cost Docker about as much CPU as a job's
//! own start (dockerd and containerd tear down its mounts, cgroup and
//! layer). When a burst ends, every job task removing its own container at
//! once puts hundreds of removals on the CPUs the next jobs need; even one,
//! right after its job, runs beside the API answering that job. So a
//! container whose supervisor said `done` is not removed in the job's slot:
//!
//! - with linger on (the worker's default), its supervisor stays idle after
//!   `done` (every process of the job killed and checked gone, its files
//!   removed: see `Cleanup::is_idle`), and the container is handed to this
//!   queue at once, the slot freed; its exit happens at its removal;
//! - without, while the worker's slots are busy, it is handed over once its
//!   process has exited (its attach stream ended: no process, no memory
//!   left, only Docker's record and layer).
//!
//! The queue removes one at a time, none while the worker's slots are busy
//! (at least half of them taken) and none until [`SETTLE`] has passed since
//! the last job ended — unless it is full, so it stays bounded (the one
//! being removed still counts; a lingering supervisor also exits by itself
//! after the linger). When it is full, a job ends its supervisor's linger
//! before it writes its result, so the exit overlaps the write, and
//! removes its container in its slot. A container
//! that did not end by itself (killed, timed out, failed) is still removed
//! at once, in its slot.
//!
//! Nothing is lost if the worker dies with containers queued: they carry the
//! worker's label and the job's deadline, so the reaper removes them like
//! any dead worker's containers; at shutdown the queue is emptied before the
//! worker retires.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::sandbox::pool::JOB_END_SETTLE;
use crate::sandbox::{Cleanup, SandboxEngine};

/// How long a container that is stopping by itself may take to exit before
/// it is removed at once instead.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// While the slots are busy, how often the queue looks again.
const BUSY_RECHECK: Duration = Duration::from_millis(200);
/// How long after a job's end the queue waits before removing: the API is
/// still answering that job (its result was just written). The pool's held
/// refills wait as long.
const SETTLE: Duration = JOB_END_SETTLE;

/// The queue of containers to remove; see the module documentation.
pub(super) struct Removals {
    queue: Mutex<Queue>,
    wake: Notify,
    /// Most containers queued; past it a job removes its own at once.
    limit: usize,
    /// Whether queuing is on (`CODE_RUNNER_YIELD_WHILE_BUSY`).
    enabled: bool,
    metrics: Metrics,
}

impl Removals {
    pub(super) fn new(limit: usize, enabled: bool, metrics: Metrics) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            limit,
            enabled,
            metrics,
        }
    }

    fn count(&self, queue: &Queue) {
        self.metrics.removals_queued.set(queue.len() as i64);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `cleanup` when there is room and either its supervisor
    /// lingers idle ([`Cleanup::is_idle`]), or the other jobs keep the
    /// worker `busy` and its container ended by itself (within
    /// [`EXIT_WAIT`]: the caller still holds the job's slot meanwhile, so a
    /// slot is never free while a process of its job runs). Otherwise hands
    /// it back (`Some`) for the caller to remove now — at once when not
    /// busy, with no wait for the exit.
    pub(super) async fn defer(&self, mut cleanup: Cleanup, busy: bool) -> Option<Cleanup> {
        if !self.has_room() {
            return Some(cleanup);
        }
        if !cleanup.is_idle() && (!busy || !cleanup.exited_within(EXIT_WAIT).await) {
            return Some(cleanup);
        }
        let mut queue = self.lock();
        if queue.len() >= self.limit {
            return Some(cleanup);
        }
        queue.waiting.push_back(cleanup);
        queue.settles_at = Some(Instant::now() + SETTLE);
        self.count(&queue);
        drop(queue);
        self.wake.notify_one();
        None
    }

    /// Whether a container handed over now would find room.
    pub(super) fn has_room(&self) -> bool {
        self.enabled && self.lock().len() < self.limit
    }

    /// Removes the queued containers one at a time, waiting while `busy`
    /// says the slots are busy and the queue is not full, until `stop`.
    pub(super) async fn run(
        &self,
        engine: &dyn SandboxEngine,
        busy: impl Fn() -> bool,
        stop: &CancellationToken,
    ) {
        loop {
            let (next, settling) = {
                let mut queue = self.lock();
                let settling = queue.settling();
                let full = queue.len() >= self.limit;
                let next = if queue.waiting.is_empty() || (!full && (busy() || settling.is_some()))
                {
                    None
                } else {
                    queue.take()
                };
                (next, settling)
            };
            match next {
                Some(cleanup) => self.remove_taken(engine, cleanup).await,
                None => {
                    let recheck = settling.unwrap_or_else(|| Instant::now() + BUSY_RECHECK);
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep_until(recheck) => {}
                    }
                }
            }
        }
    }

    /// Removes everything still queued (at shutdown).
    pub(super) async fn drain(&self, engine: &dyn SandboxEngine) {
        loop {
            let next = self.lock().take();
            let Some(cleanup) = next else { return };
            self.remove_taken(engine, cleanup).await;
        }
    }

    /// Removes a container [`Queue::take`] gave, then stops counting it.
    async fn remove_taken(&self, engine: &dyn SandboxEngine, cleanup: Cleanup) {
        remove(engine, cleanup).await;
        let mut queue = self.lock();
        queue.removing -= 1;
        self.count(&queue);
    }
}

/// The containers waiting, and how many of them are being removed now:
/// those still exist, so they count against the bound until they are gone.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<Cleanup>,
    removing: usize,
    /// No removal before this: [`SETTLE`] after the last container queued.
    settles_at: Option<Instant>,
}

impl Queue {
    /// When the queue may remove again, if [`SETTLE`] has not passed yet.
    fn settling(&self) -> Option<Instant> {
        self.settles_at.filter(|at| *at > Instant::now())
    }

    fn len(&self) -> usize {
        self.waiting.len() + self.removing
    }

    /// The next container to remove, counted as being removed.
    fn take(&mut self) -> Option<Cleanup> {
        let next = self.waiting.pop_front()?;
        self.removing += 1;
        Some(next)
    }
}

/// Removes one container; a Docker that did not answer is noted, so the
/// claim loop asks it before claiming again.
pub(super) async fn remove(engine: &dyn SandboxEngine, cleanup: Cleanup) {
    if !cleanup.remove().await {
        engine.note_unanswered();
    }
}
