//! The daemon end to end, through HTTP: the real binary (`serve` or `api`), a
//! real redis-server per test and the real dockerd.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::containers::docker;
use common::daemon;
use common::programs::HELLO;
use common::redis_server::RedisServer;
use daemon::{
    DaemonBuilder, KEY_A, KEY_B, Role, job, job_containers, metric, python, run_stdout, sleeper,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Long enough for a Go compile on a busy 2-core machine.
const JOB_DEADLINE: Duration = Duration::from_secs(90);

/// Asserts the fields of the job view of a job that succeeded on `worker`.
fn assert_succeeded_view(view: &Value, id: &str, language: &str, worker: &str) {
    assert_eq!(view["id"], id, "{view:#}");
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(view["language"], language, "{view:#}");
    assert_eq!(view["attempts"], 1, "{view:#}");
    assert_eq!(view["worker"], worker, "{view:#}");
    for field in ["created_at", "started_at", "finished_at"] {
        assert!(!view[field].is_null(), "no {field}: {view:#}");
    }
    assert_eq!(view["result"]["status"], "succeeded", "{view:#}");
    assert_eq!(view["result"]["run"]["exit_code"], 0, "{view:#}");
    assert_eq!(view["result"]["run"]["reason"], "exited", "{view:#}");
}

#[tokio::test]
async fn every_language_by_poll_and_by_wait_gives_the_engines_output() {
    let engine = common::Harness::new().await;
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 4)
        .start()
        .await;
    let docker = docker().await;

    let checks = HELLO.iter().map(|&(language, name, source)| {
        let (engine, daemon) = (&engine, &daemon);
        async move {
            let expected = format!("hello from {language}\n");
            let spec = common::job(language, name, source);
            let body = job(language, name, source);
            let (by_engine, submitted, waited) = tokio::join!(
                engine.run(&spec),
                daemon.submit(&body),
                daemon.submit_wait(&body)
            );
            // What the engine gives for this program, exactly.
            assert_eq!(common::stdout(&by_engine), expected, "{by_engine:#?}");

            // Submit, then poll.
            assert_eq!(submitted.status, StatusCode::ACCEPTED, "{submitted:#?}");
            let id = submitted.id();
            assert_eq!(submitted.body["status"], "queued", "{submitted:#?}");
            assert!(
                submitted.body["token"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty()),
                "no attach token: {submitted:#?}"
            );
            assert!(!submitted.body["urls"].is_null(), "{submitted:#?}");
            let view = daemon.wait_terminal(&id, JOB_DEADLINE).await;
            assert_succeeded_view(&view, &id, language, &daemon.worker_id);
            assert_eq!(run_stdout(&view), common::stdout(&by_engine));
            assert_eq!(view["result"]["run"]["stderr"], "", "{view:#}");

            // Submit with ?wait=true: the result comes with the answer (200),
            // unless the job did not end within the wait budget (its wall
            // limit + a slack, from submission): with 14 jobs on 4 slots it
            // can still be queued or running (202), and is then followed
            // by polling.
            let id = waited.id();
            let waited = match waited.status {
                StatusCode::OK => waited.body,
                StatusCode::ACCEPTED => daemon.wait_terminal(&id, JOB_DEADLINE).await,
                _ => panic!("{waited:#?}"),
            };
            assert_succeeded_view(&waited, &id, language, &daemon.worker_id);
            assert_eq!(run_stdout(&waited), common::stdout(&by_engine));
            // And GET answers the same.
            assert_eq!(daemon.job(&id).await["result"], waited["result"]);
        }
    });
    futures_util::future::join_all(checks).await;
    daemon.assert_no_containers(&docker).await;
    engine.assert_clean().await;
}

#[tokio::test]
async fn a_failing_program_and_a_compile_error_are_reported_in_the_result() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let failing = daemon
        .submit_wait(&python(
            "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)",
        ))
        .await;
    assert_eq!(failing.status, StatusCode::OK, "{failing:#?}");
    let view = &failing.body;
    assert_eq!(view["status"], "failed", "{view:#}");
    assert_eq!(view["result"]["run"]["exit_code"], 3, "{view:#}");
    assert_eq!(view["result"]["run"]["stdout"], "out\n", "{view:#}");
    assert_eq!(view["result"]["run"]["stderr"], "err\n", "{view:#}");

    let broken = daemon
        .submit_wait(&job("c", "main.c", "int main(void) { return nope; }\n"))
        .await;
    let view = &broken.body;
    assert_eq!(view["status"], "failed", "{view:#}");
    assert_eq!(view["result"]["run"], Value::Null, "{view:#}");
    assert_eq!(view["result"]["compile"]["exit_code"], 1, "{view:#}");
    assert!(
        view["result"]["compile"]["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("error: ‘nope’ undeclared")),
        "{view:#}"
    );
}

