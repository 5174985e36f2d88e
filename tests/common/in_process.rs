//! A whole `code-runner serve|api|worker|reaper` process run inside the
//! test, on a scripted engine ([`super::scripted`]): the same settings, the
//! same validation ([`Plan::validate`]) and the same roles as the binary,
//! on a real redis-server and a loopback port, with no dockerd.
//!
//! Settings are given as the `CODE_RUNNER_*` variables the binary reads;
//! each becomes its command-line flag (found through clap's own
//! description of the command), so nothing of the test process's
//! environment changes. As in the binary, only a worker and a reaper work
//! with the engine: an `api` process has none.
//!
//! Each process runs on a tokio runtime of its own (threads of the test
//! process), so that it can end as a process does: dropping an
//! [`InProcess`] stops every task of it at once, without a drain (its
//! runs' sandboxes are removed); [`InProcess::shut_down`] is the graceful
//! stop SIGTERM begins, and [`InProcess::crash`] the stop of a killed
//! process (every task ends at once, its sandboxes stay on the host, its
//! heartbeat is never retired).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use code_runner::app::{Plan, Roles};
use code_runner::cli::{Cli, Command};
use code_runner::sandbox::Engine;
use reqwest::StatusCode;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::client::{ApiClient, KEY_A, KEY_B, POLL, STARTUP};
use super::daemon::Role;
use super::redis_server::RedisServer;
use super::scripted::{ScriptedEngine, ScriptedHost};

/// Builds an in-process daemon: role, Redis, settings and the host its
/// engine runs on.
#[derive(Clone)]
pub struct InProcessBuilder {
    role: Role,
    redis_url: String,
    env: BTreeMap<String, String>,
    worker_id: Option<String>,
    host: Option<Arc<ScriptedHost>>,
}

impl InProcessBuilder {
    pub fn new(role: Role, redis: &RedisServer) -> Self {
        Self::with_redis_url(role, &redis.url())
    }

    pub fn with_redis_url(role: Role, redis_url: &str) -> Self {
        let mut env = BTreeMap::new();
        // The roles with an API read the test keys; a worker or reaper
        // reads no such setting.
        if matches!(role, Role::Serve | Role::Api) {
            env.insert(
                "CODE_RUNNER_API_KEYS".to_string(),
                format!("a:{KEY_A},b:{KEY_B}"),
            );
        }
        Self {
            role,
            redis_url: redis_url.to_string(),
            env,
            worker_id: None,
            host: None,
        }
    }

    /// A fixed worker id (default: `test-<uuid>`, new for every daemon).
    pub fn worker_id(mut self, id: &str) -> Self {
        self.worker_id = Some(id.to_string());
        self
    }

    /// Sets (or overrides) a `CODE_RUNNER_*` setting.
    pub fn env(mut self, name: &str, value: impl ToString) -> Self {
        self.env.insert(name.to_string(), value.to_string());
        self
    }

    /// The host whose sandboxes the engine shares (default: a host of its
    /// own): daemons of one host see each other's sandboxes.
    pub fn host(mut self, host: &Arc<ScriptedHost>) -> Self {
        self.host = Some(Arc::clone(host));
        self
    }

    /// Starts the process's roles and waits (up to [`STARTUP`]) for
    /// `/healthz`.
    pub async fn start(self) -> InProcess {
        let worker_id = self
            .worker_id
            .clone()
            .unwrap_or_else(|| format!("test-{}", uuid::Uuid::new_v4()));
        let host = self.host.clone().unwrap_or_else(ScriptedHost::new);
        let engine = host.engine(&worker_id);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking socket");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let plan = self
            .plan(&worker_id)
            .unwrap_or_else(|error| panic!("{error}"));
        let stop = CancellationToken::new();
        // As the binary: only a worker and a reaper work with the engine.
        let shared = (self.role != Role::Api).then(|| Arc::new(engine.clone()) as Engine);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("in-process-{}", self.role.command()))
            .enable_all()
            .build()
            .expect("a runtime for the process");
        let task = runtime.spawn({
            let stop = stop.clone();
            async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("the process listens");
                plan.run_on(listener, shared, stop).await
            }
        });
        let process = InProcess {
            role: self.role,
            worker_id,
            client: ApiClient::new(url, None),
            host,
            engine,
            stop,
            task: Some(task),
            runtime: Some(runtime),
        };
        process.wait_healthy().await;
        process
    }

    /// The plan the binary would make of these settings, or its one
    /// configuration error.
    pub fn plan(&self, worker_id: &str) -> Result<Plan, String> {
        let mut env = self.env.clone();
        env.insert("CODE_RUNNER_REDIS_URL".into(), self.redis_url.clone());
        let command = self.role.command();
        // An `api` process has no worker id, a `worker` no API keys.
        if reads(command, "CODE_RUNNER_WORKER_ID") {
            env.entry("CODE_RUNNER_WORKER_ID".into())
                .or_insert_with(|| worker_id.to_string());
        }
        if !reads(command, "CODE_RUNNER_API_KEYS") {
            env.remove("CODE_RUNNER_API_KEYS");
        }
        let args = flags(command, &env);
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        let error = |e: code_runner::config::ConfigError| e.to_string();
        match cli.command {
            Command::Serve(args) => Plan::validate(
                &args.sandbox,
                &args.redis,
                Roles::Serve {
                    api: &args.api,
                    worker: &args.worker,
                    reaper: &args.reaper,
                },
            )
            .map_err(error),
            Command::Api(args) => {
                Plan::validate(&args.sandbox, &args.redis, Roles::Api { api: &args.api })
                    .map_err(error)
            }
            Command::Worker(args) => Plan::validate(
                &args.sandbox,
                &args.redis,
                Roles::Worker {
                    worker: &args.worker,
                    reaper: &args.reaper,
                },
            )
            .map_err(error),
            Command::Reaper(args) => Plan::validate(
                &args.sandbox,
                &args.redis,
                Roles::Reaper {
                    reaper: &args.reaper,
                },
            )
            .map_err(error),
            _ => Err(format!("{command} is not a role")),
        }
    }
}

