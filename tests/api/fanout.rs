//! Bounded streams: 2000 WebSocket connections to one job while other
//! jobs run. Every connection gets every event of the job; the worker
//! keeps claiming and heartbeating and every job finishes; the API holds a
//! bounded number of Redis connections (one follower per job, fanned out,
//! not one per stream), and the 2001st stream of the job is refused.
//!
//! A real redis-server; an `api` and a `worker` process run in the test on
//! the scripted engine, the API reaching Redis through a proxy of its own
//! so that its connections (to the proxy's port) are told from the
//! worker's and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::common::client::KEY_A;
use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::proxy::RedisProxy;
use crate::common::redis_server::RedisServer;
use crate::common::scripted;

const CONNECTIONS: usize = 2000;
/// Redis connections the API may hold: its pool (16), the events reader,
/// and slack for one being replaced.
const API_REDIS_CONNECTIONS: usize = 16 + 1 + 2;

/// The TCP connections from process `pid` to `port` on loopback (`ss`).
fn redis_connections_of(pid: u32, port: u16) -> usize {
    let output = std::process::Command::new("ss")
        .args(["-tnp", "state", "established", &format!("dport = :{port}")])
        .output()
        .expect("ss runs (apt-get install iproute2)");
    assert!(
        output.status.success(),
        "ss failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains(&format!("pid={pid},")))
        .count()
}

/// Raises this process's open files limit to its hard limit (2000 sockets,
/// both ends of each in this process).
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard >= 5000,
        "the hard open files limit ({hard}) is too low"
    );
}

/// What one client saw: the stdout it was sent and whether the exit came.
async fn follow(
    url: String,
    permit: tokio::sync::OwnedSemaphorePermit,
    connected: Arc<AtomicUsize>,
) -> Result<(String, bool), String> {
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {KEY_A}").parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| e.to_string())?;
    drop(permit);
    connected.fetch_add(1, Ordering::SeqCst);
    let mut stdout = String::new();
    let mut exited = false;
    while let Some(frame) = socket.next().await {
        let Ok(Message::Text(text)) = frame else {
            continue;
        };
        let event: Value = serde_json::from_str(text.as_str()).map_err(|e| e.to_string())?;
        match event["type"].as_str() {
            Some("stdout") => stdout.push_str(event["data"].as_str().unwrap_or_default()),
            Some("exit") => exited = true,
            _ => {}
        }
    }
    Ok((stdout, exited))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_websockets_to_one_job_share_one_follower() {
    raise_open_files();
    let redis = RedisServer::start();
    let proxy = RedisProxy::start(redis.port);
    let api = InProcessBuilder::with_redis_url(Role::Api, &proxy.url())
        .env("CODE_RUNNER_MAX_STREAMS_PER_JOB", CONNECTIONS)
        .env("CODE_RUNNER_MAX_STREAMS_PER_KEY", CONNECTIONS + 100)
        .start()
        .await;
    let lines = 30;
    let followed = api
        .submit(&scripted::json(&format!(
            "repeat {lines}\nprint tick {{i}}\nsleep 100\nend\n"
        )))
        .await
        .id();
    let url = format!(
        "{}/v1/jobs/{followed}/ws",
        api.url.replacen("http", "ws", 1)
    );

    // Every client connects while the job waits in the queue.
    // At most 200 handshakes at a time.
    let gate = Arc::new(Semaphore::new(200));
    let connected = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
        clients.push(tokio::spawn(follow(
            url.clone(),
            permit,
            Arc::clone(&connected),
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while connected.load(Ordering::SeqCst) < CONNECTIONS {
        let open = redis_connections_of(std::process::id(), proxy.port);
        assert!(
            open <= API_REDIS_CONNECTIONS,
            "the API holds {open} Redis connections"
        );
        assert!(
            Instant::now() < deadline,
            "only {} clients connected",
            connected.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The stream past the job's cap is refused.
    let mut request = url.clone().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {KEY_A}").parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 429);
        }
        other => panic!("the 2001st stream was not refused: {other:?}"),
    }

    // Now a worker, and other jobs beside the followed one.
    let worker = InProcessBuilder::new(Role::Worker, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 3)
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 500)
        // Ten intervals: a beat or two late while 2000 sockets are fed on a
        // loaded machine is not a lapse; a stalled heartbeat task still is.
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 5000)
        .start()
        .await;
    let mut others = Vec::new();
    for n in 0..8 {
        others.push(
            // Submitted while 2000 sockets are fed: a 503 is the API
            // shedding load, which a client retries after Retry-After.
            api.submit_retrying(&scripted::json(&format!("print other {n}")))
                .await
                .id(),
        );
    }
    let heartbeat = format!("worker:{}:hb", worker.worker_id);
    let mut most = 0;
    let mut heartbeat_missed = 0;
    let all_done = Instant::now() + Duration::from_secs(120);
    loop {
        most = most.max(redis_connections_of(std::process::id(), proxy.port));
        if redis.cli(&["EXISTS", &heartbeat]) != "1" {
            heartbeat_missed += 1;
        }
        let mut done = true;
        for id in others.iter().chain([&followed]) {
            let status = redis.job_field(id, "status");
            done &= !matches!(status.as_str(), "queued" | "running");
        }
        if done || Instant::now() > all_done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for id in others.iter().chain([&followed]) {
        assert_eq!(redis.job_field(id, "status"), "succeeded", "job {id}");
    }
    assert_eq!(heartbeat_missed, 0, "the worker's heartbeat lapsed");

    let expected: String = (0..lines).map(|n| format!("tick {n}\n")).collect();
    let mut complete = 0;
    let mut failures = Vec::new();
    for client in clients {
        match tokio::time::timeout(Duration::from_secs(60), client).await {
            Ok(Ok(Ok((stdout, true)))) if stdout == expected => complete += 1,
            other => failures.push(format!("{other:?}")),
        }
    }
    println!(
        "fan-out: {complete} of {CONNECTIONS} clients got every event; the API held at most {most} Redis connections"
    );
    assert_eq!(
        complete,
        CONNECTIONS,
        "{:?}",
        &failures[..failures.len().min(5)]
    );
    // The probe sees the API's connections at all (its feed reader's, at
    // least), and never more than the bound.
    assert!(
        (1..=API_REDIS_CONNECTIONS).contains(&most),
        "the API held {most} Redis connections"
    );
    worker.assert_no_sandboxes().await;
}
