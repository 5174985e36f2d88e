//! Removing finished jobs' containers without fighting the running jobs.
//!
//! Removing a container costs Docker about as much CPU as a job's own start
//! (dockerd and containerd tear down its mounts, cgroup and layer). When a
//! burst ends, every job task removing its own container at once puts
//! hundreds of removals on the CPUs the next jobs need. So a container whose
//! supervisor said `done` is not removed in the job's slot: once its process
//! has exited (its attach stream ended: no process, no memory left, only
//! Docker's record and layer) it is handed to this queue, which removes one at a time, and none while
//! the worker's slots are busy — unless the queue is full, so it stays
//! bounded. A container that did not end by itself (killed, timed out,
//! failed) is still removed at once, in its slot.
//!
//! Nothing is lost if the worker dies with containers queued: they carry the
//! worker's label and the job's deadline, so the reaper removes them like
//! any dead worker's containers; at shutdown the queue is emptied before the
//! worker retires.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::sandbox::{Cleanup, SandboxEngine};

/// How long a container that is stopping by itself may take to exit before
/// it is removed at once instead.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// While the slots are busy, how often the queue looks again.
const BUSY_RECHECK: Duration = Duration::from_millis(200);

/// The queue of containers to remove; see the module documentation.
pub(super) struct Removals {
    queue: Mutex<VecDeque<Cleanup>>,
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
            queue: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            limit,
            enabled,
            metrics,
        }
    }

    fn count(&self, queue: &VecDeque<Cleanup>) {
        self.metrics.removals_queued.set(queue.len() as i64);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Cleanup>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `cleanup` if the other jobs keep the worker `busy`, its
    /// container ended by itself (within [`EXIT_WAIT`]: the caller still
    /// holds the job's slot meanwhile, so a slot is never free while its
    /// container's process runs) and there is room; otherwise hands it back
    /// (`Some`) for the caller to remove now — at once when not busy, with
    /// no wait for the exit (the queue would remove it at once anyway).
    pub(super) async fn defer(&self, mut cleanup: Cleanup, busy: bool) -> Option<Cleanup> {
        if !self.enabled || !busy || self.lock().len() >= self.limit {
            return Some(cleanup);
        }
        if !cleanup.exited_within(EXIT_WAIT).await {
            return Some(cleanup);
        }
        let mut queue = self.lock();
        if queue.len() >= self.limit {
            return Some(cleanup);
        }
        queue.push_back(cleanup);
        self.count(&queue);
        drop(queue);
        self.wake.notify_one();
        None
    }

    /// Removes the queued containers one at a time, waiting while `busy`
    /// says the slots are busy and the queue is not full, until `stop`.
    pub(super) async fn run(
        &self,
        engine: &SandboxEngine,
        busy: impl Fn() -> bool,
        stop: &CancellationToken,
    ) {
        loop {
            let next = {
                let mut queue = self.lock();
                if queue.is_empty() || (busy() && queue.len() < self.limit) {
                    None
                } else {
                    let next = queue.pop_front();
                    self.count(&queue);
                    next
                }
            };
            match next {
                Some(cleanup) => remove(engine, cleanup).await,
                None => {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep(BUSY_RECHECK) => {}
                    }
                }
            }
        }
    }

    /// Removes everything still queued (at shutdown).
    pub(super) async fn drain(&self, engine: &SandboxEngine) {
        loop {
            let next = {
                let mut queue = self.lock();
                let next = queue.pop_front();
                self.count(&queue);
                next
            };
            let Some(cleanup) = next else { return };
            remove(engine, cleanup).await;
        }
    }
}

/// Removes one container; a Docker that did not answer is noted, so the
/// claim loop asks it before claiming again.
pub(super) async fn remove(engine: &SandboxEngine, cleanup: Cleanup) {
    if !cleanup.remove().await {
        engine.docker_failed();
    }
}
