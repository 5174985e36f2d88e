//! The supervisor's top-level sequence: `ready`, the bundle, the files, the
//! stages in order, `done`. Anything that stops it sends `fatal` and exits
//! with [`EXIT_FATAL`].
//!
//! It runs on a current-thread tokio runtime: one thread owns the stage, the
//! timers, every spawn and all reaping (see [`super::reap`]); plain threads
//! do the blocking work around it: the frame reader on stdin, the frame
//! writer on stdout, the signaller of [`super::kill`], for each stage the
//! readers of its stdout and stderr and the writer of its stdin
//! ([`super::pipes`]), the job thread that does the work done as the job's
//! uid, started before the bundle comes ([`super::job_thread`]), and, if
//! the bundle has one, the egress relay ([`super::egress`]), from the bundle
//! to the end.
//!
//! Under gVisor every system call costs tens of µs, so what does not depend
//! on the job is done before the bundle, off a warm job's path: the memory
//! and pids cgroups are found, the supervisor's own hard limits and CPU
//! affinity read. A warm runtime's limits are set in the same trip to the
//! job thread as the files.
//!
//! After `done` it exits, unless the bundle has `linger_ms`: then it closes
//! the egress relay, empties the bundle's `linger_wipe` directories (the
//! worker sends the workspace, `/tmp`, `/dev/shm`, `/dev/mqueue`) from the
//! job thread, and waits, idle, until the host closes its stream (or SIGTERM
//! or SIGINT comes, or `linger_ms` passes), dropping late frames: the host
//! decides when the container exits. If it cannot empty them it says why
//! on stderr and exits at once.

use nix::sys::stat::{Mode, umask};
use nix::unistd::setgroups;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;

use super::accounting::CgroupProbe;
use super::egress::{MAX_SOCKET_PATH, Relay};
use super::files::write_bundle_files;
use super::io::{FrameSink, HostEvent, host_message_name, spawn_host_reader};
use super::kill::{Killer, Signaller, Target};
use super::runs::{Scratch, empty_dirs};
use super::runs_filter::RunFilter;
use super::runtime::{FIFO_OPEN_POLL, WarmRuntime};
use super::stage::run_stage;
use super::stdin::StdinQueue;
use super::{EXIT_FATAL, HANDLED_SIGNALS, InitError};
use code_runner_protocol::{
    Bundle, EgressRelay, Fatal, HostMessage, PROTOCOL_VERSION, Ready, Reason, RunSpec,
    SandboxMessage, SignalKind as HostSignal, StageReport,
};
use std::collections::VecDeque;

/// Runs the supervisor; returns the process exit status.
pub(crate) fn run() -> i32 {
    // Before any thread exists: see `prepare_process`.
    let prepared = prepare_process();
    let sink = match FrameSink::start() {
        Ok(sink) => sink,
        Err(error) => {
            eprintln!("code-runner-init: {error}");
            return EXIT_FATAL;
        }
    };
    let code = match prepared
        .and_then(|()| super::job_thread::start())
        .and_then(|()| Signaller::start())
    {
        Ok(signaller) => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(supervise(&sink, signaller)),
            Err(error) => report_fatal_blocking(&sink, &InitError::Runtime(error)),
        },
        Err(error) => report_fatal_blocking(&sink, &error),
    };
    sink.finish();
    code
}

/// Process-wide set-up, done while the process has a single thread. This
/// matters for `setgroups`: glibc makes every thread of a process follow a
/// credential change by signalling them all (`SIGSETXID`), and under gVisor
/// that broadcast crashed the supervisor with SIGSEGV before its first
/// frame in about one start in five.
fn prepare_process() -> Result<(), InitError> {
    nix::sys::prctl::set_dumpable(false).map_err(InitError::NonDumpable)?;
    // As PID 1 every orphan comes to us anyway; outside a container (tests)
    // this makes the job's orphans ours to reap too.
    if let Err(errno) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("code-runner-init: cannot become a child subreaper: {errno}");
    }
    // The supervisor needs no supplementary groups, and the file-writing
    // thread must not carry root's.
    if let Err(errno) = setgroups(&[]) {
        eprintln!("code-runner-init: cannot clear supplementary groups: {errno}");
    }
    // Directories are created 0755 (files get an explicit fchmod).
    umask(Mode::from_bits_truncate(0o022));
    Ok(())
}

