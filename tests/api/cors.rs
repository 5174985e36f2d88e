//! Cross-origin calls to the Judge0 API from a browser page of another
//! origin, against a whole `code-runner serve` in the test on the scripted
//! engine: preflights answered and answers marked for any origin by
//! default (as Judge0 and its rack-cors do), for a list of origins only, or
//! not at all; the native API stays same-origin.

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::client::{ApiClient, KEY_A, KEY_B};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;

const PAGE: &str = "https://quiz.example.edu";
const OTHER_PAGE: &str = "https://elsewhere.example.org";

async fn serve(redis: &RedisServer, cors: Option<&str>) -> InProcess {
    let mut builder = InProcessBuilder::new(Role::Serve, redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A},b:{KEY_B}"));
    if let Some(cors) = cors {
        builder = builder.env("CODE_RUNNER_JUDGE0_CORS_ORIGINS", cors);
    }
    builder.start().await
}

/// A browser's preflight of a `POST` with Judge0's key header from `origin`.
async fn preflight(daemon: &ApiClient, path: &str, origin: &str) -> (StatusCode, HeaderMap) {
    let response = daemon
        .http
        .request(Method::OPTIONS, format!("{}{path}", daemon.url))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "x-auth-token, content-type",
        )
        .send()
        .await
        .unwrap();
    (response.status(), response.headers().clone())
}

/// A page of [`PAGE`] submits to Judge0 and waits, with `key` if given.
async fn submission(daemon: &ApiClient, key: Option<&str>) -> reqwest::Response {
    let mut request = daemon
        .http
        .post(format!("{}/judge0/submissions?wait=true", daemon.url))
        .header("origin", PAGE)
        .json(&json!({"source_code": "print 42", "language_id": 71}));
    if let Some(key) = key {
        request = request.header("x-auth-token", key);
    }
    request.send().await.unwrap()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn judge0_answers_any_origin_by_default_and_v1_none() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, None).await;
    for path in [
        "/judge0/submissions",
        "/judge0/submissions/",
        "/judge0/languages",
    ] {
        let (status, headers) = preflight(&daemon, path, PAGE).await;
        assert_eq!(status, StatusCode::OK, "{path}: {headers:?}");
        assert_eq!(
            header(&headers, "access-control-allow-origin"),
            Some("*"),
            "{path}"
        );
        assert_eq!(
            header(&headers, "access-control-allow-methods"),
            Some("*"),
            "{path}"
        );
        assert_eq!(
            header(&headers, "access-control-allow-headers"),
            Some("*"),
            "{path}"
        );
        assert_eq!(
            header(&headers, "access-control-max-age"),
            Some("7200"),
            "{path}"
        );
    }
    // The request itself: its answer is marked, a refusal too (so that the
    // page can read why).
    let response = submission(&daemon, Some(KEY_A)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        header(response.headers(), "access-control-allow-origin"),
        Some("*")
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"]["description"], "Accepted", "{body}");
    assert_eq!(body["stdout"], "42\n", "{body}");
    let response = submission(&daemon, None).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        header(response.headers(), "access-control-allow-origin"),
        Some("*")
    );
    // The native API answers no preflight and marks nothing.
    let (status, headers) = preflight(&daemon, "/v1/jobs", PAGE).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&headers, "access-control-allow-origin"), None);
    let response = daemon
        .http
        .get(format!("{}/v1/languages", daemon.url))
        .header("origin", PAGE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(response.headers(), "access-control-allow-origin"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn judge0_answers_only_the_listed_origins_or_none_when_off() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, Some(&format!("{PAGE}, http://localhost:8080"))).await;
    for origin in [PAGE, "http://localhost:8080"] {
        let (status, headers) = preflight(&daemon, "/judge0/submissions", origin).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            header(&headers, "access-control-allow-origin"),
            Some(origin)
        );
        assert_eq!(
            header(&headers, "vary").map(|v| v.contains("origin")),
            Some(true)
        );
    }
    // Another origin's page gets no permission: its browser stops there.
    let (_, headers) = preflight(&daemon, "/judge0/submissions", OTHER_PAGE).await;
    assert_eq!(header(&headers, "access-control-allow-origin"), None);
    let response = daemon
        .http
        .get(format!("{}/judge0/languages", daemon.url))
        .header("origin", OTHER_PAGE)
        .header("x-auth-token", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(response.headers(), "access-control-allow-origin"),
        None
    );
    drop(daemon);

    let redis = RedisServer::start();
    let daemon = serve(&redis, Some("off")).await;
    let (status, headers) = preflight(&daemon, "/judge0/submissions", PAGE).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&headers, "access-control-allow-origin"), None);
}
