//! Running a job in its sandbox, from the start of its container to its
//! result: the cold start ([`run_cold`]), the session in a started sandbox
//! ([`run_in`], warm or cold), and, for a graded job whose sandbox died in
//! a test (gVisor's whole sandbox dies when a test exceeds the memory
//! limit), the remaining tests in a new sandbox.

use std::path::Path;
use std::time::{Duration, Instant};

use super::checker::Checker;
use super::connection::{Connection, OutputStream, StartFailure, start};
use super::container::{ContainerGuard, SandboxClass, SandboxShape, container_name};
use super::docker::DockerEngine;
use super::egress::{JobEgress, engine_dir};
use super::engine::{Cleanup, RunOutcome};
use super::grading::Grader;
use super::outcome::{ContainerCleanup, Started};
use super::session::{Failure, drive};
use super::{JobIo, SandboxConfig};
use crate::job::deadline::now_ms;
use crate::job::{JobResult, PreparedJob, StageResult, StartKind, Status, Timings};
use crate::protocol::Reason;

/// Most times a graded job's sandbox is started again after one died
/// during a test (gVisor's whole sandbox dies when a test exceeds the
/// memory limit).
const MAX_RESTARTS: usize = 3;

/// The job's deadline: the stored one, else its whole budget from now (a
/// run outside the daemon).
fn deadline_ms(io: &JobIo, config: &SandboxConfig, job: &PreparedJob) -> u64 {
    io.deadline_ms.unwrap_or_else(|| {
        config
            .budget
            .deadline_ms(now_ms(), Duration::from_millis(job.stages_wall_ms()))
    })
}

/// Creates and starts a new container for `job`.
async fn start_cold(
    engine: &DockerEngine,
    job_id: &str,
    job: &PreparedJob,
    deadline_ms: u64,
    egress_dir: Option<&Path>,
) -> Result<(ContainerGuard, Connection), (ContainerGuard, String)> {
    let (docker, config) = (engine.docker(), engine.config());
    let name = container_name(job_id);
    let lease = match engine.uids().lease() {
        Ok(lease) => lease,
        Err(error) => {
            let guard = ContainerGuard::new(docker.clone(), name, None);
            return Err((guard, error.to_string()));
        }
    };
    let uid = lease.uid();
    let guard = ContainerGuard::new(docker.clone(), name, Some(lease));
    let shape = SandboxShape {
        image: job.language.image_ref(),
        language: job.language.id.clone(),
        class: SandboxClass::of(&job.limits),
        uid,
        job_id: Some(job_id.to_string()),
        created_ms: now_ms(),
        deadline_ms,
        checker: false,
        egress_dir: egress_dir.map(Path::to_path_buf),
    };
    match start(docker, config, &guard, &shape).await {
        Ok(connection) => Ok((guard, connection)),
        Err(StartFailure(message)) => Err((guard, message)),
    }
}

/// Runs `job` in a new container (the cold path).
pub(super) async fn run_cold(
    engine: &DockerEngine,
    job_id: &str,
    job: &PreparedJob,
    io: JobIo,
) -> RunOutcome {
    let (docker, config) = (engine.docker(), engine.config());
    let started = Instant::now();
    let deadline_ms = deadline_ms(&io, config, job);
    let egress = match &job.egress {
        None => None,
        Some(allow) => {
            let name = container_name(job_id);
            let proxy = match &config.egress.unavailable {
                Some(message) => Err(message.clone()),
                None => JobEgress::start(
                    &config.egress,
                    &engine_dir(&config.egress, engine.uids().first()),
                    &name,
                    allow,
                    io.events.clone(),
                ),
            };
            match proxy {
                Ok(proxy) => Some(proxy),
                Err(message) => {
                    let guard = ContainerGuard::new(docker.clone(), name, None);
                    return failed(job, started, guard, StartKind::Cold, message);
                }
            }
        }
    };
    let egress_dir = egress.as_ref().map(|e| e.dir().to_path_buf());
    let mut outcome =
        match start_cold(engine, job_id, job, deadline_ms, egress_dir.as_deref()).await {
            Ok((guard, connection)) => {
                let sandbox = Started {
                    guard,
                    connection,
                    kind: StartKind::Cold,
                };
                let run = Run {
                    job_id,
                    job,
                    egress_dir: egress_dir.as_deref(),
                };
                run_in(engine, run, io, sandbox, started).await
            }
            Err((guard, message)) => failed(job, started, guard, StartKind::Cold, message),
        };
    if let Some(egress) = egress {
        // Every connection's event is handed on before the result is.
        outcome.result.egress = Some(egress.finish().await);
    }
    outcome
}

