//! SIGTERM: the worker stops claiming, lets running jobs finish within
//! `DRAIN_TIMEOUT`, settles what is left as `error`, and exits 0.

use crate::common;

use std::time::{Duration, Instant};

use common::containers::docker;
use common::daemon;
use common::redis_server::RedisServer;
use daemon::{DaemonBuilder, Role, job_containers, python};
use reqwest::StatusCode;
use serde_json::json;

/// Waits until the job runs in a container; returns when both are true.
async fn wait_running(daemon: &daemon::Daemon, docker: &bollard::Docker, id: &str) {
    daemon
        .wait_status(id, &["running"], Duration::from_secs(30))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while job_containers(docker, id).await.is_empty() {
        assert!(Instant::now() < deadline, "job {id} has no container");
        tokio::time::sleep(daemon::POLL).await;
    }
}

#[tokio::test]
async fn a_running_job_finishes_inside_the_drain_window_and_the_process_exits_0() {
    let redis = RedisServer::start();
    let mut daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_DRAIN_TIMEOUT_MS", 30000)
        .start()
        .await;
    let docker = docker().await;
    let answer = daemon
        .submit(&python(
            "import time\ntime.sleep(2)\nprint('finished after 2 s')\n",
        ))
        .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
    let id = answer.id();
    wait_running(&daemon, &docker, &id).await;

    let signalled = Instant::now();
    daemon.sigterm();
    // While the worker drains, the API still answers reads but takes no jobs.
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let answer = daemon.submit(&python("print('too late')\n")).await;
        if answer.status != StatusCode::ACCEPTED {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "submissions still accepted after SIGTERM"
        );
        tokio::time::sleep(daemon::POLL).await;
    };
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{refused:#?}"
    );
    assert_eq!(refused.error().0, "shutting_down");
    common::assert_refusal_detail(&refused.body, 1, "shutting_down", None);
    let view = daemon.job(&id).await;
    assert_eq!(view["status"], "running", "{view:#}");
    let status = daemon.wait_exit(Duration::from_secs(30)).await;
    let took = signalled.elapsed();
    eprintln!("drained and exited in {took:?}");
    assert_eq!(status.code(), Some(0), "log:\n{}", daemon.log());

    assert_eq!(redis.job_field(&id, "status"), "succeeded");
    let result = redis.stored_result(&id);
    assert_eq!(
        result["run"]["stdout"], "finished after 2 s\n",
        "{result:#}"
    );
    assert_eq!(result["run"]["exit_code"], 0, "{result:#}");
    daemon.assert_no_containers(&docker).await;
    assert!(job_containers(&docker, &id).await.is_empty());
    // Nothing stays claimed by the worker that left.
    let processing = redis.cli(&["LLEN", &format!("worker:{}:processing", daemon.worker_id)]);
    assert_eq!(processing, "0");
}

#[tokio::test]
async fn with_a_short_drain_window_a_running_job_is_settled_as_error_with_a_reason() {
    let redis = RedisServer::start();
    let mut daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_DRAIN_TIMEOUT_MS", 300)
        .start()
        .await;
    let docker = docker().await;
    let mut job = daemon::job("bash", "main.sh", "sleep 30\necho never\n");
    job["limits"] = json!({"wall_ms": 60000});
    let answer = daemon.submit(&job).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
    let id = answer.id();
    wait_running(&daemon, &docker, &id).await;

    let signalled = Instant::now();
    daemon.sigterm();
    let status = daemon.wait_exit(Duration::from_secs(20)).await;
    let took = signalled.elapsed();
    eprintln!("killed the job and exited in {took:?}");
    assert_eq!(status.code(), Some(0), "log:\n{}", daemon.log());
    assert!(took < Duration::from_secs(15), "took {took:?}");

    assert_eq!(redis.job_field(&id, "status"), "error");
    let result = redis.stored_result(&id);
    assert_eq!(result["status"], "error", "{result:#}");
    assert!(
        result["error"].as_str().is_some_and(|e| !e.is_empty()),
        "no reason: {result:#}"
    );
    daemon.assert_no_containers(&docker).await;
    assert!(job_containers(&docker, &id).await.is_empty());
    let ttl: i64 = redis.cli(&["TTL", &format!("job:{id}")]).parse().unwrap();
    assert!(ttl > 0, "TTL job:{id} = {ttl}");
}
