//! The Judge0 CE API (`/judge0/…`) in the shapes clients rely on, against
//! a whole `code-runner serve` in the test on the scripted engine: fields,
//! base64 in and out, output that is not UTF-8, validation errors per
//! field, batches, keys, the catalog endpoints, a cancelled submission and
//! admission. (The official Python SDK running real programs is in the
//! `daemon` binary's `judge0`.)

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::client::{KEY_A, KEY_B};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;

struct Judge0 {
    daemon: InProcess,
    _redis: RedisServer,
}

impl Judge0 {
    async fn start() -> Self {
        let redis = RedisServer::start();
        let daemon = InProcessBuilder::new(Role::Serve, &redis)
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
async fn fields_base64_and_errors_have_judge0s_shapes() {
    let judge0 = Judge0::start().await;

    // wait=true, text in and out, the default fields.
    let (status, view) = judge0
        .post(
            "/submissions?wait=true",
            json!({"source_code": "readline", "language_id": 71, "stdin": "hi"}),
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
            // `write \xff`: one byte that is not UTF-8.
            json!({"source_code": "d3JpdGUgXHhmZg==", "language_id": 71}),
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
            json!({"submissions": [{"source_code": "print 1", "language_id": 71}, {"language_id": 71}]}),
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

/// A fresh submission's token.
async fn body_token(judge0: &Judge0) -> String {
    let (_, body) = judge0
        .post(
            "/submissions",
            json!({"source_code": "print 2", "language_id": 71}),
        )
        .await;
    body["token"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_cancelled_submission_is_an_internal_error_and_admission_applies() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Serve, &redis)
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
            json!({"source_code": "sleep 30000", "language_id": 46}),
        )
        .await;
    let token = created["token"].as_str().unwrap().to_string();
    // Key a has one job queued or running: the next is refused, 429.
    let (status, body) = judge0
        .post(
            "/submissions",
            json!({"source_code": "print hi", "language_id": 46}),
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
