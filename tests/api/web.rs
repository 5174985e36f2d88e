//! The browser pages over plain HTTP (the browser itself is in
//! tests/browser.rs): their settings and how bad ones are refused, the
//! routes each switch turns on or off, the shared playground key and its
//! limits, the dashboard's authorization, and what its data holds, read
//! from a real redis-server through `code-runner api` processes run in
//! the test (no worker, so jobs stay queued). Bad settings are refused by
//! the binary itself, which needs no Docker for that.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::client::{Answer, ApiClient, KEY_A, python};
use crate::common::daemon::{Role, run_to_end};
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;

const ADMIN_KEY: &str = "key-ops-0123456789";
const PLAYGROUND_KEY: &str = "key-play-0123456789";

#[test]
fn bad_page_settings_exit_64_naming_the_setting() {
    let keys = format!("a:{KEY_A},ops:{ADMIN_KEY}:admin:3,play:{PLAYGROUND_KEY}:2");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("CODE_RUNNER_PLAYGROUND_KEY", "nobody")],
            "invalid configuration: CODE_RUNNER_PLAYGROUND_KEY: \"nobody\" is not the name of a key in CODE_RUNNER_API_KEYS (configured: a, ops, play)",
        ),
        (
            &[("CODE_RUNNER_PLAYGROUND_KEY", "a")],
            "invalid configuration: CODE_RUNNER_PLAYGROUND_KEY: key \"a\" has no max_active; the playground key needs a low one (e.g. a:<key>:4) so visitors cannot fill the queue",
        ),
        (
            &[("CODE_RUNNER_PLAYGROUND_KEY", "ops")],
            "invalid configuration: CODE_RUNNER_PLAYGROUND_KEY: key \"ops\" has the admin scope; the playground key is used by anyone who opens the page, so give it a key without admin",
        ),
        (
            &[
                ("CODE_RUNNER_PLAYGROUND_PATH", "off"),
                ("CODE_RUNNER_PLAYGROUND_KEY", "play"),
            ],
            "invalid configuration: CODE_RUNNER_PLAYGROUND_KEY: is set but the playground is off (CODE_RUNNER_PLAYGROUND_PATH=off)",
        ),
        (
            &[("CODE_RUNNER_PLAYGROUND_PATH", "/v1/play")],
            "invalid configuration: CODE_RUNNER_PLAYGROUND_PATH: \"/v1/play\" is under /v1, which the API uses; choose another path",
        ),
        (
            &[("CODE_RUNNER_DASHBOARD_PATH", "dashboard")],
            "invalid configuration: CODE_RUNNER_DASHBOARD_PATH: \"dashboard\" is not a path like /playground (letters, digits, '-', '_', '.', '/'; at most 100 characters, no trailing '/') or off",
        ),
        (
            &[("CODE_RUNNER_DASHBOARD_PATH", "/")],
            "invalid configuration: CODE_RUNNER_DASHBOARD_PATH: \"/\" is also the playground's path",
        ),
    ];
    for (settings, expected) in cases {
        let mut env = vec![
            ("CODE_RUNNER_API_KEYS", keys.as_str()),
            // Never reached: configuration is checked before anything connects.
            ("CODE_RUNNER_REDIS_URL", "redis://127.0.0.1:1"),
            ("CODE_RUNNER_LISTEN", "127.0.0.1:0"),
        ];
        env.extend_from_slice(settings);
        let output = run_to_end(&["api"], &env);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{settings:?}: {stderr}");
        assert_eq!(
            stderr.trim(),
            format!("code-runner: {expected}"),
            "{settings:?}"
        );
        assert!(!stderr.contains(PLAYGROUND_KEY) && !stderr.contains(ADMIN_KEY));
    }
}

async fn api(redis: &RedisServer, settings: &[(&str, &str)]) -> InProcess {
    let mut builder = InProcessBuilder::new(Role::Api, redis).env(
        "CODE_RUNNER_API_KEYS",
        format!("a:{KEY_A},ops:{ADMIN_KEY}:admin,play:{PLAYGROUND_KEY}:1"),
    );
    for (name, value) in settings {
        builder = builder.env(name, value);
    }
    builder.start().await
}

