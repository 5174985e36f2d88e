//! Harness for the daemon's end-to-end tests: a real redis-server per test,
//! the real `code-runner` binary as a child process (`serve`, `api` or
//! `worker`), and HTTP through reqwest, as a client would.
//!
//! Every process is a child of the test and is killed by its pid when its
//! guard drops, also when the test fails. Every daemon gets a worker id of its
//! own (`test-<uuid>`), so its sandbox containers carry a label no other test
//! uses; dropping the daemon force-removes whatever is left of them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use code_runner::sandbox::{LABEL_JOB, LABEL_WORKER};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::StatusCode;
use serde_json::Value;

pub use super::client::*;
use super::containers::{assert_none_left, containers_labelled, remove_labelled, sweep_later};
use super::redis_server::{RedisServer, free_port};
use super::{code_runner, drain};

/// Sends a signal to a child by its pid.
fn signal(child: &Child, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid fits in i32"));
    let _ = kill(pid, signal);
}

/// Waits for a child to end, up to `within`; `None` if it did not.
fn wait_child(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// the daemon
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Serve,
    Api,
    Worker,
    Reaper,
}

impl Role {
    pub fn command(self) -> &'static str {
        match self {
            Role::Serve => "serve",
            Role::Api => "api",
            Role::Worker => "worker",
            Role::Reaper => "reaper",
        }
    }
}

/// A `code-runner serve|api|worker|reaper` child process.
pub struct Daemon {
    child: Child,
    pub role: Role,
    /// `test-<uuid>`: the `code-runner.worker` label of its containers.
    pub worker_id: String,
    /// Its API (serve, api) or its own ops endpoint (worker, reaper).
    client: ApiClient,
    log_dir: tempfile::TempDir,
    reaped: bool,
}

/// Builds a daemon: role, Redis and settings.
#[derive(Clone)]
pub struct DaemonBuilder {
    role: Role,
    redis_url: String,
    env: HashMap<String, String>,
    worker_id: Option<String>,
}

impl DaemonBuilder {
    pub fn new(role: Role, redis: &RedisServer) -> Self {
        Self::with_redis_url(role, &redis.url())
    }

    /// A daemon on a Redis given by URL (e.g. `rediss://` to a TLS server).
    pub fn with_redis_url(role: Role, redis_url: &str) -> Self {
        let mut env = HashMap::new();
        env.insert(
            "CODE_RUNNER_API_KEYS".to_string(),
            format!("a:{KEY_A},b:{KEY_B}"),
        );
        env.insert("CODE_RUNNER_LOG".to_string(), "info".to_string());
        Self {
            role,
            redis_url: redis_url.to_string(),
            env,
            worker_id: None,
        }
    }

    /// A fixed worker id (default: `test-<uuid>`, new for every daemon).
    pub fn worker_id(mut self, id: &str) -> Self {
        self.worker_id = Some(id.to_string());
        self
    }

    /// Sets (or overrides) a `CODE_RUNNER_*` variable.
    pub fn env(mut self, name: &str, value: impl ToString) -> Self {
        self.env.insert(name.to_string(), value.to_string());
        self
    }

