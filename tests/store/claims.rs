//! Claims, releases and starts through the store's own steps, as a worker
//! makes them: a released job goes back to the head of its queue (unless
//! it was cancelled meanwhile), and a job taken back from a worker (its
//! claim requeued by a reaper) cannot be started by it.

use std::time::Duration;

use code_runner::job::{JobResult, JobSpec, Status};
use code_runner::store::{
    NewJob, ReleaseOutcome, Skipped, StartOutcome, Started, Store, SubmitOutcome,
};
use redis::AsyncCommands;

use crate::common::redis_server::RedisServer;
use crate::common::{job, python};

/// What start adds to a job's wall budget for the engine of a worker: its
/// start timeout (30 s) and grace (3 s).
const SLACK: Duration = Duration::from_secs(33);

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
            admission: crate::common::admission(),
        })
        .await
        .expect("redis answers");
    assert_eq!(outcome, SubmitOutcome::Accepted);
    id
}

/// The length of a Redis list.
async fn llen(redis: &RedisServer, key: String) -> u64 {
    let mut conn = redis.conn().await;
    conn.llen(key).await.expect("LLEN")
}

#[tokio::test]
async fn release_puts_a_claimed_job_back_at_the_head_unless_cancelled() {
    let redis = RedisServer::start();
    let prefix = format!("test-{}:", uuid::Uuid::new_v4().simple());
    let store = Store::new(&redis.url(), &prefix, Duration::from_secs(3600), 8)
        .expect("queue settings are valid");
    let worker = format!("test-{}", uuid::Uuid::new_v4());
    let first = submit(&store, &python("print(1)")).await;
    let second = submit(&store, &python("print(2)")).await;
    let mut conn = store.dedicated().await.expect("connection");
    let processing = || llen(&redis, store.keys().processing(&worker));

    let claimed = store.jobs().claim(&mut conn, &worker).await.expect("claim");
    assert_eq!(claimed.as_deref(), Some(first.as_str()));
    assert_eq!(
        store
            .jobs()
            .release(&first, &worker)
            .await
            .expect("release"),
        ReleaseOutcome::Requeued
    );
    assert_eq!(processing().await, 0);
    // Back at the head: claimed again before the second job.
    let claimed = store.jobs().claim(&mut conn, &worker).await.expect("claim");
    assert_eq!(claimed.as_deref(), Some(first.as_str()));

    let cancelled = JobResult::without_stages(Status::Cancelled, "python", "");
    store
        .jobs()
        .cancel(&first, &cancelled)
        .await
        .expect("cancel");
    assert_eq!(
        store
            .jobs()
            .release(&first, &worker)
            .await
            .expect("release"),
        ReleaseOutcome::Dropped
    );
    assert_eq!(
        store
            .jobs()
            .release(&first, &worker)
            .await
            .expect("release"),
        ReleaseOutcome::Absent
    );
    assert_eq!(processing().await, 0);
    assert_eq!(llen(&redis, store.keys().queue()).await, 1);
    let claimed = store.jobs().claim(&mut conn, &worker).await.expect("claim");
    assert_eq!(claimed.as_deref(), Some(second.as_str()));
}

#[tokio::test]
async fn a_worker_cannot_start_a_job_that_was_taken_back_from_it() {
    let redis = RedisServer::start();
    let store = Store::new(&redis.url(), "", Duration::from_secs(3600), 8).expect("valid settings");
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
    let mut conn = store.dedicated().await.expect("a connection");
    let claimed = store.jobs().claim(&mut conn, "fresh").await.unwrap();
    assert_eq!(claimed.as_deref(), Some(id.as_str()), "the next in turn");
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
