//! The edges of the three APIs that clients other than ours rely on,
//! against a whole `code-runner serve` in the test on the scripted engine:
//! every route answers the same with a trailing slash; Judge0's
//! `/authenticate` and `/authorize`; Piston's `/packages`. (Judge0's
//! operator routes are in [`crate::judge0_ops`].)

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::client::{ApiClient, KEY_A, KEY_B, metric};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;
use crate::common::scripted;

pub const ADMIN_KEY: &str = "key-ops-0123456789";

pub const DONE: Duration = Duration::from_secs(60);

pub async fn serve(redis: &RedisServer, slots: u32) -> InProcess {
    InProcessBuilder::new(Role::Serve, redis)
        .env(
            "CODE_RUNNER_API_KEYS",
            format!("a:{KEY_A},b:{KEY_B},ops:{ADMIN_KEY}:admin"),
        )
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", slots)
        // Heartbeats often, so /judge0/workers sees a slot taken soon.
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 200)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 2000)
        .start()
        .await
}

/// How a route of the table is called.
#[derive(Clone, Copy)]
pub enum Auth {
    None,
    Bearer(&'static str),
    Judge0,
}

pub struct Call {
    pub method: Method,
    pub path: String,
    pub auth: Auth,
    pub body: Option<Value>,
    /// Whether the body is the same on every call (else only the status
    /// and the content type are compared).
    pub stable: bool,
}

pub fn call(
    method: Method,
    path: impl Into<String>,
    auth: Auth,
    body: Option<Value>,
    stable: bool,
) -> Call {
    Call {
        method,
        path: path.into(),
        auth,
        body,
        stable,
    }
}

pub async fn send(
    daemon: &ApiClient,
    call: &Call,
    path: &str,
) -> (StatusCode, Option<String>, String) {
    let mut request = daemon
        .http
        .request(call.method.clone(), format!("{}{path}", daemon.url));
    match call.auth {
        Auth::None => {}
        Auth::Bearer(key) => request = request.bearer_auth(key),
        Auth::Judge0 => {
            request = request
                .header("X-Auth-Token", KEY_A)
                .header("X-Auth-User", ADMIN_KEY)
        }
    }
    if let Some(body) = &call.body {
        request = request.json(body);
    }
    let response = request.send().await.expect("the server answers");
    let status = response.status();
    let kind = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    // A stream (SSE) is not read to its end: its head is enough.
    let text = if kind.as_deref() == Some("text/event-stream") {
        String::new()
    } else {
        response.text().await.unwrap()
    };
    (status, kind, text)
}

/// The path with a trailing slash before its query.
pub fn slashed(path: &str) -> String {
    match path.split_once('?') {
        Some((head, query)) => format!("{head}/?{query}"),
        None => format!("{path}/"),
    }
}

pub async fn get_json(daemon: &ApiClient, path: &str, auth: Auth) -> (StatusCode, Value) {
    let (status, _, text) = send(daemon, &call(Method::GET, path, auth, None, true), path).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `POST path` with these headers; the status and the body's text.
pub async fn post_with(
    daemon: &ApiClient,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let mut request = daemon.http.post(format!("{}{path}", daemon.url));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    (response.status(), response.text().await.unwrap())
}

#[tokio::test]
async fn every_route_answers_the_same_with_a_trailing_slash() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, 2).await;
    let done = daemon.submit_wait(&scripted::json("print hi")).await;
    let id = done.id();
    let judge0_done = daemon
        .http
        .post(format!("{}/judge0/submissions?wait=true", daemon.url))
        .header("X-Auth-Token", KEY_A)
        .json(&json!({"source_code": "print hi", "language_id": 46}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let token = judge0_done["token"].as_str().expect("a token").to_string();
    let job = json!({"language": "python", "files": [{"name": "main.py", "content": "print 1"}]});
    let piston = json!({"language": "python", "version": "*", "files": [{"content": "print 1"}]});
    let judge0 = json!({"source_code": "print hi", "language_id": 46});
    let capacity = json!({"language": "python", "warm": 1,
        "from": "2030-01-01T00:00:00Z", "until": "2030-01-01T01:00:00Z"});
    use Auth::{Bearer, Judge0, None as Open};
    let a = Bearer(KEY_A);
    let table = [
        // /v1
        call(Method::POST, "/v1/jobs", a, Some(job.clone()), false),
        call(
            Method::POST,
            "/v1/jobs?wait=true",
            a,
            Some(job.clone()),
            false,
        ),
        call(Method::GET, "/v1/jobs", a, None, false),
        call(Method::GET, "/v1/jobs?limit=1", a, None, false),
        call(Method::GET, format!("/v1/jobs/{id}"), a, None, true),
        call(Method::DELETE, format!("/v1/jobs/{id}"), a, None, true),
        call(Method::GET, format!("/v1/jobs/{id}/ws"), a, None, true),
        call(Method::GET, format!("/v1/jobs/{id}/events"), a, None, false),
        call(Method::GET, "/v1/languages", Open, None, true),
        call(Method::GET, "/v1/capacity", Bearer(ADMIN_KEY), None, false),
        call(
            Method::PUT,
            "/v1/capacity",
            Bearer(ADMIN_KEY),
            Some(capacity),
            false,
        ),
        call(
            Method::DELETE,
            "/v1/capacity/nope",
            Bearer(ADMIN_KEY),
            None,
            true,
        ),
        call(Method::GET, "/v1/usage", a, None, false),
        call(Method::GET, "/v1/dashboard", Bearer(ADMIN_KEY), None, false),
        call(Method::GET, "/v1/playground", Open, None, true),
        call(Method::GET, "/healthz", Open, None, true),
        call(Method::GET, "/readyz", Open, None, true),
        call(Method::GET, "/metrics", Open, None, false),
        call(Method::GET, "/dashboard", Open, None, true),
        call(Method::GET, "/no/such/route", a, None, true),
        // Piston
        call(Method::GET, "/api/v2/runtimes", Open, None, true),
        call(Method::POST, "/api/v2/execute", a, Some(piston), false),
        call(Method::GET, "/api/v2/connect", a, None, true),
        call(Method::GET, "/api/v2/packages", Open, None, true),
        call(
            Method::POST,
            "/api/v2/packages",
            a,
            Some(json!({"language": "python", "version": "*"})),
            true,
        ),
        call(
            Method::DELETE,
            "/api/v2/packages",
            a,
            Some(json!({"language": "python", "version": "*"})),
            true,
        ),
        // Judge0
        call(
            Method::POST,
            "/judge0/submissions",
            Judge0,
            Some(judge0.clone()),
            false,
        ),
        call(
            Method::POST,
            "/judge0/submissions?base64_encoded=true&wait=true",
            Judge0,
            // `print hi`
            Some(json!({"source_code": "cHJpbnQgaGk=", "language_id": 46})),
            false,
        ),
        call(
            Method::GET,
            format!("/judge0/submissions/{token}"),
            Judge0,
            None,
            true,
        ),
        call(
            Method::GET,
            format!("/judge0/submissions/{token}?base64_encoded=true&fields=*"),
            Judge0,
            None,
            true,
        ),
        call(
            Method::POST,
            "/judge0/submissions/batch",
            Judge0,
            Some(json!({"submissions": [judge0]})),
            false,
        ),
        call(
            Method::GET,
            format!("/judge0/submissions/batch?tokens={token}"),
            Judge0,
            None,
            true,
        ),
        call(Method::GET, "/judge0/languages", Judge0, None, true),
        call(Method::GET, "/judge0/languages/all", Judge0, None, true),
        call(Method::GET, "/judge0/languages/71", Judge0, None, true),
        call(Method::GET, "/judge0/statuses", Judge0, None, true),
        call(Method::GET, "/judge0/about", Judge0, None, true),
        call(Method::GET, "/judge0/config_info", Judge0, None, true),
        call(Method::GET, "/judge0/system_info", Judge0, None, true),
        call(Method::GET, "/judge0/workers", Judge0, None, false),
        call(Method::GET, "/judge0/statistics", Judge0, None, false),
        call(Method::POST, "/judge0/authenticate", Judge0, None, true),
        call(Method::POST, "/judge0/authorize", Judge0, None, true),
    ];
    for entry in &table {
        let plain = send(&daemon, entry, &entry.path).await;
        let with_slash = send(&daemon, entry, &slashed(&entry.path)).await;
        let what = format!("{} {}", entry.method, entry.path);
        assert_eq!(
            plain.0, with_slash.0,
            "{what}: {} vs {}",
            plain.2, with_slash.2
        );
        assert_eq!(plain.1, with_slash.1, "{what}: the content type");
        if entry.stable {
            assert_eq!(plain.2, with_slash.2, "{what}: the body");
        }
        // Every route of the table is one (but the deliberate miss).
        if entry.path == "/no/such/route" {
            assert_eq!(plain.0, StatusCode::NOT_FOUND, "{what}");
        } else {
            assert!(!plain.2.contains("no such route"), "{what}: {}", plain.2);
            assert_ne!(
                plain.0,
                StatusCode::METHOD_NOT_ALLOWED,
                "{what}: {}",
                plain.2
            );
        }
    }
    // Several slashes are one, and the query stays.
    let (status, body) = get_json(
        &daemon,
        "/judge0/submissions/{token}//?fields=token"
            .replace("{token}", &token)
            .as_str(),
        Judge0,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"token": token}));
}

