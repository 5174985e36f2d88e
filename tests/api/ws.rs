//! A WebSocket client of a job's stream (`GET /v1/jobs/{id}/ws`), as the
//! stream tests use it (tokio-tungstenite), and what they read of its
//! frames.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::common::client::{Answer, ApiClient, KEY_A};
use crate::common::scripted;

/// Longest wait for one frame in these tests.
pub const FRAME_WAIT: Duration = Duration::from_secs(60);

/// How a client presents itself.
pub enum Auth<'a> {
    Key(&'a str),
    Query(&'a str),
    Subprotocol(&'a str),
    None,
}

pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket client of a job's stream.
pub struct Ws {
    pub socket: Socket,
    /// The subprotocol the server selected.
    pub protocol: Option<String>,
    /// The close code, once the server closed.
    pub close: Option<u16>,
    /// Whether [`Ws::next`] gives a queued job's `queued` places too (they
    /// have no seq, are not stored and come when the place is read, so the
    /// tests of the stored events leave them out).
    pub places: bool,
}

pub fn ws_url(daemon: &ApiClient, id: &str, query: &[(&str, String)]) -> String {
    let mut url = format!("{}/v1/jobs/{id}/ws", daemon.url.replacen("http", "ws", 1));
    for (index, (name, value)) in query.iter().enumerate() {
        url.push(if index == 0 { '?' } else { '&' });
        url.push_str(&format!("{name}={value}"));
    }
    url
}

impl Ws {
    /// Connects; `Err(status)` when the server refused the upgrade.
    pub async fn connect(
        daemon: &ApiClient,
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

    pub async fn open(daemon: &ApiClient, id: &str, after: Option<u64>) -> Ws {
        Ws::connect(daemon, id, after, Auth::Key(KEY_A))
            .await
            .unwrap_or_else(|status| panic!("the WebSocket was refused with {status}"))
    }

    /// The next text frame as JSON (places only with `places`); `None`
    /// once the server closed.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            let frame = self.next_frame().await?;
            if self.places || frame["type"] != "queued" {
                return Some(frame);
            }
        }
    }

    pub async fn next_frame(&mut self) -> Option<Value> {
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
    pub async fn until(&mut self, mut done: impl FnMut(&Value) -> bool) -> Vec<Value> {
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
    pub async fn until_stdout_ends_with(&mut self, frames: &mut Vec<Value>, text: &str) {
        while !stdout_of(frames).ends_with(text) {
            let more = self.until(|f| f["type"] == "stdout").await;
            frames.extend(more);
        }
    }

    /// Every frame until the server closes.
    pub async fn rest(&mut self) -> Vec<Value> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        frames
    }

    pub async fn send(&mut self, frame: Value) {
        self.socket
            .send(Message::text(frame.to_string()))
            .await
            .unwrap();
    }

    /// Writes only the (masked) header of a text frame announcing `length`
    /// payload bytes, straight to the TCP stream.
    pub async fn send_header_of_text_frame(&mut self, length: u64) {
        use tokio::io::AsyncWriteExt;
        let mut header = vec![0x81u8, 0x80 | 127];
        header.extend_from_slice(&length.to_be_bytes());
        header.extend_from_slice(&[0x12, 0x34, 0x56, 0x78]);
        let stream = self.socket.get_mut();
        stream.write_all(&header).await.unwrap();
        stream.flush().await.unwrap();
    }

    pub async fn send_raw(&mut self, message: Message) {
        self.socket.send(message).await.unwrap();
    }
}

pub fn stdin(data: &str) -> Value {
    json!({"type": "stdin", "data": data})
}

pub fn seqs(frames: &[Value]) -> Vec<u64> {
    frames.iter().filter_map(|f| f["seq"].as_u64()).collect()
}

/// The concatenated stdout of output frames.
pub fn stdout_of(frames: &[Value]) -> String {
    frames
        .iter()
        .filter(|f| f["type"] == "stdout")
        .map(|f| {
            assert!(f.get("encoding").is_none(), "{f}");
            f["data"].as_str().unwrap()
        })
        .collect()
}

pub fn exit_of(frames: &[Value]) -> &Value {
    let last = frames.last().expect("some frames");
    assert_eq!(last["type"], "exit", "the last frame: {frames:#?}");
    last
}

pub fn token_of(answer: &Answer) -> String {
    answer.body["token"].as_str().unwrap().to_string()
}

/// An interactive job whose program is `script` (see
/// [`crate::common::scripted`]).
pub fn interactive(script: &str) -> Value {
    let mut job = scripted::json(script);
    job["interactive"] = json!(true);
    job
}

/// A program that echoes `lines` lines of stdin, each as `echo: LINE`, then
/// the rest of stdin as it comes until it is closed, then says `bye`.
pub fn echo_lines(lines: usize) -> String {
    let mut script = "readline echo:\\x20\n".repeat(lines);
    script.push_str("echo\nprint bye\n");
    script
}
