//! The plan of a process: every setting of the roles it runs, validated
//! into what each role needs, before anything binds or connects. A bad
//! setting is the one [`ConfigError`] that names it.

use std::net::SocketAddr;
use std::time::Duration;

use crate::api::{ApiKeys, ApiLimits, CompatConfig, WebUi};
use crate::config::{
    ApiSettings, ConfigError, ReaperSettings, RedisSettings, SandboxSettings, SandboxSetup,
    WorkerSettings,
};
use crate::reaper::ReaperConfig;
use crate::store::Store;
use crate::worker::WorkerConfig;

/// The roles one process runs, with their settings: what the `serve`, `api`,
/// `worker` and `reaper` commands ask for. A worker always has a reaper
/// beside it, whose settings it shares (the heartbeat TTL, the requeues).
#[derive(Debug, Clone, Copy)]
pub enum Roles<'a> {
    /// API + worker + reaper (`serve`).
    Serve {
        api: &'a ApiSettings,
        worker: &'a WorkerSettings,
        reaper: &'a ReaperSettings,
    },
    /// The API alone (`api`).
    Api { api: &'a ApiSettings },
    /// A worker and its reaper (`worker`).
    Worker {
        worker: &'a WorkerSettings,
        reaper: &'a ReaperSettings,
    },
    /// The reaper alone (`reaper`).
    Reaper { reaper: &'a ReaperSettings },
}

impl<'a> Roles<'a> {
    fn api(self) -> Option<&'a ApiSettings> {
        match self {
            Self::Serve { api, .. } | Self::Api { api } => Some(api),
            Self::Worker { .. } | Self::Reaper { .. } => None,
        }
    }

    fn worker(self) -> Option<&'a WorkerSettings> {
        match self {
            Self::Serve { worker, .. } | Self::Worker { worker, .. } => Some(worker),
            Self::Api { .. } | Self::Reaper { .. } => None,
        }
    }

    fn reaper(self) -> Option<&'a ReaperSettings> {
        match self {
            Self::Serve { reaper, .. } | Self::Worker { reaper, .. } | Self::Reaper { reaper } => {
                Some(reaper)
            }
            Self::Api { .. } => None,
        }
    }

    /// Where the process's HTTP server listens: the API's address, else
    /// the worker's own /metrics and /healthz, else the reaper's.
    fn listen(self) -> SocketAddr {
        match self {
            Self::Serve { api, .. } | Self::Api { api } => api.listen,
            Self::Worker { worker, .. } => worker.worker_listen,
            Self::Reaper { reaper } => reaper.reaper_listen,
        }
    }
}

/// Everything one process needs, validated; nothing has bound or
/// connected. Each role is there when the process runs it.
pub struct Plan {
    /// Where the process's HTTP server listens: the API's address, else the
    /// worker's own /metrics and /healthz, else the reaper's.
    pub listen: SocketAddr,
    /// The sandboxes' configuration (with the worker's linger), the
    /// language catalog and the limit policy.
    pub setup: SandboxSetup,
    /// The Redis store: a pool that connects when first used.
    pub store: Store,
    pub api: Option<ApiPlan>,
    pub worker: Option<WorkerConfig>,
    /// Every process with a worker runs the reaper too.
    pub reaper: Option<ReaperConfig>,
}

/// The API role, validated.
pub struct ApiPlan {
    /// The API keys, with the hosts their jobs may reach.
    pub keys: ApiKeys,
    /// The attach tokens' secret; `None`: derived from a salt kept in Redis
    /// and the keys.
    pub token_secret: Option<String>,
    /// How long an attach token stays valid.
    pub token_ttl: Duration,
    pub limits: ApiLimits,
    /// The browser pages (playground, dashboard).
    pub web: WebUi,
    /// The Piston- and Judge0-compatible APIs.
    pub compat: CompatConfig,
    /// Submissions are refused (429) once this many jobs are queued.
    pub max_queue_depth: u64,
    /// Largest request body (413 above it).
    pub max_body_bytes: usize,
    /// Longest a `?wait=true` submit blocks.
    pub max_wait: Duration,
}