/// Whether `code-runner command` reads the setting `name`.
fn reads(command: &str, name: &str) -> bool {
    Cli::command().find_subcommand(command).is_some_and(|sub| {
        sub.get_arguments()
            .any(|arg| arg.get_env().is_some_and(|e| e == name))
    })
}

/// The command line of `command` that sets `env`: each variable becomes
/// the flag clap reads it for.
fn flags(command: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let cli = Cli::command();
    let sub = cli
        .find_subcommand(command)
        .unwrap_or_else(|| panic!("code-runner has no command {command}"));
    let mut args = vec!["code-runner".to_string(), command.to_string()];
    for (name, value) in env {
        let flag = sub
            .get_arguments()
            .find(|arg| arg.get_env().is_some_and(|e| e == name.as_str()))
            .and_then(|arg| arg.get_long())
            .unwrap_or_else(|| panic!("code-runner {command} reads no setting {name}"));
        args.push(format!("--{flag}={value}"));
    }
    args
}

/// A process's roles running in this test on a scripted engine.
pub struct InProcess {
    pub role: Role,
    /// The `code-runner.worker` label of its sandboxes.
    pub worker_id: String,
    client: ApiClient,
    /// The host its engine runs on.
    pub host: Arc<ScriptedHost>,
    pub engine: ScriptedEngine,
    stop: CancellationToken,
    task: Option<JoinHandle<u8>>,
    /// The runtime every task of the process runs on.
    runtime: Option<tokio::runtime::Runtime>,
}

impl InProcess {
    async fn wait_healthy(&self) {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(response) = self.http.get(format!("{}/healthz", self.url)).send().await
                && response.status() == StatusCode::OK
            {
                return;
            }
            if self.task.as_ref().is_some_and(JoinHandle::is_finished) {
                panic!(
                    "code-runner {} (in process) ended before answering /healthz",
                    self.role.command()
                );
            }
            assert!(
                Instant::now() < deadline,
                "code-runner {} (in process) did not answer /healthz within {STARTUP:?}",
                self.role.command()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Begins the graceful shutdown SIGTERM begins (the worker drains).
    pub fn shut_down(&self) {
        self.stop.cancel();
    }

    /// Waits (up to `within`) for the process to end; its exit code.
    pub async fn wait_exit(&mut self, within: Duration) -> u8 {
        let task = self.task.take().expect("the process is running");
        tokio::time::timeout(within, task)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "code-runner {} (in process) did not end within {within:?}",
                    self.role.command()
                )
            })
            .expect("the process did not panic")
    }

    /// Ends the process as SIGKILL would: every task of it at once, no
    /// drain, no retire, and its sandboxes stay on the host.
    pub fn crash(&mut self) {
        self.engine.crash();
        self.end_now();
    }

    /// Ends every task of the process now (its runtime's shutdown drops
    /// them, without waiting).
    fn end_now(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Whether the process is still running.
    pub fn running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Waits (up to 10 s) until none of this process's sandboxes is left
    /// on its host, as [`super::daemon::Daemon::assert_no_containers`]
    /// does for a child process's containers.
    pub async fn assert_no_sandboxes(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.host.sandboxes_of(&self.worker_id);
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sandboxes of worker {} left behind: {left:#?}",
                self.worker_id
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

impl std::ops::Deref for InProcess {
    type Target = ApiClient;

    fn deref(&self) -> &ApiClient {
        &self.client
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stop.cancel();
        self.end_now();
    }
}
