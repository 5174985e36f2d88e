//! `GET /v1/jobs/{id}/events`: the job's events as Server-Sent Events,
//! each with its `seq` as the event id and its `type` as the event name, so
//! an `EventSource` resumes with `Last-Event-ID`. A finished job with
//! nothing after the client's position answers 204, which tells an
//! `EventSource` to stop reconnecting.

use std::convert::Infallible;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;

use super::caps::StreamPermit;
use super::place::{Next, QueuePlace, next_of, queued_event};
use super::{StreamQuery, authorize, parse_after, query_error};
use crate::api::ApiState;
use crate::api::http::error::ApiError;
use crate::api::v1::jobs::job_id;
use crate::follow::feeds::{Step, Subscription};
use crate::job::events::{JobEvent, StoredEvent};

/// The `type` of a stored event.
pub(super) fn event_type(json: &str) -> String {
    #[derive(Deserialize)]
    struct Head {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_str::<Head>(json)
        .map(|head| head.kind)
        .ok()
        .filter(|kind| !kind.is_empty() && !kind.contains(['\r', '\n', '\0']))
        .unwrap_or_else(|| "message".to_string())
}

fn sse_event(event: &StoredEvent) -> Event {
    Event::default()
        .id(event.seq.to_string())
        .event(event_type(&event.json))
        .data(event.wire())
}

fn sse_error(message: &str) -> Event {
    Event::default()
        .event("error")
        .data(JobEvent::error(message).to_json())
}

/// `GET /v1/jobs/{id}/events`.
pub(crate) async fn events(
    State(state): State<ApiState>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<StreamQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(id) = id.map_err(|_| ApiError::NotFound("job not found"))?;
    let id = job_id(&id)?;
    let Query(query) = query.map_err(query_error)?;
    let after = match headers.get("last-event-id") {
        Some(value) => parse_after(
            Some(value.to_str().map_err(|_| ApiError::InvalidRequest {
                field: "Last-Event-ID",
                message: "not an event seq".into(),
            })?),
            "Last-Event-ID",
        )?,
        None => parse_after(query.after.as_deref(), "after")?,
    };
    let (record, _) = authorize(&state, &headers, &id, query.token.as_deref()).await?;
    let permit = state.stream_caps.acquire(&record.api_key, &id)?;
    let place = QueuePlace::of(&state, &record);
    let mut follower = state.feeds.subscribe(&id, after);
    // A finished job with nothing after `after`: 204, which tells an
    // EventSource to stop reconnecting.
    let first = if record.status.is_terminal() {
        match follower.next().await {
            Step::Events(events) => Some(events),
            Step::Ended => return Ok(StatusCode::NO_CONTENT.into_response()),
            Step::Gone => return Err(ApiError::NotFound("job not found")),
            Step::Shutdown => return Err(ApiError::ShuttingDown),
            Step::Failed(error) => return Err(error.into()),
        }
    } else {
        None
    };
    tracing::debug!(job.id = %id, after, "event stream opened");
    let open = Open {
        follower,
        first,
        _permit: permit,
        place,
    };
    let stream = futures_util::stream::unfold(Some(open), next_batch).flat_map(|batch| {
        futures_util::stream::iter(batch.into_iter().map(Ok::<Event, Infallible>))
    });
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response();
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// An open event stream: its follower, the events read before it opened,
/// its place among the open streams and its job's place in the queue.
struct Open {
    follower: Subscription,
    first: Option<Vec<StoredEvent>>,
    _permit: StreamPermit,
    place: QueuePlace,
}

/// The stream's next events and what is left of it (`None`: it ends after
/// these; no batch at all: it ends now).
async fn next_batch(open: Option<Open>) -> Option<(Vec<Event>, Option<Open>)> {
    let mut open = open?;
    if let Some(events) = open.first.take() {
        let batch: Vec<Event> = events.iter().map(sse_event).collect();
        return Some((batch, Some(open)));
    }
    let step = match next_of(&mut open.follower, &mut open.place).await {
        Next::Step(step) => step,
        Next::Place(now) => {
            let event = Event::default().event("queued").data(queued_event(now));
            return Some((vec![event], Some(open)));
        }
    };
    match step {
        Step::Events(events) => {
            let batch: Vec<Event> = events.iter().map(sse_event).collect();
            Some((batch, Some(open)))
        }
        Step::Ended | Step::Shutdown => None,
        Step::Gone => Some((
            vec![sse_error("the job no longer exists (it expired)")],
            None,
        )),
        Step::Failed(error) => {
            tracing::warn!(job.id = %open.follower.id(), error = %error, "following a job's events failed");
            Some((
                vec![sse_error(
                    "the job store is unavailable; reconnect with Last-Event-ID",
                )],
                None,
            ))
        }
    }
}
