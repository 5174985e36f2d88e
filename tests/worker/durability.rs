//! Durable by default: a redis-server run with exactly the
//! settings scripts/up gives it (`CODE_RUNNER_REDIS_DURABLE_ARGS` in
//! scripts/lib/services.sh) loses no queued job, idempotency record or token
//! secret when it is killed (`SIGKILL`, no save) and started again. (That
//! `/readyz` and `doctor` warn about a Redis that would lose them is tested
//! with the binary and dockerd, `tests/daemon/durability.rs`: `doctor`
//! checks dockerd first.)
//!
//! Real redis-server per test, the API in process (no job runs); every
//! process is stopped by its guard, also when a test fails.

use std::time::Duration;

use reqwest::StatusCode;

use crate::common::client::KEY_A;
use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;
use crate::common::scripted;
use crate::common::wait_for;

/// The Redis arguments scripts/up (through scripts/lib/services.sh) runs
/// Redis with.
fn durable_args() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/lib/services.sh");
    let text = std::fs::read_to_string(path).expect("scripts/lib/services.sh");
    let line = text
        .lines()
        .find(|l| l.starts_with("CODE_RUNNER_REDIS_DURABLE_ARGS=("))
        .expect("services.sh defines CODE_RUNNER_REDIS_DURABLE_ARGS");
    let inner = line
        .trim_start_matches("CODE_RUNNER_REDIS_DURABLE_ARGS=(")
        .trim_end_matches(')');
    inner.split_whitespace().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_killed_with_the_scripts_settings_loses_no_queued_job_nor_the_token_secret() {
    let args = durable_args();
    for setting in [
        ["--appendonly", "yes"],
        ["--appendfsync", "everysec"],
        ["--maxmemory-policy", "noeviction"],
    ] {
        assert!(
            args.windows(2).any(|w| w == setting),
            "{setting:?} in {args:?}"
        );
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut redis = RedisServer::start_with(&args);
    // An API only: nothing claims the jobs, they stay queued.
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let mut queued = Vec::new();
    for n in 0..20 {
        let answer = api.submit(&scripted::json(&format!("print {n}"))).await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
        queued.push(answer.id());
    }
    let body = serde_json::to_vec(&scripted::json("print once")).unwrap();
    let first = api
        .post_raw(Some(KEY_A), body.clone(), false, Some("order-42"))
        .await;
    let token = first.body["token"].as_str().unwrap().to_string();
    let idempotent = first.id();
    queued.push(idempotent.clone());
    drop(api);
    // A SIGKILL loses only what Redis has not yet written to its append-only
    // file: what it wrote, the kernel keeps (fsynced or not) for the restarted
    // server to read. With appendfsync everysec Redis may hold writes back
    // while a background fsync is under way: wait until it holds none and
    // has no fsync pending.
    wait_for(
        "Redis to write every change to its append-only file",
        Duration::from_secs(30),
        || async {
            let info = redis.cli(&["INFO", "persistence"]);
            ["aof_buffer_length:0", "aof_pending_bio_fsync:0"]
                .iter()
                .all(|field| info.lines().any(|line| line.trim() == *field))
                .then_some(())
        },
    )
    .await;

    redis.kill();
    redis.restart();
    // The restarted server runs with the same settings.
    for (name, value) in [
        ("appendonly", "yes"),
        ("appendfsync", "everysec"),
        ("maxmemory-policy", "noeviction"),
    ] {
        assert_eq!(
            redis.cli(&["CONFIG", "GET", name]).lines().nth(1),
            Some(value),
            "{name} after the restart"
        );
    }

    // Every job waits in its user's queue (the key's anonymous user here),
    // with one turn each in jobs:queue.
    let key_name = redis.job_field(&queued[0], "api_key");
    let mut in_queue: Vec<String> = redis
        .cli(&["LRANGE", &format!("apikey:{key_name}:queue:"), "0", "-1"])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        redis.cli(&["LLEN", "jobs:queue"]).trim(),
        queued.len().to_string(),
        "one turn per queued job"
    );
    in_queue.sort();
    let mut expected = queued.clone();
    expected.sort();
    assert_eq!(in_queue, expected, "the queue after the restart");
    for id in &queued {
        assert_eq!(redis.job_field(id, "status"), "queued", "job {id}");
    }
    // A new API process: the same idempotency record, and the attach token
    // signed before the restart still opens the job's stream.
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let again = api
        .post_raw(Some(KEY_A), body, false, Some("order-42"))
        .await;
    assert_eq!(again.status, StatusCode::OK, "{again:#?}");
    assert_eq!(again.id(), idempotent);
    let response = api
        .http
        .get(format!(
            "{}/v1/jobs/{idempotent}/events?token={token}",
            api.url
        ))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("the stream answers");
    assert_eq!(response.status(), StatusCode::OK);
}