fn report_fatal_blocking(sink: &FrameSink, error: &InitError) -> i32 {
    eprintln!("code-runner-init: {error}");
    let _ = sink.send_blocking(&SandboxMessage::Fatal(Fatal {
        message: error.to_string(),
    }));
    EXIT_FATAL
}

/// The signals the supervisor handles.
pub(crate) struct Signals {
    pub child: Signal,
    pub terminate: Signal,
    pub interrupt: Signal,
}

impl Signals {
    /// Installs a handler for each of [`HANDLED_SIGNALS`], the one list
    /// the helper threads block too.
    fn install() -> Result<Self, InitError> {
        let [child, terminate, interrupt] = HANDLED_SIGNALS.map(|handled| {
            signal(SignalKind::from_raw(handled as i32)).map_err(|source| {
                InitError::SignalHandler {
                    signal: handled.as_str(),
                    source,
                }
            })
        });
        Ok(Self {
            child: child?,
            terminate: terminate?,
            interrupt: interrupt?,
        })
    }
}

/// A control request from the host for the running stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    None,
    /// Input arrived (counts as activity for the idle limit).
    Input,
    Interrupt,
    Kill,
}

/// Everything that outlives one stage.
pub(crate) struct Context<'a> {
    pub sink: &'a FrameSink,
    pub host: mpsc::UnboundedReceiver<HostEvent>,
    pub host_open: bool,
    pub signals: Signals,
    pub stdin: StdinQueue,
    pub killer: Killer,
    pub cgroups: CgroupProbe,
    pub uid: u32,
    pub gid: u32,
    /// A kill (host `kill` frame or SIGTERM) arrived while no stage was
    /// running: the next stage is reported killed instead of started.
    pub kill_requested: bool,
    /// `run` frames not run yet, in the order they came.
    pub pending_runs: VecDeque<RunSpec>,
    /// The host sent `runs_end` (or closed its stream).
    pub runs_ended: bool,
    /// Whether the bundle has a run plan (else a `run` frame is an error).
    pub runs_planned: bool,
    /// Installed in every process of a run (see [`RunFilter`]).
    pub run_filter: Option<RunFilter>,
    /// A warm runtime that fits the first stage, until that stage takes it.
    pub runtime: Option<WarmRuntime>,
}

impl Context<'_> {
    /// Applies one event from the host reader.
    pub(crate) fn on_host_event(&mut self, event: Option<HostEvent>) -> Result<Control, InitError> {
        match event {
            None | Some(HostEvent::Eof) => {
                // No more stdin can come: the stage reading it gets EOF.
                self.host_open = false;
                self.runs_ended = true;
                self.stdin.request_close();
                Ok(Control::None)
            }
            Some(HostEvent::ReadError(error)) => {
                eprintln!("code-runner-init: reading stdin failed: {error}; treating it as closed");
                self.host_open = false;
                self.stdin.request_close();
                Ok(Control::None)
            }
            Some(HostEvent::Malformed(error)) => Err(InitError::MalformedFrame(error)),
            Some(HostEvent::Message(message)) => match message {
                HostMessage::Stdin(data) => {
                    self.stdin.push(data);
                    Ok(Control::Input)
                }
                HostMessage::StdinClose => {
                    self.stdin.request_close();
                    Ok(Control::Input)
                }
                HostMessage::Signal(HostSignal::Interrupt) => Ok(Control::Interrupt),
                HostMessage::Signal(HostSignal::Kill) => Ok(Control::Kill),
                HostMessage::Run(run) if self.runs_planned && !self.runs_ended => {
                    self.pending_runs.push_back(*run);
                    Ok(Control::None)
                }
                HostMessage::RunsEnd if self.runs_planned => {
                    self.runs_ended = true;
                    Ok(Control::None)
                }
                other @ (HostMessage::Bundle(_)
                | HostMessage::Run(_)
                | HostMessage::RunsEnd
                | HostMessage::Prestart(_)) => {
                    Err(InitError::UnexpectedFrame(host_message_name(&other)))
                }
            },
        }
    }

    /// Applies the host events already waiting, without blocking; a kill
    /// among them sets [`Context::kill_requested`].
    pub(crate) fn apply_waiting_host_events(&mut self) -> Result<(), InitError> {
        while self.host_open {
            let Ok(event) = self.host.try_recv() else {
                break;
            };
            if self.on_host_event(Some(event))? == Control::Kill {
                self.kill_requested = true;
            }
        }
        Ok(())
    }
}

