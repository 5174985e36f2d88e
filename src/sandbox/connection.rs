//! A sandbox's container, created, attached and started ([`start`]), and
//! the connection to its supervisor that frames go through ([`Connection`]);
//! the job's session over it is `session.rs`.

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, InspectContainerOptions,
};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::SandboxConfig;
use super::container::{ContainerGuard, SandboxShape, container_config};
use crate::protocol::{FrameDecoder, MAX_SANDBOX_FRAME, PROTOCOL_VERSION, SandboxMessage};

/// The output side of the attach stream.
pub(super) type OutputStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
>;

/// A started container, attached: frames go in through `frames` (a writer
/// task owns the container's stdin) and come out of `output`.
pub(super) struct Connection {
    pub(super) frames: mpsc::Sender<Vec<u8>>,
    pub(super) writer: tokio::task::JoinHandle<()>,
    pub(super) output: OutputStream,
    pub(super) decoder: FrameDecoder,
    pub(super) supervisor_log: Vec<u8>,
    /// When the supervisor said `ready` (before the job came, for a warm
    /// sandbox); `None` while it has not.
    pub(super) ready_at: Option<Instant>,
}

/// A platform failure while starting a sandbox.
#[derive(Debug, Clone)]
pub(super) struct StartFailure(pub(super) String);

/// Creates, attaches and starts the container `guard` names, as `shape` says.
pub(super) async fn start(
    docker: &Docker,
    config: &SandboxConfig,
    guard: &ContainerGuard,
    shape: &SandboxShape,
) -> Result<Connection, StartFailure> {
    let body = container_config(shape, config);
    let image = shape.image.clone();
    let options = CreateContainerOptions {
        name: Some(guard.name().to_string()),
        ..Default::default()
    };
    guard
        .create(options, body)
        .await
        .map_err(|error| match error {
            bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            } => StartFailure(format!(
                "image {image} is not built on this worker; run scripts/build-images"
            )),
            error => StartFailure(format!("docker could not create the sandbox: {error}")),
        })?;
    let attach = docker
        .attach_container(
            guard.name(),
            Some(AttachContainerOptions {
                stdin: true,
                stdout: true,
                stderr: true,
                stream: true,
                logs: false,
                ..Default::default()
            }),
        )
        .await
        .map_err(|error| {
            StartFailure(format!("docker could not attach to the sandbox: {error}"))
        })?;
    docker
        .start_container(guard.name(), None)
        .await
        .map_err(|error| StartFailure(format!("docker could not start the sandbox: {error}")))?;

    let (frames, mut frames_rx) = mpsc::channel::<Vec<u8>>(64);
    let mut input = attach.input;
    let writer = tokio::spawn(async move {
        while let Some(frame) = frames_rx.recv().await {
            if input.write_all(&frame).await.is_err() || input.flush().await.is_err() {
                return;
            }
        }
        let _ = input.shutdown().await;
    });
    Ok(Connection {
        frames,
        writer,
        output: attach.output,
        decoder: FrameDecoder::new(MAX_SANDBOX_FRAME),
        supervisor_log: Vec::new(),
        ready_at: None,
    })
}

