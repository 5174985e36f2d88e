//! Harness for the daemon's end-to-end tests: a real redis-server per test,
//! the real `code-runner` binary as a child process (`serve`, `api` or
//! `worker`), and HTTP through reqwest, as a client would.
//!
//! Every process is a child of the test and is killed by its pid when its
//! guard drops, also when the test fails. Every daemon gets a worker id of its
//! own (`test-<uuid>`), so its sandbox containers carry a label no other test
//! uses; dropping the daemon force-removes whatever is left of them.
//!
//! Used by the test files as `mod common;` and `use common::daemon;`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use code_runner::sandbox::{LABEL_JOB, LABEL_WORKER};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use super::containers::{assert_none_left, containers_labelled, remove_labelled, sweep_later};
use super::redis_server::{RedisServer, free_port};
use super::{code_runner, drain};

/// How long a daemon may take to answer after it started.
pub const STARTUP: Duration = Duration::from_secs(30);
/// Poll interval of every wait in these tests.
pub const POLL: Duration = Duration::from_millis(50);

/// The default API keys of a test daemon: `a` and `b`, no limits.
pub const KEY_A: &str = "key-a-0123456789";
pub const KEY_B: &str = "key-b-0123456789";

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

/// The last `lines` lines of a file, for failure messages.
fn tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
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
    fn command(self) -> &'static str {
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
    /// The API (serve, api) or the worker's own ops endpoint (worker).
    pub url: String,
    pub http: reqwest::Client,
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
            url,
            http: http_client(),
            log_dir,
            reaped: false,
        }
    }
}

/// A client for the daemon's API. Idle connections are dropped after 5 s:
/// the server closes an idle keep-alive connection after its header timeout
/// (10 s), and a request sent on a connection the server is closing at that
/// moment fails (`IncompleteMessage`).
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .pool_idle_timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client")
}

