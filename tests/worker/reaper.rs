//! The orphan reaper against a real redis-server (one per test) and a
//! scripted host: a worker killed mid-job, reapers racing over the same
//! dead worker, the `reaper` role of its own, and the settings it refuses.
//! Which sandboxes it removes or keeps, and the jobs it settles on live
//! workers, are in `reaper_sandboxes`.
//!
//! Each test's host is its own: no other test's reaper sees its sandboxes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use code_runner::job::JobSpec;
use code_runner::job::limits::{LimitPolicy, LimitsRequest};
use code_runner::languages::LanguageCatalog;
use code_runner::metrics::Metrics;
use code_runner::reaper::{Reaper, ReaperConfig, ReaperHandles};
use code_runner::store::{Admission, NewJob, ReapOutcome, Store, SubmitOutcome, now_ms};
use redis::AsyncCommands;
use serde_json::Value;

use crate::common::client::{assert_promtool_passes, http_client, metric};
use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;
use crate::common::scripted::{self, ScriptedHost};
use crate::common::wait_for;
use crate::world::assert_no_sandboxes;

const POLL: Duration = Duration::from_millis(50);

/// A queue on `redis` with the daemon's key names (no prefix).
pub fn store(redis: &RedisServer) -> Store {
    Store::new(&redis.url(), "", Duration::from_secs(3600), 8).expect("queue settings are valid")
}

/// Enqueues a job (API key `a`) as the API would; its id.
pub async fn submit(store: &Store, spec: &JobSpec) -> String {
    let id = uuid::Uuid::new_v4().to_string();
    let outcome = store
        .jobs()
        .submit(NewJob {
            id: &id,
            spec,
            api_key: "a",
            user: "",
            language: &spec.language,
            idempotency: None,
            admission: Admission {
                max_queue_depth: 10_000,
                ..crate::common::admission()
            },
        })
        .await
        .expect("redis answers");
    assert_eq!(outcome, SubmitOutcome::Accepted);
    id
}

/// Makes `worker` a dead member of the fleet: known in `workers`, with no
/// live heartbeat (as after `kill -9` once the heartbeat expired).
pub async fn mark_dead(redis: &RedisServer, store: &Store, worker: &str) {
    store
        .workers()
        .heartbeat(worker, "{}", Duration::from_secs(1))
        .await
        .unwrap();
    let mut conn = redis.conn().await;
    let _: () = conn.del(store.keys().heartbeat(worker)).await.unwrap();
}

/// Claims the job `id` for `worker` through the store's own claim (it must
/// be the next in turn), as the worker's claim loop would.
pub async fn claim_for(store: &Store, worker: &str, id: &str) {
    let mut conn = store.dedicated().await.expect("a connection");
    let claimed = store
        .jobs()
        .claim(&mut conn, worker)
        .await
        .expect("redis answers");
    assert_eq!(
        claimed.as_deref(),
        Some(id),
        "job {id} was not the next in turn"
    );
}

/// Marks a claimed job running on `worker`, as START would (its deadline:
/// the engine's slack of 33 s and the default 10 s wall budget).
async fn mark_running(redis: &RedisServer, store: &Store, worker: &str, id: &str) {
    let mut conn = redis.conn().await;
    let now = now_ms();
    let _: () = conn
        .hset_multiple(
            store.keys().job(id),
            &[
                ("status", "running".to_string()),
                ("worker", worker.to_string()),
                ("started_ms", now.to_string()),
                ("deadline_ms", (now + 43_000).to_string()),
                ("attempts", "1".to_string()),
            ],
        )
        .await
        .unwrap();
}

/// A reaper of its own (its own metrics) with an engine of `host`, the
/// embedded catalog and the default limits.
pub fn reaper(store: Store, host: &Arc<ScriptedHost>, config: ReaperConfig) -> (Reaper, Metrics) {
    let metrics = Metrics::new().expect("metrics");
    let handles = ReaperHandles {
        store,
        engine: Arc::new(host.engine(&format!("reaper-{}", uuid::Uuid::new_v4()))),
        catalog: LanguageCatalog::embedded().expect("the embedded catalog"),
        metrics: metrics.clone(),
        longest_wall: LimitPolicy::default().longest_wall(),
    };
    (Reaper::new(config, handles), metrics)
}