async fn supervise(sink: &FrameSink, signaller: Signaller) -> i32 {
    match supervise_inner(sink, signaller).await {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("code-runner-init: {error}");
            let _ = sink
                .send(&SandboxMessage::Fatal(Fatal {
                    message: error.to_string(),
                }))
                .await;
            EXIT_FATAL
        }
    }
}

async fn supervise_inner(sink: &FrameSink, signaller: Signaller) -> Result<(), InitError> {
    let mut signals = Signals::install()?;
    sink.send(&SandboxMessage::Ready(Ready {
        protocol: PROTOCOL_VERSION,
    }))
    .await?;
    let mut host = spawn_host_reader()?;
    // Before the bundle: for a warm sandbox, off the job's path.
    let cgroups = CgroupProbe::discover();
    super::spawn::read_own_limits();
    super::accounting::read_affinity();
    let (mut bundle, runtime) = await_bundle(&mut host, &mut signals).await?;
    check_bundle(&bundle)?;
    // Before anything of the job runs (a warm runtime released into the
    // first stage included), as that stage may connect at once. It relays
    // until this returns: after `done`, or before `fatal`.
    let egress = bundle.egress.as_ref().map(Relay::start).transpose()?;
    let linger = std::time::Duration::from_millis(bundle.linger_ms);
    let mut killer = Killer::new(bundle.uid, signaller);
    let mut runtime = keep_if_fits(runtime, &bundle, &mut killer).await;
    let files = std::mem::take(&mut bundle.files);
    let placeholder = runtime.as_mut().and_then(WarmRuntime::take_placeholder);
    // A kept runtime runs the first stage, as the job's ids
    // (`keep_if_fits`): its limits are set with the files, in the same trip
    // to the job thread, rather than in a second one at the release.
    let limits = runtime
        .as_mut()
        .zip(bundle.stages.first())
        .map(|(runtime, stage)| runtime.limits_work(stage));
    write_bundle_files(
        &bundle.workspace,
        bundle.uid,
        bundle.gid,
        files,
        placeholder,
        limits,
    )?;

    let mut context = Context {
        sink,
        host,
        host_open: true,
        signals,
        stdin: StdinQueue::default(),
        killer,
        cgroups,
        uid: bundle.uid,
        gid: bundle.gid,
        kill_requested: false,
        pending_runs: VecDeque::new(),
        runs_ended: false,
        runs_planned: bundle.runs.is_some(),
        run_filter: None,
        runtime,
    };
    let mut stages_succeeded = true;
    for spec in &bundle.stages {
        let report = match run_stage(&mut context, spec).await {
            Ok(report) => report,
            Err(error) => {
                // Leave nothing of the job running behind the fatal frame.
                context
                    .killer
                    .signal(Target::All, nix::sys::signal::Signal::SIGKILL);
                return Err(error);
            }
        };
        let succeeded = report.reason == Reason::Exited && report.exit_code == Some(0);
        send_outputs(&context, spec)?;
        sink.send(&SandboxMessage::StageEnd(report)).await?;
        if !succeeded {
            stages_succeeded = false;
            break;
        }
    }
    if let Some(plan) = &bundle.runs
        && stages_succeeded
    {
        run_plan(&mut context, plan).await?;
    }
    if let Some(runtime) = context.runtime.take() {
        // No stage ran (a kill came first).
        runtime.discard(&mut context.killer, context.uid).await;
    }
    sink.send(&SandboxMessage::Done).await?;
    drop(egress);
    if !linger.is_zero() {
        match empty_dirs(&bundle.linger_wipe, context.uid, context.gid) {
            Ok(()) => linger_until_closed(&mut context, linger).await,
            Err(error) => eprintln!("code-runner-init: not lingering after done: {error}"),
        }
    }
    Ok(())
}

/// After `done`, when the bundle asked for it and its `linger_wipe`
/// directories are empty (see [`empty_dirs`]): stays, idle, until the host
/// closes its stream (or SIGTERM or SIGINT comes, or `within` passes), so
/// that the host decides when the container exits. Nothing of the job is
/// left to run meanwhile: each stage's end killed every process of the job
/// and checked that none was left, the runs' uid's too, and the egress
/// relay is closed. Frames that still come (late stdin) are dropped.
async fn linger_until_closed(context: &mut Context<'_>, within: std::time::Duration) {
    let deadline = tokio::time::sleep(within);
    tokio::pin!(deadline);
    while context.host_open {
        tokio::select! {
            () = &mut deadline => return,
            _ = context.signals.terminate.recv() => return,
            _ = context.signals.interrupt.recv() => return,
            event = context.host.recv() => match event {
                Some(HostEvent::Message(_)) => {}
                None | Some(HostEvent::Eof | HostEvent::ReadError(_) | HostEvent::Malformed(_)) => return,
            },
        }
    }
}

