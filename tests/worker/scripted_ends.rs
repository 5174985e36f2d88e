//! How the scripted engine ends a stage otherwise than by its program's
//! own end — its wall, idle and output limits, a cancel, a client's kill
//! or interrupt, a crash, the job's deadline — and what it leaves on its
//! host: labelled sandboxes, removed by the cleanup or a dropped run, left
//! by a crashed engine; a host that is down. Each as the Docker engine
//! does it (`src/sandbox/session.rs`, `run.rs`, `outcome.rs`).

use std::time::{Duration, Instant};

use code_runner::job::deadline::now_ms;
use code_runner::job::limits::LimitsRequest;
use code_runner::job::{JobSpec, StartKind, Status};
use code_runner::protocol::{Reason, SignalKind};
use code_runner::sandbox::{JobInput, JobIo, SandboxEngine, SandboxEvent};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::common::scripted::{self, ScriptedHost};
use crate::common::until;
use crate::scripted::{Ran, engine, prepared, run_as, run_with, stage_end};

/// A batch job of `script` with these run limits.
fn limited(script: &str, limits: LimitsRequest) -> JobSpec {
    JobSpec {
        limits,
        ..scripted::job(script)
    }
}

/// An interactive job of `script` with these run limits.
fn interactive(script: &str, limits: LimitsRequest) -> JobSpec {
    JobSpec {
        interactive: true,
        ..limited(script, limits)
    }
}

/// Asserts how the run stage ended: killed (SIGKILL, no exit code) for
/// `reason`, with the job's `status`, its end reported in an event.
fn assert_killed(ran: &Ran, reason: Reason, status: Status) {
    let run = ran.run();
    assert_eq!(
        (run.exit_code, run.signal.as_deref(), run.reason),
        (None, Some("SIGKILL"), reason),
        "{:#?}",
        ran.result
    );
    assert_eq!(ran.result.status, status);
    assert_eq!(ran.result.error, None);
    assert_eq!(ran.events.last(), Some(&stage_end("run", run)));
}

#[tokio::test]
async fn a_stage_past_its_wall_limit_is_killed() {
    let (_host, engine) = engine();
    let walled = LimitsRequest {
        wall_ms: Some(300),
        ..Default::default()
    };
    let started = Instant::now();
    let mut ran = run_with(
        &engine,
        &limited("print a\nsleep 5000", walled),
        JobIo::default(),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(3), "{started:?}");
    assert!(ran.run().wall_ms >= 300, "{:#?}", ran.result);
    assert_eq!(ran.stdout(), "a\n");
    assert_killed(&ran, Reason::WallTimeout, Status::TimedOut);
    // The sandbox reported the kill and exited by itself.
    assert!(ran.cleanup.exited_within(Duration::ZERO).await);
    // A loop that never sleeps is stopped at its wall as well.
    let ran = run_with(
        &engine,
        &limited("forever\n  usage 1 1\nend", walled),
        JobIo::default(),
    )
    .await;
    assert_killed(&ran, Reason::WallTimeout, Status::TimedOut);
}

/// An interactive stage with no activity (input, its close, output) for
/// its idle limit is killed; input keeps it alive.
#[tokio::test]
async fn an_idle_interactive_stage_is_killed() {
    let (_host, engine) = engine();
    let idle = LimitsRequest {
        idle_ms: Some(400),
        ..Default::default()
    };
    let (input_tx, input_rx) = mpsc::channel(16);
    let io = JobIo {
        input: Some(input_rx),
        ..Default::default()
    };
    let started = Instant::now();
    let feed = async {
        tokio::time::sleep(Duration::from_millis(250)).await;
        input_tx
            .send(JobInput::Stdin(b"a\n".to_vec()))
            .await
            .unwrap();
    };
    let spec = interactive("readline\nreadline", idle);
    let (ran, ()) = tokio::join!(run_with(&engine, &spec, io), feed);
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{started:?}"
    );
    assert_eq!(ran.stdout(), "a\n");
    assert_killed(&ran, Reason::IdleTimeout, Status::TimedOut);
}