impl Connection {
    /// Reads until the supervisor says `ready` (a warm sandbox, before any
    /// job), within `timeout`. Anything else it says then is a failure.
    pub(super) async fn await_ready(&mut self, timeout: Duration) -> Result<(), StartFailure> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(frame) = self.next_message()? {
                return match frame {
                    SandboxMessage::Ready(ready) if ready.protocol == PROTOCOL_VERSION => {
                        self.ready_at = Some(Instant::now());
                        Ok(())
                    }
                    SandboxMessage::Ready(ready) => {
                        Err(StartFailure(protocol_mismatch(ready.protocol)))
                    }
                    SandboxMessage::Fatal(fatal) => Err(StartFailure(format!(
                        "the sandbox supervisor failed: {}",
                        fatal.message
                    ))),
                    other => Err(StartFailure(format!(
                        "the sandbox sent a {} frame before it was ready",
                        message_name(&other)
                    ))),
                };
            }
            let item = tokio::time::timeout_at(deadline, self.output.next())
                .await
                .map_err(|_| {
                    StartFailure(format!(
                        "the sandbox did not start within {} s{}",
                        timeout.as_secs(),
                        log_suffix(&self.supervisor_log)
                    ))
                })?;
            match item {
                None => {
                    return Err(StartFailure(format!(
                        "the sandbox exited before it was ready{}",
                        log_suffix(&self.supervisor_log)
                    )));
                }
                Some(Err(error)) => {
                    return Err(StartFailure(format!("the sandbox stream broke: {error}")));
                }
                Some(Ok(output)) => self.take_output(output),
            }
        }
    }

    /// The next message from the supervisor, by `deadline` at the latest.
    pub(super) async fn next(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<SandboxMessage, StartFailure> {
        loop {
            if let Some(message) = self.next_message()? {
                return Ok(message);
            }
            let item = tokio::time::timeout_at(deadline, self.output.next())
                .await
                .map_err(|_| StartFailure("the sandbox did not answer in time".into()))?;
            match item {
                None => {
                    return Err(StartFailure(format!(
                        "the sandbox exited{}",
                        log_suffix(&self.supervisor_log)
                    )));
                }
                Some(Err(error)) => {
                    return Err(StartFailure(format!("the sandbox stream broke: {error}")));
                }
                Some(Ok(output)) => self.take_output(output),
            }
        }
    }

    /// An idle warm sandbox's supervisor says nothing until it gets a
    /// bundle: returns (with why) when its stream says anything or ends.
    pub(super) async fn idle_until_broken(&mut self) -> String {
        match self.output.next().await {
            None => format!(
                "the idle sandbox exited{}",
                log_suffix(&self.supervisor_log)
            ),
            Some(Err(error)) => format!("the idle sandbox's stream broke: {error}"),
            Some(Ok(output)) => {
                self.take_output(output);
                format!(
                    "the idle sandbox spoke before it had a job{}",
                    log_suffix(&self.supervisor_log)
                )
            }
        }
    }

    /// Feeds one chunk of the attach stream: stdout into the frame decoder,
    /// stderr into the supervisor's log tail.
    fn take_output(&mut self, output: LogOutput) {
        match output {
            LogOutput::StdOut { message } => self.decoder.extend(&message),
            LogOutput::StdErr { message } => {
                tracing::debug!(log = %String::from_utf8_lossy(&message), "sandbox supervisor stderr");
                self.supervisor_log.extend_from_slice(&message);
                let excess = self
                    .supervisor_log
                    .len()
                    .saturating_sub(SUPERVISOR_LOG_TAIL);
                self.supervisor_log.drain(..excess);
            }
            _ => {}
        }
    }

    /// The next whole message the decoder holds, if any.
    fn next_message(&mut self) -> Result<Option<SandboxMessage>, StartFailure> {
        let frame = self
            .decoder
            .next_frame()
            .map_err(|error| StartFailure(format!("the sandbox sent an invalid frame: {error}")))?;
        frame
            .map(|frame| {
                SandboxMessage::decode(frame).map_err(|error| {
                    StartFailure(format!("the sandbox sent an invalid frame: {error}"))
                })
            })
            .transpose()
    }
}

/// How much of the supervisor's own stderr is kept for error messages.
pub(super) const SUPERVISOR_LOG_TAIL: usize = 2048;

pub(super) fn message_name(message: &SandboxMessage) -> &'static str {
    match message {
        SandboxMessage::Ready(_) => "ready",
        SandboxMessage::StageStart(_) => "stage_start",
        SandboxMessage::Stdout(_) => "stdout",
        SandboxMessage::Stderr(_) => "stderr",
        SandboxMessage::StageEnd(_) => "stage_end",
        SandboxMessage::Fatal(_) => "fatal",
        SandboxMessage::Done => "done",
        SandboxMessage::InputWanted => "input_wanted",
        SandboxMessage::OutputFile(_) => "output_file",
        SandboxMessage::OutputData(_) => "output_data",
        SandboxMessage::OutputError(_) => "output_error",
    }
}