pub fn config(grace: Duration) -> ReaperConfig {
    ReaperConfig {
        interval: Duration::from_millis(500),
        grace,
        max_requeues: 3,
        // These tests start their Redis and judge at once.
        heartbeat_ttl: Duration::ZERO,
        own_worker: None,
    }
}

// ---------------------------------------------------------------------------
// kill -9
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_worker_killed_mid_job_is_reaped_by_another_worker() {
    let redis = RedisServer::start();
    let store = store(&redis);
    let host = ScriptedHost::new();
    let heartbeat = |builder: InProcessBuilder| {
        builder
            .host(&host)
            .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 500)
            .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 1500)
    };
    // One slot: once the sleeper runs, the doomed worker claims nothing more.
    let mut doomed = heartbeat(InProcessBuilder::new(Role::Worker, &redis))
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 1)
        .start()
        .await;
    // Still running, whenever within the bound below the reaper removes it.
    let sleeper = crate::common::job_with_limits(
        "bash",
        "main.sh",
        "sleep 120000",
        LimitsRequest {
            wall_ms: Some(180_000),
            ..Default::default()
        },
    );
    let running = submit(&store, &sleeper).await;
    wait_for(
        "the sleeper to run in a sandbox",
        Duration::from_secs(60),
        || async {
            let started = redis.job_field(&running, "status") == "running";
            let sandboxes = host.sandboxes_of(&doomed.worker_id);
            (started && sandboxes.len() == 1).then_some(())
        },
    )
    .await;
    assert_eq!(redis.job_field(&running, "worker"), doomed.worker_id);

    // A job the doomed worker claimed but never started.
    let claimed = submit(&store, &scripted::job("print second life")).await;
    claim_for(&store, &doomed.worker_id, &claimed).await;

    let survivor = heartbeat(InProcessBuilder::new(Role::Worker, &redis))
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", 500)
        .env("CODE_RUNNER_REAPER_GRACE_MS", 1000)
        .start()
        .await;

    // As SIGKILL: no drain, its sandbox stays.
    doomed.crash();
    let killed = Instant::now();

    // Heartbeat TTL (1.5 s) + reaper interval (0.5 s) + slack for removing
    // the sandbox and settling its job on a loaded machine.
    let within = Duration::from_secs(30);
    wait_for("the sleeper's sandbox to go", within, || async {
        host.sandboxes_of(&doomed.worker_id)
            .is_empty()
            .then_some(())
    })
    .await;
    wait_for("the sleeper to be settled", within, || async {
        (redis.job_field(&running, "status") == "error").then_some(())
    })
    .await;
    assert!(killed.elapsed() <= within, "{:?}", killed.elapsed());

    let result = redis.stored_result(&running);
    assert_eq!(result["status"], "error", "{result:#}");
    assert_eq!(result["reason"], "worker_lost", "{result:#}");
    assert_eq!(result["language"], "bash", "{result:#}");
    let error = result["error"].as_str().unwrap();
    assert!(error.contains(&doomed.worker_id), "{error}");
    assert!(
        !redis.job_field(&running, "finished_ms").is_empty(),
        "no finished_ms"
    );
    // Followers of the job see it end: its stream's last event is the exit.
    let last = redis.cli(&[
        "XREVRANGE",
        &format!("job:{running}:events"),
        "+",
        "-",
        "COUNT",
        "1",
    ]);
    let event: Value = serde_json::from_str(last.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("last event of {running} ({e}): {last:?}"));
    assert_eq!(event["type"], "exit", "{event:#}");
    assert_eq!(event["status"], "error", "{event:#}");
    assert_eq!(event["result"]["reason"], "worker_lost", "{event:#}");
    let ttl: i64 = redis
        .cli(&["TTL", &format!("job:{running}")])
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= 3600, "ttl {ttl}");

    // The claimed job runs once, on the survivor, as its first attempt.
    let deadline = Instant::now() + Duration::from_secs(60);
    while redis.job_field(&claimed, "status") != "succeeded" {
        assert!(
            Instant::now() < deadline,
            "the requeued job did not succeed: {}",
            redis.cli(&["HGETALL", &format!("job:{claimed}")])
        );
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(redis.job_field(&claimed, "attempts"), "1");
    assert_eq!(redis.job_field(&claimed, "requeues"), "1");
    assert_eq!(redis.job_field(&claimed, "worker"), survivor.worker_id);
    let result = redis.stored_result(&claimed);
    assert_eq!(result["run"]["stdout"], "second life\n", "{result:#}");
    assert!(result.get("reason").is_none(), "{result:#}");

    // The dead worker is forgotten; nothing of it is left.
    let forgotten = &doomed.worker_id;
    wait_for("the dead worker to be forgotten", within, || async {
        (redis.cli(&["SISMEMBER", "workers", forgotten]) == "0").then_some(())
    })
    .await;
    assert_eq!(
        redis.cli(&["EXISTS", &format!("worker:{forgotten}:processing")]),
        "0"
    );
    assert_eq!(redis.cli(&["SCARD", "apikey:a:active"]), "0");
    assert_eq!(redis.queue_depth(), 0);

    let text = survivor
        .wait_metric(
            "code_runner_reaper_orphans_total{kind=\"requeued\"}",
            1.0,
            Duration::from_secs(5),
        )
        .await;
    for (kind, count) in [("container", 1.0), ("worker_lost", 1.0), ("dead", 0.0)] {
        let name = format!("code_runner_reaper_orphans_total{{kind=\"{kind}\"}}");
        assert_eq!(metric(&text, &name).unwrap_or(0.0), count, "{name}\n{text}");
    }
    assert_no_sandboxes(&survivor).await;
    assert_no_sandboxes(&doomed).await;
}

