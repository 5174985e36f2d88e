//! Configuration shared by every role: each setting is a flag and a
//! `CODE_RUNNER_*` environment variable. Everything is validated before
//! anything connects; a bad value is one line naming the setting (exit 64).
//!
//! An on/off setting takes `on` or `off`, and also `true`/`false`,
//! `yes`/`no` and `1`/`0`, in any case (see [`switch`]); clap reads it as
//! text, so a bad value is refused here, naming the setting, like any other.
//!
//! One file per settings group, each a `clap::Args` struct with the checks
//! that turn it into what its role needs: [`SandboxSettings`],
//! [`RedisSettings`], [`WorkerSettings`], [`ApiSettings`] (with its
//! [`WebSettings`] and [`CompatSettings`]) and [`ReaperSettings`].

mod api;
mod compat;
mod files;
mod reaper;
mod redis;
mod sandbox;
mod web;
mod worker;

pub use api::{ApiSettings, MAX_TOKEN_TTL_SECS};
pub use compat::CompatSettings;
pub use files::FileStoreSettings;
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

/// What an on/off setting takes, as its errors say it.
const SWITCH_VALUES: &str = "on or off (also true/false, yes/no, 1/0)";

/// The value of the on/off setting `setting`: `on`, `true`, `yes` or `1`
/// for on, `off`, `false`, `no` or `0` for off, in any case; anything else
/// is an error naming the setting and what it takes.
fn switch(setting: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(ConfigError::new(
            setting,
            format!("{value:?} is not {SWITCH_VALUES}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::switch;

    #[test]
    fn a_switch_takes_on_off_true_false_yes_no_1_0_in_any_case() {
        for on in ["on", "true", "yes", "1", "ON", "True", "Yes"] {
            assert!(switch("CODE_RUNNER_X", on).unwrap(), "{on}");
        }
        for off in ["off", "false", "no", "0", "OFF", "False", "No"] {
            assert!(!switch("CODE_RUNNER_X", off).unwrap(), "{off}");
        }
    }

    #[test]
    fn a_switch_refuses_anything_else_naming_the_setting_and_its_values() {
        for bad in ["maybe", "", " on", "y", "n", "t", "f", "2", "enabled"] {
            let error = switch("CODE_RUNNER_X", bad).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!(
                    "invalid configuration: CODE_RUNNER_X: {bad:?} is not on or off \
                     (also true/false, yes/no, 1/0)"
                )
            );
        }
    }
}
