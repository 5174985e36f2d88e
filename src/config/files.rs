//! Where the file store keeps files' bytes: Redis, or an S3-compatible
//! bucket (the metadata stays in Redis either way; see `store::files`).

use clap::Args;

use super::{ConfigError, switch};
use crate::store::files::s3::S3Config;

/// Where files' bytes live. Every process of a fleet needs the same.
#[derive(Debug, Clone, Default, Args)]
pub struct FileStoreSettings {
    /// Where files' bytes live: `redis` (beside their metadata; small
    /// deployments) or `s3` (an S3-compatible bucket; fleets and large
    /// files).
    #[arg(long, env = "CODE_RUNNER_FILE_BACKEND", default_value = "redis")]
    pub file_backend: String,

    /// The S3 endpoint's URL (`https://…`, or `http://…` on a trusted
    /// network); unset: AWS's endpoint of CODE_RUNNER_S3_REGION.
    #[arg(long, env = "CODE_RUNNER_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,

    /// The bucket files' bytes go to (it must exist).
    #[arg(long, env = "CODE_RUNNER_S3_BUCKET")]
    pub s3_bucket: Option<String>,

    /// The bucket's region.
    #[arg(long, env = "CODE_RUNNER_S3_REGION", default_value = "us-east-1")]
    pub s3_region: String,

    /// Before every object's name: `<prefix>/<key>/<sha256>/<upload id>`.
    #[arg(long, env = "CODE_RUNNER_S3_PREFIX", default_value = "files")]
    pub s3_prefix: String,

    /// The access key id (also read from AWS_ACCESS_KEY_ID).
    #[arg(long, env = "CODE_RUNNER_S3_ACCESS_KEY_ID", hide_env_values = true)]
    pub s3_access_key_id: Option<String>,

    /// The secret access key (also read from AWS_SECRET_ACCESS_KEY).
    #[arg(long, env = "CODE_RUNNER_S3_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub s3_secret_access_key: Option<String>,

    /// Path-style addressing (`endpoint/bucket/key`) rather than virtual
    /// hosts (`bucket.endpoint/key`), on or off; unset: on with
    /// CODE_RUNNER_S3_ENDPOINT (MinIO, Ceph, Garage…), off without (AWS).
    #[arg(long, env = "CODE_RUNNER_S3_PATH_STYLE")]
    pub s3_path_style: Option<String>,
}

/// The most MiB a file may have with each backend: a Redis value holds 512
/// MiB; an object far more, but a job's files are read whole by a worker.
pub const MAX_FILE_MB_REDIS: u64 = 512;
pub const MAX_FILE_MB_S3: u64 = 4096;

impl FileStoreSettings {
    /// The S3 backend's configuration, `None` for the Redis backend; an
    /// error names the first bad setting. Connects to nothing.
    pub fn s3(&self) -> Result<Option<S3Config>, ConfigError> {
        match self.file_backend.as_str() {
            // Empty: as unset.
            "redis" | "" => return Ok(None),
            "s3" => {}
            other => {
                return Err(ConfigError::new(
                    "CODE_RUNNER_FILE_BACKEND",
                    format!("{other:?} is not redis or s3"),
                ));
            }
        }
        let endpoint = match self.s3_endpoint.as_deref().filter(|e| !e.is_empty()) {
            None => None,
            Some(url) => {
                let rest = url
                    .strip_prefix("https://")
                    .or_else(|| url.strip_prefix("http://"));
                if rest.is_none_or(|host| host.is_empty() || host.starts_with('/')) {
                    return Err(ConfigError::new(
                        "CODE_RUNNER_S3_ENDPOINT",
                        format!("{url:?} is not an http:// or https:// URL"),
                    ));
                }
                Some(url.trim_end_matches('/').to_string())
            }
        };
        let bucket = self.s3_bucket.clone().unwrap_or_default();
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(ConfigError::new(
                "CODE_RUNNER_S3_BUCKET",
                if bucket.is_empty() {
                    "must be set with CODE_RUNNER_FILE_BACKEND=s3".to_string()
                } else {
                    format!("{bucket:?} is not a bucket name (3 to 63 of a-z, 0-9, '-' and '.')")
                },
            ));
        }
        if self.s3_region.is_empty()
            || !self
                .s3_region
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(ConfigError::new(
                "CODE_RUNNER_S3_REGION",
                format!("{:?} is not a region name", self.s3_region),
            ));
        }
        let prefix = &self.s3_prefix;
        if prefix.starts_with('/')
            || prefix.ends_with('/')
            || prefix.contains("//")
            || prefix.split('/').any(|part| part == "." || part == "..")
        {
            return Err(ConfigError::new(
                "CODE_RUNNER_S3_PREFIX",
                format!(
                    "{prefix:?} is not a prefix of object names (no leading, trailing or double '/', no '.' or '..')"
                ),
            ));
        }
        let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let access_key_id = self
            .s3_access_key_id
            .clone()
            .filter(|v| !v.is_empty())
            .or_else(|| from_env("AWS_ACCESS_KEY_ID"));
        let secret_access_key = self
            .s3_secret_access_key
            .clone()
            .filter(|v| !v.is_empty())
            .or_else(|| from_env("AWS_SECRET_ACCESS_KEY"));
        let Some(access_key_id) = access_key_id else {
            return Err(ConfigError::new(
                "CODE_RUNNER_S3_ACCESS_KEY_ID",
                "must be set with CODE_RUNNER_FILE_BACKEND=s3 (or AWS_ACCESS_KEY_ID)",
            ));
        };
        let Some(secret_access_key) = secret_access_key else {
            return Err(ConfigError::new(
                "CODE_RUNNER_S3_SECRET_ACCESS_KEY",
                "must be set with CODE_RUNNER_FILE_BACKEND=s3 (or AWS_SECRET_ACCESS_KEY)",
            ));
        };
        let path_style = match self.s3_path_style.as_deref() {
            None => endpoint.is_some(),
            Some(value) => switch("CODE_RUNNER_S3_PATH_STYLE", value)?,
        };
        Ok(Some(S3Config {
            endpoint,
            bucket,
            region: self.s3_region.clone(),
            prefix: prefix.clone(),
            access_key_id,
            secret_access_key,
            path_style,
        }))
    }

    /// The most MiB CODE_RUNNER_FILE_MAX_MB may say with this backend.
    pub fn max_file_mb(&self) -> u64 {
        if self.file_backend == "s3" {
            MAX_FILE_MB_S3
        } else {
            MAX_FILE_MB_REDIS
        }
    }
}
