//! An outage is not a death (issue 11, item 1): a Redis outage longer than
//! the heartbeat TTL, with a job that finishes inside it, loses nothing;
//! and a worker cut off from Redis that a reaper elsewhere gave up on still
//! gets its real result recorded when it comes back.
//!
//! Real redis-server (one per test), real dockerd, the real binary. Every
//! process, container and proxy is removed by its guard, also when a test
//! fails.

mod common;

use std::time::{Duration, Instant};

use code_runner::job::events::JobEvent;
use code_runner::metrics::Metrics;
use code_runner::reaper::{Reaper, ReaperConfig};
use code_runner::store::Store;
use common::daemon::{DaemonBuilder, Role, metric, python};
use common::proxy::RedisProxy;
use common::redis_server::RedisServer;
use common::{Harness, init_tracing, wait_for};
use serde_json::{Value, json};

/// Every event of a job, from its stream, parsed.
async fn events(store: &Store, id: &str) -> Vec<(u64, JobEvent)> {
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let batch = store
            .events()
            .since(id, after, 1000)
            .await
            .expect("redis answers");
        let Some(last) = batch.last() else {
            return all;
        };
        after = last.seq;
        for event in batch {
            let parsed = event
                .event()
                .unwrap_or_else(|e| panic!("{}: {e}", event.json));
            all.push((event.seq, parsed));
        }
    }
}

fn streamed_stdout(events: &[(u64, JobEvent)]) -> String {
    events
        .iter()
        .filter_map(|(_, e)| match e {
            JobEvent::Stdout { .. } => e.output_bytes(),
            _ => None,
        })
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect()
}

