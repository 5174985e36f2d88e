//! Warm runtimes conform: every program of these suites gives byte for byte
//! the same stdout, stderr, exit code, signal, reason and status when it
//! runs cold and when it runs on a runtime started ahead in a warm sandbox
//! (docs/warm-runtimes.md), under runc and under runsc.
//!
//! The programs cover what a runtime started before its program could get
//! wrong: argv, `__main__`/`__file__`/`require.main`, the working directory,
//! the module search path and the loaded modules, the environment, stdio
//! buffering and encodings, exit codes and exit hooks, uncaught exceptions
//! and their tracebacks, signals, resource limits, ids, descriptors, child
//! processes and threads. Nothing here may print what differs between two
//! sandboxes by design (their uid, pid or host name).
//!
//! The suites are [`python`], [`javascript`], [`php`], [`ruby`] and [`r`];
//! [`fit`] is which jobs a runtime serves, [`hostile`] the limits on php's,
//! ruby's and R's runtimes.

use crate::common;

mod fit;
mod hostile;
mod javascript;
mod php;
mod python;
mod r;
mod ruby;

use code_runner::sandbox::SandboxEngine as _;
use std::time::{Duration, Instant};

use code_runner::job::{FileSpec, JobSpec, StartKind, Status};
use code_runner::protocol::Reason;
use code_runner::sandbox::{JobIo, WarmPool};
use common::*;
use javascript::JAVASCRIPT;
use php::PHP;
use python::PYTHON;
use r::R;
use ruby::RUBY;

/// One program of a suite.
struct Case {
    name: &'static str,
    source: &'static str,
    stdin: &'static str,
    args: &'static [&'static str],
    /// Other files beside the entry.
    files: &'static [(&'static str, &'static str)],
}

const fn case(name: &'static str, source: &'static str) -> Case {
    Case {
        name,
        source,
        stdin: "",
        args: &[],
        files: &[],
    }
}

