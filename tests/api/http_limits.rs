//! The HTTP server's limits: header and idle timeouts, the per-key request
//! rate, the caps on open streams, and a process that exits non-zero when
//! its listener fails. A whole process in the test
//! ([`InProcessBuilder`]), each with a redis-server of its own.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::common;
use crate::common::client::{Answer, KEY_A, KEY_B, metric, python};
use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::logs;
use crate::common::redis_server::RedisServer;

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

/// The process's logs are this test process's tracing ([`logs::capture`]).
#[tokio::test]
async fn serve_exits_non_zero_when_its_listener_fails() {
    let log = logs::capture();
    let redis = RedisServer::start();
    let mut daemon = InProcessBuilder::new(Role::Serve, &redis).start().await;
    let port = port_of(&daemon.url);
    // Destroy the listening socket from outside (iproute2 `ss -K`): accept
    // fails with EINVAL from then on.
    let killed = std::process::Command::new("ss")
        .args(["-K", "-l", "-t", &format!("sport = :{port}")])
        .output()
        .expect("ss runs (apt-get install iproute2)");
    assert!(killed.status.success(), "{killed:?}");
    let status = daemon.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(status, 69, "log:\n{}", log.text());
    assert!(
        log.text().contains("the HTTP server failed"),
        "{}",
        log.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_headers_and_idle_connections_are_closed() {
    let redis = RedisServer::start();
    let api = InProcessBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_HTTP_HEADER_TIMEOUT_MS", 1000)
        .env("CODE_RUNNER_HTTP_KEEP_ALIVE_MS", 3000)
        .start()
        .await;
    let address = api.url.trim_start_matches("http://").to_string();

    // Half a request, then nothing. Timed from before the connection, so
    // from before the server's timer starts.
    let started = Instant::now();
    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buffer = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read(&mut buffer))
        .await
        .expect("the server closes a connection whose headers do not come");
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "closed after {:?}",
        started.elapsed()
    );
    // Closed (0) or answered with 408 and closed.
    if let Ok(n) = read
        && n > 0
    {
        let text = String::from_utf8_lossy(&buffer[..n]);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    }

    // A new connection that sends nothing: closed after the header timeout
    // too.
    let started = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(&address).await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buffer))
        .await
        .expect("the server closes a connection that sends nothing");
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "closed after {:?}",
        started.elapsed()
    );
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");

    // A keep-alive connection that stays idle after a request: kept for the
    // keep-alive (3 s here), not the header timeout. Timed from after the
    // answer, so from after the server's timer starts.
    let mut idle = tokio::net::TcpStream::connect(&address).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let n = idle.read(&mut buffer).await.unwrap();
    assert!(String::from_utf8_lossy(&buffer[..n]).starts_with("HTTP/1.1 200"));
    let answered = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match idle.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the idle connection stayed open");
    assert!(
        answered.elapsed() >= Duration::from_millis(2900),
        "closed after {:?}",
        answered.elapsed()
    );
}

