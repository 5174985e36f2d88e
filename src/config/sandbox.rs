//! The sandbox settings: runtime, seccomp, language catalog, job limits and uids.

use std::path::PathBuf;

use clap::Args;

use super::ConfigError;
use crate::job::limits::{CompileLimitsRequest, LimitPolicy, LimitsRequest, parse_limit_list};
use crate::languages::LanguageCatalog;
use crate::sandbox::{Door, SandboxConfig, SeccompProfile};

#[derive(Debug, Clone, Args)]
pub struct SandboxSettings {
    /// OCI runtime for sandboxes: runc (Docker's default) or runsc (gVisor).
    /// `SANDBOX_RUNTIME` is read too.
    #[arg(long = "runtime", env = "CODE_RUNNER_SANDBOX_RUNTIME")]
    pub runtime: Option<String>,

    /// Seccomp profile (Docker JSON format); the built-in copy of
    /// seccomp/profile.json when unset.
    #[arg(long, env = "CODE_RUNNER_SECCOMP_PROFILE")]
    pub seccomp_profile: Option<PathBuf>,

    /// Kernel doors the seccomp profile may re-open, comma-separated:
    /// socket-families, compat-abi, modify_ldt. A profile that re-opens one
    /// not listed here is refused.
    #[arg(long, env = "CODE_RUNNER_SECCOMP_ALLOW")]
    pub seccomp_allow: Option<String>,

    /// Language catalog (languages.toml); the built-in copy when unset.
    #[arg(long, env = "CODE_RUNNER_LANGUAGES_FILE")]
    pub languages_file: Option<PathBuf>,

    /// CPU quota of one sandbox, in CPUs.
    #[arg(long, env = "CODE_RUNNER_SANDBOX_CPUS", default_value_t = 1.0)]
    pub sandbox_cpus: f64,

    /// Server defaults for job limits, as key=value,… (wall_ms, idle_ms, cpu_ms,
    /// memory_mb, pids, output_bytes, disk_mb, files_bytes).
    #[arg(long, env = "CODE_RUNNER_DEFAULT_LIMITS")]
    pub default_limits: Option<String>,

    /// Server maximums for job limits, as key=value,…; a job asking for more is
    /// refused.
    #[arg(long, env = "CODE_RUNNER_MAX_LIMITS")]
    pub max_limits: Option<String>,

    /// Defaults for the compile stage, as key=value,… (wall_ms, cpu_ms, output_bytes).
    #[arg(long, env = "CODE_RUNNER_COMPILE_DEFAULT_LIMITS")]
    pub compile_default_limits: Option<String>,

    /// Maximums for the compile stage, as key=value,….
    #[arg(long, env = "CODE_RUNNER_COMPILE_MAX_LIMITS")]
    pub compile_max_limits: Option<String>,

    /// First uid of the host's sandbox uids: each live sandbox runs as a uid
    /// of its own from `base` up (every process takes a range of 4096).
    #[arg(long, env = "CODE_RUNNER_SANDBOX_UID_BASE", default_value_t = crate::sandbox::DEFAULT_UID_BASE)]
    pub sandbox_uid_base: u32,

    /// Directory of the host-wide locks that hand out the uid ranges.
    #[arg(long, env = "CODE_RUNNER_UID_LOCK_DIR", default_value = crate::sandbox::DEFAULT_LOCK_DIR)]
    pub uid_lock_dir: PathBuf,

    /// Directory of the per-job egress sockets (jobs with network; see
    /// docs/egress.md). On the host of the Docker daemon: it is mounted
    /// into the sandboxes.
    #[arg(long, env = "CODE_RUNNER_EGRESS_DIR", default_value = crate::sandbox::DEFAULT_EGRESS_DIR)]
    pub egress_dir: PathBuf,

    /// The OCI runtime of sandboxes with network. Default: the sandboxes'
    /// runtime, but `runsc-egress` for `runsc` (runsc with
    /// `--host-uds=open`, which only those sandboxes need).
    #[arg(long, env = "CODE_RUNNER_EGRESS_RUNTIME")]
    pub egress_runtime: Option<String>,

    /// Most bytes (in MiB) one job may relay through its egress proxy, both
    /// ways together.
    #[arg(long, env = "CODE_RUNNER_EGRESS_MAX_MB", default_value_t = 64)]
    pub egress_max_mb: u64,

    /// Most connections one job may open through its egress proxy (refused
    /// ones count).
    #[arg(
        long,
        env = "CODE_RUNNER_EGRESS_MAX_CONNECTIONS",
        default_value_t = 256
    )]
    pub egress_max_connections: u32,

    /// Most MiB of compiled checker programs the worker keeps for the next
    /// graded job with the same checker (per API key; see docs/grading.md);
    /// 0 turns the cache off.
    #[arg(long, env = "CODE_RUNNER_CHECKER_CACHE_MB", default_value_t = crate::sandbox::DEFAULT_CHECKER_CACHE_MB)]
    pub checker_cache_mb: u64,

    /// Tests only: `name=address,…` answers instead of DNS for the egress
    /// proxy, loopback let through (only non-public addresses accepted).
    #[arg(long, env = "CODE_RUNNER_TEST_EGRESS_HOSTS", hide = true)]
    pub test_egress_hosts: Option<String>,
}

/// Most MiB `CODE_RUNNER_CHECKER_CACHE_MB` may ask for: the cache lives in
/// the worker's memory.
const MAX_CHECKER_CACHE_MB: u64 = 16 * 1024;

