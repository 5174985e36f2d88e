//! Configuration shared by every role: each setting is a flag and a
//! `CODE_RUNNER_*` environment variable. Everything is validated before
//! anything connects; a bad value is one line naming the setting (exit 64).

use std::path::PathBuf;

use clap::Args;

use crate::job::limits::{CompileLimitsRequest, LimitPolicy, LimitsRequest, parse_limit_list};
use crate::languages::LanguageCatalog;
use crate::sandbox::{SandboxConfig, SeccompProfile};

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

#[derive(Debug, Clone, Args)]
pub struct SandboxSettings {
    /// OCI runtime for sandboxes: runc (Docker's default) or runsc (gVisor).
    /// `SANDBOX_RUNTIME` is read too.
    #[arg(long = "runtime", env = "CODE_RUNNER_SANDBOX_RUNTIME", global = true)]
    pub runtime: Option<String>,

    /// Seccomp profile (Docker JSON format); the built-in copy of
    /// seccomp/profile.json when unset.
    #[arg(long, env = "CODE_RUNNER_SECCOMP_PROFILE", global = true)]
    pub seccomp_profile: Option<PathBuf>,

    /// Language catalog (languages.toml); the built-in copy when unset.
    #[arg(long, env = "CODE_RUNNER_LANGUAGES_FILE", global = true)]
    pub languages_file: Option<PathBuf>,

    /// CPU quota of one sandbox, in CPUs.
    #[arg(
        long,
        env = "CODE_RUNNER_SANDBOX_CPUS",
        default_value_t = 1.0,
        global = true
    )]
    pub sandbox_cpus: f64,

    /// Server defaults for job limits, as key=value,… (wall_ms, idle_ms, cpu_ms,
    /// memory_mb, pids, output_bytes, disk_mb, files_bytes).
    #[arg(long, env = "CODE_RUNNER_DEFAULT_LIMITS", global = true)]
    pub default_limits: Option<String>,

    /// Server maximums for job limits, as key=value,…; a job asking for more is
    /// refused.
    #[arg(long, env = "CODE_RUNNER_MAX_LIMITS", global = true)]
    pub max_limits: Option<String>,

    /// Defaults for the compile stage, as key=value,… (wall_ms, cpu_ms, output_bytes).
    #[arg(long, env = "CODE_RUNNER_COMPILE_DEFAULT_LIMITS", global = true)]
    pub compile_default_limits: Option<String>,

    /// Maximums for the compile stage, as key=value,….
    #[arg(long, env = "CODE_RUNNER_COMPILE_MAX_LIMITS", global = true)]
    pub compile_max_limits: Option<String>,
}

/// Everything the sandbox side needs, validated.
#[derive(Debug, Clone)]
pub struct SandboxSetup {
    pub sandbox: SandboxConfig,
    pub catalog: LanguageCatalog,
    pub policy: LimitPolicy,
}

impl SandboxSettings {
    /// The runtime after the `SANDBOX_RUNTIME` fallback; `None` is Docker's default.
    fn runtime(&self) -> Result<Option<String>, ConfigError> {
        let runtime = self
            .runtime
            .clone()
            .or_else(|| std::env::var("SANDBOX_RUNTIME").ok())
            .filter(|r| !r.is_empty());
        match runtime.as_deref() {
            None | Some("runc") => Ok(None),
            Some(name)
                if name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) =>
            {
                Ok(Some(name.to_string()))
            }
            Some(name) => Err(ConfigError::new(
                "CODE_RUNNER_SANDBOX_RUNTIME",
                format!("{name:?} is not a runtime name"),
            )),
        }
    }

    pub fn build(&self, worker_id: &str) -> Result<SandboxSetup, ConfigError> {
        let runtime = self.runtime()?;
        if !(self.sandbox_cpus > 0.0 && self.sandbox_cpus <= 64.0) {
            return Err(ConfigError::new(
                "CODE_RUNNER_SANDBOX_CPUS",
                format!("{} is not between 0 and 64", self.sandbox_cpus),
            ));
        }
        let seccomp = SeccompProfile::load(self.seccomp_profile.as_deref())
            .map_err(|e| ConfigError::new("CODE_RUNNER_SECCOMP_PROFILE", e.to_string()))?;
        let catalog = LanguageCatalog::load(self.languages_file.as_deref())
            .map_err(|e| ConfigError::new("CODE_RUNNER_LANGUAGES_FILE", e.to_string()))?;
        let policy = self.policy()?;
        let mut sandbox = SandboxConfig::new(seccomp, worker_id);
        sandbox.runtime = runtime;
        sandbox.cpus = self.sandbox_cpus;
        Ok(SandboxSetup {
            sandbox,
            catalog,
            policy,
        })
    }

    fn policy(&self) -> Result<LimitPolicy, ConfigError> {
        let mut policy = LimitPolicy::default();
        let limits = |setting, text: &Option<String>| -> Result<LimitsRequest, ConfigError> {
            text.as_deref()
                .map_or(Ok(LimitsRequest::default()), |t| {
                    parse_limit_list(t, LimitsRequest::set)
                })
                .map_err(|m| ConfigError::new(setting, m))
        };
        let compile = |setting, text: &Option<String>| {
            text.as_deref()
                .map_or(Ok(CompileLimitsRequest::default()), |t| {
                    parse_limit_list(t, CompileLimitsRequest::set)
                })
                .map_err(|m| ConfigError::new(setting, m))
        };
        policy.maximum =
            limits("CODE_RUNNER_MAX_LIMITS", &self.max_limits)?.with_defaults(policy.maximum);
        policy.defaults = limits("CODE_RUNNER_DEFAULT_LIMITS", &self.default_limits)?
            .with_defaults(policy.defaults);
        policy.compile_maximum =
            compile("CODE_RUNNER_COMPILE_MAX_LIMITS", &self.compile_max_limits)?
                .with_defaults(policy.compile_maximum);
        policy.compile_defaults = compile(
            "CODE_RUNNER_COMPILE_DEFAULT_LIMITS",
            &self.compile_default_limits,
        )?
        .with_defaults(policy.compile_defaults);
        policy
            .defaults
            .check_within("default", policy.maximum)
            .map_err(|m| ConfigError::new("CODE_RUNNER_DEFAULT_LIMITS", m))?;
        policy
            .compile_defaults
            .check_within("default", policy.compile_maximum)
            .map_err(|m| ConfigError::new("CODE_RUNNER_COMPILE_DEFAULT_LIMITS", m))?;
        Ok(policy)
    }
}
