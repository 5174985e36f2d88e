//! What a session leaves: the output of the stage that is running, the
//! started sandbox a job is given, and what is left of its container once
//! the job's result is known ([`ContainerCleanup`], the Docker engine's
//! side of a [`Cleanup`]).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;

use super::connection::{Connection, OutputStream};
use super::container::ContainerGuard;
use super::engine::{Cleanup, Teardown};
use crate::job::result::signal_name;
use crate::job::{Output, StageResult, StartKind};
use crate::protocol::{Reason, StageReport};

/// Output of the stage that is running, capped at its output limit.
pub(super) struct StageOutput {
    pub(super) name: String,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
    pub(super) cap: u64,
    pub(super) truncated: bool,
    pub(super) started: Instant,
    /// The stage's output files, when it asked for any.
    pub(super) outputs: Option<super::outputs::OutputCollector>,
}

impl StageOutput {
    /// A stage that starts now, its output capped at `cap` bytes.
    pub(super) fn new(name: String, cap: u64) -> Self {
        Self {
            name,
            stdout: Vec::new(),
            stderr: Vec::new(),
            cap,
            truncated: false,
            started: Instant::now(),
            outputs: None,
        }
    }

    /// The same stage, collecting its output files with `outputs`.
    pub(super) fn with_outputs(mut self, outputs: Option<super::outputs::OutputCollector>) -> Self {
        self.outputs = outputs;
        self
    }

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

/// What is left of a job's container once its result is known: the
/// Docker engine's [`Teardown`] (see [`Cleanup`]).
pub(super) struct ContainerCleanup {
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

impl ContainerCleanup {
    /// The removal of a container that never ran the job.
    pub(super) fn of(guard: ContainerGuard) -> Cleanup {
        Cleanup::new(Self {
            guard: Some(guard),
            stopping: None,
            lingering: false,
        })
    }
}

#[async_trait]
impl Teardown for ContainerCleanup {
    /// Every process of the job was killed and checked gone before `done`,
    /// and the supervisor removes the job's files before it lingers (or
    /// exits at once). Its exit, and the teardown Docker does for it, then
    /// happen at the removal, not beside the jobs running.
    fn is_idle(&self) -> bool {
        self.lingering && self.stopping.is_some() && self.guard.is_some()
    }

    /// Closes the attach stream: the supervisor exits.
    fn stop_lingering(&mut self) {
        if self.lingering {
            self.lingering = false;
            self.stopping = None;
        }
    }

    async fn exited_within(&mut self, within: Duration) -> bool {
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

    async fn remove(mut self: Box<Self>) -> bool {
        match self.guard.take() {
            Some(guard) => guard.remove().await,
            None => true,
        }
    }
}