/// The runs after the stages: one per `run` frame until `runs_end`, each
/// as the plan's uid, each finding the sandbox as the first one did.
async fn run_plan(
    context: &mut Context<'_>,
    plan: &code_runner_protocol::RunPlan,
) -> Result<(), InitError> {
    if plan.uid == 0 || plan.gid == 0 || plan.uid == context.uid {
        return Err(InitError::InvalidBundle(
            "the runs must have a non-root uid of their own".into(),
        ));
    }
    let scratch = Scratch::prepare(plan, context.uid, context.gid)?;
    context.uid = plan.uid;
    context.gid = plan.gid;
    context.killer.set_uid(plan.uid);
    context.run_filter = Some(RunFilter::new());
    while let Some(run) = next_run(context).await? {
        let RunSpec {
            stage,
            input,
            files,
        } = run;
        scratch.write_run_files(files)?;
        context.stdin = StdinQueue::default();
        context.stdin.push(input);
        context.stdin.request_close();
        let report = run_one(context, &stage).await?;
        send_outputs(context, &stage)?;
        // The next run (or the end) finds the sandbox as the first did.
        scratch.wipe()?;
        context.sink.send(&SandboxMessage::StageEnd(report)).await?;
    }
    Ok(())
}

/// The stage's output files, if it asks for any (see [`super::outputs`]):
/// sent as the stage's uid, before its `stage_end`, whatever ended it.
fn send_outputs(
    context: &Context<'_>,
    stage: &code_runner_protocol::StageSpec,
) -> Result<(), InitError> {
    let Some(request) = stage.outputs.clone() else {
        return Ok(());
    };
    let tx = context.sink.sender().ok_or(InitError::HostGone)?;
    let cwd = std::path::PathBuf::from(&stage.cwd);
    super::job_thread::run_as("outputs", context.uid, context.gid, move || {
        super::outputs::collect(&cwd, &request, &mut |frame| {
            tx.blocking_send(frame.encode())
                .map_err(|_| InitError::HostGone)
        })
    })
}

/// Runs one stage of the plan; a failure kills what it left first.
async fn run_one(
    context: &mut Context<'_>,
    stage: &code_runner_protocol::StageSpec,
) -> Result<StageReport, InitError> {
    match run_stage(context, stage).await {
        Ok(report) => Ok(report),
        Err(error) => {
            context
                .killer
                .signal(Target::All, nix::sys::signal::Signal::SIGKILL);
            Err(error)
        }
    }
}

/// The next run: one already waiting, else the next `run` frame; `None`
/// after `runs_end`. A kill ends the runs.
async fn next_run(context: &mut Context<'_>) -> Result<Option<RunSpec>, InitError> {
    loop {
        context.apply_waiting_host_events()?;
        if context.kill_requested {
            return Ok(None);
        }
        if let Some(run) = context.pending_runs.pop_front() {
            return Ok(Some(run));
        }
        if context.runs_ended || !context.host_open {
            return Ok(None);
        }
        tokio::select! {
            event = context.host.recv() => {
                if context.on_host_event(event)? == Control::Kill {
                    context.kill_requested = true;
                }
            }
            _ = context.signals.terminate.recv() => context.kill_requested = true,
            _ = context.signals.interrupt.recv() => context.kill_requested = true,
        }
    }
}

