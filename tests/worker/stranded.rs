//! No stranded jobs: a `BLMOVE` whose reply is lost, a worker restarted
//! under the same fixed id, and a flood of signals trying to push a
//! `cancel` out of a job's control stream.
//!
//! In-process daemons on a scripted host, a real redis-server per test.
//! Every process and proxy is stopped by its guard, also when a test
//! fails.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::common::client::KEY_A;
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::logs;
use crate::common::proxy::RedisProxy;
use crate::common::redis_server::RedisServer;
use crate::common::scripted::{self, ScriptedHost};
use crate::common::wait_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_reply_is_lost_is_found_in_the_list_and_run() {
    let logs = logs::capture();
    let redis = RedisServer::start();
    let proxy = RedisProxy::start(redis.port);
    let worker = InProcessBuilder::with_redis_url(Role::Worker, &proxy.url())
        .start()
        .await;
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    proxy.lose_next_blmove_reply();
    let id = api.submit(&scripted::json("print found")).await.id();
    let view = api.wait_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(proxy.lost_replies(), 1, "the reply to the claim was lost");
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(view["result"]["run"]["stdout"], "found\n");
    assert_eq!(view["attempts"], 1);
    assert_eq!(view["worker"], worker.worker_id.as_str());
    logs.wait_for_line(
        &["a claim whose reply was lost", &id],
        Duration::from_secs(10),
    )
    .await;
    let list = redis.cli(&["LLEN", &format!("worker:{}:processing", worker.worker_id)]);
    assert_eq!(list, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_restarted_under_its_fixed_id_recovers_its_list() {
    let logs = logs::capture();
    let redis = RedisServer::start();
    let host = ScriptedHost::new();
    let id = format!("fixed-{}", uuid::Uuid::new_v4().simple());
    // A long heartbeat TTL: the old heartbeat still lives when the new
    // process comes, so no reaper would ever look at this list.
    let builder = || {
        InProcessBuilder::new(Role::Worker, &redis)
            .host(&host)
            .worker_id(&id)
            .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 1)
            .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 60_000)
    };
    let mut first = builder().start().await;
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let mut batch = scripted::json("sleep 6000\nprint done");
    batch["max_attempts"] = json!(2);
    let running = api.submit(&batch).await.id();
    api.wait_status(&running, &["running"], Duration::from_secs(60))
        .await;
    wait_for("the job's sandbox", Duration::from_secs(30), || async {
        (!host.sandboxes_of(&id).is_empty()).then_some(())
    })
    .await;
    // A job the worker claimed but had not started (its one slot is busy).
    let claimed = api.submit(&scripted::json("print claimed")).await.id();
    let moved = redis.cli(&[
        "LMOVE",
        "jobs:queue",
        &format!("worker:{id}:processing"),
        "RIGHT",
        "LEFT",
    ]);
    // The first half of the worker's claim: a turn, whose job the worker
    // would take next (it is killed before it does).
    assert_eq!(moved, "turn", "jobs:queue holds a turn per queued job");

    // As SIGKILL: its sandbox stays on the host.
    first.crash();
    assert_eq!(host.sandboxes_of(&id).len(), 1);
    let second = builder().start().await;

    let view = api.wait_terminal(&claimed, Duration::from_secs(60)).await;
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(view["result"]["run"]["stdout"], "claimed\n");
    let view = api.wait_terminal(&running, Duration::from_secs(60)).await;
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(view["result"]["run"]["stdout"], "done\n");
    assert_eq!(view["attempts"], 2, "it ran again: {view:#}");
    logs.wait_for_line(
        &["removed the sandboxes a previous process", &id],
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        redis.cli(&["LLEN", &format!("worker:{id}:processing")]),
        "0"
    );
    crate::world::assert_no_sandboxes(&second).await;
}

/// A WebSocket to job `id` with key `a`.
async fn websocket(
    api: &InProcess,
    id: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let url = format!("{}/v1/jobs/{id}/ws", api.url.replacen("http", "ws", 1));
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {KEY_A}").parse().unwrap());
    tokio_tungstenite::connect_async(request)
        .await
        .expect("the WebSocket opens")
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_signals_cannot_push_a_cancel_out() {
    let redis = RedisServer::start();
    // The worker reaches Redis through a proxy, which stops it hearing
    // anything as SIGSTOP would.
    let proxy = RedisProxy::start(redis.port);
    let _worker = InProcessBuilder::with_redis_url(Role::Worker, &proxy.url())
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 120_000)
        .start()
        .await;
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let mut job = scripted::json("ignore SIGINT\nprint up\nsleep 100000");
    job["interactive"] = json!(true);
    job["limits"] = json!({"wall_ms": 120000, "idle_ms": 120000});
    let id = api.submit(&job).await.id();
    api.wait_status(&id, &["running"], Duration::from_secs(60))
        .await;
    let mut first = websocket(&api, &id).await;
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(30), first.next())
            .await
            .expect("output")
            .expect("a frame")
            .expect("a frame");
        if let Message::Text(text) = frame
            && text.contains("\"up")
        {
            break;
        }
    }

    // The worker stops reading: what is sent now piles up in the stream.
    proxy.pause();
    let interrupt = json!({"type": "signal", "signal": "interrupt"}).to_string();
    first.send(Message::text(interrupt.clone())).await.unwrap();
    let cancel = api.cancel(&id).await;
    assert_eq!(cancel.status, StatusCode::ACCEPTED, "{cancel:#?}");
    // 20 000 signals after it, from four connections: twice what a capped
    // stream of 10 000 entries keeps.
    let mut floods = Vec::new();
    for _ in 0..4 {
        let ws = websocket(&api, &id).await;
        let interrupt = interrupt.clone();
        floods.push(tokio::spawn(async move {
            let (mut sink, mut stream) = ws.split();
            let reader = tokio::spawn(async move {
                let mut refused = 0;
                while let Some(Ok(frame)) = stream.next().await {
                    if let Message::Text(text) = frame
                        && text.contains("signal limit reached")
                    {
                        refused += 1;
                    }
                }
                refused
            });
            for _ in 0..5000 {
                if sink.send(Message::text(interrupt.clone())).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
            reader.await.unwrap_or(0)
        }));
    }
    let mut refused = 0;
    for flood in floods {
        refused += tokio::time::timeout(Duration::from_secs(120), flood)
            .await
            .expect("the flood ends")
            .unwrap();
    }
    proxy.resume();
    assert!(refused >= 18_000, "only {refused} signals were refused");

    let view = api.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(view["status"], "cancelled", "{view:#}");
    let signals = redis.job_field(&id, "signals");
    assert_eq!(signals, "1000", "signals counted");
    let entries: u64 = redis
        .cli(&["XLEN", &format!("job:{id}:stdin")])
        .parse()
        .unwrap();
    assert!(entries <= 1001, "{entries} control entries");
}
