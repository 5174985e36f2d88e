//! Which sandboxes the reaper removes or keeps (a dead worker's, one past
//! its deadline, one in its grace), when it forgets a dead worker, and the
//! stuck-state guard: a job past its deadline on a live worker is settled,
//! and the worker's late real result replaces the verdict.
//!
//! The sandboxes are planted on the test's own scripted host with the
//! labels a worker's would carry; no other reaper sees them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use code_runner::reaper::ContainerVerdict;
use code_runner::sandbox::{SandboxContainer, container_name};
use code_runner::store::{StartOutcome, now_ms};
use redis::AsyncCommands;
use serde_json::Value;

use crate::common::client::metric;
use crate::common::redis_server::RedisServer;
use crate::common::scripted::{self, ScriptedHost};
use crate::reaper::{claim_for, config, mark_dead, reaper, store, submit};

/// What start adds to a job's wall budget for the engine of a worker: its
/// start timeout (30 s) and grace (3 s).
const SLACK: Duration = Duration::from_secs(33);

/// Leaves a sandbox of `worker` for a job of its own, created at
/// `created_ms` with deadline `deadline_ms`, as a worker would have; its id.
fn plant(host: &Arc<ScriptedHost>, worker: &str, created_ms: u64, deadline_ms: u64) -> String {
    let job = uuid::Uuid::new_v4().to_string();
    let id = container_name(&job);
    host.plant(SandboxContainer {
        id: id.clone(),
        job: Some(job),
        worker: worker.to_string(),
        created_ms,
        deadline_ms: Some(deadline_ms),
        uid: None,
        warm: false,
        removing: false,
    });
    id
}

#[tokio::test]
async fn the_reaper_removes_expired_and_dead_workers_containers_only() {
    let redis = RedisServer::start();
    let store = store(&redis);
    let host = ScriptedHost::new();
    let test = uuid::Uuid::new_v4().to_string();

    let alive = format!("alive-{test}");
    let dead = format!("dead-{test}");
    let unknown = format!("unknown-{test}");
    store
        .workers()
        .heartbeat(&alive, "{}", Duration::from_secs(600))
        .await
        .unwrap();
    mark_dead(&redis, &store, &dead).await;

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
        let id = plant(&host, worker, created, deadline);
        ids.insert(id, (what, removed));
    }

    let (reaper, _metrics) = reaper(store.clone(), &host, config(grace));
    let report = reaper.pass().await;
    let reported: BTreeMap<&String, ContainerVerdict> = report
        .containers
        .iter()
        .filter(|(c, _)| ids.contains_key(&c.id))
        .map(|(c, verdict)| (&c.id, *verdict))
        .collect();
    let left: BTreeSet<String> = host.sandboxes().into_iter().map(|c| c.id).collect();
    for (id, (what, removed)) in &ids {
        assert_eq!(left.contains(id), !removed, "{what}: left {}", !removed);
        let expected = match (*removed, what.contains("deadline")) {
            (false, _) => None,
            (true, true) => Some(ContainerVerdict::PastDeadline),
            (true, false) => Some(ContainerVerdict::DeadWorker),
        };
        assert_eq!(reported.get(id).copied(), expected, "{what}");
    }
    assert_eq!(left.len(), 4);
}

#[tokio::test]
async fn a_dead_worker_is_forgotten_only_once_its_containers_are_gone() {
    let redis = RedisServer::start();
    let store = store(&redis);
    let host = ScriptedHost::new();
    // A worker that died right after it created a sandbox: the sandbox is
    // inside the grace period, so this pass keeps it, and must also keep
    // the worker in the fleet, or the next pass would take the sandbox for
    // an unknown worker's and leave it until its deadline.
    let dead = format!("dead-{}", uuid::Uuid::new_v4());
    mark_dead(&redis, &store, &dead).await;
    let mut conn = redis.conn().await;
    let now = now_ms();
    let id = plant(&host, &dead, now, now + 600_000);

    let (patient, _metrics) = reaper(store.clone(), &host, config(Duration::from_secs(30)));
    let report = patient.pass().await;
    assert!(report.containers.iter().all(|(c, _)| c.id != id));
    assert!(report.forgotten.is_empty(), "{:?}", report.forgotten);
    let member: bool = conn.sismember(store.keys().workers(), &dead).await.unwrap();
    assert!(member, "the worker was forgotten while its sandbox lived");

    // Once the grace has passed, the sandbox goes, and then the worker.
    let (prompt, _metrics) = reaper(store.clone(), &host, config(Duration::ZERO));
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
    assert!(host.sandboxes().is_empty(), "{:#?}", host.sandboxes());
}

// ---------------------------------------------------------------------------
// stuck-state guard
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_job_past_its_deadline_on_a_live_worker_is_settled() {
    let redis = RedisServer::start();
    let store = store(&redis);
    let host = ScriptedHost::new();
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
    let spec = scripted::job("print 1");
    let mut ids = Vec::new();
    for started_ago_ms in [600_000u64, 65_000, 74_000] {
        let id = submit(&store, &spec).await;
        claim_for(&store, &alive, &id).await;
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

    let (reaper, metrics) = reaper(store.clone(), &host, config(Duration::from_secs(30)));
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
    assert!(host.sandboxes().is_empty(), "{:#?}", host.sandboxes());
}