// ---------------------------------------------------------------------------
// reapers racing
// ---------------------------------------------------------------------------

#[tokio::test]
async fn two_reapers_racing_over_one_dead_worker_settle_each_job_once() {
    let redis = RedisServer::start();
    let setup = store(&redis);
    let host = ScriptedHost::new();
    let dead = format!("dead-{}", uuid::Uuid::new_v4());
    mark_dead(&redis, &setup, &dead).await;
    let mut conn = redis.conn().await;

    // 20 running, 20 claimed, 10 claimed with no requeue left.
    let spec = scripted::job("print 1");
    let mut expected = BTreeMap::new();
    for n in 0..50 {
        let id = submit(&setup, &spec).await;
        claim_for(&setup, &dead, &id).await;
        let kind = match n % 5 {
            0 | 1 => {
                mark_running(&redis, &setup, &dead, &id).await;
                "worker_lost"
            }
            2 | 3 => "requeued",
            _ => {
                let _: () = conn
                    .hset(setup.keys().job(&id), "requeues", 3)
                    .await
                    .unwrap();
                "dead"
            }
        };
        expected.insert(id, kind);
    }

    // Two reapers of their own (own pools), one pass each, at once.
    let (first, first_metrics) = reaper(store(&redis), &host, config(Duration::from_secs(30)));
    let (second, second_metrics) = reaper(store(&redis), &host, config(Duration::from_secs(30)));
    let (a, b) = tokio::join!(first.pass(), second.pass());

    let mut settled: BTreeMap<String, &str> = BTreeMap::new();
    for (worker, id, outcome) in a.jobs.iter().chain(&b.jobs) {
        assert_eq!(worker, &dead);
        let kind = match outcome {
            ReapOutcome::Requeued { requeues: 1 } => "requeued",
            ReapOutcome::Dead { requeues: 3 } => "dead",
            ReapOutcome::WorkerLost => "worker_lost",
            other => panic!("unexpected outcome for {id}: {other:?}"),
        };
        assert!(
            settled.insert(id.clone(), kind).is_none(),
            "{id} settled twice"
        );
    }
    assert_eq!(a.jobs.len() + b.jobs.len(), 50);
    assert_eq!(settled.len(), 50);
    assert_eq!(
        settled,
        expected
            .iter()
            .map(|(id, kind)| (id.clone(), *kind))
            .collect()
    );

    // The queue holds each requeued id once; jobs:dead each dead one once.
    let queued: Vec<String> = setup.jobs().queued_ids().await.unwrap();
    let turns: u64 = conn.llen(setup.keys().queue()).await.unwrap();
    assert_eq!(turns, 20, "one turn per requeued job");
    let requeued: BTreeSet<&String> = expected
        .iter()
        .filter(|(_, k)| **k == "requeued")
        .map(|(id, _)| id)
        .collect();
    assert_eq!(queued.len(), 20);
    assert_eq!(queued.iter().collect::<BTreeSet<_>>(), requeued);
    let dead_letters: Vec<String> = conn.lrange(setup.keys().dead(), 0, -1).await.unwrap();
    assert_eq!(dead_letters.len(), 10);
    for id in &dead_letters {
        assert_eq!(expected[id], "dead");
    }

    // Job states.
    for (id, kind) in &expected {
        let record = setup.jobs().get(id).await.unwrap().expect("the job exists");
        match *kind {
            "requeued" => {
                assert_eq!(record.status.as_str(), "queued");
                assert!(record.result.is_none());
            }
            _ => {
                assert_eq!(record.status.as_str(), "error");
                let result = record.result.expect("a result");
                assert_eq!(
                    result.reason.map(|r| r.as_str()),
                    Some("worker_lost"),
                    "{result:?}"
                );
                assert!(result.error.unwrap().contains(&dead));
                assert!(record.finished_ms.is_some());
                let ttl: i64 = conn.ttl(setup.keys().job(id)).await.unwrap();
                assert!(ttl > 0, "job {id} has no ttl");
            }
        }
    }
    let active: u64 = conn.scard(setup.keys().active("a")).await.unwrap();
    assert_eq!(active, 20, "only the requeued jobs are still active");

    // The worker is forgotten by exactly one of them.
    assert_eq!(a.forgotten.len() + b.forgotten.len(), 1);
    let member: bool = conn.sismember(setup.keys().workers(), &dead).await.unwrap();
    assert!(!member);
    let processing: u64 = conn.exists(setup.keys().processing(&dead)).await.unwrap();
    assert_eq!(processing, 0);

    // The metrics of both add up to the jobs.
    let count = |kind: &str| {
        let name = format!("code_runner_reaper_orphans_total{{kind=\"{kind}\"}}");
        metric(&first_metrics.render(), &name).unwrap_or(0.0)
            + metric(&second_metrics.render(), &name).unwrap_or(0.0)
    };
    assert_eq!(count("worker_lost"), 20.0);
    assert_eq!(count("requeued"), 20.0);
    assert_eq!(count("dead"), 10.0);

    // A second pass finds nothing left to do.
    let again = first.pass().await;
    assert!(again.jobs.is_empty() && again.forgotten.is_empty());
    assert!(host.sandboxes().is_empty(), "{:#?}", host.sandboxes());
}

