//! Following a job over its WebSocket, `GET /v1/jobs/{id}/ws` (docs/api.md):
//! the events' wire JSON comes in as text frames, replayed from the start (or
//! after `?after=<seq>`) and then live, up to the `exit` event and a normal
//! close; `stdin`, `stdin_close` and `signal` frames go out.
//!
//! A connection that ends before `exit` is opened again with
//! `?after=<last seq>`; events are also deduplicated by `seq`, so nothing is
//! written twice. After [`RECONNECTS`] failed attempts in a row that span
//! the client's outage budget (an API restart takes seconds), or at once when
//! the API has no stream for the job (any 4xx but 401/403), the caller falls
//! back to polling.
//!
//! What the events mean to the caller is an [`EventSink`]'s business (the
//! `run` command's [`Printer`](super::printer::Printer) writes them; `bench` times them), and where
//! Ctrl-C comes from is an [`Interrupts`]'.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::{CONNECT_TIMEOUT, ClientError};
use crate::job::JobResult;
use crate::job::events::{JobEvent, WS_READ_BUFFER_BYTES};

/// Attempts to reconnect after a connection ended before `exit`, in a row
/// (an attempt that brings new events starts the count again); the attempts
/// go on past it until they span [`super::OUTAGE_BUDGET`].
pub(super) const RECONNECTS: u32 = 5;
/// Pause before the first reconnect; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// A second Ctrl-C within this long of the first sends `kill`.
pub(super) const KILL_WITHIN: Duration = Duration::from_secs(2);
/// How long the closing handshake after `exit` may take.
const CLOSE_TIMEOUT: Duration = Duration::from_millis(500);

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What a [`Follower`] does with the events it receives, in order.
pub(crate) trait EventSink {
    /// A `stage` start event.
    fn stage_started(&mut self, stage: &str);
    /// A `stdout` (`stderr` = false) or `stderr` event.
    fn output(&mut self, stderr: bool, bytes: Vec<u8>);
    /// The `exit` event arrived (before the connection is closed).
    fn exited(&mut self) {}
    /// An `attempt` event: the job's worker was lost and the job runs again
    /// from the start, as attempt `attempt`.
    fn new_attempt(&mut self, _attempt: u32) {}
    /// The job waits for its stdin (see `JobEvent::InputWanted`).
    fn input_wanted(&mut self) {}
}

/// Where a [`Follower`] hears Ctrl-C.
pub(crate) trait Interrupts {
    /// Resolves at the next interrupt.
    async fn recv(&mut self) -> Option<()>;
}

impl Interrupts for tokio::signal::unix::Signal {
    async fn recv(&mut self) -> Option<()> {
        tokio::signal::unix::Signal::recv(self).await
    }
}

/// No interrupts: for a caller that leaves Ctrl-C to its default (ending
/// the process).
pub(crate) struct NoInterrupts;

impl Interrupts for NoInterrupts {
    async fn recv(&mut self) -> Option<()> {
        std::future::pending().await
    }
}

/// A frame for the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outgoing {
    Stdin(Vec<u8>),
    StdinClose,
    Signal(&'static str),
}

impl Outgoing {
    /// The frame's JSON: text as UTF-8 when it is, base64 otherwise.
    pub(crate) fn to_json(&self) -> String {
        let value = match self {
            Outgoing::Stdin(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => serde_json::json!({"type": "stdin", "data": text}),
                Err(_) => serde_json::json!({
                    "type": "stdin",
                    "data": STANDARD.encode(bytes),
                    "encoding": "base64",
                }),
            },
            Outgoing::StdinClose => serde_json::json!({"type": "stdin_close"}),
            Outgoing::Signal(signal) => serde_json::json!({"type": "signal", "signal": signal}),
        };
        value.to_string()
    }
}

/// How following the stream ended.
pub(crate) enum Followed {
    /// The `exit` event.
    Exit(Box<JobResult>),
    /// Ctrl-C in a non-interactive run: the caller cancels the job.
    Interrupted,
    /// The stream is unavailable or kept failing: poll instead.
    Fallback(String),
    Failed(ClientError),
}

/// How one connection ended.
enum Session {
    Exit(Box<JobResult>),
    Interrupted,
    /// The connection ended before `exit`.
    Dropped(String),
    Failed(ClientError),
}