#[tokio::test]
async fn cancelling_a_queued_job_means_it_never_starts_and_a_running_one_is_killed() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 1)
        .start()
        .await;
    let docker = docker().await;

    // Fill the only slot.
    let mut long = sleeper(60.0);
    long["limits"] = json!({"wall_ms": 120000});
    let running = daemon.submit(&long).await;
    assert_eq!(running.status, StatusCode::ACCEPTED, "{running:#?}");
    let running = running.id();
    daemon
        .wait_status(&running, &["running"], Duration::from_secs(30))
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while job_containers(&docker, &running).await.is_empty() {
        assert!(std::time::Instant::now() < deadline, "no container");
        tokio::time::sleep(daemon::POLL).await;
    }

    let queued = daemon.submit(&python("print('must never run')")).await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:#?}");
    let queued = queued.id();
    assert_eq!(daemon.job(&queued).await["status"], "queued");

    // Watch for a container of the queued job for the rest of the test.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (docker, stop, queued) = (docker.clone(), stop.clone(), queued.clone());
        tokio::spawn(async move {
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let seen = job_containers(&docker, &queued).await;
                assert!(seen.is_empty(), "the cancelled job got a container");
                samples += 1;
                tokio::time::sleep(daemon::POLL).await;
            }
            samples
        })
    };

    let cancelled = daemon.cancel(&queued).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{cancelled:#?}");
    assert_eq!(cancelled.body["status"], "cancelled", "{cancelled:#?}");
    assert_eq!(daemon.job(&queued).await["status"], "cancelled");

    // Cancel the running one: it is killed and its container removed.
    let killed = daemon.cancel(&running).await;
    assert!(killed.status.is_success(), "{killed:#?}");
    let view = daemon
        .wait_status(&running, &["cancelled"], Duration::from_secs(15))
        .await;
    assert_eq!(view["attempts"], 1, "{view:#}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !job_containers(&docker, &running).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed job's container is still there"
        );
        tokio::time::sleep(daemon::POLL).await;
    }

    // The slot is free again: a job submitted after the cancelled one runs,
    // so the worker has gone past the cancelled one in the queue.
    let next = daemon.submit_wait(&python("print('next')")).await;
    assert_eq!(next.body["status"], "succeeded", "{next:#?}");
    assert_eq!(run_stdout(&next.body), "next\n");

    stop.store(true, Ordering::Relaxed);
    let samples = watcher.await.expect("no container of the cancelled job");
    assert!(samples > 0);
    let view = daemon.job(&queued).await;
    assert_eq!(view["status"], "cancelled", "{view:#}");
    assert_eq!(view["attempts"], 0, "{view:#}");
    assert_eq!(view["started_at"], Value::Null, "{view:#}");
    // Cancelling again changes nothing.
    let again = daemon.cancel(&queued).await;
    assert!(again.status.is_success() || again.status == StatusCode::CONFLICT);
    assert_eq!(daemon.job(&queued).await["status"], "cancelled");
    daemon.assert_no_containers(&docker).await;
}

#[tokio::test]
async fn the_same_idempotency_key_and_body_give_the_same_job_another_body_409() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let body = serde_json::to_vec(&python("print('once')")).unwrap();
    let first = daemon
        .post_raw(Some(KEY_A), body.clone(), false, Some("retry-1"))
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:#?}");
    let id = first.id();
    let second = daemon
        .post_raw(Some(KEY_A), body.clone(), false, Some("retry-1"))
        .await;
    assert!(second.status.is_success(), "{second:#?}");
    assert_eq!(second.id(), id);

    let other = serde_json::to_vec(&python("print('twice')")).unwrap();
    let conflict = daemon
        .post_raw(Some(KEY_A), other, false, Some("retry-1"))
        .await;
    assert_eq!(conflict.status, StatusCode::CONFLICT, "{conflict:#?}");
    assert_eq!(conflict.error().0, "idempotency_conflict");

    let view = daemon.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(run_stdout(&view), "once\n");
    // One job ran, once.
    let metrics = daemon.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "code_runner_jobs_total{language=\"python\",status=\"succeeded\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    // After it ended, a retry still names the same job.
    let third = daemon
        .post_raw(Some(KEY_A), body, false, Some("retry-1"))
        .await;
    assert_eq!(third.id(), id, "{third:#?}");
}

