//! `GET /connect`: Piston's interactive WebSocket. `init` submits an
//! interactive job; its events go out as Piston's messages (`runtime`,
//! `stage`, `data`, `exit`, `error`); `data` and `signal` go to the job.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request, State};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::super::{new_job_id, semver3, submit};
use super::answer::text;
use super::request::piston_job;
use super::{SIGNALS, from_api_error, piston_caller, piston_error, piston_name};
use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::streams::caps::StreamPermit;
use crate::follow::feeds::Step;
use crate::job::events::{JobEvent, StageState, WS_READ_BUFFER_BYTES};
use crate::job::{Encoding, Status};
use crate::protocol::SignalKind;
use crate::store::{Control, InputOutcome};

/// How long `/connect` waits for the `init` message (Piston: 1 s).
const INIT_TIMEOUT: Duration = Duration::from_secs(1);
/// Frames waiting to be written to one WebSocket.
const OUTBOX: usize = 64;

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

fn frame(value: Value) -> Message {
    Message::text(value.to_string())
}

/// `GET /connect`: the key is checked before the upgrade (401 otherwise).
pub(super) async fn connect(State(state): State<ApiState>, request: Request) -> Response {
    let (mut parts, _) = request.into_parts();
    let caller = match piston_caller(&state, &parts, true) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &state).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return piston_error(rejection.status(), rejection.body_text()),
    };
    // The job's id is chosen now, so the connection counts against the
    // stream caps before the upgrade, as `/v1/jobs/{id}/ws` does.
    let id = new_job_id();
    let permit = match state.stream_caps.acquire(&caller.name, &id) {
        Ok(permit) => permit,
        Err(error) => return from_api_error(error),
    };
    let sessions = state.sessions.clone();
    upgrade
        .read_buffer_size(WS_READ_BUFFER_BYTES)
        .on_upgrade(move |socket| sessions.track_future(session(socket, state, caller, id, permit)))
        .into_response()
}

