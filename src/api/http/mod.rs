//! The HTTP plumbing under every route: the server loop and its connection
//! timers, the one error type, API keys and attach tokens, the per-key
//! request rate.

pub mod auth;
pub mod error;
mod idle;
pub(crate) mod ratelimit;
pub mod server;
pub mod tokens;
