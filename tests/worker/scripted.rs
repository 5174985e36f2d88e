//! The scripted engine's own tests ([`crate::common::scripted`]): each
//! step of the script language with its precise outcome — status, reason,
//! exit code, signal, output, events — as the Docker engine reports the
//! same program (`src/sandbox/session.rs`, `run.rs`). How stages end
//! otherwise (limits, cancel, kill, interrupt, crash, the deadline) and
//! what is left on the host is in `scripted_ends`.

use std::sync::Arc;
use std::time::Duration;

use code_runner::job::limits::LimitPolicy;
use code_runner::job::{JobResult, JobSpec, PreparedJob, StageResult, StartKind, Status, prepare};
use code_runner::languages::LanguageCatalog;
use code_runner::protocol::Reason;
use code_runner::sandbox::{Cleanup, JobInput, JobIo, SandboxEngine, SandboxEvent};
use reqwest::StatusCode;
use tokio::sync::mpsc;

use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;
use crate::common::scripted::{self, ScriptedEngine, ScriptedHost};

/// A host and one engine of it, for worker `w`.
pub fn engine() -> (Arc<ScriptedHost>, ScriptedEngine) {
    let host = ScriptedHost::new();
    let engine = host.engine("w");
    (host, engine)
}

/// `spec` prepared as a worker prepares it (the embedded catalog, the
/// default limits).
pub fn prepared(spec: &JobSpec) -> PreparedJob {
    let catalog = LanguageCatalog::embedded().expect("the embedded catalog");
    prepare(spec, &catalog, &LimitPolicy::default()).expect("the test job is valid")
}

/// What a run left: its result, every event it sent, its cleanup.
pub struct Ran {
    pub result: JobResult,
    pub events: Vec<SandboxEvent>,
    pub cleanup: Cleanup,
}

impl Ran {
    pub fn run(&self) -> &StageResult {
        self.result
            .run
            .as_ref()
            .unwrap_or_else(|| panic!("no run stage: {:#?}", self.result))
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(self.run().stdout.as_bytes()).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(self.run().stderr.as_bytes()).into_owned()
    }

    /// Whether an event says a stage ended.
    pub fn stage_ends(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, SandboxEvent::StageEnd { .. }))
            .count()
    }
}

/// Runs `spec` (as job `id`) with `io` to its end, collecting its events;
/// the sandbox is left for the caller's cleanup.
pub async fn run_as(engine: &ScriptedEngine, id: &str, spec: &JobSpec, mut io: JobIo) -> Ran {
    let (events_tx, mut events_rx) = mpsc::channel(1024);
    io.events = Some(events_tx);
    let job = prepared(spec);
    let collect = async {
        let mut events = Vec::new();
        while let Some(event) = events_rx.recv().await {
            events.push(event);
        }
        events
    };
    let (outcome, events) = tokio::join!(engine.run_job(id, &job, io, None), collect);
    Ran {
        result: outcome.result,
        events,
        cleanup: outcome.cleanup,
    }
}

/// Runs `spec` with `io` to its end.
pub async fn run_with(engine: &ScriptedEngine, spec: &JobSpec, io: JobIo) -> Ran {
    run_as(engine, &uuid::Uuid::new_v4().to_string(), spec, io).await
}

/// Runs the script `script` (a batch job) to its end.
async fn run(engine: &ScriptedEngine, script: &str) -> Ran {
    run_with(engine, &scripted::job(script), JobIo::default()).await
}

/// The `StageEnd` event of `stage` with `result`.
pub fn stage_end(stage: &str, result: &StageResult) -> SandboxEvent {
    SandboxEvent::StageEnd {
        stage: stage.to_string(),
        result: Box::new(result.clone()),
    }
}

pub fn stage_start(stage: &str) -> SandboxEvent {
    SandboxEvent::StageStart {
        stage: stage.to_string(),
    }
}