/// Text with the pids Node prints in its warnings (`(node:11)`) replaced:
/// a pid differs between any two sandboxes by design.
fn without_pids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("(node:") {
        let (head, tail) = rest.split_at(at + "(node:".len());
        out.push_str(head);
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(if digits > 0 { "PID" } else { "" });
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

/// What a run gave, timings aside.
#[derive(Debug, PartialEq)]
struct Seen {
    status: Status,
    stdout: String,
    stderr: String,
    exit_code: Option<i32>,
    signal: Option<String>,
    reason: Option<Reason>,
    truncated: bool,
}

fn seen(result: &code_runner::job::JobResult) -> Seen {
    let run = result.run.as_ref();
    Seen {
        status: result.status,
        stdout: run.map_or_else(String::new, |r| {
            String::from_utf8_lossy(r.stdout.as_bytes()).into_owned()
        }),
        stderr: run.map_or_else(String::new, |r| {
            without_pids(&String::from_utf8_lossy(r.stderr.as_bytes()))
        }),
        exit_code: run.and_then(|r| r.exit_code),
        signal: run.and_then(|r| r.signal.clone()),
        reason: run.map(|r| r.reason),
        truncated: run.is_some_and(|r| r.truncated),
    }
}

fn spec_of(language: &str, entry: &str, case: &Case) -> JobSpec {
    let mut spec = job(language, entry, case.source);
    spec.stdin = case.stdin.to_string();
    spec.args = case.args.iter().map(|a| a.to_string()).collect();
    for (name, content) in case.files {
        spec.files.push(FileSpec {
            name: name.to_string(),
            content: content.to_string(),
            encoding: code_runner::job::Encoding::Utf8,
            reference: None,
        });
    }
    spec
}

/// A ready member of `pool` for `job`, waiting (up to 60 s) for one.
async fn claim(
    pool: &WarmPool,
    job: &code_runner::job::PreparedJob,
) -> code_runner::sandbox::WarmSandbox {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(warm) = pool.claim(job).await {
            return warm;
        }
        assert!(Instant::now() < until, "no warm sandbox within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `job` in a ready member of `pool` and removes its container.
///
/// It waits a moment first, so that the member's runtime has surely reached
/// its hook: a job that came while the runtime was still starting would
/// pass even with a hook that never waits (its file written before the
/// runtime read it), and a runtime that did not wait has ended by now (the
/// job then starts `warm`, not `warm_runtime`, and the test says so).
async fn run_warm(
    harness: &Harness,
    pool: &WarmPool,
    job: &code_runner::job::PreparedJob,
) -> code_runner::job::JobResult {
    tokio::time::sleep(Duration::from_millis(400)).await;
    let sandbox = claim(pool, job).await;
    let id = uuid::Uuid::new_v4().to_string();
    let outcome = harness
        .engine
        .run_job(&id, job, JobIo::default(), Some(sandbox))
        .await;
    outcome.cleanup.remove().await;
    outcome.result
}

/// Runs `spec` on a warm sandbox whose runtime was started ahead.
async fn on_runtime_pool(harness: &Harness, spec: &JobSpec) -> code_runner::job::JobResult {
    let job = harness.prepare(spec);
    let pool = harness.warm_pool(&job, 1).await;
    let result = run_warm(harness, &pool, &job).await;
    pool.shutdown(Duration::from_secs(30)).await;
    result
}

/// Runs every case cold and on a warm runtime with `harness` and fails
/// naming each case whose runs differ.
async fn conform(harness: Harness, language: &str, entry: &str, cases: &[Case]) {
    let harness = harness.on(StartKind::WarmRuntime);
    let first = harness.prepare(&spec_of(language, entry, &cases[0]));
    let spec = harness.warm_spec(&first);
    assert!(spec.runtime.is_some(), "{language} has a warm runtime");
    let pool = WarmPool::start(&harness.engine, common::pool_settings(3));
    pool.set_targets(vec![(spec, 2)]);
    let mut differ = Vec::new();
    for case in cases {
        let job = harness.prepare(&spec_of(language, entry, case));
        let cold_id = uuid::Uuid::new_v4().to_string();
        let cold = harness.engine.run(&cold_id, &job, JobIo::default());
        let warm = run_warm(&harness, &pool, &job);
        let (cold, warm) = tokio::join!(cold, warm);
        assert_eq!(
            cold.start,
            Some(StartKind::Cold),
            "{}: {cold:#?}",
            case.name
        );
        assert_eq!(
            warm.start,
            Some(StartKind::WarmRuntime),
            "{}: {warm:#?}",
            case.name
        );
        let (cold, warm) = (seen(&cold), seen(&warm));
        if cold != warm {
            differ.push(format!(
                "{}:\n  cold: {cold:?}\n  warm: {warm:?}",
                case.name
            ));
        }
    }
    pool.shutdown(Duration::from_secs(30)).await;
    assert!(
        differ.is_empty(),
        "{} of {} {language} programs differ on a warm runtime:\n{}",
        differ.len(),
        cases.len(),
        differ.join("\n")
    );
    harness.assert_clean().await;
}

#[test]
fn pids_in_node_warnings_are_masked() {
    assert_eq!(
        without_pids("(node:11) Warning: x\n(node:) y (node:7"),
        "(node:PID) Warning: x\n(node:) y (node:PID"
    );
}

#[test]
fn the_suites_are_as_large_as_promised() {
    assert!(PYTHON.len() >= 30, "{}", PYTHON.len());
    assert!(JAVASCRIPT.len() >= 20, "{}", JAVASCRIPT.len());
    assert!(PHP.len() >= 20, "{}", PHP.len());
    assert!(RUBY.len() >= 20, "{}", RUBY.len());
    assert!(R.len() >= 20, "{}", R.len());
    // R's runtime takes no args: a case with some would run plain warm.
    assert!(R.iter().all(|case| case.args.is_empty()));
    for suite in [PYTHON, JAVASCRIPT, PHP, RUBY, R] {
        let mut names: Vec<&str> = suite.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), suite.len(), "case names are unique");
    }
}

#[tokio::test]
async fn python_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "python", "main.py", PYTHON).await;
}

#[tokio::test]
async fn javascript_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "javascript", "main.js", JAVASCRIPT).await;
}

#[tokio::test]
async fn php_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "php", "main.php", PHP).await;
}

#[tokio::test]
async fn ruby_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "ruby", "main.rb", RUBY).await;
}

#[tokio::test]
async fn ruby_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) =
        runsc_harness("ruby_programs_conform_on_a_warm_runtime_under_runsc").await
    {
        conform(harness, "ruby", "main.rb", RUBY).await;
    }
}

#[tokio::test]
async fn r_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "r", "main.r", R).await;
}

#[tokio::test]
async fn r_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) = runsc_harness("r_programs_conform_on_a_warm_runtime_under_runsc").await {
        conform(harness, "r", "main.r", R).await;
    }
}

#[tokio::test]
async fn php_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) = runsc_harness("php_programs_conform_on_a_warm_runtime_under_runsc").await
    {
        conform(harness, "php", "main.php", PHP).await;
    }
}

#[tokio::test]
async fn python_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) =
        runsc_harness("python_programs_conform_on_a_warm_runtime_under_runsc").await
    {
        conform(harness, "python", "main.py", PYTHON).await;
    }
}

#[tokio::test]
async fn javascript_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) =
        runsc_harness("javascript_programs_conform_on_a_warm_runtime_under_runsc").await
    {
        conform(harness, "javascript", "main.js", JAVASCRIPT).await;
    }
}
