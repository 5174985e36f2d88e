//! The streams of a job end to end (issue 4): `GET /v1/jobs/{id}/ws` and
//! `GET /v1/jobs/{id}/events` of the real binary, with a real redis-server
//! and the real dockerd; driven by clients not written in this project
//! (Python's `websockets`, `curl -N`) and by tokio-tungstenite.

mod common;

use std::time::Duration;

use code_runner::store::{Control, InputOutcome, Store};
use common::daemon;
use common::redis_server::RedisServer;
use daemon::{Daemon, DaemonBuilder, KEY_A, KEY_B, Role, curl_events, python, sse_events};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

const JOB_DEADLINE: Duration = Duration::from_secs(90);
/// Longest wait for one frame in these tests.
const FRAME_WAIT: Duration = Duration::from_secs(60);

/// A Python program that echoes each line it reads until EOF.
const ECHO: &str = "\
while True:
    try:
        line = input()
    except EOFError:
        print('bye', flush=True)
        break
    print('echo: ' + line, flush=True)
";

fn interactive(source: &str) -> Value {
    let mut job = python(source);
    job["interactive"] = json!(true);
    job
}

/// How a client presents itself.
enum Auth<'a> {
    Key(&'a str),
    Query(&'a str),
    Subprotocol(&'a str),
    None,
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket client of a job's stream.
struct Ws {
    socket: Socket,
    /// The subprotocol the server selected.
    protocol: Option<String>,
    /// The close code, once the server closed.
    close: Option<u16>,
    /// Whether [`Ws::next`] gives a queued job's `queued` places too (they
    /// have no seq, are not stored and come when the place is read, so the
    /// tests of the stored events leave them out).
    places: bool,
}

fn ws_url(daemon: &Daemon, id: &str, query: &[(&str, String)]) -> String {
    let mut url = format!("{}/v1/jobs/{id}/ws", daemon.url.replacen("http", "ws", 1));
    for (index, (name, value)) in query.iter().enumerate() {
        url.push(if index == 0 { '?' } else { '&' });
        url.push_str(&format!("{name}={value}"));
    }
    url
}

impl Ws {
    /// Connects; `Err(status)` when the server refused the upgrade.
    async fn connect(
        daemon: &Daemon,
        id: &str,
        after: Option<u64>,
        auth: Auth<'_>,
    ) -> Result<Ws, u16> {
        let mut query = Vec::new();
        if let Some(after) = after {
            query.push(("after", after.to_string()));
        }
        if let Auth::Query(token) = &auth {
            query.push(("token", (*token).to_string()));
        }
        let mut request = ws_url(daemon, id, &query).into_client_request().unwrap();
        match &auth {
            Auth::Key(key) => {
                request
                    .headers_mut()
                    .insert("authorization", format!("Bearer {key}").parse().unwrap());
            }
            Auth::Subprotocol(token) => {
                request.headers_mut().insert(
                    "sec-websocket-protocol",
                    format!("code-runner, token.{token}").parse().unwrap(),
                );
            }
            Auth::Query(_) | Auth::None => {}
        }
        match tokio_tungstenite::connect_async(request).await {
            Ok((socket, response)) => Ok(Ws {
                socket,
                protocol: response
                    .headers()
                    .get("sec-websocket-protocol")
                    .map(|v| v.to_str().unwrap().to_string()),
                close: None,
                places: false,
            }),
            Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
            Err(other) => panic!("the WebSocket connection failed: {other}"),
        }
    }

    async fn open(daemon: &Daemon, id: &str, after: Option<u64>) -> Ws {
        Ws::connect(daemon, id, after, Auth::Key(KEY_A))
            .await
            .unwrap_or_else(|status| panic!("the WebSocket was refused with {status}"))
    }

    /// The next text frame as JSON (places only with `places`); `None`
    /// once the server closed.
    async fn next(&mut self) -> Option<Value> {
        loop {
            let frame = self.next_frame().await?;
            if self.places || frame["type"] != "queued" {
                return Some(frame);
            }
        }
    }

    async fn next_frame(&mut self) -> Option<Value> {
        loop {
            let frame = tokio::time::timeout(FRAME_WAIT, self.socket.next())
                .await
                .expect("a frame within the wait");
            match frame {
                Some(Ok(Message::Text(text))) => {
                    return Some(
                        serde_json::from_str(text.as_str())
                            .unwrap_or_else(|e| panic!("a frame that is not JSON: {text:?}: {e}")),
                    );
                }
                Some(Ok(Message::Close(frame))) => {
                    self.close = Some(frame.map_or(1005, |f| u16::from(f.code)));
                }
                Some(Ok(Message::Binary(_))) => panic!("the server sent a binary frame"),
                Some(Ok(_)) => {}
                None | Some(Err(_)) => return None,
            }
        }
    }

    /// Frames until one matches `done` (returned last).
    async fn until(&mut self, mut done: impl FnMut(&Value) -> bool) -> Vec<Value> {
        let mut frames = Vec::new();
        loop {
            let frame = self
                .next()
                .await
                .unwrap_or_else(|| panic!("the stream closed; frames so far: {frames:#?}"));
            let stop = done(&frame);
            frames.push(frame);
            if stop {
                return frames;
            }
        }
    }

    /// Reads into `frames` until their stdout together ends with `text`: a
    /// program's one `print` may reach the stream as more than one chunk.
    async fn until_stdout_ends_with(&mut self, frames: &mut Vec<Value>, text: &str) {
        while !stdout_of(frames).ends_with(text) {
            let more = self.until(|f| f["type"] == "stdout").await;
            frames.extend(more);
        }
    }

    /// Every frame until the server closes.
    async fn rest(&mut self) -> Vec<Value> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        frames
    }

    async fn send(&mut self, frame: Value) {
        self.socket
            .send(Message::text(frame.to_string()))
            .await
            .unwrap();
    }

    /// Writes only the (masked) header of a text frame announcing `length`
    /// payload bytes, straight to the TCP stream.
    async fn send_header_of_text_frame(&mut self, length: u64) {
        use tokio::io::AsyncWriteExt;
        let mut header = vec![0x81u8, 0x80 | 127];
        header.extend_from_slice(&length.to_be_bytes());
        header.extend_from_slice(&[0x12, 0x34, 0x56, 0x78]);
        let stream = self.socket.get_mut();
        stream.write_all(&header).await.unwrap();
        stream.flush().await.unwrap();
    }

    async fn send_raw(&mut self, message: Message) {
        self.socket.send(message).await.unwrap();
    }
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

fn stdin(data: &str) -> Value {
    json!({"type": "stdin", "data": data})
}

fn seqs(frames: &[Value]) -> Vec<u64> {
    frames.iter().filter_map(|f| f["seq"].as_u64()).collect()
}

/// The concatenated stdout of output frames.
fn stdout_of(frames: &[Value]) -> String {
    frames
        .iter()
        .filter(|f| f["type"] == "stdout")
        .map(|f| {
            assert!(f.get("encoding").is_none(), "{f}");
            f["data"].as_str().unwrap()
        })
        .collect()
}

fn exit_of(frames: &[Value]) -> &Value {
    let last = frames.last().expect("some frames");
    assert_eq!(last["type"], "exit", "the last frame: {frames:#?}");
    last
}

async fn serve(redis: &RedisServer) -> Daemon {
    DaemonBuilder::new(Role::Serve, redis).start().await
}

fn token_of(answer: &daemon::Answer) -> String {
    answer.body["token"].as_str().unwrap().to_string()
}

// ---------------------------------------------------------------------------
// a client not written in this project: Python's websockets
// ---------------------------------------------------------------------------

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
    let answer = daemon.submit(&interactive(ECHO)).await;
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
        "the Python client failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
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

// ---------------------------------------------------------------------------
// replay, resume, several clients
// ---------------------------------------------------------------------------

#[tokio::test]
async fn reconnecting_with_after_loses_and_repeats_nothing_and_clients_agree() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let answer = daemon
        .submit(&python(
            "import time\nfor i in range(30):\n    print(i, flush=True)\n    time.sleep(0.05)\n",
        ))
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
    let api = DaemonBuilder::new(Role::Api, &redis).start().await;
    let answer = api.submit(&interactive(ECHO)).await;
    let id = answer.id();
    let mut ws = Ws::open(&api, &id, None).await;
    let queued = ws.next().await.unwrap();
    assert_eq!(queued["status"], "queued");
    ws.send(stdin("first\n")).await;
    ws.send(json!({"type": "stdin", "data": "c2Vjb25kCg==", "encoding": "base64"}))
        .await;
    ws.send(json!({"type": "stdin_close"})).await;
    assert_eq!(api.job(&id).await["status"], "queued");
    let _worker = DaemonBuilder::new(Role::Worker, &redis).start().await;
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
            "name = input('name? ')\nage = input('age? ')\nprint(f'{name} is {age}')\n",
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

// ---------------------------------------------------------------------------
// signals
// ---------------------------------------------------------------------------

const SIGNALS: &str = "\
import time
print('ready', flush=True)
try:
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    print('caught', flush=True)
while True:
    time.sleep(0.05)
";

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

// ---------------------------------------------------------------------------
// authentication
// ---------------------------------------------------------------------------

#[tokio::test]
async fn tokens_keys_and_jobs_are_checked_before_the_upgrade() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let first = daemon.submit(&python("print('hi')")).await;
    let second = daemon.submit(&python("print('ho')")).await;
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
    let daemon = DaemonBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_TOKEN_TTL_SECS", 1)
        .start()
        .await;
    let answer = daemon.submit(&python("print('hi')")).await;
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

// ---------------------------------------------------------------------------
// bad frames and bounds
// ---------------------------------------------------------------------------

#[tokio::test]
async fn bad_frames_get_an_error_event_and_the_connection_stays() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let id = daemon.submit(&interactive(ECHO)).await.id();
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
    let id = daemon.submit(&interactive(ECHO)).await.id();
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
    let api = DaemonBuilder::new(Role::Api, &redis).start().await;
    let id = api.submit(&interactive(ECHO)).await.id();
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
    let api = DaemonBuilder::new(Role::Api, &redis).start().await;
    let store = Store::new(&redis.url(), "", Duration::from_secs(60), 2).unwrap();
    let id = api.submit(&interactive(ECHO)).await.id();
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

// ---------------------------------------------------------------------------
// Server-Sent Events, with curl
// ---------------------------------------------------------------------------

#[tokio::test]
async fn curl_reads_the_events_of_a_job_and_resumes_with_last_event_id() {
    let redis = RedisServer::start();
    let daemon = serve(&redis).await;
    let answer = daemon
        .submit(&python(
            "import sys\nprint('out')\nprint('err', file=sys.stderr)\n",
        ))
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
    // 15 s of silence, as while a container starts on a loaded machine).
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
    let mut api = DaemonBuilder::new(Role::Api, &redis).start().await;
    let id = api.submit(&interactive(ECHO)).await.id();
    let mut ws = Ws::open(&api, &id, None).await;
    let queued = ws.next().await.unwrap();
    assert_eq!(queued["seq"], 1);
    api.sigterm();
    assert_eq!(ws.rest().await, Vec::<Value>::new());
    assert_eq!(ws.close, Some(1001));
    assert!(api.wait_exit(Duration::from_secs(15)).await.success());
}

// ---------------------------------------------------------------------------
// a queued job's place
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_jobs_streams_and_view_give_its_place_until_it_starts() {
    let redis = RedisServer::start();
    // No worker: this test claims and starts the jobs itself.
    let daemon = DaemonBuilder::new(Role::Api, &redis).start().await;
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
    let daemon = DaemonBuilder::new(Role::Api, &redis).start().await;
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
    let daemon = DaemonBuilder::new(Role::Api, &redis).start().await;
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