#[tokio::test]
async fn a_scripted_job_runs_in_process() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Serve, &redis).start().await;
    let answer = daemon
        .submit_wait(&scripted::json("print hi\neprint oops\nexit 3"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    assert_eq!(answer.body["status"], "failed", "{answer:#?}");
    assert_eq!(answer.body["result"]["run"]["stdout"], "hi\n");
    assert_eq!(answer.body["result"]["run"]["stderr"], "oops\n");
    assert_eq!(answer.body["result"]["run"]["exit_code"], 3);
    let mut job = scripted::json("sleep 5000");
    job["limits"] = serde_json::json!({"wall_ms": 300});
    let answer = daemon.submit_wait(&job).await;
    assert_eq!(answer.body["status"], "timed_out", "{answer:#?}");
    assert_eq!(answer.body["result"]["run"]["reason"], "wall_timeout");
    let id = daemon.submit(&scripted::json("sleep 60000")).await.id();
    daemon
        .wait_status(&id, &["running"], Duration::from_secs(10))
        .await;
    assert_eq!(daemon.host.sandboxes_of(&daemon.worker_id).len(), 1);
    daemon.cancel(&id).await;
    let view = daemon.wait_terminal(&id, Duration::from_secs(10)).await;
    assert_eq!(view["status"], "cancelled", "{view:#}");
    for _ in 0..50 {
        if daemon.host.sandboxes().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(daemon.host.sandboxes().is_empty());
}

/// `print`, `write`, `eprint`, `ewrite` with their escapes; comments and
/// blank lines are skipped; the result and events are the Docker engine's.
#[tokio::test]
async fn output_steps_write_their_text_and_the_stage_succeeds() {
    let (_host, engine) = engine();
    let ran = run(
        &engine,
        "# a comment\n\nprint a\\tb\nwrite c\n  write \\x41\\n\neprint e\newrite f\\\\g",
    )
    .await;
    let run = ran.run();
    assert_eq!(ran.stdout(), "a\tb\ncA\n");
    assert_eq!(ran.stderr(), "e\nf\\g");
    assert_eq!(ran.result.status, Status::Succeeded);
    assert_eq!(
        (run.exit_code, run.signal.as_deref(), run.reason),
        (Some(0), None, Reason::Exited)
    );
    assert!(!run.truncated);
    assert_eq!((run.cpu_ms, run.memory_peak_bytes), (1, 1 << 20));
    assert_eq!(run.pids_limit_reached, Some(false));
    assert_eq!(ran.result.error, None);
    assert_eq!(ran.result.start, Some(StartKind::Cold));
    assert!(ran.result.compile.is_none());
    assert!(ran.result.timings.container_start_ms >= 1);
    assert_eq!(ran.result.timings.run_ms, Some(run.wall_ms));
    assert_eq!(
        ran.events,
        [
            SandboxEvent::Ready,
            stage_start("run"),
            SandboxEvent::Stdout(b"a\tb\n".to_vec()),
            SandboxEvent::Stdout(b"c".to_vec()),
            SandboxEvent::Stdout(b"A\n".to_vec()),
            SandboxEvent::Stderr(b"e\n".to_vec()),
            SandboxEvent::Stderr(b"f\\g".to_vec()),
            stage_end("run", run),
        ]
    );
}

/// `exit`, `die`, `oom` and `cpu-limit` end the program as the sandbox
/// reports such an end; nothing after them runs.
#[tokio::test]
async fn ending_steps_end_the_program_as_the_sandbox_reports_it() {
    let (_host, engine) = engine();
    let cases = [
        ("exit 0", Status::Succeeded, Some(0), None, Reason::Exited),
        ("exit 3", Status::Failed, Some(3), None, Reason::Exited),
        (
            "die SIGSEGV",
            Status::Failed,
            None,
            Some("SIGSEGV"),
            Reason::Exited,
        ),
        (
            "oom",
            Status::Failed,
            None,
            Some("SIGKILL"),
            Reason::MemoryLimit,
        ),
        (
            "cpu-limit",
            Status::TimedOut,
            None,
            Some("SIGKILL"),
            Reason::CpuTimeout,
        ),
    ];
    for (step, status, exit_code, signal, reason) in cases {
        let ran = run(&engine, &format!("print a\n{step}\nprint b")).await;
        let run = ran.run();
        assert_eq!(ran.stdout(), "a\n", "{step}");
        assert_eq!(ran.result.status, status, "{step}");
        assert_eq!(
            (run.exit_code, run.signal.as_deref(), run.reason),
            (exit_code, signal, reason),
            "{step}"
        );
        assert_eq!(ran.result.error, None, "{step}");
        assert_eq!(ran.events.last(), Some(&stage_end("run", run)), "{step}");
    }
}

#[tokio::test]
async fn usage_sets_the_figures_the_stage_reports() {
    let (_host, engine) = engine();
    let ran = run(&engine, "usage 250 5000000\nprint done").await;
    assert_eq!(
        (ran.run().cpu_ms, ran.run().memory_peak_bytes),
        (250, 5_000_000)
    );
}

#[tokio::test]
async fn flood_writes_its_bytes_in_chunks_of_4_kib() {
    let (_host, engine) = engine();
    let ran = run(&engine, "flood 10000").await;
    assert_eq!(ran.stdout(), "y".repeat(10_000));
    let chunks: Vec<usize> = ran
        .events
        .iter()
        .filter_map(|e| match e {
            SandboxEvent::Stdout(data) => Some(data.len()),
            _ => None,
        })
        .collect();
    assert_eq!(chunks, [4096, 4096, 1808]);
}

/// `repeat` runs its block N times, `{i}` the iteration (the innermost
/// block's); `forever` until the program is ended (here by `exit`).
#[tokio::test]
async fn repeat_and_forever_run_their_blocks() {
    let (_host, engine) = engine();
    let ran = run(&engine, "repeat 3\n  write {i},\nend\nprint").await;
    assert_eq!(ran.stdout(), "0,1,2,\n");
    let ran = run(&engine, "repeat 2\nrepeat 2\nwrite {i}{i}\nend\nend").await;
    assert_eq!(ran.stdout(), "00110011");
    let ran = run(&engine, "forever\n  print once\n  exit 5\nend").await;
    assert_eq!(ran.stdout(), "once\n");
    assert_eq!(ran.run().exit_code, Some(5));
}

/// A script the engine cannot read fails the run stage at once, naming
/// the line: a mistyped script never passes for a program.
#[tokio::test]
async fn a_script_the_engine_cannot_read_fails_at_once() {
    let (_host, engine) = engine();
    for (script, says) in [
        ("print 1\nsleep soon\n", "scripted: line 2: needs a number"),
        (
            "repeat 2\nprint x\n",
            "scripted: line 2: a block has no `end`",
        ),
        ("print(1)", "scripted: line 1: unknown step"),
        ("echo loudly", "scripted: line 1: unknown step"),
    ] {
        let ran = run(&engine, script).await;
        assert_eq!(ran.result.status, Status::Failed, "{script:?}");
        assert_eq!(ran.run().exit_code, Some(2), "{script:?}");
        assert_eq!(ran.stdout(), "", "{script:?}");
        assert!(
            ran.stderr().starts_with(says),
            "{script:?}: {}",
            ran.stderr()
        );
    }
}

/// `readline` reads the job's stdin line by line (the last line may lack
/// its newline); at EOF it ends the program with exit 1 and `EOFError`.
#[tokio::test]
async fn readline_reads_stdin_and_ends_at_eof() {
    let (_host, engine) = engine();
    let spec = code_runner::job::JobSpec {
        stdin: "hello\nworld".to_string(),
        ..scripted::job("readline\nreadline upper got:\nreadline\nprint never")
    };
    let ran = run_with(&engine, &spec, JobIo::default()).await;
    assert_eq!(ran.stdout(), "hello\ngot:WORLD\n");
    assert_eq!(ran.stderr(), "EOFError\n");
    assert_eq!(ran.run().exit_code, Some(1));
    assert_eq!(ran.result.status, Status::Failed);
}

/// `read` takes a line and prints nothing; at EOF it ends as `readline`.
#[tokio::test]
async fn read_takes_a_line_and_prints_nothing() {
    let (_host, engine) = engine();
    let spec = code_runner::job::JobSpec {
        stdin: "skipped\nkept\n".to_string(),
        ..scripted::job("read\nreadline\nread")
    };
    let ran = run_with(&engine, &spec, JobIo::default()).await;
    assert_eq!(ran.stdout(), "kept\n");
    assert_eq!(ran.stderr(), "EOFError\n");
    assert_eq!(ran.run().exit_code, Some(1));
}

/// An interactive job's `readline` with nothing buffered says
/// `input_wanted` and waits; `echo [upper]` copies stdin until it is
/// closed.
#[tokio::test]
async fn readline_and_echo_wait_for_a_clients_input() {
    let (_host, engine) = engine();
    let spec = code_runner::job::JobSpec {
        interactive: true,
        ..scripted::job("readline prefix:\necho upper")
    };
    let (input_tx, input_rx) = mpsc::channel(16);
    let (events_tx, mut events_rx) = mpsc::channel(64);
    let io = JobIo {
        events: Some(events_tx),
        input: Some(input_rx),
        ..Default::default()
    };
    let job = prepared(&spec);
    let running = tokio::spawn(async move { engine.run_job("j", &job, io, None).await });
    {
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(10), events_rx.recv())
                .await
                .expect("an event")
                .expect("the run goes on")
        };
        assert_eq!(next().await, SandboxEvent::Ready);
        assert_eq!(next().await, stage_start("run"));
        assert_eq!(next().await, SandboxEvent::InputWanted);
        input_tx
            .send(JobInput::Stdin(b"one\n".to_vec()))
            .await
            .unwrap();
        assert_eq!(next().await, SandboxEvent::Stdout(b"prefix:one\n".to_vec()));
        assert_eq!(next().await, SandboxEvent::InputWanted);
        input_tx
            .send(JobInput::Stdin(b"two ".to_vec()))
            .await
            .unwrap();
        assert_eq!(next().await, SandboxEvent::Stdout(b"TWO ".to_vec()));
        assert_eq!(next().await, SandboxEvent::InputWanted);
    }
    input_tx
        .send(JobInput::Stdin(b"three".to_vec()))
        .await
        .unwrap();
    input_tx.send(JobInput::StdinClose).await.unwrap();
    let outcome = running.await.unwrap();
    let run = outcome.result.run.as_ref().expect("a run stage");
    assert_eq!(run.stdout.as_bytes(), b"prefix:one\nTWO THREE");
    assert_eq!(outcome.result.status, Status::Succeeded);
    // The rest (it may say it wants input again before it sees the close).
    let mut rest = Vec::new();
    while let Some(event) = events_rx.recv().await {
        if event != SandboxEvent::InputWanted {
            rest.push(event);
        }
    }
    assert_eq!(
        rest,
        [
            SandboxEvent::Stdout(b"THREE".to_vec()),
            stage_end("run", run)
        ]
    );
}