/// Waits for the bundle; before it, one `prestart` may start a warm
/// runtime (one that cannot start is reported on stderr and the job then
/// starts cold: not the job's failure).
async fn await_bundle(
    host: &mut mpsc::UnboundedReceiver<HostEvent>,
    signals: &mut Signals,
) -> Result<(Box<Bundle>, Option<WarmRuntime>), InitError> {
    let mut runtime = None;
    let event = loop {
        let event = tokio::select! {
            event = host.recv() => event,
            _ = signals.terminate.recv() => return Err(InitError::TerminatedBeforeBundle),
            _ = signals.interrupt.recv() => return Err(InitError::TerminatedBeforeBundle),
            // The runtime is traced: its stops (the first at its exec) are
            // handled by reaping, which also notes if it ended.
            _ = signals.child.recv() => {
                if let Some(runtime) = runtime.as_mut() {
                    WarmRuntime::check_alive(runtime);
                }
                continue;
            }
            // A fed runtime's open of its FIFO, seen here rather than on
            // the job's path.
            () = tokio::time::sleep(FIFO_OPEN_POLL),
                if runtime.as_ref().is_some_and(WarmRuntime::watching_fifo) =>
            {
                if let Some(runtime) = runtime.as_mut() {
                    runtime.look_for_fifo_idle();
                }
                continue;
            }
        };
        match event {
            Some(HostEvent::Message(HostMessage::Prestart(prestart))) if runtime.is_none() => {
                match WarmRuntime::start(*prestart) {
                    Ok(started) => runtime = Some(started),
                    Err(error) => eprintln!("code-runner-init: no warm runtime: {error}"),
                }
            }
            event => break event,
        }
    };
    match event {
        Some(HostEvent::Message(HostMessage::Bundle(bundle))) => Ok((bundle, runtime)),
        Some(HostEvent::Message(other)) => Err(InitError::NotBundle(host_message_name(&other))),
        Some(HostEvent::Malformed(error)) => Err(InitError::MalformedFrame(error)),
        Some(HostEvent::ReadError(error)) => Err(InitError::InvalidBundle(format!(
            "reading stdin failed: {error}"
        ))),
        Some(HostEvent::Eof) | None => Err(InitError::EofBeforeBundle),
    }
}

/// The warm runtime, if it is alive and the bundle's first stage runs on
/// it (a graded job's runs never do: each needs a fresh process); anything
/// else is killed and reaped here, before the first stage starts.
async fn keep_if_fits(
    runtime: Option<WarmRuntime>,
    bundle: &Bundle,
    killer: &mut Killer,
) -> Option<WarmRuntime> {
    let mut runtime = runtime?;
    let alive = runtime.check_alive();
    let fits = bundle.runs.is_none()
        && runtime.takes_files(&bundle.workspace, &bundle.files)
        && bundle
            .stages
            .first()
            .is_some_and(|stage| runtime.args_for(stage, bundle.uid, bundle.gid).is_some());
    if alive && fits && runtime.await_fifo_opened().await {
        return Some(runtime);
    }
    // Looked at again: it may have ended while the job waited for it to
    // open its script.
    if !runtime.check_alive() {
        eprintln!(
            "code-runner-init: the warm runtime (pid {}) ended before its job; starting the stage afresh",
            runtime.pid()
        );
    } else if alive && fits {
        eprintln!(
            "code-runner-init: the warm runtime (pid {}) had not opened its script; starting the stage afresh",
            runtime.pid()
        );
    }
    runtime.discard(killer, bundle.uid).await;
    None
}

/// What the supervisor checks in the bundle itself (paths are checked when
/// the files are written).
fn check_bundle(bundle: &Bundle) -> Result<(), InitError> {
    if bundle.uid == 0 || bundle.gid == 0 {
        return Err(InitError::InvalidBundle(
            "the job must run as a non-root uid and gid".into(),
        ));
    }
    if !bundle.workspace.starts_with('/') {
        return Err(InitError::InvalidBundle(format!(
            "the workspace {:?} is not an absolute path",
            bundle.workspace
        )));
    }
    if let Some(egress) = &bundle.egress {
        check_egress(egress)?;
    }
    Ok(())
}

/// What an egress relay needs: a port to listen on, a socket path a
/// connect can take, room for at least one connection.
fn check_egress(egress: &EgressRelay) -> Result<(), InitError> {
    if egress.listen_port == 0 {
        return Err(InitError::InvalidBundle(
            "egress.listen_port must not be 0".into(),
        ));
    }
    if !egress.socket.starts_with('/') {
        return Err(InitError::InvalidBundle(format!(
            "egress.socket {:?} is not an absolute path",
            egress.socket
        )));
    }
    if egress.socket.len() > MAX_SOCKET_PATH || egress.socket.contains('\0') {
        return Err(InitError::InvalidBundle(format!(
            "egress.socket {:?} is not a usable Unix socket path (at most {MAX_SOCKET_PATH} bytes, no NUL)",
            egress.socket
        )));
    }
    if egress.max_concurrent == 0 {
        return Err(InitError::InvalidBundle(
            "egress.max_concurrent must be at least 1".into(),
        ));
    }
    Ok(())
}
