//! A job's session in a sandbox: over a started container's connection
//! (`connection.rs`: create, attach, start; for a warm sandbox, the
//! supervisor's `ready`), speak frames with the supervisor for one job
//! until it is done or the deadline passes ([`run_in`](super::run::run_in)). The result
//! comes back before the container is removed ([`RunOutcome`](super::RunOutcome)): the caller
//! makes it durable first, then removes the container, still holding the
//! job's slot.
//!
//! Every frame from the sandbox is untrusted: its size is bounded by the
//! decoder, its content is checked against what the job asked for, and output
//! is capped here too, whatever the supervisor claims. `frames.rs` is the
//! session's side of each frame; this file starts the session, runs its
//! loop over the frames, the job's input and the deadline, and reads how it
//! ended.
//!
//! A sandbox that dies without reporting is inspected: OOM-killed is
//! `memory_limit` (under gVisor also a bare exit 137 the host did not cause,
//! since Docker loses some OOM events: `connection::ended_out_of_memory`).

mod frames;

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::config::GvisorLimits;
use super::connection::{
    Connection, OutputStream, SUPERVISOR_LOG_TAIL, ended_out_of_memory, inspect_end, log_suffix,
};
use super::container::ContainerGuard;
use super::grading::{Grader, Interrupt, test_index};
use super::outcome::StageOutput;
use super::uids::runs_uid;
use super::{JobInput, JobIo, SandboxConfig, SandboxEvent};
use crate::job::deadline;
use crate::job::{PreparedJob, StageResult, scratch_mounts};

use crate::protocol::{
    Bundle, FIFO_OPEN_TIMEOUT, FrameDecoder, HostMessage, MAX_OUTPUT_CHUNK, Reason, SandboxMessage,
    SignalKind,
};

/// How long a cancelled job's supervisor gets to report before the container
/// is removed anyway.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// How long Docker may take to answer whether it is still there.
const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// A platform failure: the job ends with status `error` and this message.
pub(super) struct Failure(pub(super) String);

/// Why the frame loop stopped.
enum Ending {
    Done,
    StreamEnded,
    Deadline,
}

struct Session<'a> {
    job: &'a PreparedJob,
    io: JobIo,
    frames: mpsc::Sender<Vec<u8>>,
    ready_at: Option<Instant>,
    current: Option<StageOutput>,
    compile: Option<StageResult>,
    run: Option<StageResult>,
    cancelled: bool,
    /// The host asked the supervisor to kill the job (a cancel, or a client's
    /// `kill` signal): a stage reported `killed` is then the host's doing.
    kill_sent: bool,
    supervisor_log: Vec<u8>,
    /// A graded job's tests.
    grader: Option<Grader>,
    /// A graded job's sandbox started again after the last one died in a
    /// test: it says nothing but the tests.
    restarted: bool,
    /// A stage started on the warm runtime.
    warm_runtime: bool,
    /// A stage or test has started.
    started: bool,
    /// The run stage's output files.
    outputs: Vec<crate::job::outputs::OutputEntry>,
}

