//! Attach tokens against a whole `code-runner serve` in the test (real
//! Redis, the scripted engine): the two scopes in the submit answer, what
//! each lets through, forged, expired, another job's and revoked tokens,
//! the secret (shared by the replicas through Redis, of a minimum length,
//! kept out of Redis), and `--help` never showing a secret (the binary,
//! which needs no Docker for either).

use std::time::{Duration, Instant};

use code_runner::api::{ApiKeys, Scope, TokenSigner};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest};

use crate::common::client::{Answer, ApiClient};
use crate::common::daemon::{Role, run_to_end};
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;
use crate::common::scripted;
use crate::server::{KEYS, Setup};
use crate::ws::interactive;

const WAIT: Duration = Duration::from_secs(60);

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the job's WebSocket with `token` as the subprotocol, as a browser
/// does; `Err((status, body))` when the upgrade was refused.
async fn connect(daemon: &ApiClient, id: &str, token: &str) -> Result<Socket, (u16, String)> {
    let url = format!("{}/v1/jobs/{id}/ws", daemon.url.replacen("http", "ws", 1));
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        format!("code-runner, token.{token}").parse().unwrap(),
    );
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => Err((
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(other) => panic!("the WebSocket connection failed: {other}"),
    }
}

/// Text frames as JSON until one matches `done` (returned last).
async fn frames_until(socket: &mut Socket, mut done: impl FnMut(&Value) -> bool) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let frame = tokio::time::timeout(WAIT, socket.next())
            .await
            .expect("a frame in time");
        match frame {
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(text.as_str()).unwrap();
                let stop = done(&value);
                frames.push(value);
                if stop {
                    return frames;
                }
            }
            Some(Ok(_)) => {}
            other => panic!("the stream ended ({other:?}); frames so far: {frames:#?}"),
        }
    }
}

async fn send(socket: &mut Socket, frame: Value) {
    socket.send(Message::text(frame.to_string())).await.unwrap();
}

/// Says `ready`, then echoes a line of stdin as `echo: LINE`.
const ECHO: &str = "print ready\nreadline echo:\\x20\n";

fn tokens_of(answer: &Answer) -> (String, String) {
    let tokens = &answer.body["tokens"];
    (
        tokens["read"].as_str().unwrap().to_string(),
        tokens["control"].as_str().unwrap().to_string(),
    )
}