    /// Starts the process and waits (up to [`STARTUP`]) for `/healthz`.
    /// The ports are picked free and bound by the child a moment later: if
    /// another process took one meanwhile, the child exits saying it cannot
    /// listen, and it is started again on new ports.
    pub async fn start(self) -> Daemon {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let mut daemon = self.clone().spawn();
            match daemon.healthy_or_exited().await {
                None => return daemon,
                Some(status) => {
                    let log = daemon.log();
                    assert!(
                        log.contains("cannot listen on") && attempt < ATTEMPTS,
                        "code-runner {} exited ({status}) before answering /healthz; log:\n{log}",
                        self.role.command()
                    );
                    eprintln!(
                        "code-runner {}: a port was taken; again",
                        self.role.command()
                    );
                }
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Starts the process without waiting for it.
    pub fn spawn(self) -> Daemon {
        let worker_id = self
            .worker_id
            .clone()
            .unwrap_or_else(|| format!("test-{}", uuid::Uuid::new_v4()));
        super::containers::note_worker(&worker_id);
        let listen = format!("127.0.0.1:{}", free_port());
        let worker_listen = format!("127.0.0.1:{}", free_port());
        let reaper_listen = format!("127.0.0.1:{}", free_port());
        let url = match self.role {
            Role::Worker => format!("http://{worker_listen}"),
            Role::Reaper => format!("http://{reaper_listen}"),
            Role::Serve | Role::Api => format!("http://{listen}"),
        };
        let log_dir = tempfile::tempdir().expect("a temporary directory");
        let stdout = std::fs::File::create(log_dir.path().join("stdout")).unwrap();
        let stderr = std::fs::File::create(log_dir.path().join("stderr")).unwrap();
        let mut command = code_runner();
        command
            .arg(self.role.command())
            .env("CODE_RUNNER_REDIS_URL", &self.redis_url)
            .env("CODE_RUNNER_LISTEN", &listen)
            .env("CODE_RUNNER_WORKER_LISTEN", &worker_listen)
            .env("CODE_RUNNER_REAPER_LISTEN", &reaper_listen)
            .env("CODE_RUNNER_WORKER_ID", &worker_id)
            .envs(&self.env)
            .stdout(stdout)
            .stderr(stderr);
        let child = command.spawn().expect("the code-runner binary starts");
        Daemon {
            child,
            role: self.role,
            worker_id,
            client: ApiClient::new(url, Some(log_dir.path().join("stderr"))),
            log_dir,
            reaped: false,
        }
    }
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running (it has not exited).
    #[allow(dead_code)] // not every test binary asks
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What the process wrote to stderr so far (its log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_dir.path().join("stderr")).unwrap_or_default()
    }

    pub fn log_path(&self) -> PathBuf {
        self.log_dir.path().join("stderr")
    }

    /// Waits for `GET /healthz` to answer 200; fails the test with the log if
    /// the process ends or does not answer within [`STARTUP`].
    pub async fn wait_healthy(&mut self) {
        if let Some(status) = self.healthy_or_exited().await {
            panic!(
                "code-runner {} exited ({status}) before answering /healthz; log:\n{}",
                self.role.command(),
                self.log()
            );
        }
    }

    /// `None` once `GET /healthz` answers 200 while the process runs; the
    /// exit status if it ends first. Fails the test after [`STARTUP`].
    async fn healthy_or_exited(&mut self) -> Option<ExitStatus> {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for code-runner") {
                self.reaped = true;
                return Some(status);
            }
            if let Ok(response) = self.http.get(format!("{}/healthz", self.url)).send().await
                && response.status() == StatusCode::OK
            {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "code-runner {} did not answer /healthz within {STARTUP:?}; log:\n{}",
                self.role.command(),
                self.log()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Sends SIGTERM (a graceful shutdown: the worker drains).
    pub fn sigterm(&self) {
        signal(&self.child, Signal::SIGTERM);
    }

    /// Sends SIGINT (Fly's default `kill_signal`; drains like SIGTERM).
    pub fn sigint(&self) {
        signal(&self.child, Signal::SIGINT);
    }

    /// Kills the process with SIGKILL (by its pid), as a crash or an OOM kill
    /// would: no drain, no retire. Waits (up to 10 s) for it to end.
    pub async fn kill9(&mut self) -> ExitStatus {
        signal(&self.child, Signal::SIGKILL);
        self.wait_exit(Duration::from_secs(10)).await
    }

    /// Waits (up to `within`) for the process to end; fails the test with its
    /// log if it does not.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for code-runner") {
                self.reaped = true;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "code-runner {} did not end within {within:?}; log:\n{}",
                self.role.command(),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // --- Docker -------------------------------------------------------------

    /// Ids of this daemon's containers (any state).
    pub async fn containers(&self, docker: &bollard::Docker) -> Vec<String> {
        containers_labelled(docker, &format!("{LABEL_WORKER}={}", self.worker_id)).await
    }

    /// Waits (up to 10 s) until none of this daemon's containers exists.
    pub async fn assert_no_containers(&self, docker: &bollard::Docker) {
        let what = format!("containers of worker {} left behind", self.worker_id);
        assert_none_left(&what, async || self.containers(docker).await).await;
    }
}

impl std::ops::Deref for Daemon {
    type Target = ApiClient;

    fn deref(&self) -> &ApiClient {
        &self.client
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill(); // SIGKILL, by pid
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- last lines of the log of code-runner {} ({}) ---\n{}",
                self.role.command(),
                self.worker_id,
                tail(&self.log_path(), 60)
            );
        }
        let label = format!("{LABEL_WORKER}={}", self.worker_id);
        remove_labelled(label.clone(), |_| true);
        if !self.reaped {
            // Killed: a container it was creating may still appear.
            sweep_later(&label);
        }
    }
}

/// Ids of the containers of one job.
pub async fn job_containers(docker: &bollard::Docker, job_id: &str) -> Vec<String> {
    containers_labelled(docker, &format!("{LABEL_JOB}={job_id}")).await
}

/// A child process that is killed (SIGKILL, by its pid) if it still runs
/// when the guard drops, e.g. because the test failed.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `code-runner bench ARGS… --json` to its end; the report it printed.
pub fn bench_json(args: &[&str]) -> (Output, Value) {
    bench_json_with(args, &[])
}

/// The same with environment variables.
pub fn bench_json_with(args: &[&str], env: &[(&str, &str)]) -> (Output, Value) {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = run_to_end(&all, env);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bench --json printed no JSON ({e}): {out:?}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

/// Runs `code-runner ARGS…` with `env` to its end (stdin empty), up to 60 s.
pub fn run_to_end(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut child = code_runner()
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the code-runner binary starts");
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let Some(status) = wait_child(&mut child, Duration::from_secs(60)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("code-runner {args:?} did not end within 60 s");
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}