/// What the session produced; `error` is set when the platform failed after
/// some stages had already been reported.
pub(super) struct SessionOutcome {
    pub(super) compile: Option<StageResult>,
    pub(super) run: Option<StageResult>,
    pub(super) ready_at: Option<Instant>,
    pub(super) cancelled: bool,
    pub(super) error: Option<String>,
    pub(super) grader: Option<Grader>,
    /// The job's channels, for a sandbox that takes over.
    pub(super) io: JobIo,
    /// The sandbox died in a graded job's test and tests remain.
    pub(super) restart: bool,
    /// The first stage ran on a runtime started ahead (the supervisor said so).
    pub(super) warm_runtime: bool,
    /// The run stage's output files (a graded job's are in its tests).
    pub(super) outputs: Vec<crate::job::outputs::OutputEntry>,
    /// After the supervisor said `done`: the attach stream, which ends
    /// when the container's process has exited (see `ContainerCleanup::stopping`).
    pub(super) exiting: Option<OutputStream>,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn drive(
    docker: &Docker,
    config: &SandboxConfig,
    job_id: &str,
    job: &PreparedJob,
    io: JobIo,
    guard: &ContainerGuard,
    connection: Connection,
    uid: Option<u32>,
    grader: Option<Grader>,
    restarted: bool,
    linger: Duration,
) -> Result<SessionOutcome, Failure> {
    let Connection {
        frames,
        writer,
        output,
        decoder,
        supervisor_log,
        ready_at,
    } = connection;

    let gvisor = config.gvisor_limits(job.limits.pids);
    let mut session = Session {
        job,
        io,
        frames,
        ready_at,
        current: None,
        compile: None,
        run: None,
        cancelled: false,
        kill_sent: false,
        supervisor_log,
        grader,
        restarted,
        warm_runtime: false,
        started: false,
        outputs: Vec::new(),
    };
    let mut bundle = job.bundle.clone();
    if let Some(uid) = uid {
        bundle.uid = uid;
        bundle.gid = uid;
    }
    bundle.linger_ms = u64::try_from(linger.as_millis()).unwrap_or(u64::MAX);
    if bundle.linger_ms > 0 {
        bundle.linger_wipe = scratch_mounts();
    }
    if let Some(runs) = &mut bundle.runs {
        // The tests run as a uid of their own (see `RunPlan`).
        runs.uid = runs_uid(bundle.uid);
        runs.gid = runs_uid(bundle.gid);
    }
    for stage in &mut bundle.stages {
        GvisorLimits::apply(gvisor, &mut stage.limits);
    }
    session.send_initial_frames(bundle).await;
    let mut output = output;
    let ending = session.frame_loop(&mut output, decoder, config).await;
    writer.abort();
    let mut error = None;
    let mut restart = false;
    let done = matches!(ending, Ok(Ending::Done));
    match ending {
        Ok(Ending::Done) => {
            if let Some(stage) = session.killed_from_outside() {
                // SIGTERM reached the supervisor from outside the sandbox:
                // dockerd stopping its containers as it shuts down (its API is
                // already closed then), or a `docker stop`. Not the program's
                // doing, so not its result.
                let ping = tokio::time::timeout(PING_TIMEOUT, docker.ping()).await;
                error = Some(match ping {
                    Err(_) | Ok(Err(_)) => {
                        tracing::debug!(job.id = %job_id, ?ping, "docker does not answer after the sandbox was stopped");
                        format!(
                            "dockerd stopped the sandbox while stage {stage} was running (docker is not answering: dockerd shut down or is restarting)"
                        )
                    }
                    Ok(Ok(_)) => format!(
                        "the sandbox was stopped from outside while stage {stage} was running (its supervisor got SIGTERM, as from `docker stop`)"
                    ),
                });
            }
        }
        Ok(Ending::Deadline) if session.ready_at.is_none() && !session.cancelled => {
            return Err(Failure(format!(
                "the sandbox did not start within {} s{}",
                config.budget.start_timeout.as_secs(),
                session.log_suffix()
            )));
        }
        Ok(Ending::Deadline) => {
            let reason = if session.cancelled {
                Reason::Killed
            } else {
                Reason::WallTimeout
            };
            session.end_unreported_stage(reason).await;
        }
        Ok(Ending::StreamEnded) => {
            let inspect = inspect_end(docker, guard.name()).await;
            // A cancel's kill is the host's own, never the memory limit's.
            let oom =
                ended_out_of_memory(inspect.as_ref(), config.is_gvisor() && !session.cancelled);
            if oom && session.ready_at.is_some() {
                restart = session.in_test() && !session.cancelled;
                session.end_unreported_stage(Reason::MemoryLimit).await;
                restart &= session.grader.as_ref().is_some_and(Grader::has_more);
            } else if session.cancelled {
                session.end_unreported_stage(Reason::Killed).await;
            } else {
                let code = inspect.and_then(|s| s.exit_code).unwrap_or(-1);
                error = Some(format!(
                    "the sandbox exited without reporting (exit code {code}){}",
                    session.log_suffix()
                ));
            }
        }
        Err(Failure(message)) => error = Some(message),
    }
    Ok(SessionOutcome {
        compile: session.compile,
        run: session.run,
        ready_at: session.ready_at,
        cancelled: session.cancelled,
        error,
        grader: session.grader,
        io: session.io,
        restart,
        warm_runtime: session.warm_runtime,
        outputs: session.outputs,
        exiting: done.then_some(output),
    })
}

impl Session<'_> {
    async fn send(&self, message: HostMessage) {
        // A closed writer means the container is gone; the frame loop sees
        // that on the output side and reports it.
        let _ = self.frames.send(message.encode()).await;
    }

    /// A client cancelled the job: it is killed, with a short grace for
    /// the supervisor's report.
    async fn cancel(&mut self, deadline: &mut tokio::time::Instant) {
        self.cancelled = true;
        self.kill_sent = true;
        self.send(HostMessage::Signal(SignalKind::Kill)).await;
        *deadline = (*deadline).min(tokio::time::Instant::now() + CANCEL_GRACE);
    }