/// Why a connection could not be opened.
enum ConnectError {
    /// Worth another attempt (the API restarting, a 5xx).
    Transient(String),
    /// The API has no stream for this job (404, an older API): poll.
    NoStream(String),
    Fatal(ClientError),
}

pub(crate) struct Follower<'a, S: EventSink> {
    /// `ws://host:port/v1/jobs/<id>/ws`.
    url: String,
    key: &'a str,
    interactive: bool,
    pub(crate) sink: S,
    /// The last `seq` seen; 0 before the first event.
    last_seq: u64,
    /// Frames read from `input` that are not sent yet (in order).
    pending: VecDeque<Outgoing>,
    /// Lines typed on the terminal (interactive runs); `None` after EOF.
    input: Option<mpsc::Receiver<Outgoing>>,
    last_interrupt: Option<Instant>,
}

impl<'a, S: EventSink> Follower<'a, S> {
    pub(crate) fn new(
        base: &str,
        id: &str,
        key: &'a str,
        sink: S,
        input: Option<mpsc::Receiver<Outgoing>>,
    ) -> Self {
        let host = base.strip_prefix("http://").unwrap_or(base);
        Self {
            url: format!("ws://{host}/v1/jobs/{id}/ws"),
            key,
            interactive: input.is_some(),
            sink,
            last_seq: 0,
            pending: VecDeque::new(),
            input,
            last_interrupt: None,
        }
    }

