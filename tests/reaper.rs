//! The orphan reaper against a real redis-server (one per test) and the real
//! dockerd: a worker killed with SIGKILL mid-job, reapers racing over the
//! same dead worker, and which containers the reaper removes or keeps.
//!
//! Every test cleans up what it created: daemons remove their containers
//! when dropped, and the hand-made containers carry a label only their test
//! uses, removed by a guard (also when the test fails).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::CreateContainerOptions;
use code_runner::job::JobSpec;
use code_runner::job::limits::LimitsRequest;
use code_runner::metrics::Metrics;
use code_runner::reaper::{ContainerVerdict, Reaper, ReaperConfig};
use code_runner::sandbox::{LABEL_CREATED, LABEL_DEADLINE, LABEL_JOB, LABEL_WORKER};
use code_runner::store::{
    Admission, NewJob, Quotas, ReapOutcome, Skipped, StartOutcome, Started, Store, SubmitOutcome,
    now_ms,
};
use common::containers::{containers_labelled, docker, remove_labelled};
use common::daemon::{ChildGuard, DaemonBuilder, Role, metric};
use common::redis_server::{RedisServer, free_port};
use common::{Harness, code_runner, job, job_with_limits, wait_for};
use redis::AsyncCommands;
use serde_json::Value;

const POLL: Duration = Duration::from_millis(50);

/// The tests of this file run one at a time: a reaper removes any sandbox
/// container past its deadline on the Docker host, so one test's reaper
/// would take the hand-made containers of another.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A queue on `redis` with the daemon's key names (no prefix).
fn store(redis: &RedisServer) -> Store {
    Store::new(&redis.url(), "", Duration::from_secs(3600), 8).expect("queue settings are valid")
}

/// Enqueues a job (API key `a`) as the API would; its id.
async fn submit(store: &Store, spec: &JobSpec) -> String {
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
                key_limit: None,
                max_attempts: 1,
                output_limit_bytes: 0,
                storage_budget: 1 << 40,
                // The default wall limit, as the API resolves it.
                wall_budget_ms: 10_000,
                weight: 1,
                user_limit: None,
                user_rate_per_minute: None,
                quotas: Quotas::default(),
            },
        })
        .await
        .expect("redis answers");
    assert_eq!(outcome, SubmitOutcome::Accepted);
    id
}