/// One Piston WebSocket: `init` submits an interactive job; its events go
/// out as Piston's messages; `data` and `signal` go to the job.
async fn session(
    socket: WebSocket,
    state: ApiState,
    caller: Caller,
    id: String,
    _permit: StreamPermit,
) {
    let (mut sink, mut incoming) = socket.split();
    let (outbox, mut frames) = mpsc::channel::<Message>(OUTBOX);
    let writer = tokio::spawn(async move {
        while let Some(message) = frames.recv().await {
            let last = matches!(message, Message::Close(_));
            if sink.send(message).await.is_err() || last {
                break;
            }
        }
    });
    let mut job: Option<String> = None;
    let mut follower: Option<tokio::task::JoinHandle<()>> = None;
    let init_deadline = tokio::time::sleep(INIT_TIMEOUT);
    tokio::pin!(init_deadline);
    loop {
        let message = tokio::select! {
            message = incoming.next() => message,
            () = &mut init_deadline, if job.is_none() => {
                let _ = outbox.send(close(4001, "Initialization Timeout")).await;
                break;
            }
            () = outbox.closed() => break,
        };
        let text = match message {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
            Some(Ok(Message::Text(text))) => text.to_string(),
            Some(Ok(Message::Binary(bytes))) => String::from_utf8_lossy(&bytes).into_owned(),
            Some(Ok(_)) => continue,
        };
        let outcome = handle_message(&state, &caller, &id, &text, &mut job, &outbox).await;
        match outcome {
            Ok(Some(id)) => {
                follower = Some(tokio::spawn(follow(state.clone(), id, outbox.clone())));
            }
            Ok(None) => {}
            Err(close_message) => {
                let _ = outbox.send(close_message).await;
                break;
            }
        }
    }
    if let Some(follower) = follower {
        follower.abort();
    }
    drop(outbox);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

/// Acts on one client message; `id` is the job an `init` submits.
/// `Ok(Some(id))`: the job was started;
/// `Err(close)`: the socket closes with that frame.
async fn handle_message(
    state: &ApiState,
    caller: &Caller,
    id: &str,
    text: &str,
    job: &mut Option<String>,
    outbox: &mpsc::Sender<Message>,
) -> Result<Option<String>, Message> {
    let notify = async |message: String| {
        let _ = outbox
            .send(frame(json!({"type": "error", "message": message})))
            .await;
        close(4002, "Notified Error")
    };
    let message: Map<String, Value> = match serde_json::from_str(text) {
        Ok(message) => message,
        Err(error) => return Err(notify(error.to_string()).await),
    };
    match message.get("type").and_then(Value::as_str) {
        Some("init") => {
            if job.is_some() {
                return Err(close(4000, "Already Initialized"));
            }
            let catalog = state.offered_catalog().await;
            let (mut spec, language) = match piston_job(&message, &catalog, state, true) {
                Ok(job) => job,
                Err(error) => return Err(notify(error).await),
            };
            // Initial stdin is delivered first, then what `data` sends.
            let initial = std::mem::take(&mut spec.stdin);
            let submitted = match submit(state, caller, id.to_string(), &spec, &catalog).await {
                Ok(submitted) => submitted,
                Err(error) => return Err(notify(error.to_string()).await),
            };
            *job = Some(submitted.id.clone());
            let (name, _) = piston_name(&language);
            let _ = outbox
                .send(frame(json!({
                    "type": "runtime",
                    "language": name,
                    "version": semver3(&language.version),
                })))
                .await;
            if !initial.is_empty() {
                send_control(state, &submitted.id, Control::Stdin(initial.into_bytes())).await?;
            }
            Ok(Some(submitted.id))
        }
        Some("data") => {
            let Some(id) = job.as_deref() else {
                return Err(close(4003, "Not yet initialized"));
            };
            if message.get("stream").and_then(Value::as_str) != Some("stdin") {
                return Err(close(4004, "Can only write to stdin"));
            }
            let data = message.get("data").and_then(Value::as_str).unwrap_or("");
            send_control(state, id, Control::Stdin(data.as_bytes().to_vec())).await?;
            Ok(None)
        }
        Some("signal") => {
            let Some(id) = job.as_deref() else {
                return Err(close(4003, "Not yet initialized"));
            };
            let signal = message.get("signal").and_then(Value::as_str).unwrap_or("");
            if !SIGNALS.contains(&signal) {
                return Err(close(4005, "Invalid signal"));
            }
            let kind = if signal == "SIGINT" {
                SignalKind::Interrupt
            } else {
                SignalKind::Kill
            };
            send_control(state, id, Control::Signal(kind)).await?;
            Ok(None)
        }
        // Piston ignores other types.
        _ => Ok(None),
    }
}

/// Passes stdin or a signal to the job; a job that has ended takes nothing
/// more (its `exit` is on its way).
async fn send_control(state: &ApiState, id: &str, control: Control) -> Result<(), Message> {
    let budgets = state.input_budgets();
    match state
        .inner
        .store
        .jobs()
        .send_input(id, &control, budgets)
        .await
    {
        Ok(InputOutcome::Sent { .. } | InputOutcome::Ended(_)) => Ok(()),
        Ok(InputOutcome::OverBudget { stdin_bytes }) => {
            Err(over_budget(stdin_bytes, budgets.stdin_bytes))
        }
        Ok(
            refused @ (InputOutcome::TooManySignals { .. }
            | InputOutcome::TooManyMessages { .. }
            | InputOutcome::KeyStorage { .. }),
        ) => {
            tracing::debug!(job.id = %id, ?refused, "a Piston session's input was refused");
            Err(close(4002, "Notified Error"))
        }
        Ok(InputOutcome::Missing) => Err(close(4002, "Notified Error")),
        Err(error) => {
            tracing::warn!(job.id = %id, error = %error, "cannot pass Piston stdin on");
            Err(close(1011, "the job store is unavailable"))
        }
    }
}

fn over_budget(used: u64, max: u64) -> Message {
    tracing::debug!(used, max, "a Piston session went over its stdin budget");
    close(4002, "Notified Error")
}

/// Turns the job's events into Piston's messages until it ends.
async fn follow(state: ApiState, id: String, outbox: mpsc::Sender<Message>) {
    let mut follower = state.feeds.subscribe(&id, 0);
    loop {
        let events = match follower.next().await {
            Step::Events(events) => events,
            Step::Ended => break,
            Step::Gone | Step::Shutdown | Step::Failed(_) => {
                let _ = outbox
                    .send(frame(json!({"type": "error", "message": "the job could not be followed to its end"})))
                    .await;
                let _ = outbox.send(close(4002, "Notified Error")).await;
                return;
            }
        };
        for stored in events {
            let Ok(event) = stored.event() else { continue };
            let message = match event {
                JobEvent::Stage {
                    stage,
                    state: StageState::Start,
                    ..
                } => json!({"type": "stage", "stage": stage}),
                JobEvent::Stage {
                    stage,
                    state: StageState::End,
                    exit_code,
                    signal,
                    ..
                } => json!({"type": "exit", "stage": stage, "code": exit_code, "signal": signal}),
                JobEvent::Stdout { data, encoding } => {
                    json!({"type": "data", "stream": "stdout", "data": decoded(data, encoding)})
                }
                JobEvent::Stderr { data, encoding } => {
                    json!({"type": "data", "stream": "stderr", "data": decoded(data, encoding)})
                }
                JobEvent::Exit { status, result, .. } => {
                    if status == Status::Error {
                        let message = result.error.unwrap_or_else(|| "the platform failed".into());
                        let _ = outbox
                            .send(frame(json!({"type": "error", "message": message})))
                            .await;
                        let _ = outbox.send(close(4002, "Notified Error")).await;
                        return;
                    }
                    continue;
                }
                // An interactive job is never run again, so never has an
                // `attempt` event, and never has tests.
                JobEvent::Status { .. }
                | JobEvent::Error { .. }
                | JobEvent::Attempt { .. }
                | JobEvent::Test { .. }
                // Piston's protocol has no such messages.
                | JobEvent::InputWanted
                | JobEvent::Egress(_) => {
                    continue;
                }
            };
            if outbox.send(frame(message)).await.is_err() {
                return;
            }
        }
    }
    let _ = outbox.send(close(4999, "Job Completed")).await;
}

fn decoded(data: String, encoding: Encoding) -> String {
    match encoding {
        Encoding::Utf8 => data,
        Encoding::Base64 => STANDARD.decode(&data).map_or(data, |bytes| text(&bytes)),
    }
}