/// The reset a client saw when it sent its next request on a keep-alive
/// connection just as the server closed it for being idle: now the server
/// keeps an idle connection for the keep-alive, longer than the header
/// timeout, and a request sent past the header timeout is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_on_a_connection_idle_past_the_header_timeout_is_answered() {
    let redis = RedisServer::start();
    let api = InProcessBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_HTTP_HEADER_TIMEOUT_MS", 500)
        .env("CODE_RUNNER_HTTP_KEEP_ALIVE_MS", 10_000)
        .start()
        .await;
    let address = api.url.trim_start_matches("http://").to_string();
    let mut buffer = [0u8; 4096];
    let mut connection = tokio::net::TcpStream::connect(&address).await.unwrap();
    // Idle gaps around and past the header timeout, each answered on the
    // same connection.
    for gap_ms in [0, 450, 500, 550, 1200, 2000] {
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
        connection
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap_or_else(|e| panic!("after {gap_ms} ms idle: {e}"));
        let n = connection
            .read(&mut buffer)
            .await
            .unwrap_or_else(|e| panic!("after {gap_ms} ms idle: {e}"));
        let text = String::from_utf8_lossy(&buffer[..n]);
        assert!(
            text.starts_with("HTTP/1.1 200"),
            "after {gap_ms} ms idle: {text:?}"
        );
    }
    // The same through a client with a connection pool (reqwest, one
    // connection): every request is answered, none sees a reset.
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    for gap_ms in [0, 490, 500, 510, 1000] {
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
        let response = client
            .get(format!("{}/healthz", api.url))
            .send()
            .await
            .unwrap_or_else(|e| panic!("after {gap_ms} ms idle: {e:?}"));
        assert_eq!(response.status(), reqwest::StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_over_its_rate_gets_429_and_other_keys_do_not() {
    let redis = RedisServer::start();
    let api = InProcessBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_KEY_RATE", 2)
        .env("CODE_RUNNER_KEY_BURST", 5)
        .start()
        .await;
    let path = format!("/v1/jobs/{}", uuid::Uuid::new_v4());
    let mut statuses = Vec::new();
    let mut limited = None;
    for _ in 0..10 {
        let answer = api.get(&path, Some(KEY_A)).await;
        statuses.push(answer.status.as_u16());
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(answer);
        }
    }
    assert_eq!(&statuses[..5], [404; 5], "{statuses:?}");
    assert!(statuses[5..].contains(&429), "{statuses:?}");
    let limited = limited.unwrap();
    let (code, message) = limited.error();
    assert_eq!(code, "rate_limited");
    assert!(message.contains("CODE_RUNNER_KEY_RATE"), "{message}");
    assert!(limited.retry_after() >= 1);
    // 2 a second after a burst of 5.
    common::assert_refusal_detail(
        &limited.body,
        limited.retry_after(),
        "rate_limited",
        Some(("CODE_RUNNER_KEY_RATE", 2, 5)),
    );
    // Another key has its own bucket; the probes have none.
    assert_eq!(
        api.get(&path, Some(KEY_B)).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(api.get("/healthz", None).await.status, StatusCode::OK);
}

/// Empties a key's bucket (rate 1 per second) with reads, `read` sending
/// one (404 when let through, 429 when refused); the last refusal. Reads
/// until one is refused, then until one is let through again: that one took
/// the token the moment it came in, so the next comes a second later (less
/// the pause between the two reads), and a read sent right after is
/// refused, as is what the caller sends right after that.
async fn empty_the_bucket<F, Fut>(what: &str, mut read: F) -> Answer
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    const TRIES: usize = 10;
    let mut statuses = Vec::new();
    let spend = |answer: &Answer, statuses: &mut Vec<u16>| {
        statuses.push(answer.status.as_u16());
        assert!(
            [StatusCode::NOT_FOUND, StatusCode::TOO_MANY_REQUESTS].contains(&answer.status),
            "{what}: {statuses:?} {answer:#?}"
        );
        answer.status == StatusCode::TOO_MANY_REQUESTS
    };
    // What is left of the burst.
    let mut refused = false;
    for _ in 0..TRIES {
        if spend(&read().await, &mut statuses) {
            refused = true;
            break;
        }
    }
    assert!(refused, "{what}: no refusal in {TRIES} reads: {statuses:?}");
    // The next token, taken as soon as it comes (within a second).
    let deadline = Instant::now() + Duration::from_secs(5);
    while spend(&read().await, &mut statuses) {
        assert!(
            Instant::now() < deadline,
            "{what}: no token came back: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = read().await;
    assert!(spend(&refused, &mut statuses), "{what}: {statuses:?}");
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_piston_and_judge0_routes_share_the_keys_rate() {
    let redis = RedisServer::start();
    // No worker: nothing here runs a job.
    let api = InProcessBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_KEY_RATE", 1)
        .env("CODE_RUNNER_KEY_BURST", 3)
        .start()
        .await;
    let send = |request: reqwest::RequestBuilder| async move {
        Answer::from(request.send().await.expect("answered")).await
    };
    let piston_execute = || {
        api.http
            .post(format!("{}/api/v2/execute", api.url))
            .header("authorization", KEY_A)
            .body("{}")
    };
    let judge0_submit = || {
        api.http
            .post(format!("{}/judge0/submissions", api.url))
            .header("x-auth-token", KEY_A)
            .json(&serde_json::json!({"source_code": "print(1)", "language_id": 71}))
    };
    let judge0_show = |key: &str| {
        api.http
            .get(format!(
                "{}/judge0/submissions/{}",
                api.url,
                uuid::Uuid::new_v4()
            ))
            .header("x-auth-token", key)
    };
    let v1_show = || async {
        api.get(&format!("/v1/jobs/{}", uuid::Uuid::new_v4()), Some(KEY_A))
            .await
    };
    // Submissions refused for the rate: the metric must count exactly these.
    let mut refused_submissions = 0;
    // The burst of 3, spent across the three APIs.
    assert_eq!(v1_show().await.status, StatusCode::NOT_FOUND);
    assert_eq!(send(judge0_show(KEY_A)).await.status, StatusCode::NOT_FOUND);
    let piston = send(piston_execute()).await;
    assert_eq!(piston.status, StatusCode::BAD_REQUEST, "{piston:#?}");

    // Now each refuses in its own shape, with Retry-After: each right after
    // the bucket was emptied through another API.
    let v1 = empty_the_bucket("/v1 reads", v1_show).await;
    assert_eq!(v1.error().0, "rate_limited");
    let piston = send(piston_execute()).await;
    refused_submissions += 1;
    assert_eq!(piston.status, StatusCode::TOO_MANY_REQUESTS, "{piston:#?}");
    let message = piston.body["message"].as_str().unwrap();
    assert!(message.contains("CODE_RUNNER_KEY_RATE"), "{message}");
    assert_eq!(piston.retry_after(), 1);

    empty_the_bucket("/v1 reads", v1_show).await;
    let judge0 = send(judge0_submit()).await;
    refused_submissions += 1;
    assert_eq!(judge0.status, StatusCode::TOO_MANY_REQUESTS, "{judge0:#?}");
    let message = judge0.body["error"].as_str().unwrap();
    assert!(message.contains("CODE_RUNNER_KEY_RATE"), "{message}");
    assert_eq!(judge0.retry_after(), 1);

    // And the other way: emptied through Judge0, /v1 refuses.
    let judge0 = empty_the_bucket("Judge0 reads", || send(judge0_show(KEY_A))).await;
    let message = judge0.body["error"].as_str().unwrap();
    assert!(message.contains("CODE_RUNNER_KEY_RATE"), "{message}");
    let v1 = api.submit_as(Some(KEY_A), &python("print(1)"), false).await;
    refused_submissions += 1;
    assert_eq!(v1.status, StatusCode::TOO_MANY_REQUESTS, "{v1:#?}");
    assert_eq!(v1.error().0, "rate_limited");
    // Another key has its own bucket.
    assert_eq!(send(judge0_show(KEY_B)).await.status, StatusCode::NOT_FOUND);
    // The refused submissions are counted; the refused reads are not.
    let metrics = api.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"rate_limited\"}"
        ),
        Some(f64::from(refused_submissions)),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_past_the_jobs_cap_is_refused_with_429() {
    let redis = RedisServer::start();
    let api = InProcessBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_MAX_STREAMS_PER_JOB", 2)
        .start()
        .await;
    // Nothing runs it: it stays queued, its streams stay open.
    let id = api.submit(&python("print(1)")).await.id();
    let url = format!("{}/v1/jobs/{id}/ws", api.url.replacen("http", "ws", 1));
    let open = || async {
        let mut request = url.clone().into_client_request().unwrap();
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {KEY_A}").parse().unwrap());
        tokio_tungstenite::connect_async(request).await
    };
    let first = open().await.expect("the first stream opens");
    let _second = open().await.expect("the second stream opens");
    match open().await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 429);
            let body: serde_json::Value =
                serde_json::from_slice(response.body().as_deref().unwrap_or_default()).unwrap();
            assert_eq!(body["error"]["code"], "too_many_streams", "{body:#}");
            assert_eq!(response.headers()["retry-after"], "5");
            common::assert_refusal_detail(
                &body,
                5,
                "too_many_streams",
                Some(("CODE_RUNNER_MAX_STREAMS_PER_JOB", 2, 2)),
            );
            let message = body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("this job has 2 open streams")
                    && message.contains("CODE_RUNNER_MAX_STREAMS_PER_JOB"),
                "{message}"
            );
        }
        other => panic!("a third stream was not refused: {other:?}"),
    }
    // SSE counts the same.
    let sse = api.get(&format!("/v1/jobs/{id}/events"), Some(KEY_A)).await;
    assert_eq!(sse.status, StatusCode::TOO_MANY_REQUESTS, "{sse:#?}");
    // The metrics say so: two open, two refused at the job's cap.
    let metrics = api.metrics().await;
    for (name, value) in [
        ("code_runner_streams_open", 2.0),
        ("code_runner_streams_refused_total{cap=\"job\"}", 2.0),
        ("code_runner_streams_refused_total{cap=\"key\"}", 0.0),
        ("code_runner_streams_refused_total{cap=\"server\"}", 0.0),
    ] {
        assert_eq!(metric(&metrics, name), Some(value), "{name}: {metrics}");
    }
    // A closed stream gives its place back.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if open().await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the place did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn piston_connections_count_against_the_keys_stream_cap() {
    let redis = RedisServer::start();
    let api = InProcessBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_MAX_STREAMS_PER_KEY", 1)
        .start()
        .await;
    let url = format!("{}/api/v2/connect", api.url.replacen("http", "ws", 1));
    let open = |key: &'static str| {
        let url = url.clone();
        async move {
            let mut request = url.into_client_request().unwrap();
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {key}").parse().unwrap());
            tokio_tungstenite::connect_async(request).await
        }
    };
    let first = open(KEY_A).await.expect("the key's first stream opens");
    match open(KEY_A).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 429);
            assert!(response.headers().contains_key("retry-after"));
            // Piston's error shape: {"message": …}.
            let body: serde_json::Value =
                serde_json::from_slice(response.body().as_deref().unwrap_or_default()).unwrap();
            let message = body["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("this API key has 1 open streams")
                    && message.contains("CODE_RUNNER_MAX_STREAMS_PER_KEY"),
                "{body:#}"
            );
        }
        other => panic!("a second Piston connection of the key was not refused: {other:?}"),
    }
    // Counted like the streams of /v1: one open, one refused at the key's cap.
    let metrics = api.metrics().await;
    for (name, value) in [
        ("code_runner_streams_open", 1.0),
        ("code_runner_streams_refused_total{cap=\"key\"}", 1.0),
        ("code_runner_streams_refused_total{cap=\"job\"}", 0.0),
    ] {
        assert_eq!(metric(&metrics, name), Some(value), "{name}: {metrics}");
    }
    // Another key has its own count.
    let _other = open(KEY_B).await.expect("another key's stream opens");
    // A closed connection gives its place back.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    while open(KEY_A).await.is_err() {
        assert!(Instant::now() < deadline, "the place did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