/// A compiled language's job has a compile stage before its run: silent
/// and passing, or failing with `compile-error`'s text (then nothing runs);
/// an interpreted language has none, so `compile-error` does nothing.
#[tokio::test]
async fn a_compiled_jobs_compile_stage_passes_or_fails_as_scripted() {
    let (_host, engine) = engine();
    let c = |script: &str| crate::common::job("c", "main.c", script);
    let ran = run_with(&engine, &c("print hi"), JobIo::default()).await;
    let compile = ran.result.compile.as_ref().expect("a compile stage");
    assert_eq!(
        (compile.exit_code, compile.reason),
        (Some(0), Reason::Exited)
    );
    assert!(compile.stdout.as_bytes().is_empty() && compile.stderr.as_bytes().is_empty());
    assert_eq!(ran.stdout(), "hi\n");
    assert_eq!(ran.result.status, Status::Succeeded);
    assert_eq!(ran.result.timings.compile_ms, Some(compile.wall_ms));
    assert_eq!(
        ran.events,
        [
            SandboxEvent::Ready,
            stage_start("compile"),
            stage_end("compile", compile),
            stage_start("run"),
            SandboxEvent::Stdout(b"hi\n".to_vec()),
            stage_end("run", ran.run()),
        ]
    );

    let ran = run_with(
        &engine,
        &c("compile-error main.c:1: error: expected ';'\nprint hi"),
        JobIo::default(),
    )
    .await;
    let compile = ran.result.compile.as_ref().expect("a compile stage");
    assert_eq!(
        (compile.exit_code, compile.reason),
        (Some(1), Reason::Exited)
    );
    assert_eq!(
        compile.stderr.as_bytes(),
        b"main.c:1: error: expected ';'\n"
    );
    assert!(ran.result.run.is_none());
    assert_eq!(ran.result.status, Status::Failed);
    assert_eq!(ran.result.error, None);

    let ran = run(&engine, "compile-error nothing to compile\nprint ran").await;
    assert!(ran.result.compile.is_none());
    assert_eq!(ran.stdout(), "ran\n");
}