/// A job printing `line <n>` once a second, `lines` times.
fn ticker(lines: u32) -> Value {
    let mut job = python(&format!(
        "import time\nfor n in range({lines}):\n    print(f'line {{n}}', flush=True)\n    time.sleep(1)\n"
    ));
    job["limits"] = json!({"wall_ms": 60000});
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_that_finishes_during_a_25_s_redis_outage_keeps_its_result() {
    init_tracing();
    let mut redis = RedisServer::start();
    // The default heartbeat TTL (15 s) is shorter than the outage; the
    // reaper passes every 200 ms, so a pass comes right after Redis is back,
    // long before the worker's next retry of its result (up to 5 s later).
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", 200)
        .start()
        .await;
    let lines = 12;
    let id = daemon.submit(&ticker(lines)).await.id();
    daemon
        .wait_status(&id, &["running"], Duration::from_secs(60))
        .await;
    // A second process of the fleet, whose reaper (also every 200 ms) sees
    // the first worker's heartbeat expired once Redis is back.
    let watcher = DaemonBuilder::new(Role::Worker, &redis)
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", 200)
        .start()
        .await;
    let store = Store::new(&redis.url(), "", Duration::from_secs(3600), 2).unwrap();
    wait_for("the first lines", Duration::from_secs(30), || async {
        streamed_stdout(&events(&store, &id).await)
            .contains("line 2")
            .then_some(())
    })
    .await;

    // Redis goes away for 25 s, its data kept; the job ends inside that.
    redis.stop();
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_secs(25)).await;
    redis.restart();
    println!("outage of {:.1} s", stopped.elapsed().as_secs_f64());

    let view = daemon.wait_terminal(&id, Duration::from_secs(60)).await;
    let expected: String = (0..lines).map(|n| format!("line {n}\n")).collect();
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(view["result"]["run"]["stdout"], expected, "{view:#}");
    assert_eq!(view["attempts"], 1, "{view:#}");
    // The stream has every line too (held by the worker through the
    // outage), and exactly one exit, the real one.
    let events = events(&store, &id).await;
    assert_eq!(streamed_stdout(&events), expected);
    let exits: Vec<&JobEvent> = events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| matches!(e, JobEvent::Exit { .. }))
        .collect();
    assert_eq!(exits.len(), 1, "{exits:#?}");
    // Neither process's reaper judged the worker lost: with the single
    // attempt, the real result and the single exit above, this is what
    // proves an outage is not a death. (Whether the watcher logs that it
    // waited depends on which process reconnects first after the restart:
    // if the daemon rewrites its heartbeat first, the watcher has nothing to
    // wait for, so that log line is not asserted.)
    for process in [&daemon, &watcher] {
        let text = process.metrics().await;
        assert_eq!(
            metric(
                &text,
                "code_runner_reaper_orphans_total{kind=\"worker_lost\"}"
            )
            .unwrap_or(0.0),
            0.0,
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_real_result_replaces_the_worker_lost_verdict() {
    let redis = RedisServer::start();
    let proxy = RedisProxy::start(redis.port);
    let harness = Harness::new().await;
    // The worker reaches Redis only through the proxy.
    let worker = DaemonBuilder::with_redis_url(Role::Worker, &proxy.url())
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 1000)
        .start()
        .await;
    let store = Store::new(&redis.url(), "", Duration::from_secs(3600), 4).unwrap();
    let api = DaemonBuilder::new(Role::Api, &redis).start().await;
    let id = api
        .submit(&python(
            "import time\nprint('started', flush=True)\ntime.sleep(4)\nprint('real result')\n",
        ))
        .await
        .id();
    api.wait_status(&id, &["running"], Duration::from_secs(60))
        .await;

    // Cut off: its heartbeat expires, and a reaper that reaches Redis
    // directly gives its job up. Its grace keeps the container: the worker
    // is alive and its program goes on.
    proxy.cut();
    let reaper = Reaper::new(
        ReaperConfig {
            interval: Duration::from_millis(200),
            grace: Duration::from_secs(600),
            max_requeues: 3,
            heartbeat_ttl: Duration::from_millis(1000),
            own_worker: None,
        },
        harness.reaper_handles(store.clone(), Metrics::new().unwrap()),
    );
    let verdict = wait_for(
        "the worker_lost verdict",
        Duration::from_secs(20),
        || async {
            reaper.pass().await;
            let view = api.job(&id).await;
            (view["status"] == "error").then_some(view)
        },
    )
    .await;
    assert_eq!(verdict["result"]["reason"], "worker_lost", "{verdict:#}");
    let verdict_seq = events(&store, &id)
        .await
        .iter()
        .find(|(_, e)| matches!(e, JobEvent::Exit { .. }))
        .map(|(seq, _)| *seq)
        .expect("an exit event");

    // The program ends while the worker is still cut off; then it is back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.restore();
    let view = wait_for("the real result", Duration::from_secs(30), || async {
        let view = api.job(&id).await;
        (view["status"] == "succeeded").then_some(view)
    })
    .await;
    assert_eq!(
        view["result"]["run"]["stdout"], "started\nreal result\n",
        "{view:#}"
    );
    assert!(view["result"].get("reason").is_none(), "{view:#}");
    let events = events(&store, &id).await;
    let exits: Vec<(u64, &JobEvent)> = events
        .iter()
        .filter(|(_, e)| matches!(e, JobEvent::Exit { .. }))
        .map(|(seq, e)| (*seq, e))
        .collect();
    assert_eq!(exits.len(), 2, "{exits:#?}");
    match exits[1].1 {
        JobEvent::Exit {
            status,
            replaces,
            result,
        } => {
            assert_eq!(status.as_str(), "succeeded");
            assert_eq!(*replaces, Some(verdict_seq));
            assert_eq!(result.status.as_str(), "succeeded");
        }
        other => panic!("{other:?}"),
    }
    // The worker logs it once the result is written, which the API may
    // already have shown.
    let log = common::until(
        Duration::from_secs(10),
        || async { worker.log() },
        |log| log.contains("it replaced the verdict"),
    )
    .await;
    assert!(log.contains("it replaced the verdict"), "{log}");
    drop(worker);
    harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_started_before_its_redis_waits_for_it() {
    // Nothing listens on the port yet: connections are refused.
    let port = common::redis_server::free_port();
    let mut api =
        DaemonBuilder::with_redis_url(Role::Api, &format!("redis://127.0.0.1:{port}")).spawn();
    let log = api.log_path();
    wait_for(
        "the API's log line saying it waits for Redis",
        Duration::from_secs(30),
        || {
            let log = log.clone();
            async move {
                std::fs::read_to_string(&log)
                    .ok()?
                    .contains("Redis does not answer; the API waits for it")
                    .then_some(())
            }
        },
    )
    .await;
    // It keeps waiting: a few retries later it is still there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        api.running(),
        "the API exited while Redis was not up; log:\n{}",
        api.log()
    );
    let _redis = RedisServer::start_on(port);
    api.wait_healthy().await;
    let answer = api.submit(&python("print(1)")).await;
    assert_eq!(answer.status, reqwest::StatusCode::ACCEPTED, "{answer:#?}");
    assert!(answer.body["tokens"]["read"].is_string(), "{answer:#?}");
}