/// `(status, error message)` of a refused WebSocket upgrade.
fn refusal(result: Result<Socket, (u16, String)>) -> (u16, String) {
    let Err((status, body)) = result else {
        panic!("the upgrade was accepted")
    };
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    (
        status,
        body["error"]["message"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn read_tokens_follow_and_control_tokens_type() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Serve, &redis).start().await;
    let answer = daemon.submit(&interactive(ECHO)).await;
    assert_eq!(answer.status, 202, "{answer:#?}");
    let id = answer.id();
    let (read, control) = tokens_of(&answer);
    // `token` is the control token, as the first answers had it.
    assert_eq!(answer.body["token"], control.as_str());
    assert_ne!(read, control);
    assert!(read.starts_with(&format!("{id}.read.")), "{read}");
    assert!(control.starts_with(&format!("{id}.control.")), "{control}");

    // The read token follows the events; its stdin is refused on this
    // connection, which stays open.
    let mut reader = connect(&daemon, &id, &read).await.unwrap();
    // One `print` may reach the stream as more than one chunk.
    let mut seen = String::new();
    frames_until(&mut reader, |f| {
        if f["type"] == "stdout" {
            seen.push_str(f["data"].as_str().unwrap());
        }
        seen.ends_with("ready\n")
    })
    .await;
    send(
        &mut reader,
        json!({"type": "stdin", "data": "from the reader\n"}),
    )
    .await;
    let refused = frames_until(&mut reader, |f| f["type"] == "error").await;
    assert_eq!(
        refused.last().unwrap()["message"],
        "this connection has the job's read token: stdin and signals need its control token"
    );
    send(&mut reader, json!({"type": "signal", "signal": "kill"})).await;
    let refused = frames_until(&mut reader, |f| f["type"] == "error").await;
    assert!(
        refused.last().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("read token")
    );

    // The control token's stdin reaches the program; the reader sees it.
    let mut controller = connect(&daemon, &id, &control).await.unwrap();
    send(
        &mut controller,
        json!({"type": "stdin", "data": "from the controller\n"}),
    )
    .await;
    let frames = frames_until(&mut reader, |f| f["type"] == "exit").await;
    let stdout: String = frames
        .iter()
        .filter(|f| f["type"] == "stdout")
        .filter_map(|f| f["data"].as_str())
        .collect();
    assert_eq!(stdout, "echo: from the controller\n");
    assert_eq!(frames.last().unwrap()["status"], "succeeded");

    // The read token opens the SSE stream of the finished job.
    let events = daemon
        .get(&format!("/v1/jobs/{id}/events?token={read}"), None)
        .await;
    assert_eq!(events.status, 200, "{events:#?}");
    assert!(
        events.body.as_str().unwrap().contains("event: exit"),
        "{events:#?}"
    );
    daemon.assert_no_sandboxes().await;
}

#[tokio::test]
async fn forged_expired_and_other_jobs_tokens_are_refused() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_TOKEN_TTL_SECS", 2)
        .start()
        .await;
    let first = daemon.submit(&scripted::json("print one")).await;
    let id = first.id();
    let (read, control) = tokens_of(&first);
    // The control token is let through while it is valid. With a 2 s TTL it
    // is valid for 1 to 2 s after the submit, so it is tried at once.
    assert!(connect(&daemon, &id, &control).await.is_ok());
    let second = daemon.submit(&scripted::json("print two")).await;
    let (_, other_control) = tokens_of(&second);

    let promoted = read.replacen(".read.", ".control.", 1);
    assert_eq!(
        refusal(connect(&daemon, &id, &promoted).await),
        (401, "the attach token is not valid".to_string())
    );
    // A token signed with another secret.
    let stranger = TokenSigner::new(
        b"not this server's secret, 32 bytes",
        Duration::from_secs(60),
    );
    assert_eq!(
        refusal(connect(&daemon, &id, &stranger.sign(&id, Scope::Control)).await),
        (401, "the attach token is not valid".to_string())
    );
    assert_eq!(
        refusal(connect(&daemon, &id, &other_control).await),
        (403, "the attach token is for another job".to_string())
    );
    daemon.wait_terminal(&id, WAIT).await;

    // Two seconds after the submit both have expired.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match connect(&daemon, &id, &control).await {
            Ok(_) => assert!(Instant::now() < deadline, "the token never expired"),
            Err(refused) => {
                let body: Value = serde_json::from_str(&refused.1).unwrap();
                assert_eq!(refused.0, 401);
                assert_eq!(body["error"]["message"], "the attach token has expired");
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let events = daemon
        .get(&format!("/v1/jobs/{id}/events?token={read}"), None)
        .await;
    assert_eq!(events.status, 401);
    assert_eq!(events.error().1, "the attach token has expired");
}

#[tokio::test]
async fn cancelling_a_job_revokes_its_tokens() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Serve, &redis).start().await;
    let answer = daemon.submit(&interactive(ECHO)).await;
    let id = answer.id();
    let (read, control) = tokens_of(&answer);
    let mut controller = connect(&daemon, &id, &control).await.unwrap();
    frames_until(&mut controller, |f| f["type"] == "stdout").await;

    let cancelled = daemon.cancel(&id).await;
    assert_eq!(cancelled.status, 202, "{cancelled:#?}");
    // The open connection can no longer type into the job...
    send(
        &mut controller,
        json!({"type": "stdin", "data": "too late\n"}),
    )
    .await;
    let frames = frames_until(&mut controller, |f| {
        f["type"] == "error" || f["type"] == "exit"
    })
    .await;
    let last = frames.last().unwrap();
    if last["type"] == "error" {
        assert_eq!(
            last["message"],
            "the attach token was revoked: the job was cancelled"
        );
    }
    // ...and neither token opens anything any more.
    for token in [&read, &control] {
        assert_eq!(
            refusal(connect(&daemon, &id, token).await),
            (
                401,
                "the attach token was revoked: the job was cancelled".to_string()
            )
        );
        let events = daemon
            .get(&format!("/v1/jobs/{id}/events?token={token}"), None)
            .await;
        assert_eq!(events.status, 401, "{events:#?}");
    }
    // The key still sees the job.
    let view = daemon.wait_terminal(&id, WAIT).await;
    assert_eq!(view["status"], "cancelled");
    daemon.assert_no_sandboxes().await;
}

