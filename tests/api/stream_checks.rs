//! What a job's stream checks and refuses, on a whole process in the test
//! (the scripted engine, a real redis-server): keys, tokens and jobs
//! before the upgrade, an expired token, frames it cannot read (an error
//! event, the connection stays), stdin beyond the job's budget, and input
//! to a job that ended or is gone.

use std::time::Duration;

use code_runner::store::{Control, InputOutcome, Store};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::common::client::{KEY_A, KEY_B};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;
use crate::common::scripted;
use crate::ws::{Auth, Ws, echo_lines, exit_of, interactive, stdin, stdout_of, token_of};

const JOB_DEADLINE: Duration = Duration::from_secs(90);

async fn serve(redis: &RedisServer) -> InProcess {
    InProcessBuilder::new(Role::Serve, redis).start().await
}

/// Budgets with `stdin_bytes` of stdin and room for everything else.
fn budgets(stdin_bytes: u64) -> code_runner::store::InputBudgets {
    code_runner::store::InputBudgets {
        stdin_bytes,
        signals: 1000,
        messages: 1000,
        key_storage: 1 << 30,
    }
}

#[tokio::test]
async fn tokens_keys_and_jobs_are_checked_before_the_upgrade() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let first = daemon.submit(&scripted::json("print hi")).await;
    let second = daemon.submit(&scripted::json("print ho")).await;
    let (id, token) = (first.id(), token_of(&first));
    let other_token = token_of(&second);
    daemon.wait_terminal(&id, JOB_DEADLINE).await;

    let status = |r: Result<Ws, u16>| r.err().unwrap_or(101);
    assert_eq!(
        status(Ws::connect(&daemon, &id, None, Auth::None).await),
        401
    );
    assert_eq!(
        status(Ws::connect(&daemon, &id, None, Auth::Query("1.2.3")).await),
        401
    );
    // The expiry moved forward: the signature no longer matches.
    let forged = format!("{id}.9{}", &token[id.len() + 1..]);
    assert_eq!(
        status(Ws::connect(&daemon, &id, None, Auth::Query(&forged)).await),
        401
    );
    assert_eq!(
        status(Ws::connect(&daemon, &id, None, Auth::Query(&other_token)).await),
        403
    );
    assert_eq!(
        status(Ws::connect(&daemon, &id, None, Auth::Subprotocol(&other_token)).await),
        403
    );
    assert_eq!(
        status(Ws::connect(&daemon, &id, None, Auth::Key(KEY_B)).await),
        404
    );
    assert_eq!(
        status(Ws::connect(&daemon, &id, None, Auth::Key("not-a-key-0123456789")).await),
        401
    );
    let unknown = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        status(Ws::connect(&daemon, &unknown, None, Auth::Key(KEY_A)).await),
        404
    );

    // The token works as a query parameter and as a subprotocol; the server
    // selects `code-runner` and never echoes the token.
    for (auth, protocol) in [
        (Auth::Query(&token), None),
        (Auth::Subprotocol(&token), Some("code-runner")),
    ] {
        let mut ws = Ws::connect(&daemon, &id, None, auth).await.unwrap();
        assert_eq!(ws.protocol.as_deref(), protocol);
        let frames = ws.rest().await;
        assert_eq!(exit_of(&frames)["status"], "succeeded");
        assert_eq!(ws.close, Some(1000));
    }

    // The SSE stream checks the same way.
    let events = |query: String, key: Option<&'static str>| {
        let daemon = &daemon;
        let id = id.clone();
        async move {
            daemon
                .get(&format!("/v1/jobs/{id}/events{query}"), key)
                .await
                .status
                .as_u16()
        }
    };
    assert_eq!(events(String::new(), None).await, 401);
    assert_eq!(events(format!("?token={other_token}"), None).await, 403);
    assert_eq!(events(String::new(), Some(KEY_B)).await, 404);
    assert_eq!(events(format!("?token={token}"), None).await, 200);
    assert_eq!(events("?after=x".into(), Some(KEY_A)).await, 400);

    // A job whose keys expired is gone: 404 even with its token.
    redis.cli(&["DEL", &format!("job:{id}"), &format!("job:{id}:events")]);
    assert_eq!(
        status(Ws::connect(&daemon, &id, None, Auth::Query(&token)).await),
        404
    );
}

#[tokio::test]
async fn an_expired_token_is_refused() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_TOKEN_TTL_SECS", 1)
        .start()
        .await;
    let answer = daemon.submit(&scripted::json("print hi")).await;
    let (id, token) = (answer.id(), token_of(&answer));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let refused = Ws::connect(&daemon, &id, None, Auth::Query(&token)).await;
    assert_eq!(refused.err(), Some(401));
    let answer = daemon
        .get(&format!("/v1/jobs/{id}/events?token={token}"), None)
        .await;
    assert_eq!(answer.status, 401, "{answer:#?}");
    assert!(answer.error().1.contains("expired"), "{answer:#?}");
}

