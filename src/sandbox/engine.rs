//! The seam in front of the sandbox: what the worker, the reaper and the
//! API's readiness check need of an engine ([`SandboxEngine`]), and what a
//! job's run leaves to clean up ([`Cleanup`]).
//!
//! [`DockerEngine`](super::DockerEngine) is the product's engine: hardened
//! containers through the Docker Engine API. Tests of the worker, the reaper,
//! the API and the store run the same code against a scripted engine in the
//! test harness (`tests/common/scripted.rs`), with no dockerd: the trait is
//! the whole of what those callers know of a sandbox.
//!
//! What the trait deliberately leaves out: containers' configuration, uids,
//! images, the frame protocol. Those are the Docker engine's own business.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::container::SandboxContainer;
use super::pool::{PoolSettings, WarmPool, WarmSandbox};
use super::{JobIo, SandboxError};
use crate::job::deadline::Budget;
use crate::job::{JobResult, PreparedJob};

/// A shared handle on the engine a process runs its jobs in.
pub type Engine = Arc<dyn SandboxEngine>;

/// Runs jobs in sandboxes, and lists and removes the sandboxes of its host.
#[async_trait]
pub trait SandboxEngine: Send + Sync + fmt::Debug + 'static {
    /// Which host's sandboxes this engine sees: two engines with the same
    /// id see the same sandboxes (a lost job is retried on the same host
    /// only once its sandbox is known gone).
    fn host_id(&self) -> &str;

    /// The platform's share of every job's time: how long a sandbox may
    /// take to start, and the grace after its walls (see
    /// [`crate::job::deadline`]).
    fn budget(&self) -> Budget;

    /// Whether the engine's backend answered one of its calls within
    /// `within` (a claim loop asks it before claiming otherwise).
    fn answered_within(&self, within: Duration) -> bool;

    /// Notes that a call to the backend failed: until it answers again,
    /// [`Self::answered_within`] says no.
    fn note_unanswered(&self);

    /// What keeps this engine from running jobs: its backend not answering
    /// within `timeout` (check `"docker"`), or an image of `images` missing
    /// (check `"image <name>"`). Each problem is `(check, message)`; empty
    /// when ready.
    async fn readiness(&self, images: &[String], timeout: Duration) -> Vec<(String, String)>;

    /// Every sandbox on this engine's host, in any state, whoever created
    /// it.
    async fn list_sandboxes(&self) -> Result<Vec<SandboxContainer>, SandboxError>;

    /// Removes a sandbox by id whatever it is doing (the reaper's kill); one
    /// already gone is not an error.
    async fn remove_sandbox(&self, id: &str) -> Result<(), SandboxError>;

    /// Runs `job` to its end, in `warm` when given (a sandbox of the job's
    /// class from this engine's [`WarmPool`]), else in a new sandbox.
    /// Platform failures are a result with status `error`, never a panic.
    /// The result comes back before the sandbox is removed: call
    /// [`Cleanup::remove`] once it is durable (a dropped outcome removes it
    /// in the background).
    async fn run_job(
        &self,
        job_id: &str,
        job: &PreparedJob,
        io: JobIo,
        warm: Option<WarmSandbox>,
    ) -> RunOutcome;

    /// Runs `job` to its end in a new sandbox and removes it.
    async fn run(&self, job_id: &str, job: &PreparedJob, io: JobIo) -> JobResult {
        let outcome = self.run_job(job_id, job, io, None).await;
        outcome.cleanup.remove().await;
        outcome.result
    }

    /// Starts a pool of warm sandboxes of this engine; `None` when the
    /// engine keeps none (then every job starts cold).
    fn warm_pool(&self, settings: PoolSettings) -> Option<WarmPool> {
        let _ = settings;
        None
    }
}

/// A job's end: its result, and the sandbox still to remove. The result
/// is ready before the sandbox is gone, so it can be made durable first;
/// [`Cleanup::remove`] follows (a dropped `Cleanup` removes in the
/// background).
pub struct RunOutcome {
    pub result: JobResult,
    pub cleanup: Cleanup,
    /// The sandbox that ran the job (its container's name).
    pub container: String,
}

/// What is left to do once a job's result is known: its sandbox's removal.
pub struct Cleanup(Option<Box<dyn Teardown>>);

/// An engine's side of a [`Cleanup`]. Dropping it without
/// [`Teardown::remove`] must still remove the sandbox (in the background).
#[async_trait]
pub trait Teardown: Send + 'static {
    /// Whether the sandbox holds nothing of its job any more while its
    /// supervisor lingers: its removal may wait without a job process
    /// running, or its files held, past the job's slot.
    fn is_idle(&self) -> bool;

    /// Ends a lingering supervisor now: the sandbox exits while the caller
    /// goes on, to be removed at once.
    fn stop_lingering(&mut self);

    /// Whether the sandbox ended by itself within `within`: its removal
    /// may then wait. `false` when it was not stopping by itself or did not
    /// end in time (remove it now).
    async fn exited_within(&mut self, within: Duration) -> bool;

    /// Removes the sandbox; `false` when the backend did not answer (the
    /// removal goes on in the background).
    async fn remove(self: Box<Self>) -> bool;
}

impl Cleanup {
    /// The removal of a sandbox, by its engine.
    pub fn new(teardown: impl Teardown) -> Self {
        Self(Some(Box::new(teardown)))
    }

    /// Nothing to remove (no sandbox was made).
    pub fn nothing() -> Self {
        Self(None)
    }

    /// See [`Teardown::is_idle`]; nothing to remove is not idle.
    pub fn is_idle(&self) -> bool {
        self.0.as_ref().is_some_and(|t| t.is_idle())
    }

    /// See [`Teardown::stop_lingering`].
    pub fn stop_lingering(&mut self) {
        if let Some(teardown) = self.0.as_mut() {
            teardown.stop_lingering();
        }
    }

    /// See [`Teardown::exited_within`]; nothing to remove has not exited.
    pub async fn exited_within(&mut self, within: Duration) -> bool {
        match self.0.as_mut() {
            Some(teardown) => teardown.exited_within(within).await,
            None => false,
        }
    }

    /// Removes the job's sandbox; `false` when the backend did not answer
    /// (the removal goes on in the background).
    pub async fn remove(mut self) -> bool {
        match self.0.take() {
            Some(teardown) => teardown.remove().await,
            None => true,
        }
    }
}

impl fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cleanup")
            .field("pending", &self.0.is_some())
            .finish()
    }
}