    /// Hands a client's input to the sandbox.
    async fn forward(&mut self, input: JobInput) {
        match input {
            JobInput::Stdin(data) => {
                for chunk in data.chunks(MAX_OUTPUT_CHUNK) {
                    self.send(HostMessage::Stdin(chunk.to_vec())).await;
                }
            }
            JobInput::StdinClose => self.send(HostMessage::StdinClose).await,
            JobInput::Signal(signal) => {
                self.kill_sent |= signal == SignalKind::Kill;
                if signal == SignalKind::Kill
                    && let Some(grader) = &mut self.grader
                {
                    // A kill stops the grading: the test running is
                    // killed and the rest are not run.
                    grader.kill();
                }
                self.send(HostMessage::Signal(signal)).await;
            }
        }
    }

    async fn send_initial_frames(&mut self, bundle: Bundle) {
        self.send(HostMessage::Bundle(Box::new(bundle))).await;
        for chunk in self.job.stdin.chunks(MAX_OUTPUT_CHUNK) {
            self.send(HostMessage::Stdin(chunk.to_vec())).await;
        }
        if !self.job.interactive {
            self.send(HostMessage::StdinClose).await;
        }
        let runs = self
            .grader
            .as_mut()
            .map(Grader::first_frames)
            .unwrap_or_default();
        for frame in runs {
            self.send(frame).await;
        }
    }

    async fn emit(&self, event: SandboxEvent) {
        let of_tests = matches!(
            event,
            SandboxEvent::TestStart { .. } | SandboxEvent::TestEnd(_)
        );
        if self.restarted && !of_tests {
            return;
        }
        if let Some(events) = &self.io.events {
            let _ = events.send(event).await;
        }
    }

    fn log_suffix(&self) -> String {
        log_suffix(&self.supervisor_log)
    }

    /// `at`, or the job's stored deadline ([`JobIo::deadline_ms`]) when
    /// that comes first: the worker, the reaper and a waiting client all
    /// read that one figure.
    fn at_latest_by_stored(&self, at: tokio::time::Instant) -> tokio::time::Instant {
        match self.io.deadline_ms {
            Some(stored) => {
                let left = deadline::until(stored);
                at.min(tokio::time::Instant::now() + left)
            }
            None => at,
        }
    }

    /// What the job may still take once its first stage started: its walls
    /// and the grace.
    fn after_first_stage(&self, config: &SandboxConfig) -> Duration {
        config
            .budget
            .after_first_stage(Duration::from_millis(self.job.stages_wall_ms()))
    }

    /// The job's walls and the grace from now, or its stored deadline
    /// when that comes first.
    fn walls_from_now(&self, config: &SandboxConfig) -> tokio::time::Instant {
        self.at_latest_by_stored(tokio::time::Instant::now() + self.after_first_stage(config))
    }

    /// A stage or test started: at the first, the job's walls count from
    /// now. Before it, a warm sandbox had [`FIFO_OPEN_TIMEOUT`] more (see
    /// `frame_loop`), which is not the job's time.
    fn note_started(&mut self, deadline: &mut tokio::time::Instant, config: &SandboxConfig) {
        if !self.started {
            self.started = true;
            if !self.cancelled {
                *deadline = self.walls_from_now(config);
            }
        }
    }

