//! A client of the daemon's HTTP API, as the tests use it: the same for a
//! `code-runner` child process ([`super::daemon::Daemon`]) and a process
//! run inside the test with a scripted engine
//! ([`super::in_process::InProcess`]); both dereference to an [`ApiClient`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

/// How long a daemon may take to answer after it started.
pub const STARTUP: Duration = Duration::from_secs(30);
/// Poll interval of every wait in these tests.
pub const POLL: Duration = Duration::from_millis(50);

/// The default API keys of a test daemon: `a` and `b`, no limits.
pub const KEY_A: &str = "key-a-0123456789";
pub const KEY_B: &str = "key-b-0123456789";

/// The last `lines` lines of a file, for failure messages.
pub fn tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
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

/// The API of one running process, and where its log is (for failure
/// messages).
pub struct ApiClient {
    /// The API (serve, api) or the process's own ops endpoint (worker,
    /// reaper).
    pub url: String,
    pub http: reqwest::Client,
    /// The process's log file, when it has one.
    pub log_file: Option<PathBuf>,
}

impl ApiClient {
    pub fn new(url: String, log_file: Option<PathBuf>) -> Self {
        Self {
            url,
            http: http_client(),
            log_file,
        }
    }

    /// The last `lines` of the log, as a failure message's tail.
    pub fn log_tail(&self, lines: usize) -> String {
        match &self.log_file {
            Some(path) => format!("\nlog:\n{}", tail(path, lines)),
            None => String::new(),
        }
    }

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
                "job {id} did not reach {statuses:?} within {within:?}: {view:#}{}",
                self.log_tail(40)
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
    daemon: &ApiClient,
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
