//! The exam's burst on the default settings: 100 students press Run at
//! once, each an interactive program they answer three times over its
//! WebSocket (`code-runner bench --interactive -n 100 -c 100
//! --round-trips 3`, a 300-student exam's burst scaled to the test
//! machine), against a `code-runner serve` whose only settings are a warm
//! pool and slots sized for the class. Three rounds in one test (300
//! sessions): every session succeeds, no submission is refused (no 429 of
//! any reason: not the key's storage, not its active jobs, not its rate),
//! and no client sees a transport error. One failing session in 20 would
//! go unseen three rounds running with a chance of 0.95^300, about 2·10⁻⁷.

use crate::common;

use std::time::Duration;

use common::daemon::{DaemonBuilder, KEY_A, Role, bench_json, metric};
use common::redis_server::RedisServer;

const STUDENTS: u32 = 100;
const ROUNDS: u32 = 3;

#[tokio::test]
async fn a_class_of_100_runs_at_once_three_times_on_the_default_settings_with_no_refusal() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", STUDENTS)
        .env("CODE_RUNNER_WARM", format!("python={STUDENTS}"))
        .env("CODE_RUNNER_WARM_MAX", STUDENTS)
        .start()
        .await;
    let ready = "code_runner_warm_ready{language=\"python\"}";
    for round in 1..=ROUNDS {
        // The class presses Run once the pool is full again.
        daemon
            .wait_metric(ready, f64::from(STUDENTS), Duration::from_secs(240))
            .await;
        let url = daemon.url.clone();
        let (out, report) = tokio::task::spawn_blocking(move || {
            bench_json(&[
                "--url",
                &url,
                "--key",
                KEY_A,
                "--interactive",
                "--round-trips",
                "3",
                "--jobs",
                &STUDENTS.to_string(),
                "--concurrency",
                &STUDENTS.to_string(),
            ])
        })
        .await
        .unwrap();
        let what = format!("round {round}: {report:#}");
        assert_eq!(out.status.code(), Some(0), "{what}");
        let counts = &report["counts"];
        assert_eq!(counts["submitted"], STUDENTS, "{what}");
        assert_eq!(counts["succeeded"], STUDENTS, "{what}");
        assert_eq!(counts["failed"], 0, "{what}");
        assert_eq!(counts["errors"], 0, "{what}");
        assert_eq!(counts["busy_retries"], 0, "{what}");
        assert_eq!(counts["busy_reasons"], serde_json::json!({}), "{what}");
        assert_eq!(report["errors"], serde_json::json!([]), "{what}");
        assert_eq!(report["round_trips"]["sent"], 3 * STUDENTS, "{what}");
        assert_eq!(report["round_trips"]["echoed"], 3 * STUDENTS, "{what}");
    }
    // The server refused nothing, for any reason.
    let metrics = daemon.metrics().await;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("code_runner_submissions_rejected_total{"))
    {
        let name = line.split_whitespace().next().unwrap();
        assert_eq!(metric(&metrics, name), Some(0.0), "{line}");
    }
}
