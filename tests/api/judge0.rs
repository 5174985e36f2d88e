//! The Judge0 CE API (`/judge0/…`) driven by the unmodified official
//! Python SDK (PyPI `judge0`, installed by `scripts/compat-clients`) against
//! a real `code-runner serve` and redis-server, plus the raw shapes the SDK
//! does not show (fields, base64 off, error bodies).

mod common;

use std::time::{Duration, Instant};

use common::compat::judge0_python;
use common::daemon::{Daemon, DaemonBuilder, KEY_A, KEY_B, Role, metric};
use common::redis_server::RedisServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

struct Judge0 {
    daemon: Daemon,
    _redis: RedisServer,
}

impl Judge0 {
    async fn start() -> Self {
        let redis = RedisServer::start();
        let daemon = DaemonBuilder::new(Role::Serve, &redis)
            .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
            .start()
            .await;
        Self {
            daemon,
            _redis: redis,
        }
    }

    fn url(&self) -> String {
        format!("{}/judge0", self.daemon.url)
    }

    /// Runs a scenario of `tests/compat/judge0_client.py` with the SDK.
    fn sdk(&self, scenario: &str) -> Value {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/judge0_client.py");
        let output = std::process::Command::new(judge0_python())
            .arg(script)
            .args([&self.url(), KEY_A, scenario])
            .output()
            .expect("the venv's python runs");
        assert!(
            output.status.success(),
            "the judge0 SDK scenario {scenario} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
    }

    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, String) {
        let mut request = self
            .daemon
            .http
            .request(method, format!("{}{path}", self.url()));
        if let Some(key) = key {
            request = request.header("X-Auth-Token", key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (status, text) = self
            .request(reqwest::Method::GET, path, Some(KEY_A), None)
            .await;
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let (status, text) = self
            .request(reqwest::Method::POST, path, Some(KEY_A), Some(body))
            .await;
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

#[tokio::test]
async fn every_status_through_the_sdk() {
    let judge0 = Judge0::start().await;
    let out = judge0.sdk("statuses");
    assert!(out["languages"].as_u64().unwrap() >= 20, "{out:#}");
    assert_eq!(out["batch_size"], 20);
    let check = |name: &str, status: u64| {
        assert_eq!(out[name]["status"], status, "{name}: {:#}", out[name]);
        &out[name]
    };
    let accepted = check("accepted", 3);
    assert_eq!(accepted["stdout"], "hello\n");
    assert_eq!(accepted["exit_code"], 0);
    assert!(accepted["time"].as_f64().unwrap() >= 0.0);
    assert!(accepted["memory"].as_f64().unwrap() > 0.0);
    assert_eq!(check("wrong_answer", 4)["stdout"], "nope\n");
    let tle = check("time_limit", 5);
    // Judge0 base64-encodes `message` too when asked (the SDK leaves it so).
    assert_eq!(message(tle), "Time limit exceeded");
    let ce = check("compilation_error", 6);
    assert!(
        ce["compile_output"].as_str().unwrap().contains("nope"),
        "{ce:#}"
    );
    assert_eq!(
        (&ce["stdout"], &ce["time"], &ce["exit_code"]),
        (&Value::Null, &Value::Null, &Value::Null)
    );
    let segv = check("sigsegv", 7);
    assert_eq!(
        (segv["exit_signal"].as_i64(), message(segv).as_str()),
        (Some(11), "Caught fatal signal 11")
    );
    let xfsz = check("sigxfsz", 8);
    assert_eq!(xfsz["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(check("sigfpe", 9)["exit_signal"], 8);
    assert_eq!(check("sigabrt", 10)["exit_signal"], 6);
    let nzec = check("nzec", 11);
    assert_eq!(
        (nzec["exit_code"].as_i64(), nzec["stderr"].as_str()),
        (Some(3), Some("bye\n"))
    );
    assert_eq!(message(nzec), "Exited with error status 3");
    assert_eq!(message(check("other", 12)), "Memory limit exceeded");
    assert_eq!(check("cpp_alias", 3)["stdout"], "c++\n");
    assert_eq!(check("java", 3)["stdout"], "2 y z\n");
    assert_eq!(check("unicode", 3)["stdout"], "ünï ✓\n");

    // Ordinary jobs: metered like any other.
    let metrics = judge0.daemon.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "code_runner_jobs_total{language=\"c\",status=\"failed\"}"
        ),
        Some(4.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn batches_and_polling_through_the_sdk() {
    let judge0 = Judge0::start().await;
    let out = judge0.sdk("batch");
    let batch = out["batch"].as_array().unwrap();
    assert_eq!(batch.len(), 5);
    for (n, result) in batch.iter().enumerate() {
        assert_eq!(result["status"], 3, "{result:#}");
        assert_eq!(result["stdout"], format!("{}\n", n * n));
    }

    let out = judge0.sdk("polling");
    let statuses: Vec<u64> = out["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(statuses.last(), Some(&3), "{statuses:?}");
    assert!(
        statuses[..statuses.len() - 1]
            .iter()
            .all(|s| *s == 1 || *s == 2)
            && statuses.len() > 1,
        "In Queue or Processing before Accepted: {statuses:?}"
    );
    assert_eq!(out["final"]["stdout"], "late\n");
}

#[tokio::test]
async fn fields_base64_and_errors_have_judge0s_shapes() {
    let judge0 = Judge0::start().await;

    // wait=true, text in and out, the default fields.
    let (status, view) = judge0
        .post(
            "/submissions?wait=true",
            json!({"source_code": "print(input())", "language_id": 71, "stdin": "hi"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{view:#}");
    let mut keys: Vec<&str> = view
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "compile_output",
            "memory",
            "message",
            "status",
            "stderr",
            "stdout",
            "time",
            "token"
        ]
    );
    assert_eq!(view["status"], json!({"id": 3, "description": "Accepted"}));
    assert_eq!(view["stdout"], "hi\n");
    assert!(
        view["time"].as_str().unwrap().parse::<f64>().is_ok(),
        "{view:#}"
    );
    let token = view["token"].as_str().unwrap().to_string();

    // fields=, base64 out (Ruby's encode64).
    let (status, view) = judge0
        .get(&format!(
            "/submissions/{token}?base64_encoded=true&fields=stdout,stdin,language,exit_code"
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        view,
        json!({"stdout": "aGkK\n", "stdin": "aGk=\n", "language": {"id": 71, "name": "Python (3.11)"}, "exit_code": 0})
    );
    let (status, body) = judge0
        .get(&format!("/submissions/{token}?fields=stdout,colour"))
        .await;
    assert_eq!(
        (status, body),
        (
            StatusCode::BAD_REQUEST,
            json!({"error": "invalid fields: [colour]"})
        )
    );

    // base64 in; output that is not UTF-8 needs base64_encoded=true.
    let (status, created) = judge0
        .post(
            "/submissions?base64_encoded=true",
            json!({"source_code": "aW1wb3J0IHN5cwpzeXMuc3Rkb3V0LmJ1ZmZlci53cml0ZShiJ1x4ZmYnKQ==", "language_id": 71}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let token = created["token"].as_str().unwrap();
    assert_eq!(created.as_object().unwrap().len(), 1, "{created:#}");
    let within = Duration::from_secs(120);
    let deadline = Instant::now() + within;
    let view = loop {
        let (_, view) = judge0
            .get(&format!(
                "/submissions/{token}?base64_encoded=true&fields=status,stdout"
            ))
            .await;
        if view["status"]["id"].as_u64().unwrap() > 2 {
            break view;
        }
        assert!(
            Instant::now() < deadline,
            "submission {token} did not finish within {within:?}: {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["stdout"], "/w==\n");
    let (status, body) = judge0.get(&format!("/submissions/{token}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"],
        "some attributes for this submission cannot be converted to UTF-8, use base64_encoded=true query parameter"
    );

    // Validation errors: 422 with messages per field.
    let (status, body) = judge0
        .post(
            "/submissions",
            json!({"language_id": 4242, "cpu_time_limit": 99999, "compiler_options": "-O3"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        body,
        json!({
            "source_code": ["can't be blank"],
            "language_id": ["language with id 4242 doesn't exist"],
            "cpu_time_limit": ["must be less than or equal to 300.0"],
            "compiler_options": ["setting compiler options is not allowed"],
        })
    );
    // Batches: per-item answers, size limits, unknown tokens are null.
    let (status, body) = judge0
        .post(
            "/submissions/batch",
            json!({"submissions": [{"source_code": "print(1)", "language_id": 71}, {"language_id": 71}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(body[0]["token"].is_string(), "{body:#}");
    assert_eq!(body[1], json!({"source_code": ["can't be blank"]}));
    let (status, body) = judge0
        .post("/submissions/batch", json!({"submissions": []}))
        .await;
    assert_eq!(
        (status, body),
        (
            StatusCode::BAD_REQUEST,
            json!({"error": "there should be at least one submission in a batch"})
        )
    );
    let unknown = "00000000-0000-4000-8000-000000000000";
    let (status, body) = judge0
        .get(&format!(
            "/submissions/batch?tokens={},{unknown}&fields=token",
            body_token(&judge0).await
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["submissions"][1], Value::Null);
    assert!(body["submissions"][0]["token"].is_string(), "{body:#}");

    // Keys: none or a wrong one is Judge0's bare 401; another key's
    // submission does not exist for it.
    let (status, text) = judge0
        .request(reqwest::Method::GET, "/languages", None, None)
        .await;
    assert_eq!((status, text.as_str()), (StatusCode::UNAUTHORIZED, ""));
    let (status, text) = judge0
        .request(
            reqwest::Method::GET,
            &format!("/submissions/{token}"),
            Some(KEY_B),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");

    // The catalog endpoints.
    let (_, languages) = judge0.get("/languages").await;
    assert!(
        languages
            .as_array()
            .unwrap()
            .contains(&json!({"id": 62, "name": "Java (OpenJDK 17)"}))
    );
    let (_, java) = judge0.get("/languages/62").await;
    assert_eq!(java["source_file"], "Main.java");
    assert!(java["compile_cmd"].as_str().unwrap().starts_with("javac"));
    let (status, _) = judge0.get("/languages/70").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, statuses) = judge0.get("/statuses").await;
    assert_eq!(statuses.as_array().unwrap().len(), 14);
    assert_eq!(
        statuses[12],
        json!({"id": 13, "description": "Internal Error"})
    );
    let (_, about) = judge0.get("/about").await;
    assert_eq!(about["version"], "1.13.1");
    let (_, config) = judge0.get("/config_info").await;
    assert_eq!(config["max_cpu_time_limit"], 300.0);
    assert_eq!(config["enable_callbacks"], false);
}

/// A base64 `message` (Ruby's encode64, newlines and all) as text.
fn message(submission: &Value) -> String {
    use base64::Engine as _;
    let text: String = submission["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {submission:#}"))
        .split_whitespace()
        .collect();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap(),
    )
    .unwrap()
}

/// A fresh submission's token.
async fn body_token(judge0: &Judge0) -> String {
    let (_, body) = judge0
        .post(
            "/submissions",
            json!({"source_code": "print(2)", "language_id": 71}),
        )
        .await;
    body["token"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_cancelled_submission_is_an_internal_error_and_admission_applies() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A}:1,b:{KEY_B}"))
        .start()
        .await;
    let judge0 = Judge0 {
        daemon,
        _redis: redis,
    };
    let (_, created) = judge0
        .post(
            "/submissions",
            json!({"source_code": "sleep 30", "language_id": 46}),
        )
        .await;
    let token = created["token"].as_str().unwrap().to_string();
    // Key a has one job queued or running: the next is refused, 429.
    let (status, body) = judge0
        .post(
            "/submissions",
            json!({"source_code": "echo hi", "language_id": 46}),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        body,
        json!({"error": "this api key already has 1 queued or running jobs, its limit of 1 (the key entry's max_active)"})
    );
    // It is an ordinary job: /v1 cancels it.
    let cancelled = judge0.daemon.cancel(&token).await;
    assert!(cancelled.status.is_success(), "{cancelled:#?}");
    judge0
        .daemon
        .wait_status(&token, &["cancelled"], Duration::from_secs(30))
        .await;
    let (_, view) = judge0
        .get(&format!("/submissions/{token}?fields=status,message"))
        .await;
    let job = judge0.daemon.job(&token).await;
    assert_eq!(
        view["status"],
        json!({"id": 13, "description": "Internal Error"}),
        "{view:#} {job:#}"
    );
    assert!(
        view["message"].as_str().unwrap().contains("cancelled"),
        "{view:#}"
    );
}