/// Everything the sandbox side needs, validated.
#[derive(Debug, Clone)]
pub struct SandboxSetup {
    pub sandbox: SandboxConfig,
    pub catalog: LanguageCatalog,
    pub policy: LimitPolicy,
}

/// `name` when it can be an OCI runtime's name (letters, digits, `-_.`),
/// else the error of `setting`.
fn runtime_name(setting: &'static str, name: String) -> Result<String, ConfigError> {
    if name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        Ok(name)
    } else {
        Err(ConfigError::new(
            setting,
            format!("{name:?} is not a runtime name"),
        ))
    }
}

impl SandboxSettings {
    /// The egress settings, checked.
    fn egress(&self) -> Result<crate::sandbox::EgressConfig, ConfigError> {
        if !self.egress_dir.is_absolute() {
            return Err(ConfigError::new(
                "CODE_RUNNER_EGRESS_DIR",
                format!("{:?} is not an absolute path", self.egress_dir),
            ));
        }
        let runtime = self
            .egress_runtime
            .clone()
            .filter(|r| !r.is_empty())
            .map(|name| runtime_name("CODE_RUNNER_EGRESS_RUNTIME", name))
            .transpose()?;
        if !(1..=1_048_576).contains(&self.egress_max_mb) {
            return Err(ConfigError::new(
                "CODE_RUNNER_EGRESS_MAX_MB",
                "must be between 1 and 1048576",
            ));
        }
        if !(1..=100_000).contains(&self.egress_max_connections) {
            return Err(ConfigError::new(
                "CODE_RUNNER_EGRESS_MAX_CONNECTIONS",
                "must be between 1 and 100000",
            ));
        }
        let test_hosts = self
            .test_egress_hosts
            .as_deref()
            .filter(|t| !t.trim().is_empty())
            .map(crate::sandbox::parse_test_hosts)
            .transpose()
            .map_err(|message| ConfigError::new("CODE_RUNNER_TEST_EGRESS_HOSTS", message))?;
        if test_hosts.is_some() {
            tracing::warn!(
                "CODE_RUNNER_TEST_EGRESS_HOSTS is set: the egress proxy resolves only the names it gives and lets loopback through (a test setting)"
            );
        }
        Ok(crate::sandbox::EgressConfig {
            dir: self.egress_dir.clone(),
            runtime,
            max_bytes: self.egress_max_mb << 20,
            max_connections: self.egress_max_connections,
            test_hosts,
            unavailable: None,
        })
    }

    /// The runtime after the `SANDBOX_RUNTIME` fallback; `None` is Docker's default.
    fn runtime(&self) -> Result<Option<String>, ConfigError> {
        let runtime = self
            .runtime
            .clone()
            .or_else(|| std::env::var("SANDBOX_RUNTIME").ok())
            .filter(|r| !r.is_empty());
        match runtime {
            None => Ok(None),
            Some(name) if name == "runc" => Ok(None),
            Some(name) => runtime_name("CODE_RUNNER_SANDBOX_RUNTIME", name).map(Some),
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
        let doors = Door::parse_list(self.seccomp_allow.as_deref().unwrap_or(""))
            .map_err(|message| ConfigError::new("CODE_RUNNER_SECCOMP_ALLOW", message))?;
        let seccomp = SeccompProfile::load_allowing(self.seccomp_profile.as_deref(), &doors)
            .map_err(|e| ConfigError::new("CODE_RUNNER_SECCOMP_PROFILE", e.to_string()))?;
        let catalog = LanguageCatalog::load(self.languages_file.as_deref())
            .map_err(|e| ConfigError::new("CODE_RUNNER_LANGUAGES_FILE", e.to_string()))?;
        let policy = self.policy()?;
        if self.sandbox_uid_base < 1000
            || self
                .sandbox_uid_base
                .checked_add(crate::sandbox::RANGE_SIZE * crate::sandbox::uids_ranges())
                .is_none()
        {
            return Err(ConfigError::new(
                "CODE_RUNNER_SANDBOX_UID_BASE",
                format!(
                    "{} must be at least 1000 and leave room for {} ranges of {} uids below 2^32",
                    self.sandbox_uid_base,
                    crate::sandbox::uids_ranges(),
                    crate::sandbox::RANGE_SIZE
                ),
            ));
        }
        if !self.uid_lock_dir.is_absolute() {
            return Err(ConfigError::new(
                "CODE_RUNNER_UID_LOCK_DIR",
                format!("{:?} is not an absolute path", self.uid_lock_dir),
            ));
        }
        if self.checker_cache_mb > MAX_CHECKER_CACHE_MB {
            return Err(ConfigError::new(
                "CODE_RUNNER_CHECKER_CACHE_MB",
                format!(
                    "{} is more than {MAX_CHECKER_CACHE_MB} (MiB of the worker's memory)",
                    self.checker_cache_mb
                ),
            ));
        }
        let egress = self.egress()?;
        let mut sandbox = SandboxConfig::new(seccomp, worker_id);
        sandbox.checker_cache =
            crate::sandbox::checker_cache::CheckerCache::new(self.checker_cache_mb << 20);
        sandbox.egress = egress;
        sandbox.runtime = runtime;
        sandbox.cpus = self.sandbox_cpus;
        sandbox.uid_base = self.sandbox_uid_base;
        sandbox.uid_lock_dir = self.uid_lock_dir.clone();
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