#[tokio::test]
async fn a_reader_of_redis_cannot_sign_tokens() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Api, &redis).start().await;
    let answer = daemon.submit(&scripted::json("print x")).await;
    let id = answer.id();
    let (read, _) = tokens_of(&answer);
    // (No worker: the job stays queued, and its streams stay open.)
    assert!(connect(&daemon, &id, &read).await.is_ok());
    // Every string value and hash field in Redis, tried as the secret.
    let mut candidates = Vec::new();
    for key in redis.cli(&["--scan"]).lines() {
        match redis.cli(&["type", key]).as_str() {
            "string" => candidates.push(redis.cli(&["get", key])),
            "hash" => candidates.extend(redis.cli(&["hvals", key]).lines().map(str::to_string)),
            _ => {}
        }
    }
    assert!(!candidates.is_empty());
    for candidate in candidates {
        let signer = TokenSigner::new(candidate.as_bytes(), Duration::from_secs(60));
        let forged = signer.sign(&id, Scope::Read);
        assert_eq!(
            refusal(connect(&daemon, &id, &forged).await),
            (401, "the attach token is not valid".to_string()),
            "signed with a Redis value"
        );
    }
}

#[tokio::test]
async fn every_replica_shares_the_token_secret_through_redis() {
    // Replicas with the same keys (in any order) and no configured secret
    // derive the same secret from the salt in Redis.
    let api = Setup::new(KEYS).start().await;
    let same_keys = ApiKeys::parse(&KEYS.split(',').rev().collect::<Vec<_>>().join(",")).unwrap();
    let other = TokenSigner::from_config(None, &same_keys, &api.store, Duration::from_secs(60))
        .await
        .unwrap();
    let id = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        api.state
            .tokens()
            .verify(&id, &other.sign(&id, Scope::Read)),
        Ok(Scope::Read)
    );
    let configured = TokenSigner::from_config(
        Some("a configured secret of at least 32 bytes"),
        &same_keys,
        &api.store,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(
        api.state
            .tokens()
            .verify(&id, &configured.sign(&id, Scope::Control))
            .is_err()
    );
}

#[tokio::test]
async fn a_short_token_secret_is_refused_without_showing_it() {
    let output = run_to_end(
        &["api"],
        &[
            ("CODE_RUNNER_API_KEYS", "a:key-a-0123456789"),
            (
                "CODE_RUNNER_TOKEN_SECRET",
                "only-31-bytes-long-secret-value",
            ),
        ],
    );
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "code-runner: invalid configuration: CODE_RUNNER_TOKEN_SECRET: must be at least 32 bytes, \
         it is 31 (for example: openssl rand -hex 32)\n"
    );
}

#[tokio::test]
async fn help_never_shows_secret_values() {
    let secrets = [
        ("CODE_RUNNER_API_KEYS", "a:api-key-that-must-stay-hidden"),
        (
            "CODE_RUNNER_TOKEN_SECRET",
            "token-secret-that-must-stay-hidden-0123",
        ),
        (
            "CODE_RUNNER_REDIS_URL",
            "redis://:redis-password-hidden@127.0.0.1:1",
        ),
        ("CODE_RUNNER_API_KEY", "client-key-that-must-stay-hidden"),
    ];
    for command in [
        &["serve", "--help"][..],
        &["api", "--help"],
        &["run", "--help"],
        &["worker", "--help"],
    ] {
        let output = run_to_end(command, &secrets);
        assert_eq!(output.status.code(), Some(0), "{command:?}: {output:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains("CODE_RUNNER_"), "{command:?}: {text}");
        for hidden in ["must-stay-hidden", "redis-password-hidden"] {
            assert!(
                !text.contains(hidden),
                "{command:?} shows a secret:\n{text}"
            );
        }
    }
}