pub(super) fn protocol_mismatch(theirs: u32) -> String {
    format!(
        "the image speaks protocol {theirs} but this worker speaks {PROTOCOL_VERSION}; rebuild the images"
    )
}

pub(super) fn log_suffix(log: &[u8]) -> String {
    let text = String::from_utf8_lossy(log);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!("; supervisor said: {text}")
    }
}

/// Attempts (and the pause between them) to see the out-of-memory flag of
/// a sandbox that ended killed (exit 137): Docker can report the exit before
/// the kernel's OOM event.
const OOM_FLAG_ATTEMPTS: u32 = 5;
const OOM_FLAG_PAUSE: Duration = Duration::from_millis(100);

/// The state of a sandbox that ended without reporting; when it ended
/// killed but not (yet) flagged OOM-killed, asked again a few times.
pub(super) async fn inspect_end(
    docker: &Docker,
    name: &str,
) -> Option<bollard::models::ContainerState> {
    let mut state = None;
    for attempt in 0..OOM_FLAG_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(OOM_FLAG_PAUSE).await;
        }
        state = docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
            .ok()
            .and_then(|i| i.state);
        if state.as_ref().is_none_or(|s| !killed(s) || flagged_oom(s)) {
            break;
        }
    }
    state
}

fn killed(state: &bollard::models::ContainerState) -> bool {
    state.exit_code == Some(137)
}

fn flagged_oom(state: &bollard::models::ContainerState) -> bool {
    state.oom_killed == Some(true)
}

/// Whether a sandbox that ended without reporting, and that the host did
/// not kill, was ended by its memory limit.
///
/// Docker's `OOMKilled` says so when it is set. Under gVisor it is not
/// enough: the host's OOM killer takes the whole sandbox, and Docker loses
/// that OOM event now and then (measured here: 2 of 40 memory bombs under
/// load never flagged, however long it was asked) — the kill comes out as
/// a bare exit 137. A gVisor sandbox the host did not kill has no other
/// sender of SIGKILL than the OOM killer (the deadline and a cancel are the
/// host's own kills, told apart before this), so there a bare 137 is the
/// memory limit too.
pub(super) fn ended_out_of_memory(
    state: Option<&bollard::models::ContainerState>,
    gvisor: bool,
) -> bool {
    state.is_some_and(|s| flagged_oom(s) || (gvisor && killed(s)))
}

#[cfg(test)]
mod tests {
    use bollard::models::ContainerState;

    use super::ended_out_of_memory;

    fn ended(exit_code: i64, oom_killed: bool) -> ContainerState {
        ContainerState {
            exit_code: Some(exit_code),
            oom_killed: Some(oom_killed),
            ..Default::default()
        }
    }

    #[test]
    fn the_oom_flag_means_the_memory_limit_on_both_runtimes() {
        for gvisor in [false, true] {
            assert!(ended_out_of_memory(Some(&ended(137, true)), gvisor));
        }
    }

    #[test]
    fn a_bare_kill_is_the_memory_limit_only_under_gvisor() {
        assert!(ended_out_of_memory(Some(&ended(137, false)), true));
        assert!(!ended_out_of_memory(Some(&ended(137, false)), false));
    }

    #[test]
    fn other_ends_and_no_state_are_not_the_memory_limit() {
        for gvisor in [false, true] {
            assert!(!ended_out_of_memory(Some(&ended(1, false)), gvisor));
            assert!(!ended_out_of_memory(Some(&ended(139, false)), gvisor));
            assert!(!ended_out_of_memory(None, gvisor));
        }
    }
}