#[tokio::test]
async fn judge0_authenticate_and_authorize_take_the_header_or_the_query_parameter() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, 1).await;
    let ok = (StatusCode::OK, String::new());
    let unauthorized = (StatusCode::UNAUTHORIZED, String::new());
    let forbidden = (StatusCode::FORBIDDEN, String::new());
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a (StatusCode, String));
    let cases: &[Case] = &[
        ("/judge0/authenticate", &[("X-Auth-Token", KEY_A)], &ok),
        (
            "/judge0/authenticate?X-Auth-Token=key-a-0123456789",
            &[],
            &ok,
        ),
        (
            "/judge0/authenticate",
            &[("Authorization", "Bearer key-a-0123456789")],
            &ok,
        ),
        (
            "/judge0/authenticate",
            &[("X-Auth-Token", "key-x-0123456789")],
            &unauthorized,
        ),
        (
            "/judge0/authenticate?X-Auth-Token=wrong",
            &[],
            &unauthorized,
        ),
        (
            "/judge0/authenticate",
            &[("X-Auth-Token", "")],
            &unauthorized,
        ),
        ("/judge0/authenticate", &[], &unauthorized),
        // Authorization: X-Auth-User must be a key with the admin scope,
        // after the token authenticates.
        (
            "/judge0/authorize",
            &[("X-Auth-Token", KEY_A), ("X-Auth-User", ADMIN_KEY)],
            &ok,
        ),
        (
            "/judge0/authorize?X-Auth-Token=key-a-0123456789&X-Auth-User=key-ops-0123456789",
            &[],
            &ok,
        ),
        (
            "/judge0/authorize?X-Auth-User=key-ops-0123456789",
            &[("X-Auth-Token", KEY_B)],
            &ok,
        ),
        (
            "/judge0/authorize",
            &[("X-Auth-Token", ADMIN_KEY), ("X-Auth-User", ADMIN_KEY)],
            &ok,
        ),
        (
            "/judge0/authorize",
            &[("X-Auth-Token", KEY_A), ("X-Auth-User", KEY_B)],
            &forbidden,
        ),
        (
            "/judge0/authorize",
            &[("X-Auth-Token", KEY_A), ("X-Auth-User", "key-x-0123456789")],
            &forbidden,
        ),
        (
            "/judge0/authorize?X-Auth-User=",
            &[("X-Auth-Token", KEY_A)],
            &forbidden,
        ),
        (
            "/judge0/authorize",
            &[("X-Auth-Token", ADMIN_KEY)],
            &forbidden,
        ),
        (
            "/judge0/authorize",
            &[("X-Auth-User", ADMIN_KEY)],
            &unauthorized,
        ),
        (
            "/judge0/authorize",
            &[("X-Auth-Token", "wrong"), ("X-Auth-User", ADMIN_KEY)],
            &unauthorized,
        ),
    ];
    for (path, headers, expected) in cases {
        assert_eq!(
            &post_with(&daemon, path, headers).await,
            *expected,
            "{path} {headers:?}"
        );
    }
    // Neither is a submission: no refusal was counted.
    let metrics = daemon.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"unauthorized\"}"
        ),
        Some(0.0)
    );
}

