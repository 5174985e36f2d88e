//! The settings of the Piston-, Judge0- and Jobe-compatible APIs.

use clap::Args;

use super::ConfigError;

/// The Piston-, Judge0- and Jobe-compatible APIs (`src/api/compat/`).
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

    /// Where Jobe's REST API is served (`off`: not at all); the default is
    /// the path Moodle's CodeRunner builds.
    #[arg(
        long,
        env = "CODE_RUNNER_JOBE_PREFIX",
        default_value = "/jobe/index.php/restapi"
    )]
    pub jobe_prefix: String,

    /// The name of a configured API key: Jobe requests whose `X-API-KEY` is
    /// not a code-runner key (or that have none) are served as this key,
    /// as a Jobe without API keys serves everyone. Unset: the Jobe API
    /// needs a code-runner key in `X-API-KEY`.
    #[arg(long, env = "CODE_RUNNER_JOBE_KEY")]
    pub jobe_key: Option<String>,

    /// Which origins' pages may call the Jobe API from a browser: `*` any
    /// (Jobe's default), `off` none, or origins separated by commas.
    #[arg(long, env = "CODE_RUNNER_JOBE_CORS_ORIGINS", default_value = "*")]
    pub jobe_cors_origins: String,

    /// The most `cputime` (seconds) a Jobe run may ask for, as Jobe's
    /// `cputime_upper_limit_secs` (120 in Jobe 2.2); a run asking more is
    /// refused in Jobe's words. The server's CPU maximum caps it too.
    #[arg(long, env = "CODE_RUNNER_JOBE_MAX_CPUTIME_SECS", default_value_t = 120)]
    pub jobe_max_cputime_secs: u64,
}

impl CompatSettings {
    /// The checked settings; `keys` are the configured API key names.
    pub fn validate<'a>(
        &self,
        keys: impl Iterator<Item = &'a str>,
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
        let jobe = prefix("CODE_RUNNER_JOBE_PREFIX", &self.jobe_prefix)?;
        if jobe.is_some() && (jobe == piston || jobe == judge0) {
            return Err(ConfigError::new(
                "CODE_RUNNER_JOBE_PREFIX",
                "the Jobe API cannot share a prefix with the Piston or Judge0 API",
            ));
        }
        let keys: Vec<&str> = keys.collect();
        for (setting, name) in [
            ("CODE_RUNNER_PISTON_LOOPBACK_KEY", &self.piston_loopback_key),
            ("CODE_RUNNER_JOBE_KEY", &self.jobe_key),
        ] {
            if let Some(name) = name
                && !keys.contains(&name.as_str())
            {
                return Err(ConfigError::new(
                    setting,
                    format!("{name:?} is not the name of a key in CODE_RUNNER_API_KEYS"),
                ));
            }
        }
        if self.jobe_max_cputime_secs == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_JOBE_MAX_CPUTIME_SECS",
                "must be at least 1",
            ));
        }
        let cors = |setting: &'static str, text: &str| {
            crate::api::CorsOrigins::parse(text)
                .map_err(|message| ConfigError::new(setting, message))
        };
        Ok(crate::api::CompatConfig {
            piston_prefix: piston,
            piston_loopback_key: self.piston_loopback_key.clone(),
            judge0_prefix: judge0,
            judge0_cors: cors("CODE_RUNNER_JUDGE0_CORS_ORIGINS", &self.judge0_cors_origins)?,
            jobe_prefix: jobe,
            jobe_key: self.jobe_key.clone(),
            jobe_cors: cors("CODE_RUNNER_JOBE_CORS_ORIGINS", &self.jobe_cors_origins)?,
            jobe_max_cputime_secs: self.jobe_max_cputime_secs,
        })
    }
}
