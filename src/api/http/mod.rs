//! The HTTP plumbing under every route, none of it a route itself:
//!
//! - [`server`]: the server loop (hyper), with two timers per connection
//!   ([`idle`]: a short header timeout, a long keep-alive);
//! - [`error`]: the one error type, [`ApiError`], and its JSON answers;
//! - [`auth`]: API keys, checked in constant time; [`tokens`]: the
//!   job-scoped attach tokens a browser follows a job with;
//! - [`ratelimit`]: the per-key request rate; [`refusals`]: the count of
//!   refused submissions, by reason;
//! - here: the request log line, and the answers to a path or a method no
//!   route takes.
//!
//! What a route does is in [`super::v1`], [`super::streams`],
//! [`super::pages`] and [`super::compat`]; nothing here knows a route.

pub mod auth;
pub mod error;
mod idle;
pub(crate) mod ratelimit;
pub mod refusals;
pub mod server;
pub mod tokens;

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

use error::ApiError;

/// One debug line per request: method, path, status, time taken.
pub(crate) async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::debug!(
        http.method = %method,
        http.path = %path,
        http.status = response.status().as_u16(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "request served"
    );
    response
}

/// The answer to a path no route takes.
pub(crate) async fn no_route() -> ApiError {
    ApiError::NotFound("no such route")
}

/// The answer to a method the path's route does not take.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
