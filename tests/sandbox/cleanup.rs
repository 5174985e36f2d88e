//! The container is removed on every path (dropped future, cancellation, an
//! image that does not exist), and what a job streams arrives in order: the
//! events of a run, and interactive input answered line by line.

use crate::common;
use crate::jobs::sleep_forever;

use code_runner::sandbox::SandboxEngine as _;
use std::time::{Duration, Instant};

use code_runner::job::{JobResult, Status};
use code_runner::protocol::Reason;
use code_runner::sandbox::{JobInput, JobIo, SandboxEvent};
use common::{Harness, default_settings, next_event, python, stdout};
use tokio::sync::mpsc;

/// Starts `spec` on its own task with events; returns the task, the events,
/// and the cancel token.
fn spawn_job(
    harness: &Harness,
    spec: &code_runner::job::JobSpec,
    input: Option<mpsc::Receiver<JobInput>>,
) -> (
    tokio::task::JoinHandle<JobResult>,
    mpsc::Receiver<SandboxEvent>,
    tokio_util::sync::CancellationToken,
) {
    let job = harness.prepare(spec);
    let (events_tx, events) = mpsc::channel(64);
    let io = JobIo {
        events: Some(events_tx),
        input,
        ..Default::default()
    };
    let cancel = io.cancel.clone();
    let engine = harness.engine.clone();
    let task = tokio::spawn(async move {
        engine
            .run(&uuid::Uuid::new_v4().to_string(), &job, io)
            .await
    });
    (task, events, cancel)
}

/// Waits for the run stage's first stdout, failing past `deadline`.
async fn wait_for_run_output(events: &mut mpsc::Receiver<SandboxEvent>, deadline: Instant) {
    loop {
        match next_event(events, deadline).await {
            Some(SandboxEvent::Stdout(_)) => return,
            Some(_) => {}
            None => panic!("the job ended before its first output"),
        }
    }
}

#[tokio::test]
async fn dropping_the_run_future_as_soon_as_the_container_exists_removes_it() {
    let harness = Harness::new().await;
    let job = harness.prepare(&sleep_forever());
    let engine = harness.engine.clone();
    let task = tokio::spawn(async move {
        engine
            .run(&uuid::Uuid::new_v4().to_string(), &job, JobIo::default())
            .await
    });
    harness.wait_for_container(Duration::from_secs(30)).await;
    task.abort();
    let ended = task.await;
    assert!(
        ended.as_ref().is_err_and(|e| e.is_cancelled()),
        "the run ended by itself: {ended:?}"
    );
    // The job's own deadline is two minutes away: only the drop guard can
    // have removed the container within assert_clean's 10 s.
    harness.assert_clean().await;
}

#[tokio::test]
async fn dropping_the_run_future_mid_run_removes_the_container() {
    let harness = Harness::new().await;
    let (task, mut events, _cancel) = spawn_job(&harness, &sleep_forever(), None);
    wait_for_run_output(&mut events, Instant::now() + Duration::from_secs(30)).await;
    assert_eq!(harness.leftovers().await.len(), 1);
    task.abort();
    assert!(task.await.is_err_and(|e| e.is_cancelled()));
    harness.assert_clean().await;
}

