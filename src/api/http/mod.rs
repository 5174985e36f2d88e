//! The HTTP plumbing under every route: the server loop and its connection
//! timers, the one error type, API keys and attach tokens, the per-key
//! request rate.

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