    async fn frame_loop(
        &mut self,
        output: &mut OutputStream,
        mut decoder: FrameDecoder,
        config: &SandboxConfig,
    ) -> Result<Ending, Failure> {
        let mut deadline = self.at_latest_by_stored(
            tokio::time::Instant::now()
                + if self.ready_at.is_some() {
                    // A warm sandbox: its supervisor was ready before the job
                    // came. Its runtime may still be starting: the supervisor
                    // waits up to `FIFO_OPEN_TIMEOUT` for it before the first
                    // stage (`note_started` then counts the walls afresh).
                    self.after_first_stage(config) + FIFO_OPEN_TIMEOUT
                } else {
                    config.budget.start_timeout
                },
        );
        // Frames the decoder already holds (none, normally) come first.
        loop {
            let frame = decoder
                .next_frame()
                .map_err(|error| Failure(format!("the sandbox sent an invalid frame: {error}")))?;
            let Some(frame) = frame else { break };
            let message = SandboxMessage::decode(frame)
                .map_err(|error| Failure(format!("the sandbox sent an invalid frame: {error}")))?;
            if self.handle(message, &mut deadline, config).await? {
                return Ok(Ending::Done);
            }
        }
        let mut input_open = self.io.input.is_some();
        let cancel = self.io.cancel.clone();
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled(), if !self.cancelled => self.cancel(&mut deadline).await,
                () = tokio::time::sleep_until(deadline) => return Ok(Ending::Deadline),
                input = recv_input(&mut self.io.input), if input_open => match input {
                    None => input_open = false,
                    Some(input) => self.forward(input).await,
                },
                item = output.next() => match item {
                    None => return Ok(Ending::StreamEnded),
                    Some(Err(error)) => {
                        return Err(Failure(format!("the sandbox stream broke: {error}")));
                    }
                    Some(Ok(LogOutput::StdOut { message })) => {
                        decoder.extend(&message);
                        loop {
                            let frame = decoder.next_frame().map_err(|error| {
                                Failure(format!("the sandbox sent an invalid frame: {error}"))
                            })?;
                            let Some(frame) = frame else { break };
                            let message = SandboxMessage::decode(frame).map_err(|error| {
                                Failure(format!("the sandbox sent an invalid frame: {error}"))
                            })?;
                            if self.handle(message, &mut deadline, config).await? {
                                return Ok(Ending::Done);
                            }
                        }
                    }
                    Some(Ok(LogOutput::StdErr { message })) => {
                        tracing::debug!(log = %String::from_utf8_lossy(&message), "sandbox supervisor stderr");
                        self.supervisor_log.extend_from_slice(&message);
                        let excess = self.supervisor_log.len().saturating_sub(SUPERVISOR_LOG_TAIL);
                        self.supervisor_log.drain(..excess);
                    }
                    Some(Ok(_)) => {}
                },
            }
        }
    }

    /// Whether the stage running is one of a graded job's tests.
    fn in_test(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(|c| test_index(&c.name).is_some())
    }

    /// The stage the supervisor reported `killed` although the host never
    /// asked for a kill: the supervisor got SIGTERM from outside.
    fn killed_from_outside(&self) -> Option<&'static str> {
        if self.kill_sent {
            return None;
        }
        [("compile", &self.compile), ("run", &self.run)]
            .into_iter()
            .find(|(_, stage)| stage.as_ref().is_some_and(|s| s.reason == Reason::Killed))
            .map(|(name, _)| name)
    }

    fn stage_slot(&self, stage: &str) -> Option<&StageResult> {
        match stage {
            "compile" => self.compile.as_ref(),
            _ => self.run.as_ref(),
        }
    }

    fn store(&mut self, stage: &str, result: StageResult) {
        match stage {
            "compile" => self.compile = Some(result),
            _ => self.run = Some(result),
        }
    }

    /// The sandbox stopped reporting in the middle of a stage (the engine
    /// killed it, or the kernel did): record that stage with `reason`.
    async fn end_unreported_stage(&mut self, reason: Reason) {
        let current = self.current.take().or_else(|| {
            // No stage had started yet: blame the first one not reported.
            let spec = self
                .job
                .bundle
                .stages
                .iter()
                .find(|s| self.stage_slot(&s.name).is_none())?;
            let mut output = StageOutput::new(spec.name.clone(), spec.limits.output_bytes);
            output.started = self.ready_at.unwrap_or_else(Instant::now);
            Some(output)
        });
        if let Some(mut current) = current {
            let name = current.name.clone();
            let outputs = current
                .outputs
                .take()
                .map(super::outputs::OutputCollector::unreported)
                .unwrap_or_default();
            let result = current.into_result(None, reason);
            match (test_index(&name), &mut self.grader) {
                (Some(index), Some(grader)) => {
                    if let Some(test) = grader.unreported(index, &result) {
                        grader.attach_outputs(index, outputs, 0);
                        self.emit(SandboxEvent::TestEnd(Box::new(test))).await;
                    }
                }
                _ => {
                    if name == "run" {
                        self.outputs = outputs;
                    }
                    self.store(&name, result);
                }
            }
        }
    }
}

/// Resolves when the job is cancelled or a client's kill comes; any other
/// input that comes first is kept in `held`, to be forwarded after.
async fn interruption(
    cancel: &tokio_util::sync::CancellationToken,
    input: &mut Option<mpsc::Receiver<JobInput>>,
    held: &mut Vec<JobInput>,
) -> Interrupt {
    let mut open = input.is_some();
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Interrupt::Cancelled,
            item = recv_input(input), if open => match item {
                Some(JobInput::Signal(SignalKind::Kill)) => return Interrupt::Killed,
                Some(other) => held.push(other),
                None => open = false,
            },
        }
    }
}

async fn recv_input(input: &mut Option<mpsc::Receiver<JobInput>>) -> Option<JobInput> {
    match input {
        Some(receiver) => receiver.recv().await,
        None => None,
    }
}