#[tokio::test]
async fn cancelling_a_running_job_kills_it_and_removes_the_container() {
    let harness = Harness::new().await;
    let (task, mut events, cancel) = spawn_job(&harness, &sleep_forever(), None);
    wait_for_run_output(&mut events, Instant::now() + Duration::from_secs(30)).await;
    let cancelled_at = Instant::now();
    cancel.cancel();
    let result = task.await.unwrap();
    // The kill and the container's removal, under load; the job's own
    // deadline is two minutes away.
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(20),
        "cancellation took {:?}",
        cancelled_at.elapsed()
    );
    assert_eq!(result.status, Status::Cancelled, "{result:#?}");
    assert_eq!(result.error, None);
    let run = result.run.as_ref().expect("the run stage is reported");
    assert_eq!(run.reason, Reason::Killed);
    assert_eq!(run.signal.as_deref(), Some("SIGKILL"));
    assert_eq!(run.exit_code, None);
    assert_eq!(stdout(&result), "sleeping\n");
    assert_eq!(
        code_runner::exit::for_result(&result),
        (130, Some("the job was cancelled".to_string()))
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn a_job_cancelled_before_it_starts_is_cancelled_and_leaves_nothing() {
    let harness = Harness::new().await;
    let job = harness.prepare(&sleep_forever());
    let io = JobIo::default();
    io.cancel.cancel();
    let started = Instant::now();
    let result = harness
        .engine
        .run(&uuid::Uuid::new_v4().to_string(), &job, io)
        .await;
    assert_eq!(result.status, Status::Cancelled, "{result:#?}");
    assert_eq!(result.error, None);
    assert!(started.elapsed() < Duration::from_secs(10));
    harness.assert_clean().await;
}

#[tokio::test]
async fn an_image_that_does_not_exist_is_an_error_naming_it() {
    let harness = harness_with_catalog(
        r#"
[[language]]
id = "ghost"
name = "Ghost"
version = "1"
extensions = ["ghost"]
image = "code-runner/does-not-exist"
source_file = "main.ghost"
run = ["cat", "{entry}"]
"#,
    )
    .await;
    let result = harness
        .run(&common::job("ghost", "main.ghost", "boo"))
        .await;
    assert_eq!(result.status, Status::Error, "{result:#?}");
    assert_eq!(
        result.error.as_deref(),
        Some(
            "image code-runner/does-not-exist:latest is not built on this worker; run scripts/build-images"
        )
    );
    assert_eq!(result.run, None);
    assert_eq!(result.compile, None);
    assert_eq!(code_runner::exit::for_result(&result).0, 125);
    harness.assert_clean().await;
}

#[tokio::test]
async fn events_arrive_in_order_and_match_the_result() {
    let harness = Harness::new().await;
    let spec = python(
        "import sys, time\nfor word in ['one', 'two', 'three']:\n    print(word)\n    sys.stdout.flush()\n    time.sleep(0.05)\n",
    );
    let (result, events) = harness.run_collecting(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(stdout(&result), "one\ntwo\nthree\n");

    assert_eq!(events.first(), Some(&SandboxEvent::Ready), "{events:#?}");
    assert_eq!(
        events.get(1),
        Some(&SandboxEvent::StageStart {
            stage: "run".into()
        }),
        "{events:#?}"
    );
    let Some(SandboxEvent::StageEnd { stage, result: end }) = events.last() else {
        panic!("the last event is not the end of the run stage: {events:#?}");
    };
    assert_eq!(stage, "run");
    assert_eq!(Some(end.as_ref()), result.run.as_ref());
    let middle = &events[2..events.len() - 1];
    let mut streamed = Vec::new();
    for event in middle {
        match event {
            SandboxEvent::Stdout(data) => streamed.extend_from_slice(data),
            other => panic!("only stdout between start and end, got {other:?} in {events:#?}"),
        }
    }
    assert!(!middle.is_empty());
    assert_eq!(streamed, result.run.as_ref().unwrap().stdout.as_bytes());
    harness.assert_clean().await;
}

/// Collects stdout events until `expected` has arrived in full; fails on any
/// other output, on the end of the job, or past `deadline`.
async fn expect_stdout(
    events: &mut mpsc::Receiver<SandboxEvent>,
    expected: &str,
    deadline: Instant,
) {
    let mut got = Vec::new();
    while got.len() < expected.len() {
        match next_event(events, deadline).await {
            Some(SandboxEvent::Stdout(data)) => got.extend_from_slice(&data),
            // The program waits for its next line between two answers.
            Some(
                SandboxEvent::Ready | SandboxEvent::StageStart { .. } | SandboxEvent::InputWanted,
            ) => {}
            other => panic!(
                "waiting for {expected:?} (have {:?}), got {other:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    assert_eq!(String::from_utf8_lossy(&got), expected);
}

#[tokio::test]
async fn interactive_input_is_answered_line_by_line() {
    let harness = Harness::new().await;
    let mut spec = python(
        "import sys\na = input()\nprint('got ' + a)\nb = input()\nprint('got ' + b)\nprint('rest', repr(sys.stdin.read()))\n",
    );
    spec.interactive = true;
    let (input, input_rx) = mpsc::channel(8);
    let (task, mut events, _cancel) = spawn_job(&harness, &spec, Some(input_rx));
    let deadline = Instant::now() + Duration::from_secs(30);

    input
        .send(JobInput::Stdin(b"first\n".to_vec()))
        .await
        .unwrap();
    // The program has only the first line: its answer comes, and nothing more.
    expect_stdout(&mut events, "got first\n", deadline).await;
    input
        .send(JobInput::Stdin(b"second\n".to_vec()))
        .await
        .unwrap();
    expect_stdout(&mut events, "got second\n", deadline).await;
    // The program now reads to the end of its input: only closing it ends it.
    input.send(JobInput::StdinClose).await.unwrap();
    expect_stdout(&mut events, "rest ''\n", deadline).await;

    match next_event(&mut events, deadline).await {
        Some(SandboxEvent::StageEnd { stage, .. }) => assert_eq!(stage, "run"),
        other => panic!("expected the end of the run stage, got {other:?}"),
    }
    let result = task.await.unwrap();
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(stdout(&result), "got first\ngot second\nrest ''\n");
    harness.assert_clean().await;
}

#[tokio::test]
async fn cancelling_a_job_whose_sandbox_never_became_ready_is_a_cancellation() {
    // An image without the supervisor: the base image's default command is a
    // shell that reads the frames as (failing) commands and never says
    // ready. The container runs, with no network and a read-only root.
    let harness = harness_with_catalog(
        r#"
[[language]]
id = "stuck"
name = "No supervisor"
version = "1"
image = "code-runner/base"
source_file = "main.txt"
run = ["cat", "{entry}"]
"#,
    )
    .await;
    let (task, _events, cancel) = spawn_job(
        &harness,
        &common::job("stuck", "main.txt", "never read"),
        None,
    );
    harness.wait_for_container(Duration::from_secs(30)).await;
    let cancelled_at = Instant::now();
    cancel.cancel();
    let result = task.await.unwrap();
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(10),
        "cancellation took {:?}",
        cancelled_at.elapsed()
    );
    // The client cancelled: that is the outcome, not a platform error
    // claiming the 30 s start timeout passed.
    assert_eq!(result.status, Status::Cancelled, "{result:#?}");
    assert_eq!(result.error, None);
    harness.assert_clean().await;
}

/// A harness whose language catalog is `languages` (a languages file).
async fn harness_with_catalog(languages: &str) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("languages.toml");
    std::fs::write(&catalog, languages).unwrap();
    let mut settings = default_settings(None);
    settings.languages_file = Some(catalog);
    Harness::with_settings(settings).await
}