/// The job a session runs, and where its egress socket is (cold starts of
/// a job with network; a new sandbox after one died mounts it too).
#[derive(Debug, Clone, Copy)]
pub(super) struct Run<'a> {
    pub job_id: &'a str,
    pub job: &'a PreparedJob,
    pub egress_dir: Option<&'a Path>,
}

/// The outcome of a job whose sandbox never ran it.
fn failed(
    job: &PreparedJob,
    started: Instant,
    guard: ContainerGuard,
    kind: StartKind,
    error: String,
) -> RunOutcome {
    let container = guard.name().to_string();
    RunOutcome {
        result: JobResult {
            start: Some(kind),
            timings: Timings {
                total_ms: started.elapsed().as_millis() as u64,
                ..Timings::default()
            },
            ..JobResult::without_stages(Status::Error, &job.language.id, &job.language.version)
                .with_error(error)
        },
        cleanup: ContainerCleanup::of(guard),
        container,
    }
}

/// Runs `job` in a started sandbox (warm or cold) to its end; the container
/// is left for the caller's [`Cleanup`].
pub(super) async fn run_in(
    engine: &DockerEngine,
    run: Run<'_>,
    io: JobIo,
    sandbox: Started,
    started: Instant,
) -> RunOutcome {
    let kind = sandbox.kind;
    let (docker, config, uids) = (engine.docker(), engine.config(), engine.uids());
    let deadline_ms = deadline_ms(&io, config, run.job);
    let tenant = run.job.tenant.as_deref().unwrap_or("");
    let checker = Grader::checker_job(run.job).map(|checker| {
        Checker::start(
            docker,
            config,
            uids,
            run.job_id,
            tenant,
            checker,
            deadline_ms,
        )
    });
    let grader = Grader::new(run.job, config.gvisor_limits(run.job.limits.pids), checker);
    let sessions = sessions(engine, run, io, sandbox, grader, deadline_ms).await;
    conclude(run.job, kind, config.linger, sessions, started)
}

/// What a job's sessions left: the first session's compile and ready time,
/// the last one's run, and the sandbox that ran it.
struct Sessions {
    guard: ContainerGuard,
    compile: Option<StageResult>,
    run: Option<StageResult>,
    ready_at: Option<Instant>,
    cancelled: bool,
    error: Option<String>,
    grader: Option<Grader>,
    /// The first stage ran on a runtime started ahead.
    on_runtime: bool,
    /// The attach stream of a sandbox whose supervisor said `done`.
    stopping: Option<OutputStream>,
    /// Sandboxes started again after one died in a test.
    restarts: usize,
    /// The run stage's output files.
    outputs: Vec<crate::job::outputs::OutputEntry>,
}

/// Drives the job's sessions: one, or for a graded job whose sandbox died
/// in a test, one more in a new sandbox for the remaining tests (at most
/// [`MAX_RESTARTS`] times).
async fn sessions(
    engine: &DockerEngine,
    run: Run<'_>,
    io: JobIo,
    sandbox: Started,
    grader: Option<Grader>,
    deadline_ms: u64,
) -> Sessions {
    let (docker, config) = (engine.docker(), engine.config());
    let Started {
        mut guard,
        mut connection,
        kind,
    } = sandbox;
    let (mut io, mut grader) = (Some(io), grader);
    let mut first: Option<(Option<StageResult>, Option<Instant>)> = None;
    let (mut restarts, mut on_runtime) = (0, false);
    loop {
        let restarted = first.is_some();
        let outcome = drive(
            docker,
            config,
            run.job_id,
            run.job,
            io.take().unwrap_or_default(),
            &guard,
            connection,
            guard.uid(),
            grader.take(),
            restarted,
            linger(kind, restarted, config),
        )
        .await;
        let mut session = match outcome {
            Ok(session) => session,
            Err(Failure(message)) => {
                return Sessions::failed(guard, None, None, message, None, restarts);
            }
        };
        if restarted && let Some(grader) = session.grader.as_mut() {
            // A new sandbox after one died: the program compiled again.
            grader.restarted(session.compile.as_ref());
        }
        on_runtime |= session.warm_runtime;
        let stopping = session.exiting.filter(|_| session.error.is_none());
        let (compile, ready_at) = first
            .get_or_insert_with(|| (session.compile.clone(), session.ready_at))
            .clone();
        if !session.restart || restarts >= MAX_RESTARTS {
            return Sessions {
                guard,
                compile,
                run: session.run,
                ready_at,
                cancelled: session.cancelled,
                error: session.error,
                grader: session.grader,
                on_runtime,
                stopping,
                restarts,
                outputs: session.outputs,
            };
        }
        restarts += 1;
        // The sandbox died in a test (its verdict is in): the rest run in
        // a new one.
        tracing::info!(job.id = %run.job_id, "the sandbox died in a test; the remaining tests run in a new one");
        guard.remove().await;
        match start_cold(engine, run.job_id, run.job, deadline_ms, run.egress_dir).await {
            Ok((new_guard, new_connection)) => {
                (guard, connection) = (new_guard, new_connection);
                grader = session.grader;
                io = Some(session.io);
            }
            Err((new_guard, message)) => {
                return Sessions::failed(
                    new_guard,
                    compile,
                    ready_at,
                    message,
                    session.grader,
                    restarts,
                );
            }
        }
    }
}

