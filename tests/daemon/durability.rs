//! `/readyz` and `doctor` warn about a Redis that would lose queued jobs,
//! idempotency records or token secrets (no persistence, keys evicted),
//! and say nothing once it keeps them. `doctor` checks dockerd before
//! Redis, so this runs with Docker; that a Redis run with the settings of
//! scripts/up loses nothing is tested without it (`tests/worker`,
//! `durability`).
//!
//! Real redis-server per test, the real binary; every process is killed by
//! its guard, also when a test fails.

use reqwest::StatusCode;
use serde_json::Value;

use crate::common::daemon::{DaemonBuilder, Role, run_to_end};
use crate::common::redis_server::RedisServer;

async fn readiness(api: &crate::common::daemon::Daemon) -> Value {
    let answer = api.get("/readyz", None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    answer.body
}

fn warned(readiness: &Value) -> Vec<String> {
    readiness["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("no warnings list: {readiness:#}"))
        .iter()
        .map(|w| w["check"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_and_doctor_warn_about_a_redis_that_would_lose_jobs() {
    let redis = RedisServer::start();
    let api = DaemonBuilder::new(Role::Api, &redis).start().await;
    let body = readiness(&api).await;
    assert_eq!(body["ready"], true, "{body:#}");
    assert_eq!(warned(&body), ["redis_persistence"], "{body:#}");
    let message = body["warnings"][0]["message"].as_str().unwrap();
    assert!(message.contains("appendonly yes"), "{message}");

    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let body = readiness(&api).await;
    assert_eq!(
        warned(&body),
        ["redis_persistence", "redis_eviction"],
        "{body:#}"
    );

    let url = redis.url();
    let doctor = run_to_end(&["doctor"], &[("CODE_RUNNER_REDIS_URL", &url)]);
    let out = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        out.contains("warning: redis has no persistence"),
        "doctor said:\n{out}"
    );
    assert!(
        out.contains("warning: redis evicts keys when full (maxmemory-policy allkeys-lru)"),
        "doctor said:\n{out}"
    );

    redis.cli(&["CONFIG", "SET", "appendonly", "yes"]);
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let body = readiness(&api).await;
    assert!(warned(&body).is_empty(), "{body:#}");
    let doctor = run_to_end(&["doctor"], &[("CODE_RUNNER_REDIS_URL", &url)]);
    let out = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        out.contains("ok: redis keeps an append-only file and never evicts keys"),
        "doctor said:\n{out}"
    );
    assert!(!out.contains("warning: redis"), "doctor said:\n{out}");
}
