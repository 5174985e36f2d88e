//! What a session leaves: the output of the stage that is running, the
//! started sandbox a job is given, and the job's end ([`RunOutcome`]) with
//! the container still to remove ([`Cleanup`]).

use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::connection::{Connection, OutputStream};
use super::container::ContainerGuard;
use crate::job::result::signal_name;
use crate::job::{JobResult, Output, StageResult, StartKind};
use crate::protocol::{Reason, StageReport};

/// Output of the stage that is running, capped at its output limit.
pub(super) struct StageOutput {
    pub(super) name: String,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
    pub(super) cap: u64,
    pub(super) truncated: bool,
    pub(super) started: Instant,
}

impl StageOutput {
    /// Keeps what fits under the cap; returns the part kept.
    pub(super) fn accept(&mut self, data: Vec<u8>, is_stdout: bool) -> Vec<u8> {
        let used = (self.stdout.len() + self.stderr.len()) as u64;
        let room = self.cap.saturating_sub(used) as usize;
        let kept = if data.len() > room {
            self.truncated = true;
            data[..room].to_vec()
        } else {
            data
        };
        if is_stdout {
            self.stdout.extend_from_slice(&kept);
        } else {
            self.stderr.extend_from_slice(&kept);
        }
        kept
    }

    pub(super) fn into_result(self, report: Option<&StageReport>, reason: Reason) -> StageResult {
        StageResult {
            stdout: Output(self.stdout),
            stderr: Output(self.stderr),
            truncated: self.truncated || report.is_some_and(|r| r.output_truncated),
            exit_code: report.and_then(|r| r.exit_code),
            signal: report
                .and_then(|r| r.signal)
                .map(signal_name)
                .or_else(|| report.is_none().then(|| "SIGKILL".to_string())),
            reason: report.map_or(reason, |r| r.reason),
            wall_ms: report
                .map_or_else(|| self.started.elapsed().as_millis() as u64, |r| r.wall_ms),
            cpu_ms: report.map_or(0, |r| r.cpu_ms),
            memory_peak_bytes: report.map_or(0, |r| r.memory_peak_bytes),
            pids_limit_reached: report.and_then(|r| r.pids_limit_reached),
        }
    }
}

/// A sandbox given to one job: its container (removed through the guard,
/// which also holds its uid) and its attached connection.
pub(super) struct Started {
    pub(super) guard: ContainerGuard,
    pub(super) connection: Connection,
    pub(super) kind: StartKind,
}

/// A job's end: its result, and the container still to remove. The result
/// is ready before the container is gone, so it can be made durable first;
/// [`Cleanup::remove`] follows (a dropped `Cleanup` removes in the
/// background).
pub struct RunOutcome {
    pub result: JobResult,
    pub cleanup: Cleanup,
    /// The container that ran the job (its name).
    pub container: String,
}

/// What is left to do once a job's result is known.
pub struct Cleanup {
    pub(super) guard: Option<ContainerGuard>,
    /// Set when the sandbox's supervisor said `done` and nothing failed:
    /// the container is stopping by itself, and this attach stream ends
    /// once its process has exited. Then its removal may wait: it holds no
    /// process and no memory, only Docker's record and layer.
    pub(super) stopping: Option<OutputStream>,
    /// The supervisor was asked to linger after `done`
    /// ([`super::SandboxConfig::linger`]): it stays, idle, until this
    /// attach stream is closed (the removal), or the linger passes.
    pub(super) lingering: bool,
}

impl Cleanup {
    /// Whether the container holds nothing of its job any more while its
    /// supervisor lingers: every process of the job was killed and checked
    /// gone before `done`, and the supervisor removes the job's files before
    /// it lingers (or exits at once), so its removal may wait without a job
    /// process running, or its files held, past its slot. Its exit, and the
    /// teardown Docker does for it, then happen at the removal, not beside
    /// the jobs running.
    pub fn is_idle(&self) -> bool {
        self.lingering && self.stopping.is_some() && self.guard.is_some()
    }

    /// Ends a lingering supervisor now (its attach stream closed): the
    /// container exits while the caller goes on, to be removed at once.
    pub fn stop_lingering(&mut self) {
        if self.lingering {
            self.lingering = false;
            self.stopping = None;
        }
    }

    /// Whether the container ended by itself within `within` (its attach
    /// stream ended): its removal may then wait. `false` when it was not
    /// stopping by itself or did not end in time (remove it now).
    pub async fn exited_within(&mut self, within: Duration) -> bool {
        let (Some(stream), Some(guard)) = (self.stopping.as_mut(), self.guard.as_ref()) else {
            return false;
        };
        // The stream ends when the process has exited; then Docker's own
        // view is awaited too, so that nothing counting containers (the
        // capacity a slot stands for) sees it running past its slot.
        let ended = tokio::time::timeout(within, async {
            while stream.next().await.is_some() {}
            guard.wait_stopped().await
        })
        .await
        .unwrap_or(false);
        self.stopping = None;
        ended
    }

    /// Removes the job's container; `false` when Docker did not answer (the
    /// removal goes on in the background).
    pub async fn remove(mut self) -> bool {
        match self.guard.take() {
            Some(guard) => guard.remove().await,
            None => true,
        }
    }
}