/// `GET path` without a key: status, content type, body text.
async fn fetch(daemon: &ApiClient, path: &str) -> (StatusCode, String, String) {
    let response = daemon
        .http
        .get(format!("{}{path}", daemon.url))
        .send()
        .await
        .expect("the GET is answered");
    let status = response.status();
    let kind = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, kind, response.text().await.unwrap())
}

#[tokio::test]
async fn the_pages_are_served_with_their_files_and_a_strict_policy() {
    let redis = RedisServer::start();
    let daemon = api(&redis, &[]).await;
    let response = daemon
        .http
        .get(format!("{}/", daemon.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let policy = headers["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
    ] {
        assert!(policy.contains(directive), "{policy}");
    }
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let etag = headers["etag"].clone();
    let page = response.text().await.unwrap();
    assert!(page.contains("<script src=\"/ui/playground.js\" defer></script>"));
    let again = daemon
        .http
        .get(format!("{}/", daemon.url))
        .header("If-None-Match", etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);

    for (path, kind, marker) in [
        (
            "/ui/playground.js",
            "text/javascript; charset=utf-8",
            "code-runner.api-key",
        ),
        ("/ui/playground.css", "text/css; charset=utf-8", ".term-box"),
        ("/dashboard", "text/html; charset=utf-8", "/ui/dashboard.js"),
        (
            "/ui/dashboard.js",
            "text/javascript; charset=utf-8",
            "/v1/dashboard",
        ),
        (
            "/ui/licenses.txt",
            "text/plain; charset=utf-8",
            "@xterm/xterm 6.0.0 (MIT)",
        ),
    ] {
        let (status, content_type, body) = fetch(&daemon, path).await;
        assert_eq!(
            (status, content_type.as_str()),
            (StatusCode::OK, kind),
            "{path}"
        );
        assert!(body.contains(marker), "{path} lacks {marker:?}");
    }
    // The big bundle also comes gzipped, and is then the same file.
    let (_, _, plain) = fetch(&daemon, "/ui/playground.js").await;
    let packed = daemon
        .http
        .get(format!("{}/ui/playground.js", daemon.url))
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(packed.headers()["content-encoding"], "gzip");
    let packed = packed.bytes().await.unwrap();
    assert!(packed.len() * 2 < plain.len());
    assert_eq!(
        gunzip(&packed),
        plain.as_bytes(),
        "the gzipped bundle is stale: run web/build"
    );

    let (status, _, body) = fetch(&daemon, "/ui/secrets.txt").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["message"],
        "no such page"
    );

    let settings = daemon.get("/v1/playground", None).await;
    assert_eq!(settings.status, StatusCode::OK);
    assert_eq!(
        settings.body,
        json!({"shared_key": false, "max_active": null, "dashboard_path": "/dashboard"})
    );
    let shared = daemon.post_playground(python("print(1)"), None).await;
    assert_eq!(shared.status, StatusCode::NOT_FOUND, "{shared:#?}");
    assert_eq!(
        shared.error(),
        (
            "not_found".to_string(),
            "this server has no shared playground key; submit to /v1/jobs with your api key"
                .to_string()
        )
    );
}

#[tokio::test]
async fn pages_can_move_or_be_switched_off() {
    let redis = RedisServer::start();
    let daemon = api(
        &redis,
        &[
            ("CODE_RUNNER_PLAYGROUND_PATH", "off"),
            ("CODE_RUNNER_DASHBOARD_PATH", "/ops/board"),
        ],
    )
    .await;
    for path in ["/", "/playground", "/dashboard", "/v1/playground"] {
        assert_eq!(
            fetch(&daemon, path).await.0,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    assert_eq!(fetch(&daemon, "/ops/board").await.0, StatusCode::OK);
    assert_eq!(fetch(&daemon, "/ui/dashboard.js").await.0, StatusCode::OK);

    let both_off = api(
        &redis,
        &[
            ("CODE_RUNNER_PLAYGROUND_PATH", "off"),
            ("CODE_RUNNER_DASHBOARD_PATH", "off"),
        ],
    )
    .await;
    for path in ["/", "/dashboard", "/ui/playground.js", "/v1/dashboard"] {
        assert_eq!(
            fetch(&both_off, path).await.0,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    // The API itself is untouched.
    assert_eq!(fetch(&both_off, "/v1/languages").await.0, StatusCode::OK);
}

#[tokio::test]
async fn the_shared_playground_key_submits_for_visitors_within_its_limit() {
    let redis = RedisServer::start();
    let daemon = api(
        &redis,
        &[
            ("CODE_RUNNER_PLAYGROUND_PATH", "/playground"),
            ("CODE_RUNNER_PLAYGROUND_KEY", "play"),
        ],
    )
    .await;
    assert_eq!(fetch(&daemon, "/").await.0, StatusCode::NOT_FOUND);
    assert_eq!(fetch(&daemon, "/playground").await.0, StatusCode::OK);
    let settings = daemon.get("/v1/playground", None).await;
    assert_eq!(
        settings.body,
        json!({"shared_key": true, "max_active": 1, "dashboard_path": "/dashboard"})
    );

    let accepted = daemon.post_playground(python("print(1)"), None).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{accepted:#?}");
    let id = accepted.id();
    assert!(accepted.body["token"].as_str().unwrap().starts_with(&id));
    // The job is the shared key's, not the visitor's: key `a` cannot see it.
    assert_eq!(redis.job_field(&id, "api_key"), "play");
    let view = daemon
        .get(&format!("/v1/jobs/{id}"), Some(PLAYGROUND_KEY))
        .await;
    assert_eq!(view.status, StatusCode::OK);
    assert_eq!(
        daemon
            .get(&format!("/v1/jobs/{id}"), Some(KEY_A))
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // max_active 1: the job is still queued (no worker), so the next waits.
    let refused = daemon.post_playground(python("print(2)"), None).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{refused:#?}"
    );
    assert_eq!(refused.error().0, "key_limit");
    assert_eq!(refused.retry_after(), 1);

    let replay = daemon
        .post_playground(python("print(3)"), Some("same-key"))
        .await;
    assert_eq!(replay.status, StatusCode::BAD_REQUEST, "{replay:#?}");
    assert_eq!(
        replay.error(),
        (
            "invalid_request".to_string(),
            "the shared playground key takes no idempotency keys".to_string()
        )
    );
    assert_eq!(replay.body["error"]["field"], "Idempotency-Key");
}

#[tokio::test]
async fn the_dashboard_needs_an_admin_key_and_shows_workers_and_recent_jobs() {
    let redis = RedisServer::start();
    // It submits 205 jobs with one key: above the default max_active and
    // request burst.
    let daemon = api(
        &redis,
        &[
            ("CODE_RUNNER_KEY_MAX_ACTIVE", "1000"),
            ("CODE_RUNNER_KEY_BURST", "1000"),
        ],
    )
    .await;

    let anonymous = daemon.get("/v1/dashboard", None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let user = daemon.get("/v1/dashboard", Some(KEY_A)).await;
    assert_eq!(user.status, StatusCode::FORBIDDEN);
    assert_eq!(
        user.error(),
        (
            "forbidden".to_string(),
            "this needs an api key with the admin scope".to_string()
        )
    );

    let empty = daemon.get("/v1/dashboard", Some(ADMIN_KEY)).await;
    assert_eq!(empty.status, StatusCode::OK, "{empty:#?}");
    assert_eq!(empty.body["queue_depth"], 0);
    assert_eq!(empty.body["tenants_waiting"], 0);
    assert_eq!(empty.body["waiting"], json!([]));
    assert_eq!(empty.body["workers"], json!([]));
    assert_eq!(empty.body["recent_jobs"], json!([]));
    // An `api` process counts no jobs of its own: no rate is claimed.
    assert_eq!(empty.body["history"]["jobs_counted"], false);
    assert_eq!(empty.body["history"]["interval_ms"], 5000);
    let samples = empty.body["history"]["samples"].as_array().unwrap();
    assert!(!samples.is_empty(), "the first sample is taken at start");
    assert_eq!(samples[0]["queue_depth"], 0);

    // Live workers come from their heartbeats, warm figures passed on; a
    // worker whose heartbeat expired is not shown.
    redis.cli(&["SADD", "workers", "w-live", "w-dead"]);
    redis.cli(&[
        "SET",
        "worker:w-live:hb",
        r#"{"slots_used":2,"slots_max":4,"version":"9.9.9","started_ms":0,"warm":{"python":{"ready":3,"target":4}},"warm_memory_held":true}"#,
        "PX",
        "60000",
    ]);

    // More jobs than the list keeps: it stays at its cap.
    let mut ids = Vec::new();
    for n in 0..205 {
        let answer = daemon.submit(&python(&format!("print({n})"))).await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
        ids.push(answer.id());
    }
    assert_eq!(redis.cli(&["LLEN", "jobs:recent"]), "200");

    // Two more, for a user of the key, and one of another key.
    for user in ["student-1", "student-1"] {
        let mut job = python("print(1)");
        job["user"] = json!(user);
        let answer = daemon.submit(&job).await;
        assert_eq!(answer.status, StatusCode::ACCEPTED);
        ids.push(answer.id());
    }
    let other = daemon
        .submit_as(Some(ADMIN_KEY), &python("print(1)"), false)
        .await;
    assert_eq!(other.status, StatusCode::ACCEPTED);
    ids.push(other.id());

    let view = daemon.get("/v1/dashboard", Some(ADMIN_KEY)).await;
    assert_eq!(view.status, StatusCode::OK);
    assert_eq!(view.body["queue_depth"], 208);
    // The users waiting, in the order of their turns.
    assert_eq!(view.body["tenants_waiting"], 2);
    assert_eq!(
        view.body["waiting"],
        json!([
            {"api_key": "a", "user": null, "queued": 205},
            {"api_key": "a", "user": "student-1", "queued": 2},
            {"api_key": "ops", "user": null, "queued": 1},
        ])
    );
    assert_eq!(
        view.body["workers"],
        json!([{
            "id": "w-live",
            "slots_used": 2,
            "slots_max": 4,
            "version": "9.9.9",
            "started_at": "1970-01-01T00:00:00.000Z",
            "warm": {"python": {"ready": 3, "target": 4}},
            "warm_memory_held": true,
        }])
    );
    let recent = view.body["recent_jobs"].as_array().unwrap();
    assert_eq!(recent.len(), 50);
    let newest: Vec<&str> = ids.iter().rev().take(50).map(String::as_str).collect();
    let shown: Vec<&str> = recent.iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(shown, newest);
    let first = &recent[3];
    assert_eq!(
        (
            &first["status"],
            &first["language"],
            &first["api_key"],
            &first["worker"]
        ),
        (
            &json!("queued"),
            &json!("python"),
            &json!("a"),
            &Value::Null
        )
    );
    assert!(first["created_at"].as_str().unwrap().ends_with('Z'));

    // An expired job leaves the list's view (its id may linger until pushed out).
    redis.cli(&["DEL", &format!("job:{}", ids[207])]);
    let view = daemon.get("/v1/dashboard", Some(ADMIN_KEY)).await;
    assert_eq!(view.body["recent_jobs"][0]["id"], ids[206].as_str());
}

/// `gzip -dc` of `data`.
fn gunzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip runs");
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(output.status.success(), "gzip -dc failed");
    output.stdout
}

/// `POST /v1/playground/jobs` without a key.
trait PostPlayground {
    async fn post_playground(&self, job: Value, idempotency_key: Option<&str>) -> Answer;
}

impl PostPlayground for ApiClient {
    async fn post_playground(&self, job: Value, idempotency_key: Option<&str>) -> Answer {
        let mut request = self
            .http
            .post(format!("{}/v1/playground/jobs", self.url))
            .json(&job);
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.expect("the POST is answered");
        let (status, headers) = (response.status(), response.headers().clone());
        let body = response.json().await.expect("a JSON answer");
        Answer {
            status,
            headers,
            body,
        }
    }
}
