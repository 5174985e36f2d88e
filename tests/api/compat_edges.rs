//! The edges of the three APIs that clients other than ours rely on,
//! against a real `code-runner serve` and redis-server: every route
//! answers the same with a trailing slash; Judge0's `/authenticate`,
//! `/authorize`, `/system_info`, `/workers`, `/statistics`,
//! `/languages/all` and `DELETE /submissions/{token}`; Piston's
//! `/packages`.

mod common;

use std::time::Duration;

use common::daemon::{Daemon, DaemonBuilder, KEY_A, KEY_B, Role};
use common::redis_server::RedisServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const ADMIN_KEY: &str = "key-ops-0123456789";
const DONE: Duration = Duration::from_secs(60);

async fn serve(redis: &RedisServer, slots: u32) -> Daemon {
    DaemonBuilder::new(Role::Serve, redis)
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
enum Auth {
    None,
    Bearer(&'static str),
    Judge0,
}

struct Call {
    method: Method,
    path: String,
    auth: Auth,
    body: Option<Value>,
    /// Whether the body is the same on every call (else only the status
    /// and the content type are compared).
    stable: bool,
}

fn call(
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

async fn send(daemon: &Daemon, call: &Call, path: &str) -> (StatusCode, Option<String>, String) {
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
fn slashed(path: &str) -> String {
    match path.split_once('?') {
        Some((head, query)) => format!("{head}/?{query}"),
        None => format!("{path}/"),
    }
}

#[tokio::test]
async fn every_route_answers_the_same_with_a_trailing_slash() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, 2).await;
    let done = daemon
        .submit_wait(&common::daemon::python("print('hi')"))
        .await;
    let id = done.id();
    let judge0_done = daemon
        .http
        .post(format!("{}/judge0/submissions?wait=true", daemon.url))
        .header("X-Auth-Token", KEY_A)
        .json(&json!({"source_code": "echo hi", "language_id": 46}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let token = judge0_done["token"].as_str().expect("a token").to_string();
    let job = json!({"language": "python", "files": [{"name": "main.py", "content": "print(1)"}]});
    let piston = json!({"language": "python", "version": "*", "files": [{"content": "print(1)"}]});
    let judge0 = json!({"source_code": "echo hi", "language_id": 46});
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
            Some(json!({"source_code": "ZWNobyBoaQ==", "language_id": 46})),
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

async fn get_json(daemon: &Daemon, path: &str, auth: Auth) -> (StatusCode, Value) {
    let (status, _, text) = send(daemon, &call(Method::GET, path, auth, None, true), path).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `POST path` with these headers; the status and the body's text.
async fn post_with(daemon: &Daemon, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let mut request = daemon.http.post(format!("{}{path}", daemon.url));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    (response.status(), response.text().await.unwrap())
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
        common::daemon::metric(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"unauthorized\"}"
        ),
        Some(0.0)
    );
}

#[tokio::test]
async fn judge0_delete_needs_authorization_and_an_ended_submission_and_answers_with_it() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, 1).await;
    let submit = |source: &'static str, wait: bool| {
        let daemon = &daemon;
        async move {
            let response = daemon
                .http
                .post(format!("{}/judge0/submissions?wait={wait}", daemon.url))
                .header("X-Auth-Token", KEY_A)
                .json(&json!({"source_code": source, "language_id": 46}))
                .send()
                .await
                .unwrap();
            let body: Value = response.json().await.unwrap();
            body["token"].as_str().expect("a token").to_string()
        }
    };
    let delete =
        |token: String, headers: Vec<(&'static str, &'static str)>, query: &'static str| {
            let daemon = &daemon;
            async move {
                let mut request = daemon
                    .http
                    .delete(format!("{}/judge0/submissions/{token}{query}", daemon.url));
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                let response = request.send().await.unwrap();
                (response.status(), response.text().await.unwrap())
            }
        };
    let done = submit("echo deleted", true).await;
    let authorized = vec![("X-Auth-Token", KEY_A), ("X-Auth-User", ADMIN_KEY)];
    // Authorization first: 403 with no body, nothing deleted.
    assert_eq!(
        delete(done.clone(), vec![("X-Auth-Token", KEY_A)], "").await,
        (StatusCode::FORBIDDEN, String::new())
    );
    assert_eq!(
        delete(
            done.clone(),
            vec![("X-Auth-Token", KEY_A), ("X-Auth-User", KEY_B)],
            ""
        )
        .await,
        (StatusCode::FORBIDDEN, String::new())
    );
    assert_eq!(
        delete(done.clone(), vec![("X-Auth-User", ADMIN_KEY)], "").await,
        (StatusCode::UNAUTHORIZED, String::new())
    );
    // Another key's submission is not found.
    let (status, body) = delete(
        done.clone(),
        vec![("X-Auth-Token", KEY_B), ("X-Auth-User", ADMIN_KEY)],
        "",
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::NOT_FOUND, r#"{"error":"submission not found"}"#)
    );
    // Deleted: answered with its fields, base64 whatever was asked.
    let (status, body) = delete(
        done.clone(),
        authorized.clone(),
        "?fields=token,stdout,status&base64_encoded=false",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"token": done, "stdout": "ZGVsZXRlZAo=\n", "status": {"id": 3, "description": "Accepted"}})
    );
    // Gone everywhere: Judge0, /v1, the run history.
    let (status, _) = get_json(
        &daemon,
        &format!("/judge0/submissions/{done}"),
        Auth::Judge0,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        daemon
            .get(&format!("/v1/jobs/{done}"), Some(KEY_A))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let history = daemon.get("/v1/jobs", Some(KEY_A)).await;
    assert!(
        !history.body.to_string().contains(&done),
        "{:#}",
        history.body
    );
    assert_eq!(
        delete(done.clone(), authorized.clone(), "").await,
        (
            StatusCode::NOT_FOUND,
            r#"{"error":"submission not found"}"#.to_string()
        )
    );
    // The default fields are Judge0's.
    let other = submit("echo two", true).await;
    let (status, body) = delete(other.clone(), authorized.clone(), "").await;
    assert_eq!(status, StatusCode::OK);
    let fields: Vec<String> = serde_json::from_str::<Value>(&body)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        fields,
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
    // Running, then queued behind it (one slot): 400, kept.
    let running = submit("sleep 30", false).await;
    daemon.wait_status(&running, &["running"], DONE).await;
    let queued = submit("echo later", false).await;
    assert_eq!(
        delete(running.clone(), authorized.clone(), "").await,
        (
            StatusCode::BAD_REQUEST,
            r#"{"error":"submission cannot be deleted because its status is 2 (Processing)"}"#
                .to_string()
        )
    );
    assert_eq!(
        delete(queued.clone(), authorized.clone(), "").await,
        (
            StatusCode::BAD_REQUEST,
            r#"{"error":"submission cannot be deleted because its status is 1 (In Queue)"}"#
                .to_string()
        )
    );
    assert_eq!(daemon.job(&running).await["status"], "running");
    daemon.cancel(&running).await;
    daemon.wait_terminal(&queued, DONE).await;
}

