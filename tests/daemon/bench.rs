//! `code-runner bench` against a real `code-runner serve` (its own
//! redis-server, the real dockerd) and against the sandbox engine alone: the
//! report parses, its counts add up, its percentiles are ordered, every
//! round trip sent is accounted for, and what went wrong is counted, never
//! hidden; `--scenario fairness` reports both drain rates and the late jobs'
//! waits. A benchmark measures; these tests assert what it reports (and in
//! what order things happened), never how fast anything was.

use crate::common;

use std::process::Output;

use common::containers::docker;
use common::daemon::{
    self, DaemonBuilder, KEY_A, KEY_B, Role, bench_json, bench_json_with, run_to_end,
};
use common::redis_server::{RedisServer, free_port};
use common::{CliHarness, source};
use reqwest::StatusCode;
use serde_json::Value;

fn count(report: &Value, pointer: &str) -> u64 {
    report
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no count at {pointer} in {report:#}"))
}

/// Asserts a latency summary: `samples` samples, min ≤ p50 ≤ p95 ≤ p99 ≤ max.
fn assert_summary(report: &Value, pointer: &str, samples: u64) {
    let summary = report
        .pointer(pointer)
        .unwrap_or_else(|| panic!("no {pointer} in {report:#}"));
    assert_eq!(summary["samples"], samples, "{pointer}: {report:#}");
    let at = |name: &str| {
        summary[name]
            .as_f64()
            .unwrap_or_else(|| panic!("no {pointer}/{name} in {report:#}"))
    };
    let ordered = [at("min"), at("p50"), at("p95"), at("p99"), at("max")];
    assert!(
        ordered.windows(2).all(|w| w[0] <= w[1]) && ordered[0] >= 0.0,
        "{pointer} is not ordered: {report:#}"
    );
    assert!(
        at("min") <= at("mean") && at("mean") <= at("max"),
        "{report:#}"
    );
}

/// Every job of `jobs` succeeded, and the report's counts say so.
fn assert_all_succeeded(out: &Output, report: &Value, jobs: u64) {
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(count(report, "/counts/submitted"), jobs, "{report:#}");
    assert_eq!(count(report, "/counts/succeeded"), jobs, "{report:#}");
    assert_eq!(count(report, "/counts/failed"), 0, "{report:#}");
    assert_eq!(count(report, "/counts/errors"), 0, "{report:#}");
    assert_eq!(report["statuses"], serde_json::json!({"succeeded": jobs}));
    assert_eq!(report["errors"], serde_json::json!([]));
    assert_eq!(report["failures"], serde_json::json!([]));
    // Every job that ran started warm, cold, or without saying which.
    let starts = count(report, "/start/warm")
        + count(report, "/start/cold")
        + count(report, "/start/unknown");
    assert_eq!(starts, jobs, "{report:#}");
    assert_summary(report, "/result_ms", jobs);
    assert!(report["jobs_per_sec"].as_f64().unwrap() > 0.0, "{report:#}");
    assert!(report["elapsed_ms"].as_f64().unwrap() > 0.0, "{report:#}");
    // No progress line: stderr is not a terminal.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{report:#}");
}

#[tokio::test]
async fn through_the_api_by_websocket_and_by_wait_every_job_is_counted_and_timed() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let url = daemon.url.clone();

    let (out, report) = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            bench_json(&[
                "--url",
                &url,
                "--key",
                KEY_A,
                "--jobs",
                "6",
                "--concurrency",
                "3",
            ])
        }
    })
    .await
    .unwrap();
    assert_all_succeeded(&out, &report, 6);
    assert_eq!(report["target"], "api");
    assert_eq!(report["via"], "ws");
    assert_eq!(report["language"], "python");
    assert_eq!(report["concurrency"], 3);
    // Every job printed 42: each has a first output, before its result.
    assert_summary(&report, "/first_output_ms", 6);
    assert!(report["first_output_ms"]["min"].as_f64() <= report["result_ms"]["max"].as_f64());
    assert_eq!(count(&report, "/counts/busy_retries"), 0);
    assert!(report["round_trips"].is_null(), "{report:#}");

    let (out, report) = tokio::task::spawn_blocking(move || {
        bench_json(&[
            "--url",
            &url,
            "--key",
            KEY_A,
            "--via",
            "wait",
            "--jobs",
            "4",
            "-c",
            "2",
            "--pause-ms",
            "200",
        ])
    })
    .await
    .unwrap();
    assert_all_succeeded(&out, &report, 4);
    assert_eq!(report["via"], "wait");
    assert_eq!(report["pause_ms"], 200);
    // Two lanes, two jobs each: each lane paused once before its second.
    assert!(
        report["elapsed_ms"].as_f64().unwrap() >= 200.0,
        "{report:#}"
    );
    // One request per job: no first output to time.
    assert!(report["first_output_ms"].is_null(), "{report:#}");
    daemon.assert_no_containers(&docker().await).await;
}

