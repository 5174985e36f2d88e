//! Configuration shared by every role: each setting is a flag and a
//! `CODE_RUNNER_*` environment variable. Everything is validated before
//! anything connects; a bad value is one line naming the setting (exit 64).
//!
//! One file per settings group, each a `clap::Args` struct with the checks
//! that turn it into what its role needs: [`SandboxSettings`],
//! [`RedisSettings`], [`WorkerSettings`], [`ApiSettings`] (with its
//! [`WebSettings`] and [`CompatSettings`]) and [`ReaperSettings`].

mod api;
mod compat;
mod reaper;
mod redis;
mod sandbox;
mod web;
mod worker;

pub use api::{ApiSettings, MAX_TOKEN_TTL_SECS};
pub use compat::CompatSettings;
pub use reaper::ReaperSettings;
pub use redis::RedisSettings;
pub use sandbox::{SandboxSettings, SandboxSetup};
pub use web::WebSettings;
pub use worker::WorkerSettings;

/// A setting that failed validation.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {setting}: {message}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub message: String,
}

impl ConfigError {
    fn new(setting: &'static str, message: impl Into<String>) -> Self {
        Self {
            setting,
            message: message.into(),
        }
    }
}