// ---------------------------------------------------------------------------
// `code-runner reaper`
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_reaper_command_settles_a_dead_workers_job_and_serves_metrics() {
    let redis = RedisServer::start();
    let store = store(&redis);
    let dead = format!("dead-{}", uuid::Uuid::new_v4());
    mark_dead(&redis, &store, &dead).await;
    let id = submit(&store, &scripted::job("print 1")).await;
    claim_for(&store, &dead, &id).await;
    mark_running(&redis, &store, &dead, &id).await;

    // The `reaper` role, in this process: its listener serves its metrics.
    let reaper = InProcessBuilder::new(Role::Reaper, &redis)
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", "200")
        .start()
        .await;

    wait_for("the job to be settled", Duration::from_secs(30), || async {
        (redis.job_field(&id, "status") == "error").then_some(())
    })
    .await;
    assert_eq!(redis.stored_result(&id)["reason"], "worker_lost");

    let http = http_client();
    let text = wait_for(
        "/metrics to count the job",
        Duration::from_secs(10),
        || async {
            let text = http
                .get(format!("{}/metrics", reaper.url))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            let name = "code_runner_reaper_orphans_total{kind=\"worker_lost\"}";
            (metric(&text, name) == Some(1.0)).then_some(text)
        },
    )
    .await;
    assert_promtool_passes(&text);
    let health = http
        .get(format!("{}/healthz", reaper.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), reqwest::StatusCode::OK);
}

/// The binary itself (no Redis, no Docker needed): its settings are
/// checked before it connects to anything.
#[test]
fn invalid_reaper_settings_exit_64_naming_the_setting() {
    let output =
        crate::common::daemon::run_to_end(&["reaper"], &[("CODE_RUNNER_REAPER_INTERVAL_MS", "0")]);
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("CODE_RUNNER_REAPER_INTERVAL_MS"),
        "{stderr}"
    );
}