#[tokio::test]
async fn interactive_jobs_report_every_round_trip_they_sent() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let url = daemon.url.clone();
    let (out, report) = tokio::task::spawn_blocking(move || {
        bench_json(&[
            "--url",
            &url,
            "--key",
            KEY_A,
            "--interactive",
            "--round-trips",
            "5",
            "--jobs",
            "2",
            "--concurrency",
            "2",
        ])
    })
    .await
    .unwrap();
    assert_all_succeeded(&out, &report, 2);
    assert_eq!(report["interactive"], true);
    assert_eq!(report["program"], "built-in echo");
    assert_eq!(count(&report, "/round_trips/per_job"), 5);
    assert_eq!(count(&report, "/round_trips/sent"), 10, "{report:#}");
    assert_eq!(count(&report, "/round_trips/echoed"), 10, "{report:#}");
    assert_summary(&report, "/round_trips/ms", 10);
    daemon.assert_no_containers(&docker().await).await;
}

/// `--exam N`: every student's waits are said once each and answered, and
/// the three latencies have a sample per wait (first output: per student).
#[tokio::test]
async fn the_exam_answers_every_wait_of_every_student() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let url = daemon.url.clone();
    let (out, report) = tokio::task::spawn_blocking(move || {
        bench_json(&[
            "--url",
            &url,
            "--key",
            KEY_A,
            "--exam",
            "3",
            "--questions",
            "2",
            "--think-ms",
            "40",
        ])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{report:#}\n{}", daemon.log());
    assert_eq!(report["scenario"], "exam");
    assert_eq!(count(&report, "/students"), 3);
    assert_eq!(count(&report, "/succeeded"), 3, "{report:#}");
    assert_eq!(count(&report, "/problem_count"), 0, "{report:#}");
    assert_eq!(report["problems"], serde_json::json!([]));
    // A name and two questions: three waits per student, each said once.
    assert_eq!(count(&report, "/input_waits"), 9);
    assert_eq!(count(&report, "/input_wanted_events"), 9, "{report:#}");
    assert_summary(&report, "/first_output_ms", 3);
    assert_summary(&report, "/input_prompt_ms", 9);
    assert_summary(&report, "/wait_to_event_ms", 9);
    assert_summary(&report, "/answer_ms", 9);
    assert_eq!(report["refusals"], serde_json::json!({}));
    daemon.assert_no_containers(&docker().await).await;

    let out = run_to_end(&["bench", "--key", KEY_A, "--exam", "2", "--engine"], &[]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "code-runner: --engine does not go with --exam (its students run a built-in python program over the WebSocket)\n"
    );
}

#[tokio::test]
async fn answers_429_are_waited_out_and_counted() {
    let redis = RedisServer::start();
    // Key a may have one job at a time.
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A}:1"))
        .start()
        .await;
    let busy = daemon.submit(&daemon::sleeper(2.0)).await;
    assert_eq!(busy.status, StatusCode::ACCEPTED, "{busy:#?}");
    let url = daemon.url.clone();
    let (out, report) = tokio::task::spawn_blocking(move || {
        bench_json(&[
            "--url", &url, "--key", KEY_A, "--via", "wait", "--jobs", "2", "-c", "1",
        ])
    })
    .await
    .unwrap();
    assert_all_succeeded(&out, &report, 2);
    // The first submission met the sleeper's job at least once.
    assert!(count(&report, "/counts/busy_retries") >= 1, "{report:#}");
    assert_eq!(daemon.job(&busy.id()).await["status"], "succeeded");
    daemon.assert_no_containers(&docker().await).await;
}

/// A backlog drain as the fairness report gives it: every job succeeded,
/// a drain time and rate, and one queue wait per job.
fn assert_drain(report: &Value, pointer: &str, jobs: u64) {
    assert_eq!(
        count(report, &format!("{pointer}/jobs")),
        jobs,
        "{report:#}"
    );
    assert_eq!(
        count(report, &format!("{pointer}/succeeded")),
        jobs,
        "{report:#}"
    );
    for field in ["drain_ms", "jobs_per_sec"] {
        let value = report.pointer(&format!("{pointer}/{field}"));
        assert!(
            value.and_then(Value::as_f64).is_some_and(|v| v > 0.0),
            "{pointer}/{field}: {report:#}"
        );
    }
    assert_summary(report, &format!("{pointer}/wait_ms"), jobs);
}

#[tokio::test]
async fn the_fairness_scenario_lets_the_other_key_and_the_second_user_in_before_the_backlog_is_done()
 {
    let redis = RedisServer::start();
    // Two slots, so that the backlog outlasts the late jobs' arrival.
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .start()
        .await;
    let url = daemon.url.clone();
    let (out, report) = tokio::task::spawn_blocking(move || {
        bench_json(&[
            "--url",
            &url,
            "--key",
            KEY_A,
            "--scenario",
            "fairness",
            "--other-key",
            KEY_B,
            "--backlog",
            "10",
            "--job-ms",
            "300",
            "--late-ms",
            "200",
        ])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{report:#}");
    assert_eq!(report["scenario"], "fairness");
    assert_eq!(report["language"], "python");
    assert_eq!(report["program"], "built-in sleep of 300 ms");
    assert_eq!(
        (&report["backlog"], &report["job_ms"], &report["late_ms"]),
        (&Value::from(10), &Value::from(300), &Value::from(200)),
        "{report:#}"
    );
    assert_drain(&report, "/alone", 10);
    assert_drain(&report, "/contended/backlog", 10);
    assert!(report["drain_ratio"].as_f64().unwrap() > 0.0, "{report:#}");
    for late in ["/contended/other_key", "/contended/second_user"] {
        let job = &report.pointer(late).unwrap();
        assert_eq!(job["status"], "succeeded", "{late}: {report:#}");
        assert!(job["wait_ms"].as_f64().unwrap() >= 0.0, "{report:#}");
        // It was submitted behind the whole backlog and started before the
        // backlog was done: backlog jobs started after it.
        assert_eq!(
            job["started_before_backlog_done"], true,
            "{late}: {report:#}"
        );
        assert!(
            count(&report, &format!("{late}/backlog_started_after")) >= 1,
            "{late}: {report:#}"
        );
    }
    assert!(report["host"]["cpus"].as_u64().unwrap() >= 1, "{report:#}");
    daemon.assert_no_containers(&docker().await).await;

    let usage = |args: &[&str], line: &str| {
        let out = run_to_end(args, &[]);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), line, "{args:?}");
    };
    let fairness = ["bench", "--key", KEY_A, "--scenario", "fairness"];
    usage(
        &fairness,
        "code-runner: --scenario fairness needs --other-key: a second API key of the server (key B)\n",
    );
    usage(
        &[&fairness[..], &["--other-key", KEY_A]].concat(),
        "code-runner: --other-key is the key of --key; the fair turns are between two keys\n",
    );
    usage(
        &[&fairness[..], &["--other-key", KEY_B, "--engine"]].concat(),
        "code-runner: --engine does not go with --scenario fairness (its jobs are python sleeps)\n",
    );
}

#[tokio::test]
async fn the_engine_alone_needs_no_redis_and_no_api() {
    let cli = CliHarness::new().await;
    // Nothing listens at this Redis URL; --engine never looks.
    let nowhere = format!("redis://127.0.0.1:{}", free_port());
    let env = [("CODE_RUNNER_REDIS_URL", nowhere.as_str())];
    let (out, report) = bench_json_with(&["--engine", "--jobs", "3", "-c", "2"], &env);
    assert_all_succeeded(&out, &report, 3);
    assert_eq!(report["target"], "engine");
    assert_eq!(report["runtime"], "runc");
    assert!(report["url"].is_null());
    assert_summary(&report, "/first_output_ms", 3);

    let interactive = [
        "--engine",
        "--interactive",
        "--round-trips",
        "4",
        "--jobs",
        "2",
    ];
    let (out, report) = bench_json_with(&interactive, &env);
    assert_all_succeeded(&out, &report, 2);
    assert_eq!(count(&report, "/round_trips/sent"), 8, "{report:#}");
    assert_eq!(count(&report, "/round_trips/echoed"), 8, "{report:#}");
    cli.assert_clean().await;
}

#[tokio::test]
async fn jobs_that_fail_are_counted_by_status_and_the_exit_code_says_so() {
    let cli = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let program = source(dir.path(), "fails.py", "raise SystemExit(3)\n");
    let program = program.to_str().unwrap();
    let out = run_to_end(
        &["bench", "--engine", "--program", program, "--jobs", "2"],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("jobs         0 succeeded, 2 failed, 0 errors"),
        "{stdout}"
    );
    assert!(
        stdout.contains("failed       2 × failed: exit code 3\n"),
        "{stdout}"
    );
    assert!(
        stdout.starts_with(&format!(
            "2 python jobs ({program}) through the sandbox engine (runc, no Redis, no API), 2 at a time\n"
        )),
        "{stdout}"
    );
    assert_eq!(
        stderr,
        "code-runner: 2 of 2 jobs did not succeed (2 failed, 0 errors); 0 lines not echoed\n"
    );
    cli.assert_clean().await;
}

#[tokio::test]
async fn an_api_that_cannot_be_reached_is_an_error_per_job() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let (out, report) = tokio::task::spawn_blocking(move || {
        bench_json(&["--url", &url, "--key", KEY_A, "--jobs", "3", "-c", "2"])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    assert_eq!(count(&report, "/counts/submitted"), 3);
    assert_eq!(count(&report, "/counts/errors"), 3);
    assert_eq!(count(&report, "/counts/succeeded"), 0);
    assert_eq!(report["errors"][0]["count"], 3, "{report:#}");
    let message = report["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("cannot reach http://127.0.0.1:"),
        "{message}"
    );
    assert!(report["result_ms"].is_null());
}

#[tokio::test]
async fn a_refused_key_or_bad_flags_stop_at_once_with_exit_64() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let url = daemon.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        run_to_end(
            &["bench", "--url", &url, "--key", "not-a-key", "--jobs", "50"],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "code-runner: the API refused the key; stopped after 0 jobs\n"
    );
    assert!(out.stdout.is_empty());

    let usage = |args: &[&str], line: &str| {
        let out = run_to_end(args, &[]);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), line, "{args:?}");
    };
    usage(
        &["bench", "--key", KEY_A, "--via", "wait", "--interactive"],
        "code-runner: --interactive sends stdin over the WebSocket; it needs --via ws\n",
    );
    usage(
        &["bench", "--engine", "--via", "wait"],
        "code-runner: --via wait measures through the API; it does not go with --engine\n",
    );
    let known = code_runner::languages::LanguageCatalog::embedded()
        .unwrap()
        .ids()
        .join(", ");
    usage(
        &["bench", "--key", KEY_A, "--language", "cobol"],
        &format!("code-runner: unknown language \"cobol\" (known: {known})\n"),
    );
    usage(
        &["bench"],
        "code-runner: CODE_RUNNER_API_KEY is not set: it is the API key to submit with (scripts/up prints one)\n",
    );
    let out = run_to_end(&["bench", "--key", KEY_A, "--jobs", "0"], &[]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--jobs <JOBS>"),
        "{out:?}"
    );
    daemon.assert_no_containers(&docker().await).await;
}