impl Plan {
    /// Checks every setting of `roles`, in a fixed order (the first bad one
    /// is the error); connects and binds nothing.
    pub fn validate(
        sandbox: &SandboxSettings,
        redis: &RedisSettings,
        roles: Roles<'_>,
    ) -> Result<Self, ConfigError> {
        let worker_id = roles
            .worker()
            .zip(roles.reaper())
            .map(|(worker, reaper)| worker.validate(reaper))
            .transpose()?;
        let reaper = roles
            .reaper()
            .map(|r| r.validate(worker_id.clone()))
            .transpose()?;
        let file_max_mb = redis.files.max_file_mb();
        let api_limits = roles.api().map(|api| api.limits(file_max_mb)).transpose()?;
        // The sandboxes are labelled with the worker's id (a process
        // without a worker creates none).
        let default_id = if reaper.is_some() { "reaper" } else { "api" };
        let mut setup = sandbox.build(worker_id.as_deref().unwrap_or(default_id))?;
        let store = redis.build()?;
        let mut worker = match (roles.worker().zip(roles.reaper()), worker_id) {
            (Some((worker, reaper)), Some(id)) => {
                Some(worker.config(id, reaper, &setup.catalog)?)
            }
            _ => None,
        };
        if let (Some(worker), Some(limits)) = (worker.as_mut(), api_limits.as_ref()) {
            // Output files a worker stores are files like the API's:
            // the same size limit and keep time.
            worker.outputs.file_max_bytes = limits.file_max_bytes;
            worker.outputs.file_keep = limits.file_keep;
        }
        let api = roles
            .api()
            .zip(api_limits)
            .map(|(api, limits)| ApiPlan::validate(api, limits))
            .transpose()?;
        // Yielding on: a finished job's container lingers for the removal
        // queue (see `worker::removals`).
        if worker.as_ref().is_some_and(|w| w.yield_while_busy) {
            setup.sandbox.linger = crate::worker::LINGER;
        }
        Ok(Self {
            listen: roles.listen(),
            setup,
            store,
            api,
            worker,
            reaper,
        })
    }

