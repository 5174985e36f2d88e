//! The Redis settings: where the shared state lives and how long results
//! the run history and the usage ledger are kept.

use clap::Args;

use super::{ConfigError, FileStoreSettings};

/// Where the shared state lives.
#[derive(Debug, Clone, Args)]
pub struct RedisSettings {
    /// Redis URL (it may hold a password, so `--help` never shows the
    /// environment's value).
    #[arg(
        long,
        env = "CODE_RUNNER_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: String,

    /// Prefix of every Redis key (e.g. `cr:`), to share one Redis.
    #[arg(long, env = "CODE_RUNNER_REDIS_PREFIX", default_value = "")]
    pub redis_prefix: String,

    /// Connections in the Redis pool (blocking reads use their own).
    #[arg(long, env = "CODE_RUNNER_REDIS_POOL_SIZE", default_value_t = 16)]
    pub redis_pool_size: usize,

    /// How long a finished job (its key and streams) is kept, in seconds.
    #[arg(long, env = "CODE_RUNNER_RESULT_TTL_SECS", default_value_t = 3600)]
    pub result_ttl_secs: u64,

    /// How long the run history (`GET /v1/jobs`) lists a job, in days,
    /// whatever the result TTL.
    #[arg(long, env = "CODE_RUNNER_HISTORY_DAYS", default_value_t = 7)]
    pub history_days: u64,

    /// How many days each UTC day of the usage ledger (`GET /v1/usage`) is
    /// kept after it ends; also the longest range `/v1/usage` answers.
    #[arg(long, env = "CODE_RUNNER_USAGE_RETENTION_DAYS", default_value_t = crate::store::usage::DEFAULT_RETENTION_DAYS)]
    pub usage_retention_days: u64,

    /// Where files' bytes live (the store's, so every role has it).
    #[command(flatten)]
    pub files: FileStoreSettings,
}

/// The longest history window, in days.
const MAX_HISTORY_DAYS: u64 = 366;

/// The longest usage retention: ten years.
pub const MAX_USAGE_RETENTION_DAYS: u64 = 3660;

impl RedisSettings {
    pub fn build(&self) -> Result<crate::store::Store, ConfigError> {
        if !(self.redis_url.starts_with("redis://") || self.redis_url.starts_with("rediss://")) {
            return Err(ConfigError::new(
                "CODE_RUNNER_REDIS_URL",
                format!("{:?} is not a redis:// URL", self.redis_url),
            ));
        }
        if self.redis_pool_size == 0 || self.redis_pool_size > 1024 {
            return Err(ConfigError::new(
                "CODE_RUNNER_REDIS_POOL_SIZE",
                "must be between 1 and 1024",
            ));
        }
        if self.result_ttl_secs == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_RESULT_TTL_SECS",
                "must be at least 1",
            ));
        }
        if !(1..=MAX_HISTORY_DAYS).contains(&self.history_days) {
            return Err(ConfigError::new(
                "CODE_RUNNER_HISTORY_DAYS",
                format!("must be between 1 and {MAX_HISTORY_DAYS}"),
            ));
        }
        if !(1..=MAX_USAGE_RETENTION_DAYS).contains(&self.usage_retention_days) {
            return Err(ConfigError::new(
                "CODE_RUNNER_USAGE_RETENTION_DAYS",
                format!("must be between 1 and {MAX_USAGE_RETENTION_DAYS}"),
            ));
        }
        let store = crate::store::Store::new(
            &self.redis_url,
            &self.redis_prefix,
            std::time::Duration::from_secs(self.result_ttl_secs),
            self.redis_pool_size,
        )
        .map_err(|e| ConfigError::new("CODE_RUNNER_REDIS_URL", e.to_string()))?;
        let store = store
            .with_history_window(std::time::Duration::from_secs(self.history_days * 86_400))
            .with_usage_retention(std::time::Duration::from_secs(
                self.usage_retention_days * 86_400,
            ));
        // Last: the other `with_` make the store anew.
        match self.files.s3()? {
            None => Ok(store),
            Some(config) => {
                let objects = crate::store::files::s3::Objects::new(&config)
                    .map_err(|e| ConfigError::new("CODE_RUNNER_S3_ENDPOINT", e))?;
                Ok(store.with_s3_files(objects))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn settings(history_days: u64) -> RedisSettings {
        RedisSettings {
            redis_url: "redis://127.0.0.1:6379".into(),
            redis_prefix: String::new(),
            redis_pool_size: 4,
            result_ttl_secs: 60,
            history_days,
            usage_retention_days: 90,
            files: FileStoreSettings::default(),
        }
    }

    #[test]
    fn the_history_window_is_whole_days_from_1_to_366() {
        let store = settings(7).build().unwrap();
        assert_eq!(store.history_window(), Duration::from_secs(7 * 86_400));
        assert_eq!(store.result_ttl(), Duration::from_secs(60));
        assert_eq!(
            settings(366).build().unwrap().history_window(),
            Duration::from_secs(366 * 86_400)
        );
        for days in [0, 367] {
            let error = settings(days).build().unwrap_err();
            assert_eq!(
                error.to_string(),
                "invalid configuration: CODE_RUNNER_HISTORY_DAYS: must be between 1 and 366"
            );
        }
    }
}