    /// Follows the job to its `exit` event, reconnecting as needed.
    pub(crate) async fn follow(&mut self, interrupt: &mut impl Interrupts) -> Followed {
        let mut failures = 0u32;
        let mut failing_since = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        loop {
            let seq_before = self.last_seq;
            let why = match self.connect().await {
                Ok(socket) => match self.session(socket, interrupt).await {
                    Session::Exit(result) => return Followed::Exit(result),
                    Session::Interrupted => return Followed::Interrupted,
                    Session::Failed(error) => return Followed::Failed(error),
                    Session::Dropped(why) => why,
                },
                Err(ConnectError::Transient(why)) => why,
                Err(ConnectError::NoStream(why)) => return Followed::Fallback(why),
                Err(ConnectError::Fatal(error)) => return Followed::Failed(error),
            };
            if self.last_seq > seq_before || failures == 0 {
                failures = 0;
                failing_since = Instant::now();
                backoff = FIRST_BACKOFF;
            }
            failures += 1;
            if failures > RECONNECTS && failing_since.elapsed() >= super::OUTAGE_BUDGET {
                return Followed::Fallback(why);
            }
            tracing::debug!(%why, failures, "the job's stream ended early; reconnecting");
            let pause = tokio::time::sleep(backoff);
            tokio::pin!(pause);
            loop {
                tokio::select! {
                    () = &mut pause => break,
                    _ = interrupt.recv() => {
                        if !self.interrupted() {
                            return Followed::Interrupted;
                        }
                    }
                }
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Ctrl-C: queues `interrupt` (or `kill` for a second one within
    /// [`KILL_WITHIN`]) in an interactive run and returns true; false in a
    /// non-interactive one (the caller cancels).
    fn interrupted(&mut self) -> bool {
        if !self.interactive {
            return false;
        }
        let now = Instant::now();
        let signal = match self.last_interrupt {
            Some(last) if now.duration_since(last) <= KILL_WITHIN => "kill",
            _ => "interrupt",
        };
        self.last_interrupt = Some(now);
        self.pending.push_back(Outgoing::Signal(signal));
        true
    }

    async fn connect(&self) -> Result<Socket, ConnectError> {
        let url = if self.last_seq == 0 {
            self.url.clone()
        } else {
            format!("{}?after={}", self.url, self.last_seq)
        };
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| ConnectError::Fatal(ClientError::Protocol(format!("{url}: {e}"))))?;
        let bearer = HeaderValue::from_str(&format!("Bearer {}", self.key))
            .map_err(|_| ConnectError::Fatal(ClientError::Unauthorized))?;
        request.headers_mut().insert(header::AUTHORIZATION, bearer);
        let connected = tokio::time::timeout(
            CONNECT_TIMEOUT,
            // Nagle off: typed lines go out at once.
            tokio_tungstenite::connect_async_with_config(
                request,
                Some(
                    tungstenite::protocol::WebSocketConfig::default()
                        .read_buffer_size(WS_READ_BUFFER_BYTES),
                ),
                true,
            ),
        )
        .await;
        match connected {
            Err(_) => Err(ConnectError::Transient(format!(
                "connecting to {url} took longer than {CONNECT_TIMEOUT:?}"
            ))),
            Ok(Ok((socket, _))) => Ok(socket),
            Ok(Err(tungstenite::Error::Http(response))) => {
                let status = response.status();
                if status == 401 || status == 403 {
                    Err(ConnectError::Fatal(ClientError::Unauthorized))
                } else if status.is_client_error() {
                    Err(ConnectError::NoStream(format!("{url} answered {status}")))
                } else {
                    Err(ConnectError::Transient(format!("{url} answered {status}")))
                }
            }
            Ok(Err(error)) => Err(ConnectError::Transient(format!(
                "{url}: {}",
                super::root_cause(&error)
            ))),
        }
    }

    /// One connection: events in, frames out, until `exit` or the end.
    async fn session(&mut self, mut socket: Socket, interrupt: &mut impl Interrupts) -> Session {
        loop {
            while let Some(frame) = self.pending.front() {
                if let Err(error) = socket.send(Message::text(frame.to_json())).await {
                    // Not written: it goes out again on the next connection.
                    return Session::Dropped(format!("sending a frame: {error}"));
                }
                self.pending.pop_front();
            }
            let reading = self.input.is_some();
            let input = self.input.as_mut();
            tokio::select! {
                message = socket.next() => match message {
                    Some(Ok(Message::Text(text))) => match self.event(text.as_str()) {
                        Ok(Some(result)) => {
                            // The API closes after `exit`; answer its close.
                            let _ = tokio::time::timeout(CLOSE_TIMEOUT, socket.close(None)).await;
                            return Session::Exit(result);
                        }
                        Ok(None) => {}
                        Err(error) => return Session::Failed(error),
                    },
                    Some(Ok(Message::Close(frame))) => {
                        return Session::Dropped(match frame {
                            Some(frame) => format!("closed ({}) {}", frame.code, frame.reason),
                            None => "closed".to_string(),
                        });
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => return Session::Dropped(error.to_string()),
                    None => return Session::Dropped("the connection ended".to_string()),
                },
                line = async { input?.recv().await }, if reading => match line {
                    Some(frame) => self.pending.push_back(frame),
                    None => self.input = None,
                },
                _ = interrupt.recv() => {
                    if !self.interrupted() {
                        return Session::Interrupted;
                    }
                }
            }
        }
    }

    /// One event's wire JSON; the result once it is `exit`.
    fn event(&mut self, text: &str) -> Result<Option<Box<JobResult>>, ClientError> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| ClientError::Protocol(format!("an event that is not JSON: {e}")))?;
        match value.get("seq").and_then(serde_json::Value::as_u64) {
            // Seen already (a replay that overlaps): not written twice.
            Some(seq) if seq <= self.last_seq => return Ok(None),
            Some(seq) => self.last_seq = seq,
            None => {}
        }
        let event = match serde_json::from_value::<JobEvent>(value.clone()) {
            Ok(event) => event,
            Err(error) if value.get("type").and_then(|t| t.as_str()) == Some("exit") => {
                return Err(ClientError::Protocol(format!(
                    "the exit event does not parse: {error}"
                )));
            }
            // An event this client does not know: not its business.
            Err(_) => return Ok(None),
        };
        match event {
            JobEvent::Exit { result, .. } => {
                self.sink.exited();
                return Ok(Some(result));
            }
            JobEvent::Attempt { attempt, .. } => self.sink.new_attempt(attempt),
            JobEvent::Stage { stage, state, .. } => {
                if state == crate::job::events::StageState::Start {
                    self.sink.stage_started(&stage);
                }
            }
            JobEvent::Stdout { .. } | JobEvent::Stderr { .. } => {
                let stderr = matches!(event, JobEvent::Stderr { .. });
                let bytes = event.output_bytes().ok_or_else(|| {
                    ClientError::Protocol(format!("an output event does not decode: {text}"))
                })?;
                self.sink.output(stderr, bytes);
            }
            JobEvent::Error { message } => {
                eprintln!("code-runner: the API refused a frame: {message}");
            }
            JobEvent::InputWanted => self.sink.input_wanted(),
            // A refused connection is worth a line: the program's own error
            // rarely says that the allowlist stopped it.
            JobEvent::Egress(connection) if !connection.allowed => {
                eprintln!(
                    "code-runner: network: {}:{} refused ({})",
                    connection.host,
                    connection.port,
                    connection.reason.as_deref().unwrap_or("refused")
                );
            }
            JobEvent::Egress(_) => {}
            // The result carries every test's verdict.
            JobEvent::Status { .. } | JobEvent::Test { .. } => {}
        }
        Ok(None)
    }
}

/// Reads the terminal's stdin line by line on a thread of its own and sends
/// each line (with its newline) as a `stdin` frame; EOF sends `stdin_close`.
///
/// A plain thread rather than `tokio::io::stdin`: a read of a terminal cannot
/// be cancelled, and tokio's runtime waits for its blocking reads when it
/// shuts down, so a program that ends while nobody types would keep the
/// client open until Enter. The thread simply dies with the process.
pub(super) fn read_terminal() -> mpsc::Receiver<Outgoing> {
    let (lines, receiver) = mpsc::channel(64);
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        let mut stdin = std::io::stdin().lock();
        loop {
            let mut line = Vec::new();
            match stdin.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => {
                    let _ = lines.blocking_send(Outgoing::StdinClose);
                    return;
                }
                Ok(_) => {
                    if lines.blocking_send(Outgoing::Stdin(line)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    receiver
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::printer::Printer;

    #[test]
    fn frames_are_the_documented_json() {
        assert_eq!(
            Outgoing::Stdin(b"hi\n".to_vec()).to_json(),
            r#"{"data":"hi\n","type":"stdin"}"#
        );
        assert_eq!(
            Outgoing::Stdin(vec![0xff]).to_json(),
            r#"{"data":"/w==","encoding":"base64","type":"stdin"}"#
        );
        assert_eq!(Outgoing::StdinClose.to_json(), r#"{"type":"stdin_close"}"#);
        assert_eq!(
            Outgoing::Signal("interrupt").to_json(),
            r#"{"signal":"interrupt","type":"signal"}"#
        );
    }

    #[test]
    fn events_are_deduplicated_by_seq_and_exit_ends() {
        let mut follower = Follower::new("http://127.0.0.1:1", "j", "k", Printer::new(true), None);
        assert_eq!(follower.url, "ws://127.0.0.1:1/v1/jobs/j/ws");
        assert!(
            follower
                .event(r#"{"seq":1,"type":"status","status":"queued"}"#)
                .unwrap()
                .is_none()
        );
        assert!(
            follower
                .event(r#"{"seq":2,"type":"stdout","data":"aGk=","encoding":"base64"}"#)
                .unwrap()
                .is_none()
        );
        // A replay of what was seen is skipped; an unknown event is ignored.
        assert!(
            follower
                .event(r#"{"seq":2,"type":"stdout","data":"x"}"#)
                .unwrap()
                .is_none()
        );
        assert!(
            follower
                .event(r#"{"seq":3,"type":"future"}"#)
                .unwrap()
                .is_none()
        );
        assert_eq!(follower.last_seq, 3);
        assert!(follower.event(r#"{"seq":4,"type":"exit"}"#).is_err());
    }

    #[test]
    fn a_second_ctrl_c_within_two_seconds_kills() {
        let (_tx, rx) = mpsc::channel(1);
        let mut follower =
            Follower::new("http://127.0.0.1:1", "j", "k", Printer::new(true), Some(rx));
        assert!(follower.interrupted());
        assert!(follower.interrupted());
        assert_eq!(
            follower.pending.iter().cloned().collect::<Vec<_>>(),
            vec![Outgoing::Signal("interrupt"), Outgoing::Signal("kill")]
        );
        let mut quiet = Follower::new("http://127.0.0.1:1", "j", "k", Printer::new(true), None);
        assert!(!quiet.interrupted());
    }
}