    /// The roles this process runs, as its readiness status names them.
    pub fn role_names(&self) -> Vec<&'static str> {
        [
            self.api.as_ref().map(|_| "api"),
            self.worker.as_ref().map(|_| "worker"),
            self.reaper.as_ref().map(|_| "reaper"),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl ApiPlan {
    /// The API's settings past its limits (checked first, with the other
    /// roles' settings): the token secret and lifetime, the keys, the
    /// browser pages, the compatible APIs.
    fn validate(api: &ApiSettings, limits: ApiLimits) -> Result<Self, ConfigError> {
        let token_secret = api.token_secret()?.map(str::to_owned);
        let keys = api.keys()?;
        let web = api.web(&keys)?;
        let compat = api.compat.validate(keys.names())?;
        Ok(Self {
            keys,
            token_secret,
            token_ttl: Duration::from_secs(api.token_ttl_secs),
            limits,
            web,
            compat,
            max_queue_depth: api.max_queue_depth,
            max_body_bytes: api.max_body_bytes,
            max_wait: Duration::from_millis(api.max_wait_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::{Plan, Roles};
    use crate::config::{
        ApiSettings, ConfigError, ReaperSettings, RedisSettings, SandboxSettings, WorkerSettings,
    };

    /// Every settings group, as the `serve` command reads them.
    #[derive(Parser)]
    struct Settings {
        #[command(flatten)]
        sandbox: SandboxSettings,
        #[command(flatten)]
        redis: RedisSettings,
        #[command(flatten)]
        worker: WorkerSettings,
        #[command(flatten)]
        api: ApiSettings,
        #[command(flatten)]
        reaper: ReaperSettings,
    }

    const KEYS: &str = "ops:0123456789abcdef0123:admin,web:fedcba9876543210fedc";

    /// The settings of `args` (after two API keys).
    fn settings(args: &[&str]) -> Settings {
        let base = ["code-runner", "--api-keys", KEYS, "--worker-id", "w1"];
        Settings::try_parse_from(base.iter().chain(args)).unwrap()
    }

    fn serve(s: &Settings) -> Roles<'_> {
        Roles::Serve {
            api: &s.api,
            worker: &s.worker,
            reaper: &s.reaper,
        }
    }

    fn plan(s: &Settings, roles: Roles<'_>) -> Result<Plan, ConfigError> {
        Plan::validate(&s.sandbox, &s.redis, roles)
    }

    #[test]
    fn serve_plans_every_role_on_the_apis_address() {
        let s = settings(&["--listen", "127.0.0.1:9000", "--max-requeues", "7"]);
        let plan = plan(&s, serve(&s)).unwrap();
        assert_eq!(plan.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(plan.role_names(), ["api", "worker", "reaper"]);
        let worker = plan.worker.as_ref().unwrap();
        assert_eq!(worker.id, "w1");
        // The worker shares the reaper's heartbeat TTL and requeues.
        assert_eq!(worker.heartbeat_ttl, Duration::from_millis(15_000));
        assert_eq!(worker.max_requeues, 7);
        let reaper = plan.reaper.as_ref().unwrap();
        assert_eq!(reaper.own_worker.as_deref(), Some("w1"));
        assert_eq!(plan.setup.sandbox.worker_id, "w1");
        let api = plan.api.as_ref().unwrap();
        assert_eq!(api.keys.names().collect::<Vec<_>>(), ["ops", "web"]);
        assert_eq!(api.token_secret, None);
    }

    #[test]
    fn each_role_alone_listens_on_its_own_address() {
        let s = settings(&[
            "--worker-listen",
            "127.0.0.1:9001",
            "--reaper-listen",
            "127.0.0.1:9002",
        ]);
        let api = plan(&s, Roles::Api { api: &s.api }).unwrap();
        assert_eq!(api.role_names(), ["api"]);
        assert_eq!(api.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(api.setup.sandbox.worker_id, "api");
        let worker = Roles::Worker {
            worker: &s.worker,
            reaper: &s.reaper,
        };
        let worker = plan(&s, worker).unwrap();
        assert_eq!(worker.role_names(), ["worker", "reaper"]);
        assert_eq!(worker.listen.to_string(), "127.0.0.1:9001");
        let reaper = plan(&s, Roles::Reaper { reaper: &s.reaper }).unwrap();
        assert_eq!(reaper.role_names(), ["reaper"]);
        assert_eq!(reaper.listen.to_string(), "127.0.0.1:9002");
        assert_eq!(reaper.setup.sandbox.worker_id, "reaper");
        assert_eq!(reaper.reaper.unwrap().own_worker, None);
    }

    #[test]
    fn a_yielding_worker_lets_finished_containers_linger() {
        let linger = |value: &str| {
            let s = settings(&["--yield-while-busy", value]);
            let plan = plan(&s, serve(&s)).unwrap();
            assert_eq!(plan.worker.unwrap().yield_while_busy, value == "on");
            plan.setup.sandbox.linger
        };
        assert_eq!(linger("on"), crate::worker::LINGER);
        assert_eq!(linger("off"), Duration::ZERO);
        // Without a worker, nothing lingers.
        let s = settings(&[]);
        let reaper = plan(&s, Roles::Reaper { reaper: &s.reaper }).unwrap();
        assert_eq!(reaper.setup.sandbox.linger, Duration::ZERO);
    }

    #[test]
    fn a_bad_setting_of_any_role_is_the_error_naming_it() {
        for (args, setting) in [
            (
                &["--worker-max-sandboxes", "0"][..],
                "CODE_RUNNER_WORKER_MAX_SANDBOXES",
            ),
            (
                &["--reaper-interval-ms", "0"],
                "CODE_RUNNER_REAPER_INTERVAL_MS",
            ),
            (&["--key-rate", "0"], "CODE_RUNNER_KEY_RATE"),
            (&["--sandbox-cpus", "0"], "CODE_RUNNER_SANDBOX_CPUS"),
            (&["--redis-url", "http://x"], "CODE_RUNNER_REDIS_URL"),
            (&["--warm", "cobol=1"], "CODE_RUNNER_WARM"),
            (&["--warm-runtimes", "maybe"], "CODE_RUNNER_WARM_RUNTIMES"),
            (&["--token-secret", "short"], "CODE_RUNNER_TOKEN_SECRET"),
            (
                &["--key-egress", "nobody=example.com"],
                "CODE_RUNNER_KEY_EGRESS",
            ),
            (
                &["--playground-key", "nobody"],
                "CODE_RUNNER_PLAYGROUND_KEY",
            ),
            (&["--judge0-prefix", "/v1"], "CODE_RUNNER_JUDGE0_PREFIX"),
            (
                &["--judge0-cors-origins", "quiz.example.edu"],
                "CODE_RUNNER_JUDGE0_CORS_ORIGINS",
            ),
        ] {
            let s = settings(args);
            let error = plan(&s, serve(&s)).err().unwrap();
            assert_eq!(error.setting, setting, "{args:?}: {error}");
        }
        // The file store's settings, with the S3 backend.
        let s3 = ["--file-backend", "s3", "--s3-bucket", "files-1"];
        let s = settings(&["--file-backend", "s3", "--s3-bucket", "No_Such"]);
        let error = plan(&s, serve(&s)).err().unwrap();
        assert_eq!(error.setting, "CODE_RUNNER_S3_BUCKET");
        let keys = [
            "--s3-access-key-id",
            "id",
            "--s3-secret-access-key",
            "secret",
        ];
        for (extra, setting) in [
            (
                &["--s3-endpoint", "minio:9000"][..],
                "CODE_RUNNER_S3_ENDPOINT",
            ),
            (&["--s3-prefix", "/files"], "CODE_RUNNER_S3_PREFIX"),
            (&["--s3-path-style", "maybe"], "CODE_RUNNER_S3_PATH_STYLE"),
            (&["--file-max-mb", "4097"], "CODE_RUNNER_FILE_MAX_MB"),
        ] {
            let args: Vec<&str> = s3.iter().chain(&keys).chain(extra).copied().collect();
            let s = settings(&args);
            let error = plan(&s, serve(&s)).err().unwrap();
            assert_eq!(error.setting, setting, "{args:?}: {error}");
        }
        for (args, setting) in [
            (&["--file-backend", "disk"][..], "CODE_RUNNER_FILE_BACKEND"),
            (&["--file-backend", "s3"], "CODE_RUNNER_S3_BUCKET"),
        ] {
            let s = settings(args);
            let error = plan(&s, serve(&s)).err().unwrap();
            assert_eq!(error.setting, setting, "{args:?}: {error}");
        }
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
            let s = settings(&s3);
            let error = plan(&s, serve(&s)).err().unwrap();
            assert_eq!(error.setting, "CODE_RUNNER_S3_ACCESS_KEY_ID");
        }
        // Up to 4096 MiB a file with S3, 512 with Redis.
        let args: Vec<&str> = s3
            .iter()
            .chain(&keys)
            .chain(&["--file-max-mb", "4096"])
            .copied()
            .collect();
        let s = settings(&args);
        assert!(plan(&s, serve(&s)).is_ok());
        let s = settings(&["--file-max-mb", "513"]);
        let error = plan(&s, serve(&s)).err().unwrap();
        assert_eq!(error.setting, "CODE_RUNNER_FILE_MAX_MB");
        // Keys are parsed only for the API: their setting names them.
        let s = Settings::try_parse_from(["code-runner", "--api-keys", "ops"]).unwrap();
        let error = plan(&s, Roles::Api { api: &s.api }).err().unwrap();
        assert_eq!(error.setting, "CODE_RUNNER_API_KEYS");
    }

    #[test]
    fn a_role_not_run_has_its_settings_left_alone() {
        let s = settings(&["--key-rate", "0", "--warm-runtimes", "maybe"]);
        let reaper = Roles::Reaper { reaper: &s.reaper };
        assert!(plan(&s, reaper).is_ok());
    }
}
