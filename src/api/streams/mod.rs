//! The streams of a job: `GET /v1/jobs/{id}/ws` (WebSocket, both ways;
//! [`ws`]) and `GET /v1/jobs/{id}/events` (Server-Sent Events, read-only;
//! [`sse`]).
//!
//! Both replay the job's events from its events stream (from the start, or
//! after `?after=<seq>` / `Last-Event-ID`), then follow it live through this
//! process's one follower of the job ([`crate::follow::feeds`]: no Redis
//! connection per stream), until the `exit` event (then a normal close),
//! the server's shutdown (WebSocket close 1001: reconnect with `?after=`)
//! or the client leaves. Each event goes out as
//! [`StoredEvent::wire`](crate::job::events::StoredEvent::wire), `seq`
//! first.
//!
//! Caps ([`caps`], which Piston's `/connect` counts against too): a stream
//! past the cap of its job, of its key or of the process is refused before
//! the upgrade with 429 `too_many_streams`.
//!
//! While the job is queued, its streams also send its place in the queue
//! (`{"type":"queued","position","eta_ms"}`, no `seq`, not stored), from
//! [`crate::follow::places`], until it starts, and again when it goes back
//! to the queue for another attempt ([`place`]).
//!
//! Authentication: the API key (`Authorization: Bearer`; the job must be
//! that key's, else 404) or one of the job's attach tokens (see
//! [`crate::api::http::tokens`]): on the WebSocket as the subprotocol
//! `token.<token>` offered next to `code-runner` (the server selects
//! `code-runner` and never echoes the token) — the form browsers should
//! use — or as `?token=`, which
//! `EventSource` needs (it cannot set headers) but which proxies log. No
//! credentials, a forged or an expired token, or a token of a cancelled job
//! (revoked): 401; a genuine token of another job: 403; a job that does not
//! exist (any more): 404, before any upgrade ([`authorize`]). A `read`
//! token follows the events only: its client frames get an error event.
//!
//! This folder knows HTTP, WebSocket and SSE framing; the events come from
//! [`crate::follow`] and the store, and it names no Redis key.

pub(crate) mod caps;
mod place;
mod sse;
mod ws;

use axum::extract::rejection::QueryRejection;
use axum::http::{HeaderMap, header};
use serde::Deserialize;

use crate::api::ApiState;
use crate::api::http::error::ApiError;
use crate::api::http::tokens::{Scope, TokenError};
use crate::api::v1::jobs::owned_job;
use crate::job::Status;
use crate::store::JobRecord;

pub(crate) use sse::events;
pub(crate) use ws::{MAX_CONTROL_MESSAGES, MAX_SIGNALS, websocket};

/// `?token=&after=` of both streams.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamQuery {
    token: Option<String>,
    after: Option<String>,
}

/// A `seq` to resume after, from `?after=` or `Last-Event-ID`.
fn parse_after(text: Option<&str>, field: &'static str) -> Result<u64, ApiError> {
    match text.map(str::trim) {
        None | Some("") => Ok(0),
        Some(text) => text.parse().map_err(|_| ApiError::InvalidRequest {
            field,
            message: format!("{text:?} is not an event seq (a non-negative integer)"),
        }),
    }
}

fn query_error(rejection: QueryRejection) -> ApiError {
    ApiError::InvalidRequest {
        field: "query",
        message: rejection.body_text().to_lowercase(),
    }
}

/// How a stream was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// With the API key the job was submitted with.
    Key,
    /// With one of the job's attach tokens.
    Token(Scope),
}

impl Access {
    /// Whether stdin and signals may be sent.
    fn may_control(self) -> bool {
        matches!(self, Access::Key | Access::Token(Scope::Control))
    }
}

const REVOKED: &str = "the attach token was revoked: the job was cancelled";

/// Who may open the job's streams: the API key it was submitted with, or its
/// attach token while the job is not cancelled. The key wins when both are
/// given.
async fn authorize(
    state: &ApiState,
    headers: &HeaderMap,
    id: &str,
    token: Option<&str>,
) -> Result<(JobRecord, Access), ApiError> {
    if headers.contains_key(header::AUTHORIZATION) {
        let caller = state.keys().authenticate_headers(headers)?;
        return Ok((owned_job(state, &caller, id).await?, Access::Key));
    }
    let token = token.ok_or(ApiError::Unauthorized(
        "give the api key (Authorization: Bearer) or the job's attach token",
    ))?;
    let scope = match state.tokens().verify(id, token) {
        Ok(scope) => scope,
        Err(TokenError::Expired) => {
            return Err(ApiError::Unauthorized("the attach token has expired"));
        }
        Err(TokenError::Invalid) => {
            return Err(ApiError::Unauthorized("the attach token is not valid"));
        }
        Err(TokenError::OtherJob) => {
            return Err(ApiError::Forbidden("the attach token is for another job"));
        }
    };
    let store = &state.inner.store;
    let record = store
        .jobs()
        .get(id)
        .await?
        .ok_or(ApiError::NotFound("job not found"))?;
    if record.status == Status::Cancelled || store.jobs().cancel_requested(id).await? {
        return Err(ApiError::Unauthorized(REVOKED));
    }
    Ok((record, Access::Token(scope)))
}

#[cfg(test)]
mod tests;