#[tokio::test]
async fn requests_without_a_valid_key_get_401_and_one_keys_limit_leaves_another_key_alone() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A}:1,b:{KEY_B}"))
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .start()
        .await;
    let docker = docker().await;
    let hello = python("print('hi')");

    for key in [None, Some("not-a-key"), Some("key-a-012345678"), Some("")] {
        let answer = daemon.submit_as(key, &hello, false).await;
        assert_eq!(
            answer.status,
            StatusCode::UNAUTHORIZED,
            "{key:?}: {answer:#?}"
        );
        assert_eq!(answer.error().0, "unauthorized");
    }
    let answer = daemon.get("/v1/jobs/nope", None).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{answer:#?}");

    // Key a may have one job queued or running.
    let mut long = sleeper(60.0);
    long["limits"] = json!({"wall_ms": 120000});
    let first = daemon.submit_as(Some(KEY_A), &long, false).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:#?}");
    let first = first.id();
    let refused = daemon.submit_as(Some(KEY_A), &hello, false).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{refused:#?}"
    );
    assert_eq!(refused.error().0, "key_limit");
    assert!(refused.retry_after() >= 1, "{refused:#?}");

    // Key b is not affected.
    let other = daemon.submit_as(Some(KEY_B), &hello, true).await;
    assert_eq!(other.status, StatusCode::OK, "{other:#?}");
    assert_eq!(other.body["status"], "succeeded", "{other:#?}");

    // Once a's job is over, a may submit again.
    assert!(daemon.cancel(&first).await.status.is_success());
    daemon
        .wait_status(&first, &["cancelled"], Duration::from_secs(15))
        .await;
    let again = daemon.submit_as(Some(KEY_A), &hello, true).await;
    assert_eq!(again.status, StatusCode::OK, "{again:#?}");
    assert_eq!(again.body["status"], "succeeded", "{again:#?}");
    daemon.assert_no_containers(&docker).await;
}

