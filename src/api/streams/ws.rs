//! `GET /v1/jobs/{id}/ws`: the job's events out, its input in. A writer
//! task owns the sending half (a client that takes no frame for
//! [`WRITE_TIMEOUT`] is disconnected); a follower task feeds it the events
//! and the queued job's places; the session reads the client's frames and
//! acts on them in order. Each job takes at most [`MAX_SIGNALS`] signals
//! and [`MAX_CONTROL_MESSAGES`] client frames in all (besides its stdin
//! byte budget); a frame past them gets an `error` event and is not
//! delivered.
//!
//! Client frames (WebSocket text frames, JSON): `stdin` (`data`, `encoding`
//! `utf8` (default) or `base64`), `stdin_close`, `signal` (`interrupt` |
//! `kill`). Each is appended to the job's control stream before the next is
//! read, so they reach the program in the order sent, also when sent while
//! the job is still queued. A frame that cannot be acted on gets an `error`
//! event (`{"type":"error","message":…}`, no `seq`) on this connection
//! only, and the connection stays open.

use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::caps::StreamPermit;
use super::place::{Next, QueuePlace, next_of, queued_event};
use super::{Access, REVOKED, StreamQuery, authorize, parse_after, query_error};
use crate::api::ApiState;
use crate::api::http::error::ApiError;
use crate::api::v1::jobs::job_id;
use crate::follow::feeds::{Step, Subscription};
use crate::job::Encoding;
use crate::job::events::{JobEvent, WS_READ_BUFFER_BYTES};
use crate::protocol::SignalKind;
use crate::store::{Control, InputBudgets, InputOutcome, Store};

/// The subprotocol the server selects.
pub const SUBPROTOCOL: &str = "code-runner";
/// The subprotocol a browser carries the attach token in: `token.<token>`.
const TOKEN_SUBPROTOCOL_PREFIX: &str = "token.";
/// Largest client frame acted on; a larger one (up to
/// [`MAX_WIRE_MESSAGE_BYTES`]) gets an error event.
pub const MAX_CLIENT_FRAME_BYTES: usize = 64 * 1024;
/// Largest message the WebSocket reads at all; above it the connection is
/// closed with 1009.
const MAX_WIRE_MESSAGE_BYTES: usize = 1 << 20;
/// Most signals one job takes from its stream clients.
pub const MAX_SIGNALS: u64 = 1000;
/// Most client frames (stdin, stdin close, signals) one job takes.
pub const MAX_CONTROL_MESSAGES: u64 = 20_000;
/// How long the server waits for a client to take one frame.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the server waits for the client's answer to its close.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Frames waiting to be written to one WebSocket; a slow client holds the
/// reading of events back, not memory.
const OUTBOX: usize = 64;
/// A custom close code: the job disappeared (expired) while followed.
const CLOSE_JOB_GONE: u16 = 4404;

/// The attach token offered as the subprotocol `token.<token>`.
pub(super) fn subprotocol_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .find_map(|protocol| protocol.strip_prefix(TOKEN_SUBPROTOCOL_PREFIX))
        .map(str::to_string)
}

/// A frame a client sends.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum ClientFrame {
    Stdin {
        data: String,
        #[serde(default)]
        encoding: Encoding,
    },
    StdinClose,
    Signal {
        signal: SignalKind,
    },
}