/// An answer: status, headers and the body as JSON (a JSON string holding
/// the text when the body is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Answer {
    pub async fn from(response: reqwest::Response) -> Self {
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("the body arrives");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Self {
            status,
            headers,
            body,
        }
    }

    /// Asserts the documented error shape and returns `(code, message)`.
    pub fn error(&self) -> (String, String) {
        let error = &self.body["error"];
        let code = error["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no error.code in {self:#?}"));
        let message = error["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no error.message in {self:#?}"));
        assert!(!code.is_empty() && !message.is_empty(), "{self:#?}");
        (code.to_string(), message.to_string())
    }

    pub fn id(&self) -> String {
        self.body["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no id in {self:#?}"))
            .to_string()
    }

    /// `Retry-After` in seconds.
    pub fn retry_after(&self) -> u64 {
        self.headers
            .get("retry-after")
            .unwrap_or_else(|| panic!("no Retry-After header: {self:#?}"))
            .to_str()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("Retry-After is not seconds: {self:#?}"))
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

    // --- HTTP ---------------------------------------------------------------

    /// `POST /v1/jobs` with key `a`.
    pub async fn submit(&self, job: &Value) -> Answer {
        self.submit_as(Some(KEY_A), job, false).await
    }

    /// `POST /v1/jobs?wait=true` with key `a`.
    pub async fn submit_wait(&self, job: &Value) -> Answer {
        self.submit_as(Some(KEY_A), job, true).await
    }

    pub async fn submit_as(&self, key: Option<&str>, job: &Value, wait: bool) -> Answer {
        let body = serde_json::to_vec(job).unwrap();
        self.post_raw(key, body, wait, None).await
    }

    /// `POST /v1/jobs` with key `a`, as a client that honours a 503's
    /// `Retry-After` (the API sheds load that way when Redis is slow): up to
    /// 10 attempts, with one `Idempotency-Key`, so a retry never submits twice.
    pub async fn submit_retrying(&self, job: &Value) -> Answer {
        let body = serde_json::to_vec(job).unwrap();
        let key = uuid::Uuid::new_v4().to_string();
        for _ in 1..10 {
            let answer = self
                .post_raw(Some(KEY_A), body.clone(), false, Some(&key))
                .await;
            if answer.status != StatusCode::SERVICE_UNAVAILABLE {
                return answer;
            }
            let after = answer
                .headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(after)).await;
        }
        self.post_raw(Some(KEY_A), body, false, Some(&key)).await
    }

    /// `POST /v1/jobs` with any body and an optional `Idempotency-Key`.
    pub async fn post_raw(
        &self,
        key: Option<&str>,
        body: Vec<u8>,
        wait: bool,
        idempotency_key: Option<&str>,
    ) -> Answer {
        let url = if wait {
            format!("{}/v1/jobs?wait=true", self.url)
        } else {
            format!("{}/v1/jobs", self.url)
        };
        let mut request = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(idempotency_key) = idempotency_key {
            request = request.header("Idempotency-Key", idempotency_key);
        }
        Answer::from(request.send().await.expect("POST /v1/jobs is answered")).await
    }

    pub async fn get(&self, path: &str, key: Option<&str>) -> Answer {
        let mut request = self.http.get(format!("{}{path}", self.url));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        Answer::from(request.send().await.expect("the GET is answered")).await
    }

    /// `GET /v1/jobs/<id>` with key `a`; must be 200.
    pub async fn job(&self, id: &str) -> Value {
        let answer = self.get(&format!("/v1/jobs/{id}"), Some(KEY_A)).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
        answer.body
    }

    /// `DELETE /v1/jobs/<id>` with key `a`.
    pub async fn cancel(&self, id: &str) -> Answer {
        let response = self
            .http
            .delete(format!("{}/v1/jobs/{id}", self.url))
            .bearer_auth(KEY_A)
            .send()
            .await
            .expect("DELETE is answered");
        Answer::from(response).await
    }

    /// Polls the job until its status is one of `statuses`; fails the test
    /// after `within`.
    pub async fn wait_status(&self, id: &str, statuses: &[&str], within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let view = self.job(id).await;
            if statuses.iter().any(|s| view["status"] == *s) {
                return view;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} did not reach {statuses:?} within {within:?}: {view:#}\nlog:\n{}",
                tail(&self.log_path(), 40)
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Polls the job until it is terminal.
    pub async fn wait_terminal(&self, id: &str, within: Duration) -> Value {
        self.wait_status(
            id,
            &["succeeded", "failed", "timed_out", "cancelled", "error"],
            within,
        )
        .await
    }

    /// `GET /metrics` as text.
    pub async fn metrics(&self) -> String {
        let response = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .expect("/metrics is answered");
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.expect("the metrics text")
    }

    /// Polls `/metrics` until the sample `name` has `value` (a gauge settles
    /// just after a job's result is visible); returns the text.
    pub async fn wait_metric(&self, name: &str, value: f64, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let text = self.metrics().await;
            if metric(&text, name) == Some(value) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not become {value} within {within:?}:\n{text}"
            );
            tokio::time::sleep(POLL).await;
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

// ---------------------------------------------------------------------------
// jobs, views and metrics
// ---------------------------------------------------------------------------

/// A job of one UTF-8 file, as JSON.
pub fn job(language: &str, name: &str, source: &str) -> Value {
    json!({"language": language, "files": [{"name": name, "content": source}]})
}

pub fn python(source: &str) -> Value {
    job("python", "main.py", source)
}

/// A Python job that sleeps `seconds` then prints `done`.
pub fn sleeper(seconds: f64) -> Value {
    python(&format!(
        "import time\ntime.sleep({seconds})\nprint('done')\n"
    ))
}

/// The run stage's stdout of a job view (the result must be there, UTF-8).
pub fn run_stdout(view: &Value) -> &str {
    let run = &view["result"]["run"];
    assert_eq!(run["stdout_encoding"], "utf8", "{view:#}");
    run["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("no result.run.stdout in {view:#}"))
}

/// The value of a sample line `name value` (name with its labels, exactly
/// as written) in a Prometheus text exposition.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (sample, value) = l.rsplit_once(' ')?;
        (sample == name).then(|| value.parse().ok())?
    })
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

/// `promtool check metrics` (Debian package `prometheus`) accepts `text`.
pub fn assert_promtool_passes(text: &str) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs (apt-get install prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
        "promtool check metrics: {output:?}\n{text}"
    );
}

// ---------------------------------------------------------------------------
// Server-Sent Events, with curl
// ---------------------------------------------------------------------------

/// `curl -sN` of a job's events with `headers`; the SSE text.
pub async fn curl_events(
    daemon: &Daemon,
    id: &str,
    query: &str,
    headers: &[String],
) -> (String, String) {
    let url = format!("{}/v1/jobs/{id}/events{query}", daemon.url);
    let headers = headers.to_vec();
    let output = tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new("curl");
        command.args(["-sN", "--max-time", "60", "-w", "\n%{http_code}"]);
        for header in &headers {
            command.args(["-H", header]);
        }
        command.arg(&url).output().expect("curl runs")
    })
    .await
    .unwrap();
    assert!(output.status.success(), "curl failed: {output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (body.to_string(), code.to_string())
}

/// The stored events of an SSE text: (id, event, data as JSON). A queued
/// job's places (`event: queued`, no id: never stored) are left out.
pub fn sse_events(text: &str) -> Vec<(u64, String, Value)> {
    text.split("\n\n")
        .filter(|block| {
            !block.trim().is_empty()
                && !block.starts_with(':')
                && !block.starts_with("event: queued\n")
        })
        .map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                    .unwrap_or_else(|| panic!("no {name} in {block:?}"))
                    .to_string()
            };
            let lines: Vec<&str> = block.lines().collect();
            assert_eq!(lines.len(), 3, "{block:?}");
            assert!(lines[0].starts_with("id: ") && lines[1].starts_with("event: "));
            (
                field("id").parse().unwrap(),
                field("event"),
                serde_json::from_str(&field("data")).unwrap(),
            )
        })
        .collect()
}