/// Output past the limit (stdout and stderr together) is cut there, and
/// the stage is killed.
#[tokio::test]
async fn output_past_the_limit_is_cut_and_the_stage_killed() {
    let (_host, engine) = engine();
    let capped = |bytes| LimitsRequest {
        output_bytes: Some(bytes),
        ..Default::default()
    };
    let ran = run_with(
        &engine,
        &limited("forever\n  write yyyyyyy\nend", capped(1000)),
        JobIo::default(),
    )
    .await;
    assert_eq!(ran.stdout(), "y".repeat(1000));
    assert!(ran.run().truncated);
    assert_killed(&ran, Reason::OutputLimit, Status::Failed);
    let ran = run_with(
        &engine,
        &limited("eprint 12345\nflood 10\nprint never", capped(8)),
        JobIo::default(),
    )
    .await;
    assert_eq!(
        (ran.stderr().as_str(), ran.stdout().as_str()),
        ("12345\n", "yy")
    );
    assert!(ran.run().truncated);
    assert_killed(&ran, Reason::OutputLimit, Status::Failed);
}

/// A cancel kills the stage (`killed`), and the job is `cancelled`, with
/// no error; the stage's end is reported.
#[tokio::test]
async fn a_cancel_kills_the_stage_and_cancels_the_job() {
    let (_host, engine) = engine();
    let cancel = CancellationToken::new();
    let io = JobIo {
        cancel: cancel.clone(),
        ..Default::default()
    };
    let later = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    };
    let spec = scripted::job("print up\nsleep 30000");
    let (mut ran, ()) = tokio::join!(run_with(&engine, &spec, io), later);
    assert_eq!(ran.stdout(), "up\n");
    assert_killed(&ran, Reason::Killed, Status::Cancelled);
    assert!(ran.cleanup.exited_within(Duration::ZERO).await);
}

/// Signals from a client: a kill ends the stage as `killed` (the job
/// `failed`); an interrupt ends the program by SIGINT unless it ignores
/// it, or writes its trap's text first.
#[tokio::test]
async fn a_clients_kill_and_interrupt_reach_the_program() {
    let (_host, engine) = engine();
    let signalled = async |script: &str, signal: SignalKind| {
        let (input_tx, input_rx) = mpsc::channel(16);
        let io = JobIo {
            input: Some(input_rx),
            ..Default::default()
        };
        let send = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            // (A program that already ended takes no signal.)
            let _ = input_tx.send(JobInput::Signal(signal)).await;
        };
        let spec = scripted::job(script);
        tokio::join!(run_with(&engine, &spec, io), send).0
    };
    let ran = signalled("print up\nsleep 30000", SignalKind::Kill).await;
    assert_killed(&ran, Reason::Killed, Status::Failed);

    let ran = signalled("print up\nsleep 30000", SignalKind::Interrupt).await;
    let run = ran.run();
    assert_eq!(
        (run.exit_code, run.signal.as_deref(), run.reason),
        (None, Some("SIGINT"), Reason::Exited)
    );
    assert_eq!(ran.result.status, Status::Failed);

    let ran = signalled(
        "ignore SIGINT\nsleep 1500\nprint still",
        SignalKind::Interrupt,
    )
    .await;
    assert_eq!(ran.stdout(), "still\n");
    assert_eq!(ran.result.status, Status::Succeeded);

    let ran = signalled(
        "trap SIGINT KeyboardInterrupt\nsleep 30000",
        SignalKind::Interrupt,
    )
    .await;
    assert_eq!(ran.stderr(), "KeyboardInterrupt\n");
    assert_eq!(ran.run().signal.as_deref(), Some("SIGINT"));
    assert_eq!(ran.result.status, Status::Failed);
    assert!(
        ran.events
            .contains(&SandboxEvent::Stderr(b"KeyboardInterrupt\n".to_vec()))
    );

    let ran = signalled(
        "catch SIGINT caught\nsleep 1500\nprint after",
        SignalKind::Interrupt,
    )
    .await;
    assert_eq!(ran.stdout(), "caught\nafter\n");
    assert_eq!(ran.run().exit_code, Some(0));
    assert_eq!(ran.result.status, Status::Succeeded);
}

/// A crash is a platform error: no stage is recorded, no stage end is
/// sent, the sandbox stays until the cleanup removes it (at once: it did
/// not exit by itself), and the engine asks its backend again.
#[tokio::test]
async fn a_crash_ends_the_job_as_an_error_without_its_stage() {
    let (host, engine) = engine();
    let mut ran = run_with(&engine, &scripted::job("print up\ncrash"), JobIo::default()).await;
    assert_eq!(ran.result.status, Status::Error);
    assert_eq!(
        ran.result.error.as_deref(),
        Some("the sandbox exited without reporting (exit code 137)")
    );
    assert!(ran.result.run.is_none());
    assert_eq!(ran.stage_ends(), 0);
    assert_eq!(
        ran.events.last(),
        Some(&SandboxEvent::Stdout(b"up\n".to_vec()))
    );
    assert!(!engine.answered_within(Duration::from_secs(3600)));
    assert_eq!(host.sandboxes().len(), 1);
    assert!(host.running().is_empty(), "its program is gone");
    assert!(!ran.cleanup.exited_within(Duration::ZERO).await);
    assert!(ran.cleanup.remove().await);
    assert!(host.sandboxes().is_empty());
}