#[tokio::test]
async fn piston_packages_list_the_languages_and_installing_is_the_operators() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, 1).await;
    let (status, packages) = get_json(&daemon, "/api/v2/packages", Auth::None).await;
    assert_eq!(status, StatusCode::OK);
    let (_, runtimes) = get_json(&daemon, "/api/v2/runtimes", Auth::None).await;
    let runtimes = runtimes.as_array().unwrap();
    let packages = packages.as_array().unwrap();
    assert_eq!(packages.len(), runtimes.len());
    for (package, runtime) in packages.iter().zip(runtimes) {
        assert_eq!(
            package,
            &json!({"language": runtime["language"], "language_version": runtime["version"], "installed": true})
        );
    }
    assert!(
        packages.contains(
            &json!({"language": "python", "language_version": "3.11.0", "installed": true})
        )
    );
    for method in [Method::POST, Method::DELETE] {
        // Piston's own check of the content type comes first.
        let response = daemon
            .http
            .request(method.clone(), format!("{}/api/v2/packages", daemon.url))
            .bearer_auth(KEY_A)
            .body(r#"{"language":"python","version":"3.12.0"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{method}"
        );
        assert_eq!(
            response.json::<Value>().await.unwrap(),
            json!({"message": "requests must be of type application/json"})
        );
        let response = daemon
            .http
            .request(method.clone(), format!("{}/api/v2/packages", daemon.url))
            .bearer_auth(KEY_A)
            .json(&json!({"language": "python", "version": "3.12.0"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED, "{method}");
        assert_eq!(
            response.json::<Value>().await.unwrap(),
            json!({"message": "packages are installed by the operator on this server: languages and their libraries come from runner-images/languages.toml and scripts/build-images, not from the API; GET /api/v2/packages lists what is installed"})
        );
        // Without a key: 401.
        let response = daemon
            .http
            .request(method.clone(), format!("{}/api/v2/packages", daemon.url))
            .json(&json!({"language": "python", "version": "3.12.0"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{method}");
    }
}