#[tokio::test]
async fn bad_bodies_are_4xx_with_the_error_shape_never_500() {
    let redis = RedisServer::start();
    // The API alone: nothing here reaches a worker.
    let daemon = DaemonBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_MAX_BODY_BYTES", 4096)
        .start()
        .await;

    let big = python(&format!("print('{}')", "x".repeat(8000)));
    let answer = daemon.submit(&big).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{answer:#?}");
    assert_eq!(answer.error().0, "too_large");

    for body in [
        &b"{\"language\": \"python\", \"files\": ["[..],
        b"not json at all",
        b"",
        b"{\"language\": 5, \"files\": []}",
        b"[]",
    ] {
        let answer = daemon
            .post_raw(Some(KEY_A), body.to_vec(), false, None)
            .await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{:?}: {answer:#?}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(answer.error().0, "invalid_json");
    }

    // Invalid jobs name the field at fault.
    let cases = [
        (job("cobol", "main.cob", "x"), "language"),
        (
            json!({"language": "python", "files": [{"name": "../x.py", "content": ""}]}),
            "files[0].name",
        ),
        (
            json!({"language": "python", "files": [{"name": "a.py", "content": ""}],
                   "limits": {"memory_mb": 999999}}),
            "limits.memory_mb",
        ),
        (
            json!({"language": "python", "files": [{"name": "a.py", "content": ""}],
                   "surprise": true}),
            "",
        ),
    ];
    for (body, field) in cases {
        let answer = daemon.submit(&body).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{body}: {answer:#?}"
        );
        let (code, _) = answer.error();
        if field.is_empty() {
            assert_eq!(code, "invalid_json", "{answer:#?}");
        } else {
            assert_eq!(code, "invalid_job", "{answer:#?}");
            assert_eq!(answer.body["error"]["field"], field, "{answer:#?}");
        }
    }
    // Nothing was queued.
    assert_eq!(redis.queue_depth(), 0);
    let answer = daemon.get("/v1/jobs/does-not-exist", Some(KEY_A)).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{answer:#?}");
    assert_eq!(answer.error().0, "not_found");
}

/// Redis refuses none of the daemon's commands in a job's life: its error
/// counts are what an operator watches. (Redis before 7.2, Debian 12's
/// 7.0 among them, refuses `CLIENT SETINFO`, which redis-rs sends on every
/// new connection unless told not to.)
#[tokio::test]
async fn redis_refuses_none_of_the_daemons_commands() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let answer = daemon.submit_wait(&python("print('counted')")).await;
    assert_eq!(answer.body["status"], "succeeded", "{answer:#?}");
    let connections: u64 = redis
        .info("stats", "total_connections_received")
        .parse()
        .unwrap();
    assert!(connections >= 2, "{connections} connections");
    let errors = redis.cli(&["INFO", "errorstats"]);
    let refused: Vec<&str> = errors
        .lines()
        .filter(|line| line.starts_with("errorstat_") && !line.starts_with("errorstat_NOSCRIPT"))
        .collect();
    let stats = redis.cli(&["INFO", "commandstats"]);
    assert!(refused.is_empty(), "{errors}\n{stats}");
}

#[tokio::test]
async fn a_finished_jobs_redis_key_expires_within_the_result_ttl() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_RESULT_TTL_SECS", 120)
        .start()
        .await;
    let answer = daemon.submit_wait(&python("print('ttl')")).await;
    assert_eq!(answer.body["status"], "succeeded", "{answer:#?}");
    let id = answer.id();
    let ttl: i64 = redis.cli(&["TTL", &format!("job:{id}")]).parse().unwrap();
    assert!(ttl > 0 && ttl <= 120, "TTL job:{id} = {ttl}");
    // No key of the job lives forever: its own within the result TTL, its
    // run-history summary within the history window (7 days by default).
    for key in redis.cli(&["KEYS", &format!("job:{id}*")]).lines() {
        let ttl: i64 = redis.cli(&["TTL", key]).parse().unwrap();
        let most = if key.ends_with(":summary") {
            7 * 86_400
        } else {
            120
        };
        assert!(ttl > 0 && ttl <= most, "TTL {key} = {ttl}");
    }
    // A cancelled job too (whether it was still queued or already running).
    let cancelled = daemon.submit(&sleeper(30.0)).await.id();
    assert!(daemon.cancel(&cancelled).await.status.is_success());
    daemon
        .wait_status(&cancelled, &["cancelled"], Duration::from_secs(15))
        .await;
    let ttl: i64 = redis
        .cli(&["TTL", &format!("job:{cancelled}")])
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= 120, "TTL job:{cancelled} = {ttl}");
    // Every key of every job of this Redis expires.
    for key in redis.cli(&["KEYS", "job:*"]).lines() {
        let ttl: i64 = redis.cli(&["TTL", key]).parse().unwrap();
        let most = if key.ends_with(":summary") {
            7 * 86_400
        } else {
            120
        };
        assert!(ttl > 0 && ttl <= most, "TTL {key} = {ttl}");
    }
    daemon.assert_no_containers(&docker().await).await;
}

#[tokio::test]
async fn metrics_pass_promtool_and_carry_the_contract_names() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .start()
        .await;
    let answer = daemon.submit_wait(&python("print('m')")).await;
    assert_eq!(answer.body["status"], "succeeded", "{answer:#?}");
    let refused = daemon.submit_as(Some("bad"), &python(""), false).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let text = daemon
        .wait_metric("code_runner_slots_used", 0.0, Duration::from_secs(10))
        .await;

    for (name, value) in [
        ("code_runner_slots_max", 2.0),
        ("code_runner_slots_used", 0.0),
        ("code_runner_queue_depth", 0.0),
        (
            "code_runner_jobs_total{language=\"python\",status=\"succeeded\"}",
            1.0,
        ),
        (
            "code_runner_queue_wait_seconds_count{language=\"python\"}",
            1.0,
        ),
        ("code_runner_run_seconds_count{language=\"python\"}", 1.0),
    ] {
        assert_eq!(metric(&text, name), Some(value), "{name} in\n{text}");
    }
    daemon::assert_promtool_passes(&text);

    let ops = daemon.get("/readyz", None).await;
    assert_eq!(ops.status, StatusCode::OK, "{ops:#?}");
    let languages = daemon.get("/v1/languages", Some(KEY_A)).await;
    assert_eq!(languages.status, StatusCode::OK, "{languages:#?}");
    let text = languages.body.to_string();
    for id in ["python", "javascript", "c", "cpp", "bash", "ruby", "go"] {
        assert!(text.contains(&format!("\"{id}\"")), "{id} in {text}");
    }
}