/// The job's stored deadline passing in a stage is the host's cut: the
/// stage is recorded as a wall timeout without a report (no usage, no
/// stage end event), and the sandbox did not exit by itself.
#[tokio::test]
async fn the_jobs_deadline_cuts_the_stage_without_a_report() {
    let (host, engine) = engine();
    let deadline_ms = now_ms() + 300;
    let io = JobIo {
        deadline_ms: Some(deadline_ms),
        ..Default::default()
    };
    let id = uuid::Uuid::new_v4().to_string();
    let spec = scripted::job("usage 50 50\nprint a\nsleep 5000");
    let mut ran = run_as(&engine, &id, &spec, io).await;
    let run = ran.run().clone();
    assert_eq!(ran.stdout(), "a\n");
    assert_eq!(
        (run.exit_code, run.signal.as_deref(), run.reason),
        (None, Some("SIGKILL"), Reason::WallTimeout)
    );
    assert_eq!((run.cpu_ms, run.memory_peak_bytes), (0, 0));
    assert_eq!(run.pids_limit_reached, None);
    assert_eq!(ran.result.status, Status::TimedOut);
    assert_eq!(ran.stage_ends(), 0);
    let sandbox = &host.sandboxes()[0];
    assert_eq!(sandbox.deadline_ms, Some(deadline_ms));
    assert!(!ran.cleanup.exited_within(Duration::ZERO).await);
}

/// A run's sandbox carries the labels Docker's containers do, runs while
/// its program runs, waits after it (exited by itself) and is gone once
/// the cleanup removed it.
#[tokio::test]
async fn a_runs_sandbox_is_labelled_and_removed_by_its_cleanup() {
    let (host, engine) = engine();
    let job = prepared(&scripted::job("sleep 1000\nprint done"));
    let deadline_ms = now_ms() + 60_000;
    let io = JobIo {
        deadline_ms: Some(deadline_ms),
        ..Default::default()
    };
    let before = now_ms();
    let running = tokio::spawn({
        let engine = engine.clone();
        async move { engine.run_job("the-job", &job, io, None).await }
    });
    let seen = until(
        Duration::from_secs(5),
        || async { host.sandboxes_of("w") },
        |list| !list.is_empty(),
    )
    .await;
    let sandbox = seen.first().expect("a sandbox while the job runs").clone();
    assert_eq!(sandbox.job.as_deref(), Some("the-job"));
    assert_eq!(sandbox.worker, "w");
    assert_eq!(sandbox.deadline_ms, Some(deadline_ms));
    assert!(sandbox.created_ms >= before && sandbox.created_ms <= now_ms());
    assert!(!sandbox.warm);
    assert_eq!(host.running(), std::slice::from_ref(&sandbox.id));
    let mut outcome = running.await.unwrap();
    assert_eq!(outcome.container, sandbox.id);
    assert_eq!(outcome.result.status, Status::Succeeded);
    assert_eq!(host.sandboxes().len(), 1, "it waits for its removal");
    assert!(host.running().is_empty(), "its program ended");
    assert!(outcome.cleanup.exited_within(Duration::ZERO).await);
    assert!(outcome.cleanup.remove().await);
    assert!(host.sandboxes().is_empty());
    assert_eq!((host.starts("the-job"), host.runs()), (1, 1));
    assert!(host.overlaps().is_empty());
}