/// Makes `worker` a dead member of the fleet: known in `workers`, with no
/// live heartbeat (as after `kill -9` once the heartbeat expired).
async fn mark_dead(redis: &RedisServer, store: &Store, worker: &str) {
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
async fn claim_for(_redis: &RedisServer, store: &Store, worker: &str, id: &str) {
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

/// What start adds to a job's wall budget for these tests' engine: its
/// start timeout (30 s) and grace (3 s).
const SLACK: Duration = Duration::from_secs(33);

/// Marks a claimed job running on `worker`, as START would (its deadline:
/// the slack and the default 10 s wall budget).
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

fn reaper(store: Store, harness: &Harness, config: ReaperConfig) -> (Reaper, Metrics) {
    let metrics = Metrics::new().expect("metrics");
    let reaper = Reaper::new(config, harness.reaper_handles(store, metrics.clone()));
    (reaper, metrics)
}

fn config(grace: Duration) -> ReaperConfig {
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
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let docker = docker().await;
    let heartbeat = |builder: DaemonBuilder| {
        builder
            .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 500)
            .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 1500)
    };
    // One slot: once the sleeper runs, the doomed worker claims nothing more.
    let mut doomed = heartbeat(DaemonBuilder::new(Role::Worker, &redis))
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 1)
        .start()
        .await;
    // Still running, whenever within the bound below the reaper removes it.
    let sleeper = job_with_limits(
        "bash",
        "main.sh",
        "sleep 120\n",
        LimitsRequest {
            wall_ms: Some(180_000),
            ..Default::default()
        },
    );
    let running = submit(&store, &sleeper).await;
    wait_for(
        "the sleeper to run in a container",
        Duration::from_secs(60),
        || async {
            let started = redis.job_field(&running, "status") == "running";
            let containers = doomed.containers(&docker).await;
            (started && containers.len() == 1).then_some(())
        },
    )
    .await;
    assert_eq!(redis.job_field(&running, "worker"), doomed.worker_id);

    // A job the doomed worker claimed but never started.
    let claimed = submit(&store, &job("python", "main.py", "print('second life')\n")).await;
    claim_for(&redis, &store, &doomed.worker_id, &claimed).await;

    let survivor = heartbeat(DaemonBuilder::new(Role::Worker, &redis))
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", 500)
        .env("CODE_RUNNER_REAPER_GRACE_MS", 1000)
        .start()
        .await;

    let pid = nix::unistd::Pid::from_raw(i32::try_from(doomed.pid()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    doomed.wait_exit(Duration::from_secs(10)).await;

    // Heartbeat TTL (1.5 s) + reaper interval (0.5 s) + slack for removing a
    // running container and settling its job on a loaded machine.
    let within = Duration::from_secs(30);
    wait_for("the sleeper's container to go", within, || async {
        doomed.containers(&docker).await.is_empty().then_some(())
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
    survivor.assert_no_containers(&docker).await;
    doomed.assert_no_containers(&docker).await;
}

// ---------------------------------------------------------------------------
// reapers racing
// ---------------------------------------------------------------------------

#[tokio::test]
async fn two_reapers_racing_over_one_dead_worker_settle_each_job_once() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let setup = store(&redis);
    let harness = Harness::new().await;
    let dead = format!("dead-{}", uuid::Uuid::new_v4());
    mark_dead(&redis, &setup, &dead).await;
    let mut conn = redis.conn().await;

    // 20 running, 20 claimed, 10 claimed with no requeue left.
    let spec = job("python", "main.py", "print(1)\n");
    let mut expected = BTreeMap::new();
    for n in 0..50 {
        let id = submit(&setup, &spec).await;
        claim_for(&redis, &setup, &dead, &id).await;
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
    let (first, first_metrics) = reaper(store(&redis), &harness, config(Duration::from_secs(30)));
    let (second, second_metrics) = reaper(store(&redis), &harness, config(Duration::from_secs(30)));
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
    harness.assert_clean().await;
}

// ---------------------------------------------------------------------------
// containers
// ---------------------------------------------------------------------------

/// Removes the containers a test made by hand (label `code-runner.test`),
/// also when the test fails.
struct HandMade {
    label: String,
}

impl Drop for HandMade {
    fn drop(&mut self) {
        remove_labelled(self.label.clone(), |_| true);
    }
}

/// Starts a `sleep 60` container carrying sandbox labels set by hand; its id.
async fn labelled_sleeper(
    docker: &bollard::Docker,
    test: &str,
    worker: &str,
    created_ms: u64,
    deadline_ms: u64,
) -> String {
    let labels = HashMap::from([
        ("code-runner.test".to_string(), test.to_string()),
        (LABEL_JOB.to_string(), uuid::Uuid::new_v4().to_string()),
        (LABEL_WORKER.to_string(), worker.to_string()),
        (LABEL_CREATED.to_string(), created_ms.to_string()),
        (LABEL_DEADLINE.to_string(), deadline_ms.to_string()),
    ]);
    let body = ContainerCreateBody {
        image: Some("code-runner/bash:latest".into()),
        entrypoint: Some(vec!["sleep".into(), "60".into()]),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let options = CreateContainerOptions {
        name: Some(format!("code-runner-test-{}", uuid::Uuid::new_v4())),
        ..Default::default()
    };
    let id = docker
        .create_container(Some(options), body)
        .await
        .expect("docker creates the container")
        .id;
    docker
        .start_container(&id, None)
        .await
        .expect("docker starts the container");
    id
}

#[tokio::test]
async fn the_reaper_removes_expired_and_dead_workers_containers_only() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let harness = Harness::new().await;
    let docker = docker().await;
    // Other tests' reapers share this Docker: one may remove a container
    // past its deadline before this pass lists it. That case is tried
    // afresh; any other wrong verdict fails at once.
    let mut raced = Vec::new();
    for _ in 0..3 {
        match reaper_verdicts_on_fresh_containers(&redis, &store, &harness, &docker).await {
            Ok(()) => return,
            Err(race) => raced.push(race),
        }
    }
    panic!("every attempt raced another reaper: {raced:?}");
}

/// One attempt of the test above, with containers of its own.
async fn reaper_verdicts_on_fresh_containers(
    redis: &RedisServer,
    store: &Store,
    harness: &Harness,
    docker: &bollard::Docker,
) -> Result<(), String> {
    let test = uuid::Uuid::new_v4().to_string();
    let label = format!("code-runner.test={test}");
    let _cleanup = HandMade {
        label: label.clone(),
    };

    let alive = format!("alive-{test}");
    let dead = format!("dead-{test}");
    let unknown = format!("unknown-{test}");
    store
        .workers()
        .heartbeat(&alive, "{}", Duration::from_secs(600))
        .await
        .unwrap();
    mark_dead(redis, store, &dead).await;

    let grace = Duration::from_secs(30);
    let now = now_ms();
    let hour_ago = now - 3_600_000;
    let later = now + 600_000;
    let past = now - 31_000; // deadline + grace is in the past
    let recent_past = now - 10_000; // past its deadline, but within the grace
    let cases = [
        ("alive, past its deadline", &alive, hour_ago, past, true),
        ("unknown, past its deadline", &unknown, hour_ago, past, true),
        ("dead, past its deadline", &dead, now, past, true),
        ("alive, within its deadline", &alive, hour_ago, later, false),
        (
            "unknown, within its deadline",
            &unknown,
            hour_ago,
            later,
            false,
        ),
        (
            "unknown, in the deadline grace",
            &unknown,
            hour_ago,
            recent_past,
            false,
        ),
        ("dead, old", &dead, now - 31_000, later, true),
        (
            "dead, fresh (in the grace)",
            &dead,
            now - 1_000,
            later,
            false,
        ),
    ];
    let mut ids = BTreeMap::new();
    for (what, worker, created, deadline, removed) in cases {
        let id = labelled_sleeper(docker, &test, worker, created, deadline).await;
        ids.insert(id, (what, removed));
    }

    let (reaper, _metrics) = reaper(store.clone(), harness, config(grace));
    let report = reaper.pass().await;
    let reported: BTreeMap<&String, ContainerVerdict> = report
        .containers
        .iter()
        .filter(|(c, _)| ids.contains_key(&c.id))
        .map(|(c, verdict)| (&c.id, *verdict))
        .collect();
    // Another test's reaper on this Docker may be removing an expired one
    // too: Docker then answers this pass's removal with 409 (in progress),
    // and the container is listed until that removal ends.
    let kept: BTreeSet<&String> = ids
        .iter()
        .filter(|(_, (_, removed))| !removed)
        .map(|(id, _)| id)
        .collect();
    let left: BTreeSet<String> = common::until(
        Duration::from_secs(10),
        || async {
            containers_labelled(docker, &label)
                .await
                .into_iter()
                .collect()
        },
        |left: &BTreeSet<String>| left.iter().collect::<BTreeSet<_>>() == kept,
    )
    .await;
    for (id, (what, removed)) in &ids {
        assert_eq!(left.contains(id), !removed, "{what}: left {}", !removed);
        let verdict = reported.get(id).copied();
        let expected = match (*removed, what.contains("deadline")) {
            (false, _) => None,
            (true, true) => Some(ContainerVerdict::PastDeadline),
            (true, false) => Some(ContainerVerdict::DeadWorker),
        };
        // Seen while another reaper was removing it: left to that one.
        if *removed && verdict == Some(ContainerVerdict::BeingRemoved) {
            continue;
        }
        // Gone before this pass listed it: another test's reaper (whose
        // Redis knows none of these workers) removed one past its deadline.
        if verdict.is_none() && expected == Some(ContainerVerdict::PastDeadline) {
            return Err(format!(
                "{what}: removed by another reaper before this pass"
            ));
        }
        assert_eq!(verdict, expected, "{what}");
    }
    assert_eq!(left.len(), 4);
    Ok(())
}

#[tokio::test]
async fn a_dead_worker_is_forgotten_only_once_its_containers_are_gone() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let harness = Harness::new().await;
    let docker = docker().await;
    let test = uuid::Uuid::new_v4().to_string();
    let _cleanup = HandMade {
        label: format!("code-runner.test={test}"),
    };
    // A worker that died right after it created a container: the container
    // is inside the grace period, so this pass keeps it, and must also keep
    // the worker in the fleet, or the next pass would take the container for
    // an unknown worker's and leave it until its deadline.
    let dead = format!("dead-{test}");
    mark_dead(&redis, &store, &dead).await;
    let mut conn = redis.conn().await;
    let now = now_ms();
    let id = labelled_sleeper(&docker, &test, &dead, now, now + 600_000).await;

    let (patient, _metrics) = reaper(store.clone(), &harness, config(Duration::from_secs(30)));
    let report = patient.pass().await;
    assert!(report.containers.iter().all(|(c, _)| c.id != id));
    assert!(report.forgotten.is_empty(), "{:?}", report.forgotten);
    let member: bool = conn.sismember(store.keys().workers(), &dead).await.unwrap();
    assert!(member, "the worker was forgotten while its container lived");

    // Once the grace has passed, the container goes, and then the worker.
    let (prompt, _metrics) = reaper(store.clone(), &harness, config(Duration::ZERO));
    let report = prompt.pass().await;
    let removed: Vec<_> = report
        .containers
        .iter()
        .filter(|(c, _)| c.id == id)
        .map(|(_, verdict)| *verdict)
        .collect();
    assert_eq!(removed, [ContainerVerdict::DeadWorker]);
    assert_eq!(report.forgotten, std::slice::from_ref(&dead));
    let member: bool = conn.sismember(store.keys().workers(), &dead).await.unwrap();
    assert!(!member);
}

#[tokio::test]
async fn a_worker_cannot_start_a_job_that_was_taken_back_from_it() {
    let redis = RedisServer::start();
    let store = store(&redis);
    let id = submit(&store, &job("python", "main.py", "print(1)")).await;
    // A worker that stalled past its heartbeat: the reaper requeued the job
    // it had claimed, so the id is no longer in its processing list.
    assert_eq!(
        store
            .jobs()
            .start(&id, "stalled", "test-host", true, SLACK)
            .await
            .unwrap(),
        StartOutcome::Skip(Skipped::NotClaimed)
    );
    assert_eq!(redis.job_field(&id, "status"), "queued");
    assert_eq!(redis.queue_depth(), 1);
    // The worker that claims it now starts it.
    claim_for(&redis, &store, "fresh", &id).await;
    assert!(matches!(
        store
            .jobs()
            .start(&id, "fresh", "test-host", true, SLACK)
            .await
            .unwrap(),
        StartOutcome::Start(Started { attempts: 1, .. })
    ));
    // A retried start by the same worker (its first reply lost) keeps it claimed.
    assert_eq!(
        store
            .jobs()
            .start(&id, "fresh", "test-host", true, SLACK)
            .await
            .unwrap(),
        StartOutcome::Skip(Skipped::RunningHere)
    );
    let mut conn = redis.conn().await;
    let claimed: Vec<String> = conn
        .lrange(store.keys().processing("fresh"), 0, -1)
        .await
        .unwrap();
    assert_eq!(claimed, std::slice::from_ref(&id));
}

// ---------------------------------------------------------------------------
// `code-runner reaper`
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_reaper_command_settles_a_dead_workers_job_and_serves_metrics() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let dead = format!("dead-{}", uuid::Uuid::new_v4());
    mark_dead(&redis, &store, &dead).await;
    let id = submit(&store, &job("python", "main.py", "print(1)\n")).await;
    claim_for(&redis, &store, &dead, &id).await;
    mark_running(&redis, &store, &dead, &id).await;

    let listen = format!("127.0.0.1:{}", free_port());
    let child = code_runner()
        .arg("reaper")
        .env("CODE_RUNNER_REDIS_URL", redis.url())
        .env("CODE_RUNNER_REAPER_LISTEN", &listen)
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", "200")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the code-runner binary starts");
    let _guard = ChildGuard(child);

    wait_for("the job to be settled", Duration::from_secs(30), || async {
        (redis.job_field(&id, "status") == "error").then_some(())
    })
    .await;
    assert_eq!(redis.stored_result(&id)["reason"], "worker_lost");

    let http = common::daemon::http_client();
    let text = wait_for(
        "/metrics to count the job",
        Duration::from_secs(10),
        || async {
            let text = http
                .get(format!("http://{listen}/metrics"))
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
    common::daemon::assert_promtool_passes(&text);
    let health = http
        .get(format!("http://{listen}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), reqwest::StatusCode::OK);
}

#[test]
fn invalid_reaper_settings_exit_64_naming_the_setting() {
    let output =
        common::daemon::run_to_end(&["reaper"], &[("CODE_RUNNER_REAPER_INTERVAL_MS", "0")]);
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("CODE_RUNNER_REAPER_INTERVAL_MS"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------
// stuck-state guard
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_job_past_its_deadline_on_a_live_worker_is_settled() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let harness = Harness::new().await;
    let alive = format!("alive-{}", uuid::Uuid::new_v4());
    store
        .workers()
        .heartbeat(&alive, "{}", Duration::from_secs(600))
        .await
        .unwrap();
    let mut conn = redis.conn().await;
    // Default limits: 30 s start timeout + 10 s wall + 3 s grace, and the
    // reaper's own 30 s grace: 73 s. The recent job, 65 s old, stays within
    // it however slow the set-up before the pass (up to 8 s).
    let spec = job("python", "main.py", "print(1)\n");
    let mut ids = Vec::new();
    for started_ago_ms in [600_000u64, 65_000, 74_000] {
        let id = submit(&store, &spec).await;
        claim_for(&redis, &store, &alive, &id).await;
        // Started for real: the deadline stored is the start + the engine's
        // slack (30 s + 3 s) + the wall budget of submit (10 s).
        let Ok(StartOutcome::Start(started)) = store
            .jobs()
            .start(&id, &alive, "test-host", false, SLACK)
            .await
        else {
            panic!("job {id} did not start");
        };
        let started_ms: u64 = redis.job_field(&id, "started_ms").parse().unwrap();
        assert_eq!(started.deadline_ms, Some(started_ms + 43_000));
        // Then moved into the past, the deadline with it.
        let _: () = conn
            .hset_multiple(
                store.keys().job(&id),
                &[
                    ("started_ms", started_ms - started_ago_ms),
                    ("deadline_ms", started_ms - started_ago_ms + 43_000),
                ],
            )
            .await
            .unwrap();
        ids.push(id);
    }
    let (old, recent, just_past) = (&ids[0], &ids[1], &ids[2]);

    let (reaper, metrics) = reaper(store.clone(), &harness, config(Duration::from_secs(30)));
    let report = reaper.pass().await;
    let stuck: BTreeSet<&String> = report.stuck.iter().map(|(_, id)| id).collect();
    assert_eq!(stuck, BTreeSet::from([old, just_past]));
    assert!(report.jobs.is_empty() && report.forgotten.is_empty());

    for id in [old, just_past] {
        let record = store.jobs().get(id).await.unwrap().expect("the job exists");
        assert_eq!(record.status.as_str(), "error");
        let result = record.result.expect("a result");
        assert_eq!(result.reason.map(|r| r.as_str()), Some("deadline_exceeded"));
        assert!(result.error.unwrap().contains(&alive));
        let ttl: i64 = conn.ttl(store.keys().job(id)).await.unwrap();
        assert!(ttl > 0, "job {id} has no ttl");
    }
    assert_eq!(redis.job_field(recent, "status"), "running");
    let processing: Vec<String> = conn
        .lrange(store.keys().processing(&alive), 0, -1)
        .await
        .unwrap();
    assert_eq!(processing, vec![recent.clone()]);
    let active: Vec<String> = conn.smembers(store.keys().active("a")).await.unwrap();
    assert_eq!(active, vec![recent.clone()]);
    let name = "code_runner_reaper_orphans_total{kind=\"deadline_exceeded\"}";
    assert_eq!(metric(&metrics.render(), name), Some(2.0));

    // The worker's own real result, when it comes after all (within the
    // late-result window), replaces the verdict; an `error` does not.
    let verdict_seq: u64 = redis.job_field(old, "event_seq").parse().unwrap();
    let late_error = store
        .jobs()
        .get(old)
        .await
        .unwrap()
        .unwrap()
        .result
        .unwrap();
    assert_eq!(
        store
            .jobs()
            .finish(just_past, &alive, 1, &late_error)
            .await
            .unwrap(),
        code_runner::store::FinishOutcome::Stale(code_runner::job::Status::Error)
    );
    let late = code_runner::job::JobResult {
        status: code_runner::job::Status::Succeeded,
        error: None,
        reason: None,
        ..late_error
    };
    assert_eq!(
        store.jobs().finish(old, &alive, 1, &late).await.unwrap(),
        code_runner::store::FinishOutcome::Late
    );
    assert_eq!(redis.job_field(old, "status"), "succeeded");
    let events = store.events().since(old, verdict_seq, 10).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    let exit: Value = serde_json::from_str(&events[0].json).unwrap();
    assert_eq!(exit["type"], "exit");
    assert_eq!(exit["status"], "succeeded");
    assert_eq!(exit["replaces"], verdict_seq);
    harness.assert_clean().await;
}
