//! The orphan reaper's settings: its interval, grace, requeues and heartbeat TTL.

use clap::Args;

use super::ConfigError;

/// The orphan reaper (every worker process runs it; `code-runner reaper`
/// runs only it).
#[derive(Debug, Clone, Args)]
pub struct ReaperSettings {
    /// How often the reaper looks for dead workers and expired containers,
    /// in milliseconds.
    #[arg(long, env = "CODE_RUNNER_REAPER_INTERVAL_MS", default_value_t = 5000)]
    pub reaper_interval_ms: u64,

    /// Grace before the reaper touches a container: one of a dead worker is
    /// left alone this long after it was created, and any container this
    /// long past its deadline is removed, in milliseconds.
    #[arg(long, env = "CODE_RUNNER_REAPER_GRACE_MS", default_value_t = 30000)]
    pub reaper_grace_ms: u64,

    /// How many times a job claimed by a worker that died before starting
    /// it is put back in the queue; after that it ends as `error`
    /// (`worker_lost`) and goes to `jobs:dead`.
    #[arg(long, env = "CODE_RUNNER_MAX_REQUEUES", default_value_t = 3)]
    pub max_requeues: u32,

    /// How long a worker's heartbeat lives without a refresh, in
    /// milliseconds (the worker's setting; the reaper waits this long of
    /// healthy Redis after any failure before it judges a worker dead).
    #[arg(long, env = "CODE_RUNNER_HEARTBEAT_TTL_MS", default_value_t = 15000)]
    pub heartbeat_ttl_ms: u64,

    /// Address of the `reaper` command's own /healthz and /metrics.
    #[arg(
        long,
        env = "CODE_RUNNER_REAPER_LISTEN",
        default_value = "127.0.0.1:8082"
    )]
    pub reaper_listen: std::net::SocketAddr,
}

impl ReaperSettings {
    /// The reaper's configuration; `own_worker` is the worker of the same
    /// process, if any.
    pub fn validate(
        &self,
        own_worker: Option<String>,
    ) -> Result<crate::reaper::ReaperConfig, ConfigError> {
        if self.reaper_interval_ms == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_REAPER_INTERVAL_MS",
                "must be at least 1",
            ));
        }
        if self.max_requeues > 1000 {
            return Err(ConfigError::new(
                "CODE_RUNNER_MAX_REQUEUES",
                "must be at most 1000",
            ));
        }
        if self.heartbeat_ttl_ms == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_HEARTBEAT_TTL_MS",
                "must be at least 1",
            ));
        }
        Ok(crate::reaper::ReaperConfig {
            interval: std::time::Duration::from_millis(self.reaper_interval_ms),
            grace: std::time::Duration::from_millis(self.reaper_grace_ms),
            max_requeues: self.max_requeues,
            heartbeat_ttl: std::time::Duration::from_millis(self.heartbeat_ttl_ms),
            own_worker,
        })
    }
}