/// `GET /v1/jobs/{id}/ws`.
pub(crate) async fn websocket(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<StreamQuery>, QueryRejection>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id.map_err(|_| ApiError::NotFound("job not found"))?;
    let id = job_id(&id)?;
    let Query(query) = query.map_err(query_error)?;
    let after = parse_after(query.after.as_deref(), "after")?;
    let token = query.token.clone().or_else(|| subprotocol_token(&headers));
    let (record, access) = authorize(&state, &headers, &id, token.as_deref()).await?;
    let upgrade = upgrade.map_err(|rejection| ApiError::InvalidRequest {
        field: "upgrade",
        message: rejection.body_text().to_lowercase(),
    })?;
    let permit = state.stream_caps.acquire(&record.api_key, &id)?;
    let place = QueuePlace::of(&state, &record);
    tracing::debug!(job.id = %id, after, "WebSocket stream opened");
    let sessions = state.sessions.clone();
    Ok(upgrade
        .protocols([SUBPROTOCOL])
        .max_message_size(MAX_WIRE_MESSAGE_BYTES)
        .max_frame_size(MAX_WIRE_MESSAGE_BYTES)
        .read_buffer_size(WS_READ_BUFFER_BYTES)
        .on_failed_upgrade(|error| {
            tracing::debug!(error = %error, "a WebSocket upgrade failed");
        })
        .on_upgrade(move |socket| {
            sessions.track_future(session(socket, state, id, after, access, permit, place))
        }))
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

fn error_frame(message: impl Into<String>) -> Message {
    Message::text(JobEvent::error(message).to_json())
}

/// One WebSocket: a writer task owns the sending half; a follower task feeds
/// it the events; this task reads the client's frames and acts on them in
/// order.
async fn session(
    socket: WebSocket,
    state: ApiState,
    id: String,
    after: u64,
    access: Access,
    _permit: StreamPermit,
    place: QueuePlace,
) {
    let (sink, mut incoming) = socket.split();
    let (outbox, frames) = mpsc::channel::<Message>(OUTBOX);
    let closed = CancellationToken::new();
    let writer = tokio::spawn(write_frames(sink, frames, closed.clone()));
    let subscription = state.feeds.subscribe(&id, after);
    let follower = tokio::spawn(follow(subscription, place, outbox.clone()));
    let budgets = state.input_budgets();
    loop {
        let frame = tokio::select! {
            frame = incoming.next() => frame,
            // The server closed: the client has a moment to answer.
            () = async {
                closed.cancelled().await;
                tokio::time::sleep(CLOSE_GRACE).await;
            } => break,
        };
        let reply = match frame {
            None | Some(Ok(Message::Close(_))) if closed.is_cancelled() => break,
            None => break,
            Some(Ok(Message::Close(_) | Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Binary(_))) => Some(
                "binary frames are not accepted; send JSON text frames (stdin bytes as \
                 {\"type\":\"stdin\",\"data\":…,\"encoding\":\"base64\"})"
                    .to_string(),
            ),
            Some(Ok(Message::Text(_))) if !access.may_control() => Some(
                "this connection has the job's read token: stdin and signals need its control token"
                    .to_string(),
            ),
            Some(Ok(Message::Text(text))) => match revoked(&state, &id, access).await {
                Some(message) => Some(message),
                None => handle_frame(&state.inner.store, &id, text.as_str(), budgets).await,
            },
            Some(Err(error)) => {
                tracing::debug!(job.id = %id, error = %error, "a WebSocket read failed");
                let _ = outbox
                    .send(close(
                        close_code::SIZE,
                        "unreadable or oversize message (the limit is 1 MiB)",
                    ))
                    .await;
                break;
            }
        };
        if let Some(message) = reply
            && outbox.send(error_frame(message)).await.is_err()
        {
            break;
        }
    }
    follower.abort();
    drop(outbox);
    if tokio::time::timeout(CLOSE_GRACE, writer).await.is_err() {
        tracing::debug!(job.id = %id, "a WebSocket writer did not finish in time");
    }
    tracing::debug!(job.id = %id, "WebSocket stream closed");
}

/// Why a client frame of a token-holder may not be acted on any more: the
/// job was cancelled since the connection opened (one HGET per frame).
async fn revoked(state: &ApiState, id: &str, access: Access) -> Option<String> {
    if access == Access::Key {
        return None;
    }
    match state.inner.store.jobs().cancel_requested(id).await {
        Ok(false) => None,
        Ok(true) => Some(REVOKED.to_string()),
        // The frame's own append reports an unavailable store.
        Err(_) => None,
    }
}

/// Writes frames until a close frame went out, the client is gone or every
/// sender is dropped.
async fn write_frames(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut frames: mpsc::Receiver<Message>,
    closed: CancellationToken,
) {
    while let Some(frame) = frames.recv().await {
        let last = matches!(frame, Message::Close(_));
        match tokio::time::timeout(WRITE_TIMEOUT, sink.send(frame)).await {
            Ok(Ok(())) if !last => {}
            Ok(_) => break,
            Err(_) => {
                tracing::debug!(
                    "a WebSocket client took no frame for {WRITE_TIMEOUT:?}; closing it"
                );
                break;
            }
        }
    }
    closed.cancel();
}

/// Sends the job's events (and its places while queued) to the writer,
/// then the close that fits.
async fn follow(
    mut subscription: Subscription,
    mut place: QueuePlace,
    outbox: mpsc::Sender<Message>,
) {
    let id = subscription.id().to_string();
    let last = loop {
        let step = match next_of(&mut subscription, &mut place).await {
            Next::Step(step) => step,
            Next::Place(now) => {
                if outbox.send(Message::text(queued_event(now))).await.is_err() {
                    return;
                }
                continue;
            }
        };
        match step {
            Step::Events(events) => {
                for event in events {
                    if outbox.send(Message::text(event.wire())).await.is_err() {
                        return;
                    }
                }
            }
            Step::Ended => break close(close_code::NORMAL, "the job has ended"),
            Step::Gone => {
                let _ = outbox
                    .send(error_frame("the job no longer exists (it expired)"))
                    .await;
                break close(CLOSE_JOB_GONE, "the job no longer exists");
            }
            Step::Shutdown => {
                break close(
                    close_code::AWAY,
                    "the server is shutting down; reconnect with ?after=<last seq>",
                );
            }
            Step::Failed(error) => {
                tracing::warn!(job.id = %id, error = %error, "following a job's events failed");
                break close(
                    close_code::ERROR,
                    "the job store is unavailable; reconnect with ?after=<last seq>",
                );
            }
        }
    };
    let _ = outbox.send(last).await;
}

/// Acts on one client frame; `Some(message)`: the error event to answer with.
async fn handle_frame(
    store: &Store,
    id: &str,
    text: &str,
    budgets: InputBudgets,
) -> Option<String> {
    let control = match control_of(text) {
        Ok(control) => control,
        Err(message) => return Some(message),
    };
    let bytes = match &control {
        Control::Stdin(data) => data.len(),
        _ => 0,
    };
    let max_stdin = budgets.stdin_bytes;
    match store.jobs().send_input(id, &control, budgets).await {
        Ok(InputOutcome::Sent { .. }) => None,
        Ok(InputOutcome::OverBudget { stdin_bytes }) => Some(format!(
            "stdin limit reached: a job takes at most {max_stdin} bytes of stdin and \
             {stdin_bytes} were sent; these {bytes} bytes were not delivered"
        )),
        Ok(InputOutcome::TooManySignals { signals }) => Some(format!(
            "signal limit reached: a job takes at most {MAX_SIGNALS} signals and {signals} \
             were sent; this one was not delivered (DELETE the job to cancel it)"
        )),
        Ok(InputOutcome::TooManyMessages { messages }) => Some(format!(
            "frame limit reached: a job takes at most {MAX_CONTROL_MESSAGES} frames and \
             {messages} were sent; this one was not delivered"
        )),
        Ok(InputOutcome::KeyStorage { held }) => Some(format!(
            "the job's api key holds {held} bytes in the job store, its whole budget; \
             this frame was not delivered"
        )),
        Ok(InputOutcome::Ended(_)) => Some("the job has ended".to_string()),
        Ok(InputOutcome::Missing) => Some("the job no longer exists".to_string()),
        Err(error) => {
            tracing::warn!(job.id = %id, error = %error, "cannot pass a client frame on");
            Some("the job store is unavailable; the frame was not delivered, send it again".into())
        }
    }
}

/// The control message a client frame asks for, or why there is none.
fn control_of(text: &str) -> Result<Control, String> {
    if text.len() > MAX_CLIENT_FRAME_BYTES {
        return Err(format!(
            "the frame is {} bytes, over the limit of {MAX_CLIENT_FRAME_BYTES}; \
             send stdin in smaller frames (nothing of this frame was delivered)",
            text.len()
        ));
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| format!("the frame is not JSON: {error}"))?;
    let frame: ClientFrame =
        serde_json::from_value(value).map_err(|error| format!("not a valid frame: {error}"))?;
    Ok(match frame {
        ClientFrame::Stdin { data, encoding } => Control::Stdin(match encoding {
            Encoding::Utf8 => data.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(data.as_bytes())
                .map_err(|error| format!("stdin data is not valid base64: {error}"))?,
        }),
        ClientFrame::StdinClose => Control::StdinClose,
        ClientFrame::Signal { signal } => Control::Signal(signal),
    })
}
