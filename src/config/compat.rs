//! The settings of the Piston- and Judge0-compatible APIs.

use clap::Args;

use super::ConfigError;

/// The Piston- and Judge0-compatible APIs (`src/api/compat/`).
#[derive(Debug, Clone, Args)]
pub struct CompatSettings {
    /// Where the Piston v2 API is served (`off`: not at all).
    #[arg(long, env = "CODE_RUNNER_PISTON_PREFIX", default_value = "/api/v2")]
    pub piston_prefix: String,

    /// Piston has no keys: with the name of a configured API key here, a
    /// Piston request without a key that comes from a loopback address
    /// (127.0.0.0/8, ::1) is served as that key (its limits apply). Requests
    /// from elsewhere still need a key.
    #[arg(long, env = "CODE_RUNNER_PISTON_LOOPBACK_KEY")]
    pub piston_loopback_key: Option<String>,

    /// Where the Judge0 CE API is served (`off`: not at all).
    #[arg(long, env = "CODE_RUNNER_JUDGE0_PREFIX", default_value = "/judge0")]
    pub judge0_prefix: String,

    /// Which origins' pages may call the Judge0 API from a browser: `*` any
    /// (Judge0's default), `off` none, or origins separated by commas
    /// (`https://quiz.example.edu,http://localhost:8080`). Preflights are
    /// answered for them; any method and request header is allowed.
    #[arg(long, env = "CODE_RUNNER_JUDGE0_CORS_ORIGINS", default_value = "*")]
    pub judge0_cors_origins: String,
}

impl CompatSettings {
    /// The checked settings; `keys` are the configured API key names.
    pub fn validate<'a>(
        &self,
        mut keys: impl Iterator<Item = &'a str>,
    ) -> Result<crate::api::CompatConfig, ConfigError> {
        let prefix = |setting: &'static str, text: &str| -> Result<Option<String>, ConfigError> {
            if text == "off" {
                return Ok(None);
            }
            let valid = text.starts_with('/')
                && !text.ends_with('/')
                && text.len() > 1
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
                && !text.contains("//");
            if !valid {
                return Err(ConfigError::new(
                    setting,
                    format!("{text:?} is not a path like /api/v2 (or off)"),
                ));
            }
            if ["/v1", "/healthz", "/readyz", "/metrics"]
                .iter()
                .any(|taken| text == *taken || text.starts_with(&format!("{taken}/")))
            {
                return Err(ConfigError::new(
                    setting,
                    format!("{text} is taken by code-runner's own API"),
                ));
            }
            Ok(Some(text.to_string()))
        };
        let piston = prefix("CODE_RUNNER_PISTON_PREFIX", &self.piston_prefix)?;
        let judge0 = prefix("CODE_RUNNER_JUDGE0_PREFIX", &self.judge0_prefix)?;
        if piston.is_some() && piston == judge0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_JUDGE0_PREFIX",
                "the Piston and Judge0 APIs cannot share a prefix",
            ));
        }
        if let Some(name) = &self.piston_loopback_key
            && !keys.any(|k| k == name)
        {
            return Err(ConfigError::new(
                "CODE_RUNNER_PISTON_LOOPBACK_KEY",
                format!("{name:?} is not the name of a key in CODE_RUNNER_API_KEYS"),
            ));
        }
        let judge0_cors = crate::api::CorsOrigins::parse(&self.judge0_cors_origins)
            .map_err(|message| ConfigError::new("CODE_RUNNER_JUDGE0_CORS_ORIGINS", message))?;
        Ok(crate::api::CompatConfig {
            piston_prefix: piston,
            piston_loopback_key: self.piston_loopback_key.clone(),
            judge0_prefix: judge0,
            judge0_cors,
        })
    }
}