#[tokio::test]
async fn every_built_in_program_runs_and_echoes() {
    let cli = CliHarness::new().await;
    for language in ["python", "javascript", "c", "cpp", "bash", "ruby", "go"] {
        let args = ["--engine", "--language", language, "--jobs", "1"];
        let (out, report) = bench_json(&args);
        assert_all_succeeded(&out, &report, 1);
        assert_eq!(report["language"], language);
        assert_eq!(report["program"], "built-in hello world");

        let interactive = ["--interactive", "--round-trips", "2"];
        let (out, report) = bench_json(&[&args[..], &interactive].concat());
        assert_all_succeeded(&out, &report, 1);
        assert_eq!(count(&report, "/round_trips/sent"), 2, "{report:#}");
        assert_eq!(count(&report, "/round_trips/echoed"), 2, "{report:#}");
    }
    cli.assert_clean().await;
}

#[tokio::test]
async fn ctrl_c_stops_the_run_removes_its_sandboxes_and_reports_what_ran() {
    let cli = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let program = source(dir.path(), "slow.py", "import time\ntime.sleep(60)\n");
    let mut child = daemon::ChildGuard(
        common::code_runner()
            .args(["bench", "--engine", "--jobs", "5", "-c", "2", "--json"])
            .arg("--program")
            .arg(&program)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the code-runner binary starts"),
    );
    let stdout = common::drain(child.0.stdout.take());
    let stderr = common::drain(child.0.stderr.take());
    // Both lanes have a sandbox running.
    common::wait_for(
        "two sandboxes of the benchmark",
        std::time::Duration::from_secs(30),
        async || (cli.leftovers().await.len() == 2).then_some(()),
    )
    .await;
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "bench did not end within 30 s of Ctrl-C"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let stdout = stdout.join().unwrap();
    let stderr = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert_eq!(stderr, "code-runner: interrupted after 2 of 5 jobs\n");
    let report: Value = serde_json::from_slice(&stdout).expect("the report is JSON");
    assert_eq!(report["interrupted_of"], 5, "{report:#}");
    assert_eq!(count(&report, "/counts/submitted"), 2, "{report:#}");
    assert_eq!(report["statuses"], serde_json::json!({"cancelled": 2}));
    cli.assert_clean().await;
}