impl Sessions {
    /// Sessions that ended in a platform failure.
    fn failed(
        guard: ContainerGuard,
        compile: Option<StageResult>,
        ready_at: Option<Instant>,
        message: String,
        grader: Option<Grader>,
        restarts: usize,
    ) -> Self {
        Self {
            guard,
            compile,
            run: None,
            ready_at,
            cancelled: false,
            error: Some(message),
            grader,
            on_runtime: false,
            stopping: None,
            restarts,
            outputs: Vec::new(),
        }
    }
}

/// How long the supervisor lingers after `done`: only a sandbox of the
/// warm pool does (see `SandboxConfig::linger`); a cold job's end, and a
/// restarted graded job's (a cold sandbox too), stay as they were.
fn linger(kind: StartKind, restarted: bool, config: &SandboxConfig) -> Duration {
    if kind == StartKind::Cold || restarted {
        Duration::ZERO
    } else {
        config.linger
    }
}

/// The run stage's output files; for a job that asked some whose run
/// stage never ran (its compile failed, or the job ended first), each
/// pattern says so. A graded job's are on its tests.
fn run_outputs(
    job: &PreparedJob,
    ran: bool,
    outputs: Vec<crate::job::outputs::OutputEntry>,
) -> Vec<crate::job::outputs::OutputEntry> {
    match job.bundle.stages.last().and_then(|s| s.outputs.as_ref()) {
        Some(request) if !ran && job.tests.is_none() => crate::job::outputs::OutputEntry::for_each(
            &request.patterns,
            "not_run",
            "the run stage did not run (the compile failed, or the job ended before it)",
        ),
        _ => outputs,
    }
}

/// The job's result from what its sessions left, and its sandbox's
/// cleanup.
fn conclude(
    job: &PreparedJob,
    kind: StartKind,
    lingers: Duration,
    sessions: Sessions,
    started: Instant,
) -> RunOutcome {
    let Sessions {
        guard,
        compile,
        run,
        ready_at,
        cancelled,
        mut error,
        grader,
        on_runtime,
        stopping,
        restarts,
        outputs,
    } = sessions;
    let container = guard.name().to_string();
    let ran = run.is_some();
    let compile_failed = compile
        .as_ref()
        .is_some_and(|c| c.reason != Reason::Exited || c.exit_code != Some(0));
    let grading = grader.map(|grader| {
        let ended = if error.is_some() {
            "the platform failed"
        } else if cancelled {
            "the job was cancelled"
        } else {
            "the job ran out of time"
        };
        grader.into_grading(compile_failed, Some(ended))
    });
    let status = match &grading {
        _ if error.is_some() => Status::Error,
        _ if cancelled => Status::Cancelled,
        None => JobResult::status_from_stages(compile.as_ref(), run.as_ref()),
        Some(_) if compile_failed => JobResult::status_from_stages(compile.as_ref(), None),
        Some(grading) => grading.status(&mut error),
    };
    let stopping = stopping.filter(|_| error.is_none() && status != Status::Error);
    let error = error.or_else(|| {
        (status == Status::Error).then(|| "the sandbox ended without running the program".into())
    });
    let kind = if on_runtime {
        StartKind::WarmRuntime
    } else {
        kind
    };
    let container_start_ms = match kind {
        // Ready before the job came: nothing of the start was on its path.
        StartKind::Warm | StartKind::WarmRuntime => 0,
        StartKind::Cold => ready_at.map_or(0, |t| (t - started).as_millis() as u64),
    };
    // The last session was a restart exactly when one happened; only a
    // warm sandbox's first session lingers.
    let lingering =
        stopping.is_some() && kind != StartKind::Cold && restarts == 0 && !lingers.is_zero();
    RunOutcome {
        result: JobResult {
            status,
            language: job.language.id.clone(),
            version: job.language.version.clone(),
            timings: Timings {
                container_start_ms,
                compile_ms: compile.as_ref().map(|s| s.wall_ms),
                run_ms: run.as_ref().map(|s| s.wall_ms),
                total_ms: started.elapsed().as_millis() as u64,
            },
            compile,
            run,
            error,
            reason: None,
            start: Some(kind),
            grading,
            egress: None,
            outputs: run_outputs(job, ran, outputs),
        },
        cleanup: Cleanup::new(ContainerCleanup {
            guard: Some(guard),
            lingering,
            stopping,
        }),
        container,
    }
}
