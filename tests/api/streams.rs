//! The streams of a job end to end: `GET /v1/jobs/{id}/ws` and
//! `GET /v1/jobs/{id}/events` of a whole process in the test, with a real
//! redis-server and the scripted engine; driven by clients not written in
//! this project (Python's `websockets`, `curl -N`) and by tokio-tungstenite
//! ([`crate::ws`]): an interactive program, replay and resume, stdin sent
//! while queued, `input_wanted`, signals, and a server that shuts down.
//! What a stream refuses is in [`crate::stream_checks`], a queued job's
//! place in [`crate::stream_places`].

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::client::{KEY_A, curl_events, sse_events};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;
use crate::common::scripted;
use crate::ws::{Ws, echo_lines, exit_of, interactive, seqs, stdin, stdout_of, token_of, ws_url};

async fn serve(redis: &RedisServer) -> InProcess {
    InProcessBuilder::new(Role::Serve, redis).start().await
}

const PYTHON_CLIENT: &str = r#"
import asyncio, json, sys
import websockets

async def main(url, token, lines):
    frames = []
    async with websockets.connect(url, subprotocols=["code-runner", "token." + token]) as ws:
        async def until(pred):
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
                frames.append(frame)
                if pred(frame):
                    return
        for line in lines:
            await ws.send(json.dumps({"type": "stdin", "data": line + "\n"}))
            await until(lambda f: f.get("type") == "stdout" and ("echo: " + line + "\n") in
                        "".join(x["data"] for x in frames if x.get("type") == "stdout"))
            frames.append({"client": "sent-next"})
        await ws.send(json.dumps({"type": "stdin_close"}))
        try:
            while True:
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
        except websockets.exceptions.ConnectionClosedOK as closed:
            close = closed.rcvd.code if closed.rcvd else None
        print(json.dumps({"protocol": ws.subprotocol, "close": close, "frames": frames}))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
"#;

#[tokio::test]
async fn python_websockets_drives_an_interactive_echo_program() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let answer = daemon.submit(&interactive(&echo_lines(3))).await;
    assert_eq!(answer.status, 202, "{answer:#?}");
    let id = answer.id();
    let token = token_of(&answer);
    let url = ws_url(&daemon, &id, &[]);
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("/usr/bin/python3")
            .args(["-c", PYTHON_CLIENT, &url, &token, "one", "two", "three"])
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the Python client failed: {}{}",
        String::from_utf8_lossy(&output.stderr),
        daemon.log_tail(40)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["protocol"], "code-runner", "{report:#}");
    assert_eq!(report["close"], 1000, "{report:#}");
    let frames: Vec<Value> = report["frames"].as_array().unwrap().clone();
    // Each reply came before the next line was sent: the client only sent
    // the next line after the reply arrived, and it did arrive.
    // Its events: not the client's markers, nor the queue places (no seq).
    let events: Vec<Value> = frames
        .iter()
        .filter(|f| f.get("client").is_none() && f["type"] != "queued")
        .cloned()
        .collect();
    let numbered = seqs(&events);
    assert_eq!(numbered, (1..=numbered.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        stdout_of(&events),
        "echo: one\necho: two\necho: three\nbye\n"
    );
    let exit = exit_of(&events);
    assert_eq!(exit["status"], "succeeded", "{exit:#}");
    assert_eq!(exit["result"]["run"]["exit_code"], 0, "{exit:#}");
    assert_eq!(events[0]["type"], "status");
    assert_eq!(events[0]["status"], "queued");
}

#[tokio::test]
async fn reconnecting_with_after_loses_and_repeats_nothing_and_clients_agree() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let answer = daemon
        .submit(&scripted::json("repeat 30\nprint {i}\nsleep 50\nend\n"))
        .await;
    let id = answer.id();
    let mut whole = Ws::open(&daemon, &id, None).await;
    let mut first = Ws::open(&daemon, &id, None).await;
    // Part of the run, then the client goes away in the middle.
    let head = first.until(|f| f["type"] == "stdout").await;
    let last_seen = *seqs(&head).last().unwrap();
    drop(first);
    let mut second = Ws::open(&daemon, &id, Some(last_seen)).await;
    let tail = second.rest().await;
    assert_eq!(second.close, Some(1000));
    let resumed: Vec<Value> = head.into_iter().chain(tail).collect();
    let numbered = seqs(&resumed);
    assert_eq!(numbered, (1..=numbered.len() as u64).collect::<Vec<_>>());
    exit_of(&resumed);
    let stdout = stdout_of(&resumed);
    let expected: String = (0..30).map(|i| format!("{i}\n")).collect();
    assert_eq!(stdout, expected);

    let all = whole.rest().await;
    assert_eq!(whole.close, Some(1000));
    assert_eq!(all, resumed, "two clients of one job saw different events");

    // A client that comes after the end gets the whole story, and the close.
    let mut late = Ws::open(&daemon, &id, None).await;
    assert_eq!(late.rest().await, all);
    assert_eq!(late.close, Some(1000));
    // Resuming after the exit: nothing more, a normal close.
    let mut after_end = Ws::open(&daemon, &id, Some(numbered.len() as u64)).await;
    assert_eq!(after_end.rest().await, Vec::<Value>::new());
    assert_eq!(after_end.close, Some(1000));
}