#[tokio::test]
async fn judge0_workers_statistics_system_info_and_languages_all_have_judge0s_shapes() {
    // The statistics count "today" and the 30 days before it (UTC).
    common::clear_of_utc_midnight(Duration::from_secs(120)).await;
    let redis = RedisServer::start();
    let daemon = serve(&redis, 1).await;
    let auth = Auth::Judge0;
    // One job of each outcome the statistics count, on key a.
    for (language, file, source, status) in [
        ("python", "main.py", "print('ok')", "succeeded"),
        ("bash", "main.sh", "exit 3", "failed"),
        ("c", "main.c", "int main( {", "failed"),
    ] {
        let answer = daemon
            .submit_wait(&common::daemon::job(language, file, source))
            .await;
        assert_eq!(answer.body["status"], status, "{:#}", answer.body);
    }
    let (status, stats) = get_json(&daemon, "/judge0/statistics?invalidate_cache=true", auth).await;
    assert_eq!(status, StatusCode::OK, "{stats:#}");
    assert_eq!(stats["submissions"]["total"], 3, "{stats:#}");
    assert_eq!(stats["submissions"]["today"], 3);
    let days = stats["submissions"]["last_30_days"].as_object().unwrap();
    // The 30 days before today (today is `today`), by date.
    let today = code_runner::store::usage::Day::from_ms(code_runner::store::now_ms());
    let expected: std::collections::BTreeSet<String> =
        (1..=30).map(|back| today.plus(-back).to_string()).collect();
    let got: std::collections::BTreeSet<String> = days.keys().cloned().collect();
    assert_eq!(got, expected);
    assert!(days.values().all(|n| n == 0), "{days:?}");
    let languages: Vec<Value> = stats["languages"].as_array().unwrap().clone();
    assert_eq!(languages.len(), 3, "{languages:?}");
    for (id, name) in [
        (71, "Python (3.11)"),
        (46, "Bash (5.2)"),
        (50, "C (GCC 12)"),
    ] {
        assert!(
            languages.contains(&json!({"language": {"id": id, "name": name}, "count": 1})),
            "{id} {name}: {languages:?}"
        );
    }
    let statuses: Vec<Value> = stats["statuses"].as_array().unwrap().clone();
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    for (id, name) in [
        (3, "Accepted"),
        (11, "Runtime Error (NZEC)"),
        (6, "Compilation Error"),
    ] {
        assert!(
            statuses.contains(&json!({"status": {"id": id, "name": name}, "count": 1})),
            "{id} {name}: {statuses:?}"
        );
    }
    assert!(
        stats["database"]["size_in_bytes"].as_u64().unwrap() > 0,
        "{stats:#}"
    );
    assert!(
        stats["database"]["size_pretty"]
            .as_str()
            .unwrap()
            .ends_with("kB"),
        "{stats:#}"
    );
    assert_eq!(stats["created_at"], stats["cached_until"]);
    // Key b has none of them.
    let (_, theirs) = {
        let call = call(
            Method::GET,
            "/judge0/statistics",
            Auth::Bearer(KEY_B),
            None,
            true,
        );
        let (s, _, t) = send(&daemon, &call, &call.path).await;
        (s, serde_json::from_str::<Value>(&t).unwrap())
    };
    assert_eq!(theirs["submissions"]["total"], 0);
    assert_eq!(theirs["languages"], json!([]));

    // /workers: the one slot busy with a python job, two more queued.
    let running = daemon.submit(&common::daemon::sleeper(30.0)).await.id();
    daemon.wait_status(&running, &["running"], DONE).await;
    let mut queued = Vec::new();
    for _ in 0..2 {
        queued.push(
            daemon
                .submit(&common::daemon::python("print(1)"))
                .await
                .id(),
        );
    }
    // The next heartbeat says the slot is taken.
    let python_busy =
        json!({"queue": "python", "size": 2, "available": 1, "idle": 0, "working": 1, "paused": 0});
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let workers = loop {
        let (status, workers) = get_json(&daemon, "/judge0/workers", auth).await;
        assert_eq!(status, StatusCode::OK);
        let python = workers
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["queue"] == "python")
            .cloned();
        if python.as_ref() == Some(&python_busy) {
            break workers;
        }
        assert!(std::time::Instant::now() < deadline, "{workers:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let bash = workers
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["queue"] == "bash")
        .cloned();
    assert_eq!(
        bash,
        Some(
            json!({"queue": "bash", "size": 0, "available": 1, "idle": 0, "working": 0, "paused": 0})
        )
    );
    daemon.cancel(&running).await;
    for id in &queued {
        daemon.wait_terminal(id, DONE).await;
    }

    // /system_info: lscpu's labels and free's totals of this machine.
    let (status, info) = get_json(&daemon, "/judge0/system_info", auth).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info["Architecture"], std::env::consts::ARCH);
    let cpus: usize = info["CPU(s)"].as_str().unwrap().parse().unwrap();
    assert!(cpus >= 1, "{info:#}");
    assert!(
        info["Mem"]
            .as_str()
            .unwrap()
            .ends_with(['K', 'M', 'G', 'T']),
        "{info:#}"
    );
    assert!(info.get("Swap").is_some(), "{info:#}");
    assert!(
        info.as_object().unwrap().values().all(Value::is_string),
        "{info:#}"
    );

    // /languages/all: sorted by name, every Judge0 id, none archived here.
    let (status, all) = get_json(&daemon, "/judge0/languages/all", auth).await;
    assert_eq!(status, StatusCode::OK);
    let all = all.as_array().unwrap();
    let names: Vec<&str> = all.iter().map(|l| l["name"].as_str().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert!(
        all.contains(&json!({"id": 71, "name": "Python (3.11)", "is_archived": false})),
        "{all:?}"
    );
    assert!(all.iter().all(|l| l.as_object().unwrap().len() == 3));
    // Without a key: Judge0's 401, no body.
    let (status, _, text) = send(
        &daemon,
        &call(Method::GET, "/judge0/workers", Auth::None, None, true),
        "/judge0/workers",
    )
    .await;
    assert_eq!((status, text.as_str()), (StatusCode::UNAUTHORIZED, ""));
}