#[tokio::test]
async fn bad_frames_get_an_error_event_and_the_connection_stays() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let id = daemon.submit(&interactive(&echo_lines(1))).await.id();
    let mut ws = Ws::open(&daemon, &id, None).await;
    let oversize = stdin(&"x".repeat(70 * 1024)).to_string();
    let cases: Vec<(Message, &str)> = vec![
        (Message::text("hello"), "the frame is not JSON"),
        (
            Message::text(r#"{"type":"shout","data":"x"}"#),
            "unknown variant `shout`",
        ),
        (Message::text(r#"{"data":"x"}"#), "missing field `type`"),
        (
            Message::text(r#"{"type":"stdin","data":"@@@","encoding":"base64"}"#),
            "not valid base64",
        ),
        (
            Message::text(r#"{"type":"signal","signal":"hup"}"#),
            "unknown variant `hup`",
        ),
        (
            Message::binary(vec![1u8, 2, 3]),
            "binary frames are not accepted",
        ),
        (Message::text(oversize), "over the limit of 65536"),
    ];
    for (message, expected) in cases {
        ws.send_raw(message).await;
        let frames = ws.until(|f| f["type"] == "error").await;
        let error = frames.last().unwrap();
        assert!(error.get("seq").is_none(), "{error}");
        let text = error["message"].as_str().unwrap();
        assert!(
            text.contains(expected),
            "{text:?} does not say {expected:?}"
        );
    }
    // Still usable.
    ws.send(stdin("fine\n")).await;
    let frames = ws
        .until(|f| f["type"] == "stdout" && f["data"].as_str().unwrap().contains("fine"))
        .await;
    assert!(stdout_of(&frames).contains("echo: fine\n"));
    ws.send(json!({"type": "stdin_close"})).await;
    let frames = ws.rest().await;
    assert_eq!(exit_of(&frames)["status"], "succeeded");
    assert_eq!(ws.close, Some(1000));

    // A message the server will not even read (over 1 MiB) closes with 1009,
    // as soon as its header announces the length. Only the header is written:
    // a client still writing the body when the server closes gets a reset
    // that can swallow the close frame.
    let id = daemon.submit(&interactive(&echo_lines(1))).await.id();
    let mut ws = Ws::open(&daemon, &id, None).await;
    ws.send_header_of_text_frame(2 << 20).await;
    ws.rest().await;
    assert_eq!(ws.close, Some(1009));
    daemon.cancel(&id).await;
}

#[tokio::test]
async fn stdin_beyond_the_budget_is_refused_with_an_error() {
    let redis = RedisServer::start();
    // No worker: the job stays queued and its stdin waits in Redis.
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let id = api.submit(&interactive(&echo_lines(1))).await.id();
    let mut ws = Ws::open(&api, &id, None).await;
    let budget: usize = 8 << 20;
    let chunk = "y".repeat(64 * 1000);
    let mut sent = 0;
    while sent + chunk.len() <= budget {
        ws.send(stdin(&chunk)).await;
        sent += chunk.len();
    }
    // One more chunk does not fit: refused whole, with the numbers.
    ws.send(stdin(&chunk)).await;
    let frames = ws.until(|f| f["type"] == "error").await;
    let message = frames.last().unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains(&format!("at most {budget} bytes"))
            && message.contains(&format!("{sent} were sent")),
        "{message}"
    );
    assert_eq!(redis.job_field(&id, "stdin_bytes"), sent.to_string());
    // What still fits goes through (no error), counted across connections.
    let mut again = Ws::open(&api, &id, None).await;
    again.send(stdin(&"z".repeat(budget - sent))).await;
    again.send(stdin("!")).await;
    let frames = again.until(|f| f["type"] == "error").await;
    assert!(
        frames.last().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("these 1 bytes were not delivered")
    );
    assert_eq!(redis.job_field(&id, "stdin_bytes"), budget.to_string());
    // Cancelled: both clients get the exit and a normal close.
    assert_eq!(api.cancel(&id).await.status, 200);
    for client in [&mut ws, &mut again] {
        let frames = client.rest().await;
        assert_eq!(exit_of(&frames)["status"], "cancelled");
        assert_eq!(client.close, Some(1000));
    }
}

#[tokio::test]
async fn input_to_an_ended_or_gone_job_is_refused_by_the_queue() {
    let redis = RedisServer::start();
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let store = Store::new(&redis.url(), "", Duration::from_secs(60), 2).unwrap();
    let id = api.submit(&interactive(&echo_lines(1))).await.id();
    assert_eq!(
        store
            .jobs()
            .send_input(&id, &Control::Stdin(b"abc".to_vec()), budgets(5))
            .await
            .unwrap(),
        InputOutcome::Sent { stdin_bytes: 3 }
    );
    assert_eq!(
        store
            .jobs()
            .send_input(&id, &Control::Stdin(b"abc".to_vec()), budgets(5))
            .await
            .unwrap(),
        InputOutcome::OverBudget { stdin_bytes: 3 }
    );
    assert_eq!(
        store
            .jobs()
            .send_input(&id, &Control::StdinClose, budgets(5))
            .await
            .unwrap(),
        InputOutcome::Sent { stdin_bytes: 3 }
    );
    assert_eq!(redis.cli(&["XLEN", &format!("job:{id}:stdin")]), "2");
    assert_eq!(api.cancel(&id).await.status, 200);
    assert_eq!(
        store
            .jobs()
            .send_input(&id, &Control::StdinClose, budgets(5))
            .await
            .unwrap(),
        InputOutcome::Ended(code_runner::job::Status::Cancelled)
    );
    let unknown = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        store
            .jobs()
            .send_input(&unknown, &Control::StdinClose, budgets(5))
            .await
            .unwrap(),
        InputOutcome::Missing
    );
    // No key was made for the unknown job.
    assert_eq!(
        redis.cli(&[
            "EXISTS",
            &format!("job:{unknown}"),
            &format!("job:{unknown}:stdin")
        ]),
        "0"
    );
}