#[tokio::test]
async fn stdin_sent_while_queued_is_delivered_in_order() {
    let redis = RedisServer::start();
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let answer = api.submit(&interactive(&echo_lines(2))).await;
    let id = answer.id();
    let mut ws = Ws::open(&api, &id, None).await;
    let queued = ws.next().await.unwrap();
    assert_eq!(queued["status"], "queued");
    ws.send(stdin("first\n")).await;
    ws.send(json!({"type": "stdin", "data": "c2Vjb25kCg==", "encoding": "base64"}))
        .await;
    ws.send(json!({"type": "stdin_close"})).await;
    assert_eq!(api.job(&id).await["status"], "queued");
    let _worker = InProcessBuilder::new(Role::Worker, &redis).start().await;
    let frames = ws.rest().await;
    assert_eq!(ws.close, Some(1000));
    assert_eq!(stdout_of(&frames), "echo: first\necho: second\nbye\n");
    assert_eq!(exit_of(&frames)["status"], "succeeded");
}

/// `input_wanted` on the stream: stored (with a seq) after the prompt, once
/// per wait, on the WebSocket and on the SSE stream alike.
#[tokio::test]
async fn a_program_waiting_for_input_says_input_wanted_after_its_prompt() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let answer = daemon
        .submit(&interactive(
            "write name?\\x20\nread\nwrite age?\\x20\nread\nprint ada is 42\n",
        ))
        .await;
    assert_eq!(answer.status, 202, "{answer:#?}");
    let id = answer.id();
    let mut ws = Ws::open(&daemon, &id, None).await;
    let mut frames = ws.until(|f| f["type"] == "input_wanted").await;
    ws.send(stdin("ada\n")).await;
    frames.extend(ws.until(|f| f["type"] == "input_wanted").await);
    ws.send(stdin("42\n")).await;
    frames.extend(ws.rest().await);
    assert_eq!(ws.close, Some(1000));
    // What a terminal shows, with the waits where they came.
    let shown: Vec<String> = frames
        .iter()
        .filter_map(|f| match f["type"].as_str() {
            Some("stdout") => Some(format!("out:{}", f["data"].as_str().unwrap())),
            Some("input_wanted") => Some("wanted".to_string()),
            _ => None,
        })
        .fold(Vec::new(), |mut shown: Vec<String>, line| {
            match shown.last_mut() {
                Some(last) if last.starts_with("out:") && line.starts_with("out:") => {
                    last.push_str(&line[4..])
                }
                _ => shown.push(line),
            }
            shown
        });
    assert_eq!(
        shown,
        [
            "out:name? ",
            "wanted",
            "out:age? ",
            "wanted",
            "out:ada is 42\n"
        ]
    );
    let wanted: Vec<&Value> = frames
        .iter()
        .filter(|f| f["type"] == "input_wanted")
        .collect();
    for frame in &wanted {
        // Nothing but its seq and its type.
        assert_eq!(frame.as_object().unwrap().len(), 2, "{frame}");
        assert!(frame["seq"].as_u64().is_some(), "{frame}");
    }
    assert_eq!(exit_of(&frames)["status"], "succeeded");
    // The SSE stream replays the same events, `input_wanted` among them.
    let (text, code) = curl_events(
        &daemon,
        &id,
        "",
        &[format!("Authorization: Bearer {KEY_A}")],
    )
    .await;
    assert_eq!(code, "200", "{text}");
    let replayed: Vec<(u64, String)> = sse_events(&text)
        .into_iter()
        .filter(|(_, kind, _)| kind == "input_wanted")
        .map(|(seq, kind, _)| (seq, kind))
        .collect();
    let expected: Vec<(u64, String)> = wanted
        .iter()
        .map(|f| (f["seq"].as_u64().unwrap(), "input_wanted".to_string()))
        .collect();
    assert_eq!(replayed, expected);
}

