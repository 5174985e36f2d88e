//! Running a job in its sandbox, from the start of its container to its
//! result: the cold start ([`run_cold`]), the session in a started sandbox
//! ([`run_in`], warm or cold), and, for a graded job whose sandbox died in
//! a test (gVisor's whole sandbox dies when a test exceeds the memory
//! limit), the remaining tests in a new sandbox.

use std::path::Path;
use std::time::{Duration, Instant};

use super::checker::Checker;
use super::connection::{Connection, StartFailure, start};
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
    let Run {
        job_id,
        job,
        egress_dir,
    } = run;
    let Started {
        mut guard,
        mut connection,
        kind,
    } = sandbox;
    let (docker, config, uids) = (engine.docker(), engine.config(), engine.uids());
    let deadline_ms = deadline_ms(&io, config, job);
    let tenant = job.tenant.as_deref().unwrap_or("");
    let checker = Grader::checker_job(job)
        .map(|checker| Checker::start(docker, config, uids, job_id, tenant, checker, deadline_ms));
    let mut grader = Grader::new(job, config.gvisor_limits(job.limits.pids), checker);
    let mut io = Some(io);
    let mut first: Option<(Option<StageResult>, Option<Instant>)> = None;
    let mut restarts = 0;
    let mut on_runtime = false;
    let mut stopping = None;
    // Only a sandbox of the warm pool lingers after `done` (see
    // `SandboxConfig::linger`): a cold job's end, and a restarted graded
    // job's (a cold sandbox too), stay as they were.
    let linger_of = |restarted: bool| {
        if kind == StartKind::Cold || restarted {
            Duration::ZERO
        } else {
            config.linger
        }
    };
    let (compile, run, ready_at, cancelled, mut error, grader) = loop {
        let uid = guard.uid();
        let session_io = io.take().unwrap_or_default();
        let outcome = drive(
            docker,
            config,
            job_id,
            job,
            session_io,
            &guard,
            connection,
            uid,
            grader.take(),
            first.is_some(),
            linger_of(first.is_some()),
        )
        .await;
        let mut session = match outcome {
            Ok(session) => session,
            Err(Failure(message)) => break (None, None, None, false, Some(message), None),
        };
        if first.is_some()
            && let Some(grader) = session.grader.as_mut()
        {
            // A new sandbox after one died: the program compiled again.
            grader.restarted(session.compile.as_ref());
        }
        on_runtime |= session.warm_runtime;
        stopping = session.exiting.filter(|_| session.error.is_none());
        let (compile, ready_at) = first
            .get_or_insert_with(|| (session.compile.clone(), session.ready_at))
            .clone();
        if !session.restart || restarts >= MAX_RESTARTS {
            break (
                compile,
                session.run,
                ready_at,
                session.cancelled,
                session.error,
                session.grader,
            );
        }
        restarts += 1;
        // The sandbox died in a test (its verdict is in): the rest run in
        // a new one.
        tracing::info!(job.id = %job_id, "the sandbox died in a test; the remaining tests run in a new one");

        guard.remove().await;
        match start_cold(engine, job_id, job, deadline_ms, egress_dir).await {
            Ok((new_guard, new_connection)) => {
                (guard, connection) = (new_guard, new_connection);
                grader = session.grader;
                io = Some(session.io);
            }
            Err((new_guard, message)) => {
                guard = new_guard;
                break (
                    compile,
                    None,
                    ready_at,
                    false,
                    Some(message),
                    session.grader,
                );
            }
        }
    };
    let container = guard.name().to_string();
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
        },
        cleanup: Cleanup::new(ContainerCleanup {
            guard: Some(guard),
            // The last session was a restart exactly when one happened.
            lingering: stopping.is_some() && !linger_of(restarts > 0).is_zero(),
            stopping,
        }),
        container,
    }
}