#[tokio::test]
async fn judge0_languages_all_marks_the_languages_no_worker_offers_archived() {
    let redis = RedisServer::start();
    // An API process with the whole catalog, and a worker whose catalog's
    // ruby has no image: nobody offers ruby.
    let dir = tempfile::tempdir().unwrap();
    let catalog = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/runner-images/languages.toml"
    ))
    .unwrap()
    .replace(
        "image = \"code-runner/ruby\"",
        "image = \"code-runner/absent-ruby\"",
    );
    let file = dir.path().join("languages.toml");
    std::fs::write(&file, catalog).unwrap();
    let api = DaemonBuilder::new(Role::Api, &redis).start().await;
    let _worker = DaemonBuilder::new(Role::Worker, &redis)
        .env("CODE_RUNNER_LANGUAGES_FILE", file.display())
        .start()
        .await;
    // Once the worker has said which languages it runs (until then the
    // whole catalog is on offer).
    let archived = json!({"id": 72, "name": "Ruby (3.1)", "is_archived": true});
    let all = common::wait_for("ruby archived", Duration::from_secs(20), async || {
        let (status, all) = get_json(&api, "/judge0/languages/all", Auth::Bearer(KEY_A)).await;
        assert_eq!(status, StatusCode::OK, "{all:#}");
        all.as_array().unwrap().contains(&archived).then_some(all)
    })
    .await;
    let all = all.as_array().unwrap();
    assert!(
        all.contains(&json!({"id": 71, "name": "Python (3.11)", "is_archived": false})),
        "{all:?}"
    );
    assert_eq!(
        all.iter().filter(|l| l["is_archived"] == true).count(),
        1,
        "{all:?}"
    );
    // /languages lists only what is on offer.
    let (_, active) = get_json(&api, "/judge0/languages", Auth::Bearer(KEY_A)).await;
    assert!(!active.to_string().contains("Ruby"), "{active:#}");
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