/// Says `ready`, then runs until it is killed; an interrupt makes it say
/// `caught` and carry on (as a Python program catching
/// `KeyboardInterrupt` would).
const SIGNALS: &str = "print ready\ncatch SIGINT caught\nforever\nsleep 50\nend\n";

#[tokio::test]
async fn interrupt_is_a_keyboard_interrupt_and_kill_ends_the_program() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let id = daemon.submit(&interactive(SIGNALS)).await.id();
    let mut ws = Ws::open(&daemon, &id, None).await;
    let mut frames = Vec::new();
    ws.until_stdout_ends_with(&mut frames, "ready\n").await;
    assert_eq!(stdout_of(&frames), "ready\n");
    ws.send(json!({"type": "signal", "signal": "interrupt"}))
        .await;
    ws.until_stdout_ends_with(&mut frames, "caught\n").await;
    assert_eq!(stdout_of(&frames), "ready\ncaught\n");
    ws.send(json!({"type": "signal", "signal": "kill"})).await;
    frames.extend(ws.rest().await);
    assert_eq!(ws.close, Some(1000));
    let exit = exit_of(&frames);
    let run = &exit["result"]["run"];
    assert_eq!(run["reason"], "killed", "{exit:#}");
    assert_eq!(exit["status"], KILLED_STATUS, "{exit:#}");
}

/// The job status of a program killed by its client's `kill`.
const KILLED_STATUS: &str = "failed";

#[tokio::test]
async fn curl_reads_the_events_of_a_job_and_resumes_with_last_event_id() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let answer = daemon
        .submit(&scripted::json("print out\neprint err\n"))
        .await;
    let (id, token) = (answer.id(), token_of(&answer));
    // Followed live by curl, which ends when the stream ends after `exit`.
    let (live, code) = curl_events(
        &daemon,
        &id,
        "",
        &[format!("Authorization: Bearer {KEY_A}")],
    )
    .await;
    assert_eq!(code, "200", "{live}");
    let events = sse_events(&live);
    let ids: Vec<u64> = events.iter().map(|e| e.0).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "{live}");
    for (seq, kind, data) in &events {
        assert_eq!(data["seq"], *seq);
        assert_eq!(data["type"], kind.as_str());
    }
    let (_, last_kind, exit) = events.last().unwrap();
    assert_eq!(last_kind, "exit");
    assert_eq!(exit["result"]["run"]["stdout"], "out\n");
    // The wire form puts seq first.
    assert!(
        live.contains("data: {\"seq\":1,\"type\":\"status\",\"status\":\"queued\"}"),
        "{live}"
    );

    // The same events with the token, after the job ended. Compared as
    // events: the live text can also hold a keep-alive comment (sent after
    // 15 s of silence, as on a loaded machine).
    let (again, code) = curl_events(&daemon, &id, &format!("?token={token}"), &[]).await;
    assert_eq!(code, "200", "{again}");
    assert_eq!(sse_events(&again), events, "{again}");
    // Resumed: only what came after.
    let (resumed, code) = curl_events(
        &daemon,
        &id,
        "?after=1",
        &[
            format!("Authorization: Bearer {KEY_A}"),
            "Last-Event-ID: 2".into(),
        ],
    )
    .await;
    assert_eq!(code, "200");
    let resumed = sse_events(&resumed);
    assert_eq!(resumed, events[2..].to_vec());
    let (from_query, _) = curl_events(&daemon, &id, &format!("?after=1&token={token}"), &[]).await;
    assert_eq!(sse_events(&from_query), events[1..].to_vec());
    // After the exit: 204, which stops an EventSource from reconnecting.
    let (nothing, code) = curl_events(
        &daemon,
        &id,
        "",
        &[
            format!("Authorization: Bearer {KEY_A}"),
            format!("Last-Event-ID: {}", ids.len()),
        ],
    )
    .await;
    assert_eq!((nothing.as_str(), code.as_str()), ("", "204"));
}

#[tokio::test]
async fn a_shutting_down_server_closes_with_going_away() {
    let redis = RedisServer::start();
    let mut api = InProcessBuilder::new(Role::Api, &redis).start().await;
    let id = api.submit(&interactive(&echo_lines(1))).await.id();
    let mut ws = Ws::open(&api, &id, None).await;
    let queued = ws.next().await.unwrap();
    assert_eq!(queued["seq"], 1);
    api.shut_down();
    assert_eq!(ws.rest().await, Vec::<Value>::new());
    assert_eq!(ws.close, Some(1001));
    assert_eq!(api.wait_exit(Duration::from_secs(15)).await, 0);
}
