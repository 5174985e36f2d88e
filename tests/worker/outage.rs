//! An outage is not a death: a Redis outage while a job runs delays its
//! result but loses nothing (the sandbox stays until the result is
//! durable); an outage longer than the heartbeat TTL, with a job that
//! finishes inside it, loses nothing either; a worker cut off from Redis
//! that a reaper elsewhere gave up on still gets its real result recorded
//! when it comes back; and an API started before its Redis waits for it.
//!
//! Real redis-server (one per test), the worker in the test or in-process
//! daemons on a scripted host. Every process and proxy is stopped by its
//! guard, also when a test fails.

use std::time::{Duration, Instant};

use code_runner::job::Status;
use code_runner::job::events::JobEvent;
use code_runner::store::Store;
use serde_json::{Value, json};

use crate::common::client::metric;
use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::logs;
use crate::common::proxy::RedisProxy;
use crate::common::redis_server::RedisServer;
use crate::common::scripted::{self, ScriptedHost};
use crate::common::wait_for;
use crate::reaper::{config, reaper};
use crate::world::{JOB_DEADLINE, World};

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
    let mut job = scripted::json(&format!(
        "repeat {lines}\n  print line {{i}}\n  sleep 1000\nend"
    ));
    job["limits"] = json!({"wall_ms": 60000});
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_outage_delays_the_result_but_loses_nothing() {
    let mut world = World::new().await;
    let id = world
        .submit(&scripted::job("sleep 3000\nprint survived"))
        .await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));
    world.wait_running(&id).await;

    // Redis goes away while the job runs, and stays away until the job's
    // program has ended (its sandbox exited): the worker then holds a
    // result it cannot write. The sandbox stays until the result is
    // durable: it is removed after, never before.
    world.redis.stop();
    wait_for("the job's program to end", JOB_DEADLINE, || async {
        (!world.running_sandboxes().contains(&id)).then_some(())
    })
    .await;
    assert!(
        world.sandboxes().contains(&id),
        "the sandbox was removed before the result was written"
    );
    world.redis.restart();

    world
        .assert_succeeded(&id, "survived\n", Duration::from_secs(30))
        .await;

    // The worker kept going: it claims and runs new jobs.
    let next = world.submit(&scripted::job("print next")).await;
    let record = world.wait_terminal(&next, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    wait_for(
        "the heartbeat to be back",
        Duration::from_secs(10),
        || async { world.heartbeat().await },
    )
    .await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_that_finishes_during_a_25_s_redis_outage_keeps_its_result() {
    let mut redis = RedisServer::start();
    let host = ScriptedHost::new();
    // The default heartbeat TTL (15 s) is shorter than the outage; the
    // reaper passes every 200 ms, so a pass comes right after Redis is back,
    // long before the worker's next retry of its result (up to 5 s later).
    let daemon = InProcessBuilder::new(Role::Serve, &redis)
        .host(&host)
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
    let watcher = InProcessBuilder::new(Role::Worker, &redis)
        .host(&host)
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
    let logs = logs::capture();
    let redis = RedisServer::start();
    let proxy = RedisProxy::start(redis.port);
    let host = ScriptedHost::new();
    // The worker reaches Redis only through the proxy.
    let worker = InProcessBuilder::with_redis_url(Role::Worker, &proxy.url())
        .host(&host)
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 1000)
        .start()
        .await;
    let store = Store::new(&redis.url(), "", Duration::from_secs(3600), 4).unwrap();
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let id = api
        .submit(&scripted::json(
            "print started\nsleep 4000\nprint real result",
        ))
        .await
        .id();
    api.wait_status(&id, &["running"], Duration::from_secs(60))
        .await;

    // Cut off: its heartbeat expires, and a reaper that reaches Redis
    // directly gives its job up. Its grace keeps the container: the worker
    // is alive and its program goes on.
    proxy.cut();
    let (reaper, _metrics) = reaper(
        store.clone(),
        &host,
        code_runner::reaper::ReaperConfig {
            interval: Duration::from_millis(200),
            heartbeat_ttl: Duration::from_millis(1000),
            ..config(Duration::from_secs(600))
        },
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
    logs.wait_for_line(&["it replaced the verdict", &id], Duration::from_secs(10))
        .await;
    // Its sandbox is removed once the result is written.
    crate::world::assert_no_sandboxes(&worker).await;
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_started_before_its_redis_waits_for_it() {
    let logs = logs::capture();
    // Nothing listens on the port yet: connections are refused.
    let port = crate::common::redis_server::free_port();
    // The start waits for /healthz (up to 30 s) beside the test.
    let starting = tokio::spawn(
        InProcessBuilder::with_redis_url(Role::Api, &format!("redis://127.0.0.1:{port}")).start(),
    );
    logs.wait_for_line(
        &["Redis does not answer; the API waits for it"],
        Duration::from_secs(20),
    )
    .await;
    // It keeps waiting: a few retries later it is still there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !starting.is_finished(),
        "the API exited (or answered) while Redis was not up; log:\n{}",
        logs.text()
    );
    let _redis = RedisServer::start_on(port);
    let api = starting.await.expect("the API started once Redis was up");
    let answer = api.submit(&scripted::json("print 1")).await;
    assert_eq!(answer.status, reqwest::StatusCode::ACCEPTED, "{answer:#?}");
    assert!(answer.body["tokens"]["read"].is_string(), "{answer:#?}");
}