/// A run whose future is dropped (its worker's task ended) removes its
/// sandbox; a crashed engine's runs leave theirs, running on, as a killed
/// worker process leaves its containers; their cleanup removes nothing.
#[tokio::test]
async fn a_dropped_run_removes_its_sandbox_and_a_crashed_engines_stay() {
    let (host, engine) = engine();
    let stuck = |engine: crate::common::scripted::ScriptedEngine| {
        let job = prepared(&scripted::job("stuck"));
        tokio::spawn(async move {
            let id = uuid::Uuid::new_v4().to_string();
            engine.run_job(&id, &job, JobIo::default(), None).await
        })
    };
    let has = async |count: usize| {
        until(
            Duration::from_secs(5),
            || async { host.sandboxes().len() },
            |n| *n == count,
        )
        .await
    };
    let task = stuck(engine.clone());
    assert_eq!(has(1).await, 1);
    task.abort();
    assert_eq!(has(0).await, 0, "a dropped run removes its sandbox");

    engine.crash();
    let task = stuck(engine.clone());
    assert_eq!(has(1).await, 1);
    task.abort();
    let _ = task.await;
    assert_eq!(
        host.sandboxes().len(),
        1,
        "a crashed engine's sandbox stays"
    );
    assert_eq!(host.running().len(), 1, "and runs on");
    let ran = run_with(&engine, &scripted::job("print a"), JobIo::default()).await;
    assert!(ran.cleanup.remove().await);
    assert_eq!(host.sandboxes().len(), 2);
    // What is left is the reaper's (or a restarted worker's) to remove.
    for sandbox in host.sandboxes() {
        engine.remove_sandbox(&sandbox.id).await.unwrap();
    }
    assert!(host.sandboxes().is_empty() && host.running().is_empty());
}

/// Two sandboxes of one job running at once are an overlap (each run's
/// sandbox has a name of its own, as Docker's have).
#[tokio::test]
async fn two_sandboxes_of_one_job_at_once_are_an_overlap() {
    let (host, engine) = engine();
    let spec = scripted::job("sleep 300");
    let one = run_as(&engine, "once", &spec, JobIo::default()).await;
    let two = run_as(&engine, "once", &spec, JobIo::default()).await;
    drop((one, two));
    assert!(host.overlaps().is_empty(), "one after the other");
    let (a, b) = tokio::join!(
        run_as(&engine, "twice", &spec, JobIo::default()),
        run_as(&engine, "twice", &spec, JobIo::default()),
    );
    assert_eq!(host.overlaps(), ["twice"]);
    assert_eq!((host.starts("once"), host.starts("twice")), (2, 2));
    drop((a, b));
}

/// While the host is down every call fails as Docker's do with dockerd
/// stopped; readiness names the missing images; once up, it answers.
#[tokio::test]
async fn a_down_host_fails_every_call_until_it_is_up() {
    let (host, engine) = engine();
    host.set_down(true);
    let ran = run_with(&engine, &scripted::job("print a"), JobIo::default()).await;
    assert_eq!(ran.result.status, Status::Error);
    let error = ran.result.error.clone().unwrap_or_default();
    assert!(error.starts_with("the sandbox did not start: "), "{error}");
    assert!(ran.result.compile.is_none() && ran.result.run.is_none());
    assert_eq!(ran.result.start, Some(StartKind::Cold));
    assert!(ran.events.is_empty(), "{:?}", ran.events);
    assert!(host.sandboxes().is_empty());
    assert_eq!(host.runs(), 0);
    assert!(!engine.answered_within(Duration::from_secs(3600)));
    assert!(engine.list_sandboxes().await.is_err());
    assert!(engine.remove_sandbox("any").await.is_err());
    let problems = engine.readiness(&[], Duration::from_secs(1)).await;
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].0, "docker");

    host.set_down(false);
    host.set_missing_images(&["code-runner/c:latest"]);
    let images = ["code-runner/python:latest", "code-runner/c:latest"].map(String::from);
    let problems = engine.readiness(&images, Duration::from_secs(1)).await;
    assert_eq!(
        problems,
        [(
            "image code-runner/c:latest".to_string(),
            "no such image: code-runner/c:latest".to_string()
        )]
    );
    assert!(engine.answered_within(Duration::from_secs(1)));
    let ran = run_with(&engine, &scripted::job("print a"), JobIo::default()).await;
    assert_eq!(ran.result.status, Status::Succeeded);
}

/// A removal while the host is down answers `false` and is done once the
/// host is up again (the Docker engine retries in the background).
#[tokio::test]
async fn a_removal_while_the_host_is_down_is_done_once_it_is_up() {
    let host = ScriptedHost::new();
    let engine = host.engine("w");
    let ran = run_with(&engine, &scripted::job("print a"), JobIo::default()).await;
    host.set_down(true);
    assert!(!ran.cleanup.remove().await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(host.sandboxes().len(), 1, "not while the host is down");
    host.set_down(false);
    let left = until(
        Duration::from_secs(5),
        || async { host.sandboxes().len() },
        |n| *n == 0,
    )
    .await;
    assert_eq!(left, 0);
}
