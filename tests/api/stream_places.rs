//! A queued job's place on its streams and in its view, on an `api`
//! process in the test with no worker: the test claims, starts and reaps
//! the jobs itself through the store's own steps.

use std::time::Duration;

use code_runner::store::Store;
use serde_json::{Value, json};

use crate::common;
use crate::common::client::{KEY_A, python};
use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;
use crate::ws::{FRAME_WAIT, Ws};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_jobs_streams_and_view_give_its_place_until_it_starts() {
    let redis = RedisServer::start();
    // No worker: this test claims and starts the jobs itself.
    let daemon = InProcessBuilder::new(Role::Api, &redis).start().await;
    let store = Store::new(&redis.url(), "", Duration::from_secs(60), 2).unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let answer = daemon.submit(&python("print(1)")).await;
        assert_eq!(answer.status, 202, "{answer:#?}");
        ids.push(answer.id());
    }
    let last = ids[3].clone();
    let view = daemon.job(&last).await;
    assert_eq!(view["queue"]["position"], 3, "{view:#}");
    // Nothing was claimed lately: no estimate.
    assert_eq!(view["queue"]["eta_ms"], Value::Null, "{view:#}");
    let first_view = daemon.job(&ids[0]).await;
    assert_eq!(first_view["queue"]["position"], 0, "{first_view:#}");

    let mut ws = Ws::open(&daemon, &last, None).await;
    ws.places = true;
    // SSE carries the same, as `event: queued` without an id.
    let mut sse = daemon
        .http
        .get(format!("{}/v1/jobs/{last}/events", daemon.url))
        .bearer_auth(KEY_A)
        .timeout(FRAME_WAIT)
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while !text.contains("event: queued\n") {
        let chunk = tokio::time::timeout(FRAME_WAIT, sse.chunk())
            .await
            .expect("an SSE chunk within the wait")
            .unwrap()
            .expect("the SSE stream stays open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let block = text
        .split("\n\n")
        .find(|block| block.contains("event: queued"))
        .unwrap();
    assert!(!block.contains("id:"), "{block}");
    let data: Value = serde_json::from_str(
        block
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(data["type"], "queued");
    assert_eq!(data["position"], 3, "{data}");
    drop(sse);
    let mut places = Vec::new();
    let frames = ws.until(|f| f["type"] == "queued").await;
    assert_eq!(frames.last().unwrap()["position"], 3, "{frames:#?}");
    assert!(frames.last().unwrap().get("seq").is_none(), "{frames:#?}");
    places.push(3);
    for expected in [2, 1, 0] {
        common::claim_and_start(&store, "w-test").await;
        let frames = ws.until(|f| f["type"] == "queued").await;
        let place = frames.last().unwrap();
        assert_eq!(place["position"], expected, "{frames:#?}");
        let eta = &place["eta_ms"];
        assert!(
            eta.is_null() || eta.as_u64().is_some_and(|ms| ms > 0),
            "{place}"
        );
        places.push(expected);
    }
    assert_eq!(places, [3, 2, 1, 0]);
    // Its own start: the running status comes, and no place after it.
    assert_eq!(common::claim_and_start(&store, "w-test").await, last);
    let frames = ws
        .until(|f| f["type"] == "status" && f["status"] == "running")
        .await;
    assert!(
        frames
            .iter()
            .all(|f| f["type"] != "queued" || f["position"] == 0),
        "{frames:#?}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), ws.next())
            .await
            .is_err(),
        "nothing follows the start until the job runs"
    );
    let view = daemon.job(&last).await;
    assert_eq!(view["status"], "running");
    assert!(view.get("queue").is_none(), "{view:#}");
}

/// A stream opened on a queued job whose place this process already knows
/// (another stream follows it) still replays the job's stored events
/// before it gives the place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_replays_its_jobs_events_before_it_gives_the_place() {
    let redis = RedisServer::start();
    // No worker: the job stays queued.
    let daemon = InProcessBuilder::new(Role::Api, &redis).start().await;
    let answer = daemon.submit(&python("print(1)")).await;
    assert_eq!(answer.status, 202, "{answer:#?}");
    let id = answer.id();
    let mut first = Ws::open(&daemon, &id, None).await;
    first.places = true;
    let frames = first.until(|f| f["type"] == "queued").await;
    assert_eq!(frames.last().unwrap()["position"], 0, "{frames:#?}");
    for round in 0..5 {
        let mut next = Ws::open(&daemon, &id, None).await;
        next.places = true;
        let replayed = next.next().await.expect("a frame");
        assert_eq!(
            (&replayed["seq"], &replayed["type"], &replayed["status"]),
            (&json!(1), &json!("status"), &json!("queued")),
            "round {round}: {replayed:#}"
        );
        let place = next.next().await.expect("a frame");
        assert_eq!(
            (&place["type"], &place["position"]),
            (&json!("queued"), &json!(0)),
            "round {round}: {place:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_back_in_the_queue_after_its_worker_was_lost_gives_its_place_again() {
    use code_runner::store::{LostResults, ReapOutcome, ReapPolicy, Retry};
    let redis = RedisServer::start();
    // No worker: this test claims, starts and reaps the job itself.
    let daemon = InProcessBuilder::new(Role::Api, &redis).start().await;
    let store = Store::new(&redis.url(), "", Duration::from_secs(60), 2).unwrap();
    let mut spec = python("print(1)");
    spec["max_attempts"] = json!(2);
    let answer = daemon.submit(&spec).await;
    assert_eq!(answer.status, 202, "{answer:#?}");
    let id = answer.id();
    // Another job behind it, so that the queue is not empty once it left.
    assert_eq!(daemon.submit(&python("print(2)")).await.status, 202);

    let mut ws = Ws::open(&daemon, &id, None).await;
    ws.places = true;
    let frames = ws.until(|f| f["type"] == "queued").await;
    assert_eq!(frames.last().unwrap()["position"], 0, "{frames:#?}");
    assert_eq!(common::claim_and_start(&store, "lost").await, id);
    ws.until(|f| f["type"] == "status" && f["status"] == "running")
        .await;

    // Its worker is lost: the job goes back to the front of the queue for
    // its second attempt, and the stream follows its place again.
    let policy = ReapPolicy {
        max_requeues: 3,
        retry: Retry::Allowed,
        late_window: Duration::from_secs(600),
        own: false,
    };
    let lost = LostResults::new("lost", "python", "3", 3);
    let outcome = store.jobs().reap("lost", &id, policy, &lost).await.unwrap();
    assert!(
        matches!(outcome, ReapOutcome::Retried { .. }),
        "{outcome:?}"
    );
    let frames = ws.until(|f| f["type"] == "queued").await;
    let kinds: Vec<(&Value, &Value)> = frames.iter().map(|f| (&f["type"], &f["status"])).collect();
    assert_eq!(
        kinds,
        [
            (&json!("attempt"), &Value::Null),
            (&json!("status"), &json!("queued")),
            (&json!("queued"), &Value::Null)
        ],
        "{frames:#?}"
    );
    assert_eq!(frames[2]["position"], 0, "{frames:#?}");
    assert!(frames[2].get("seq").is_none(), "{frames:#?}");
    // And it stops again at its second start.
    assert_eq!(common::claim_and_start(&store, "w2").await, id);
    ws.until(|f| f["type"] == "status" && f["status"] == "running")
        .await;
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), ws.next())
            .await
            .is_err(),
        "nothing follows the second start until the job runs"
    );
}
