//! The HTTP API against a real redis-server, through real HTTP (reqwest).
//!
//! Each test starts its own redis-server on a free loopback port (killed when
//! the test ends, also when it fails) and its own API on 127.0.0.1:0, with no
//! worker and no Docker: nothing consumes the queue unless a test plays the
//! worker through the queue's own operations. No sleeps for synchronisation:
//! every wait polls with a deadline.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use code_runner::api::{ApiConfig, ApiKeys, ApiState, Scope, TokenSigner};
use code_runner::job::{JobResult, Status};
use code_runner::languages::LanguageCatalog;
use code_runner::metrics::Metrics;
use code_runner::store::{Keys, Store};
use common::redis_server::RedisServer;
use redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const KEYS: &str = "alice:alice-key-0123456789abcdef:2,bob:bob-key-0123456789abcdef";

// ---------------------------------------------------------------------------
// The API under test
// ---------------------------------------------------------------------------

struct Options {
    max_queue_depth: u64,
    max_body_bytes: usize,
    max_wait: Duration,
    catalog: LanguageCatalog,
    engine: Option<code_runner::sandbox::Engine>,
    limits: code_runner::api::ApiLimits,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_queue_depth: 100,
            max_body_bytes: 64 << 10,
            max_wait: Duration::from_secs(10),
            catalog: LanguageCatalog::embedded().unwrap(),
            engine: None,
            limits: code_runner::api::ApiLimits::default(),
        }
    }
}

struct Api {
    base: String,
    http: reqwest::Client,
    store: Store,
    keys: Keys,
    state: ApiState,
    shutdown: CancellationToken,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    redis: RedisServer,
}

impl Api {
    async fn start(options: Options) -> Self {
        let redis = RedisServer::start();
        let prefix = format!("test-{}:", uuid::Uuid::new_v4().simple());
        let store = Store::new(&redis.url(), &prefix, Duration::from_secs(60), 4).unwrap();
        let keys = ApiKeys::parse(KEYS).unwrap();
        let tokens = TokenSigner::from_config(None, &keys, &store, Duration::from_secs(600))
            .await
            .unwrap();
        let state = ApiState::new(ApiConfig {
            catalog: options.catalog,
            max_queue_depth: options.max_queue_depth,
            max_body_bytes: options.max_body_bytes,
            max_wait: options.max_wait,
            engine: options.engine,
            limits: options.limits,
            ..common::api_config(store.clone(), keys, tokens)
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(code_runner::api::serve(
            listener,
            state.clone(),
            shutdown.clone(),
        ));
        Self {
            base,
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            keys: Keys::new(&prefix),
            store,
            state,
            shutdown,
            server: Some(server),
            redis,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn submit(&self, key: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url("/v1/jobs"))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    async fn get(&self, key: &str, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
    }

    async fn delete(&self, key: &str, path: &str) -> reqwest::Response {
        self.http
            .delete(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
    }

    async fn redis(&self) -> redis::aio::MultiplexedConnection {
        self.redis.conn().await
    }

    async fn queued_ids(&self) -> Vec<String> {
        self.store.jobs().queued_ids().await.unwrap()
    }

    async fn metrics(&self) -> String {
        let response = self.http.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn python(source: &str) -> Value {
    json!({"language": "python", "files": [{"name": "main.py", "content": source}]})
}

/// Status, then the JSON body (`Null` when it is not JSON).
async fn answer(response: reqwest::Response) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    (status, headers, body)
}

fn assert_error(status: StatusCode, body: &Value, expected: StatusCode, code: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty() && !message.ends_with('.'), "{body}");
}

async fn submit_ok(api: &Api, key: &str) -> String {
    let (status, _, body) = answer(api.submit(key, &python("print(1)")).await).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body["id"].as_str().unwrap().to_string()
}

fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test]
async fn requests_without_a_valid_key_are_refused() {
    let api = Api::start(Options::default()).await;
    let job = python("print(1)");

    let response = api
        .http
        .post(api.url("/v1/jobs"))
        .json(&job)
        .send()
        .await
        .unwrap();
    let (status, headers, body) = answer(response).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
    assert_eq!(headers["www-authenticate"], "Bearer");

    let (status, headers, body) = answer(api.submit("not-a-key-at-all-really", &job).await).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
    assert_eq!(headers["www-authenticate"], "Bearer");

    // Auth comes before the body: even an oversize body gets 401.
    let response = api
        .http
        .post(api.url("/v1/jobs"))
        .header("content-type", "application/json")
        .body(vec![b'x'; 100 << 10])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    let (status, _, body) = answer(
        api.get("wrong", &format!("/v1/jobs/{}", uuid::Uuid::new_v4()))
            .await,
    )
    .await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
    assert!(api.queued_ids().await.is_empty());

    let metrics = api.metrics().await;
    assert_eq!(
        metric_value(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"unauthorized\"}"
        ),
        Some(3.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn bad_bodies_are_400_naming_the_problem() {
    let api = Api::start(Options::default()).await;
    let raw = |body: &'static str| {
        api.http
            .post(api.url("/v1/jobs"))
            .bearer_auth(ALICE)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let (status, _, body) = answer(raw("{\"language\": ").await.unwrap()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the body is not valid json: language: EOF while parsing"),
        "{body}"
    );

    let (status, _, body) = answer(raw("").await.unwrap()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");

    let mut job = python("print(1)");
    job["colour"] = json!("blue");
    let (status, _, body) = answer(api.submit(ALICE, &job).await).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `colour`"),
        "{body}"
    );

    let (status, _, body) = answer(raw(r#"{"language": 3, "files": []}"#).await.unwrap()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("language: invalid type"),
        "{body}"
    );

    let mut job = python("print(1)");
    job["language"] = json!("cobol");
    let (status, _, body) = answer(api.submit(ALICE, &job).await).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_job");
    assert_eq!(body["error"]["field"], "language");

    let job = json!({"language": "python", "files": [
        {"name": "main.py", "content": "print(1)"},
        {"name": "../escape.py", "content": ""},
    ]});
    let (status, _, body) = answer(api.submit(ALICE, &job).await).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_job");
    assert_eq!(body["error"]["field"], "files[1].name");
    let job = json!({"language": "python", "files": [{"name": "../x.py", "content": ""}]});
    let (_, _, body) = answer(api.submit(ALICE, &job).await).await;
    assert_eq!(body["error"]["field"], "files[0].name");
    assert_eq!(body["error"]["message"], "\"../x.py\" contains \"..\"");

    // `user`: 1-128 printable characters.
    for (user, message) in [
        (json!(""), "must be 1-128 printable characters; it has 0"),
        (
            json!("x".repeat(129)),
            "must be 1-128 printable characters; it has 129",
        ),
        (
            json!("tab\there"),
            "must be printable characters; it contains '\\t'",
        ),
        (json!("   "), "must not be only spaces"),
    ] {
        let mut job = python("print(1)");
        job["user"] = user;
        let (status, _, body) = answer(api.submit(ALICE, &job).await).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_job");
        assert_eq!(body["error"]["field"], "user");
        assert_eq!(body["error"]["message"], message);
    }
    let mut job = python("print(1)");
    job["user"] = json!(7);
    let (status, _, body) = answer(api.submit(ALICE, &job).await).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("user: invalid type"),
        "{body}"
    );

    let mut job = python("print(1)");
    job["limits"] = json!({"memory_mb": 1_000_000});
    let (status, _, body) = answer(api.submit(ALICE, &job).await).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_job");
    assert_eq!(body["error"]["field"], "limits.memory_mb");

    // Over max_body_bytes (64 KiB here).
    let job = python(&"#".repeat(100 << 10));
    let (status, _, body) = answer(api.submit(ALICE, &job).await).await;
    assert_error(status, &body, StatusCode::PAYLOAD_TOO_LARGE, "too_large");

    // A bad Idempotency-Key or wait parameter.
    let response = api
        .http
        .post(api.url("/v1/jobs"))
        .bearer_auth(ALICE)
        .header("idempotency-key", "k".repeat(201))
        .json(&python("print(1)"))
        .send()
        .await
        .unwrap();
    let (status, _, body) = answer(response).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert_eq!(body["error"]["field"], "Idempotency-Key");
    let response = api
        .http
        .post(api.url("/v1/jobs?wait=maybe"))
        .bearer_auth(ALICE)
        .json(&python("print(1)"))
        .send()
        .await
        .unwrap();
    let (status, _, body) = answer(response).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert_eq!(body["error"]["field"], "wait");

    assert!(api.queued_ids().await.is_empty(), "nothing was queued");
    let metrics = api.metrics().await;
    for (reason, count) in [("malformed", 5.0), ("invalid", 10.0), ("too_large", 1.0)] {
        assert_eq!(
            metric_value(
                &metrics,
                &format!("code_runner_submissions_rejected_total{{reason=\"{reason}\"}}")
            ),
            Some(count),
            "{reason} in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn submit_show_and_cancel_a_queued_job() {
    let api = Api::start(Options::default()).await;
    let mut job = python("print(1)");
    job["language"] = json!("PY"); // an alias: stored as the canonical id
    job["metadata"] = json!({"exam": "e1", "seat": 7});
    job["user"] = json!("student 7 · ünï");
    let (status, headers, body) = answer(api.submit(BOB, &job).await).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 4);
    assert_eq!(body["status"], "queued");
    assert_eq!(headers["location"], format!("/v1/jobs/{id}"));
    assert_eq!(
        body["urls"],
        json!({
            "self": format!("/v1/jobs/{id}"),
            "ws": format!("/v1/jobs/{id}/ws"),
            "events": format!("/v1/jobs/{id}/events"),
        })
    );
    let token = body["token"].as_str().unwrap();
    assert_eq!(api.state.tokens().verify(&id, token), Ok(Scope::Control));
    assert_eq!(body["tokens"]["control"], token);
    let read = body["tokens"]["read"].as_str().unwrap();
    assert_eq!(api.state.tokens().verify(&id, read), Ok(Scope::Read));
    assert!(
        api.state
            .tokens()
            .verify(&uuid::Uuid::new_v4().to_string(), token)
            .is_err()
    );
    assert_eq!(api.queued_ids().await, std::slice::from_ref(&id));

    let (status, _, view) = answer(api.get(BOB, &format!("/v1/jobs/{id}")).await).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["id"], id.as_str());
    assert_eq!(view["status"], "queued");
    assert_eq!(view["language"], "python");
    assert_eq!(view["attempts"], 0);
    assert_eq!(view["worker"], Value::Null);
    assert_eq!(view["started_at"], Value::Null);
    assert_eq!(view["result"], Value::Null);
    assert_eq!(view["metadata"], json!({"exam": "e1", "seat": 7}));
    assert_eq!(view["user"], "student 7 · ünï");
    let created = view["created_at"].as_str().unwrap();
    assert!(
        created.len() == 24 && created.ends_with('Z') && created.as_bytes()[10] == b'T',
        "{created}"
    );

    // Another key, an unknown id and a malformed id: all 404.
    for (key, path) in [
        (ALICE, format!("/v1/jobs/{id}")),
        (BOB, format!("/v1/jobs/{}", uuid::Uuid::new_v4())),
        (BOB, "/v1/jobs/not-a-uuid".to_string()),
    ] {
        let (status, _, body) = answer(api.get(key, &path).await).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    }
    let (status, _, body) = answer(api.delete(ALICE, &format!("/v1/jobs/{id}")).await).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    let (status, _, view) = answer(api.delete(BOB, &format!("/v1/jobs/{id}")).await).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["status"], "cancelled");
    assert_eq!(view["result"]["status"], "cancelled");
    assert_eq!(view["result"]["language"], "python");
    let version = LanguageCatalog::embedded()
        .unwrap()
        .find("python")
        .unwrap()
        .version
        .clone();
    assert_eq!(view["result"]["version"], version.as_str());
    assert!(view["finished_at"].is_string());
    assert!(api.queued_ids().await.is_empty(), "gone from jobs:queue");
    let ttl: i64 = api.redis().await.ttl(api.keys.job(&id)).await.unwrap();
    assert!(ttl > 0 && ttl <= 60, "the cancelled job expires: ttl {ttl}");

    let (status, _, body) = answer(api.delete(BOB, &format!("/v1/jobs/{id}")).await).await;
    assert_error(status, &body, StatusCode::CONFLICT, "already_finished");
    assert_eq!(body["error"]["status"], "cancelled");

    let (status, _, body) = answer(
        api.delete(BOB, &format!("/v1/jobs/{}", uuid::Uuid::new_v4()))
            .await,
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    let (_, _, view) = answer(api.get(BOB, &format!("/v1/jobs/{id}")).await).await;
    assert_eq!(view["status"], "cancelled");
}

fn succeeded() -> JobResult {
    JobResult::without_stages(Status::Succeeded, "python", "3")
}

#[tokio::test]
async fn cancel_of_a_running_job_is_requested_and_a_finished_one_conflicts() {
    let api = Api::start(Options::default()).await;
    let id = submit_ok(&api, BOB).await;
    assert_eq!(common::claim_and_start(&api.store, "w1").await, id);

    let (status, _, view) = answer(api.get(BOB, &format!("/v1/jobs/{id}")).await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["status"], "running");
    assert_eq!(view["worker"], "w1");
    assert_eq!(view["attempts"], 1);
    assert!(view["started_at"].is_string());
    assert!(view.get("cancel_requested").is_none());

    let (status, _, view) = answer(api.delete(BOB, &format!("/v1/jobs/{id}")).await).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{view}");
    assert_eq!(view["status"], "running");
    assert_eq!(view["cancel_requested"], true);
    let (_, _, view) = answer(api.get(BOB, &format!("/v1/jobs/{id}")).await).await;
    assert_eq!(view["cancel_requested"], true);

    api.store
        .jobs()
        .finish(&id, "w1", 1, &succeeded())
        .await
        .unwrap();
    let (status, _, body) = answer(api.delete(BOB, &format!("/v1/jobs/{id}")).await).await;
    assert_error(status, &body, StatusCode::CONFLICT, "already_finished");
    assert_eq!(body["error"]["status"], "succeeded");
    let (_, _, view) = answer(api.get(BOB, &format!("/v1/jobs/{id}")).await).await;
    assert_eq!(view["status"], "succeeded");
    assert_eq!(view["result"]["status"], "succeeded");
    assert!(view.get("cancel_requested").is_none());
}

#[tokio::test]
async fn idempotency_key_returns_the_same_job_or_409() {
    let api = Api::start(Options::default()).await;
    let send = |key: &'static str, idem: &'static str, body: Value| {
        api.http
            .post(api.url("/v1/jobs"))
            .bearer_auth(key)
            .header("idempotency-key", idem)
            .json(&body)
            .send()
    };
    let (status, _, first) = answer(send(BOB, "order-1", python("print(1)")).await.unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let id = first["id"].as_str().unwrap();

    let (status, _, again) = answer(send(BOB, "order-1", python("print(1)")).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["id"], id);
    assert_eq!(again["status"], "queued");
    assert!(again["token"].is_string());
    assert_eq!(api.queued_ids().await.len(), 1, "queued once");

    let (status, _, body) = answer(send(BOB, "order-1", python("print(2)")).await.unwrap()).await;
    assert_error(status, &body, StatusCode::CONFLICT, "idempotency_conflict");

    // Keys are scoped to the API key: alice's "order-1" is her own.
    let (status, _, other) =
        answer(send(ALICE, "order-1", python("print(1)")).await.unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{other}");
    assert_ne!(other["id"], id);

    let metrics = api.metrics().await;
    assert_eq!(
        metric_value(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"conflict\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_full_queue_refuses_with_429_until_it_drains() {
    let api = Api::start(Options {
        max_queue_depth: 3,
        ..Options::default()
    })
    .await;
    for _ in 0..3 {
        submit_ok(&api, BOB).await;
    }
    let (status, headers, body) = answer(api.submit(BOB, &python("print(1)")).await).await;
    assert_error(status, &body, StatusCode::TOO_MANY_REQUESTS, "queue_full");
    assert_eq!(headers["retry-after"], "2");
    common::assert_refusal_detail(
        &body,
        2,
        "queue_full",
        Some(("CODE_RUNNER_MAX_QUEUE_DEPTH", 3, 3)),
    );
    assert_eq!(api.queued_ids().await.len(), 3);

    let metrics = api.metrics().await;
    assert_eq!(metric_value(&metrics, "code_runner_queue_depth"), Some(3.0));

    // A worker takes one: there is room again.
    let mut claiming = api.store.dedicated().await.unwrap();
    let claimed = api.store.jobs().claim(&mut claiming, "w-1").await.unwrap();
    assert!(claimed.is_some());
    submit_ok(&api, BOB).await;
    let (status, _, _) = answer(api.submit(BOB, &python("print(1)")).await).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    let metrics = api.metrics().await;
    assert_eq!(
        metric_value(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"queue_full\"}"
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn one_keys_limit_does_not_affect_another_key() {
    let api = Api::start(Options::default()).await;
    let first = submit_ok(&api, ALICE).await;
    submit_ok(&api, ALICE).await;
    let (status, headers, body) = answer(api.submit(ALICE, &python("print(1)")).await).await;
    assert_error(status, &body, StatusCode::TOO_MANY_REQUESTS, "key_limit");
    assert_eq!(headers["retry-after"], "1");
    // Alice's entry sets max_active=2.
    common::assert_refusal_detail(&body, 1, "key_limit", Some(("max_active", 2, 2)));
    for _ in 0..3 {
        submit_ok(&api, BOB).await;
    }
    // Running counts too; a finished (here: cancelled) job frees its place.
    let (status, _, _) = answer(api.delete(ALICE, &format!("/v1/jobs/{first}")).await).await;
    assert_eq!(status, StatusCode::OK);
    submit_ok(&api, ALICE).await;

    let metrics = api.metrics().await;
    assert_eq!(
        metric_value(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"key_limit\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn wait_returns_the_result_or_the_status_when_time_is_up() {
    let api = Api::start(Options {
        max_wait: Duration::from_millis(300),
        ..Options::default()
    })
    .await;

    // Nobody runs it: after max_wait, 202 with the job's status.
    let started = Instant::now();
    let response = api
        .http
        .post(api.url("/v1/jobs?wait=true"))
        .bearer_auth(BOB)
        .json(&python("print(1)"))
        .send()
        .await
        .unwrap();
    let (status, _, view) = answer(response).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{view}");
    assert_eq!(view["status"], "queued");
    assert!(view["token"].is_string());
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(started.elapsed() < Duration::from_secs(5));
    let waiting = view["id"].as_str().unwrap().to_string();
    // Drop it from the queue so the "worker" below takes the next one.
    let (status, _, _) = answer(api.delete(BOB, &format!("/v1/jobs/{waiting}")).await).await;
    assert_eq!(status, StatusCode::OK);

    // A worker finishes it while the client waits: 200 with the result.
    let api = Api::start(Options::default()).await;
    let worker = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while api.queued_ids().await.is_empty() {
            assert!(Instant::now() < deadline, "the job was never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let id = common::claim_and_start(&api.store, "w1").await;
        api.store
            .jobs()
            .finish(&id, "w1", 1, &succeeded())
            .await
            .unwrap();
    };
    let submit = async {
        api.http
            .post(api.url("/v1/jobs?wait=true"))
            .bearer_auth(BOB)
            .json(&python("print(1)"))
            .send()
            .await
            .unwrap()
    };
    let ((), response) = tokio::join!(worker, submit);
    let (status, _, view) = answer(response).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["status"], "succeeded");
    assert_eq!(view["result"]["status"], "succeeded");
    assert!(view["token"].is_string());
}

/// `?wait=true` wakes on the job's `exit` event, not on a timer: the answer
/// comes within a few ms of the moment the result (with its `exit` event)
/// is written, whenever in a poll period that moment falls. Nine rounds,
/// each finishing the job at a different offset; the median gap must stay
/// under 25 ms (a 100 ms poll would give a median of about 50 ms).
#[tokio::test]
async fn wait_answers_as_soon_as_the_exit_event_is_written() {
    let api = Api::start(Options::default()).await;
    let mut gaps = Vec::new();
    for round in 0..9u64 {
        let worker = async {
            let deadline = Instant::now() + Duration::from_secs(10);
            while api.queued_ids().await.is_empty() {
                assert!(Instant::now() < deadline, "the job was never queued");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let id = common::claim_and_start(&api.store, "w1").await;
            // Let the waiting request block on the events, then finish at
            // an offset that moves through a poll period.
            tokio::time::sleep(Duration::from_millis(150 + round * 11)).await;
            api.store
                .jobs()
                .finish(&id, "w1", 1, &succeeded())
                .await
                .unwrap();
            Instant::now()
        };
        let submit = async {
            let response = api
                .http
                .post(api.url("/v1/jobs?wait=true"))
                .bearer_auth(BOB)
                .json(&python("print(1)"))
                .send()
                .await
                .unwrap();
            (Instant::now(), response)
        };
        let (finished, (answered, response)) = tokio::join!(worker, submit);
        let (status, _, view) = answer(response).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        assert_eq!(view["status"], "succeeded");
        assert!(answered >= finished, "answered before the job ended");
        gaps.push(answered - finished);
    }
    gaps.sort();
    assert!(
        gaps[gaps.len() / 2] < Duration::from_millis(25),
        "the answers came late after the exit events: {gaps:?}"
    );
}

#[tokio::test]
async fn shutdown_ends_a_waiting_submit_and_the_server() {
    let mut api = Api::start(Options {
        max_wait: Duration::from_secs(60),
        ..Options::default()
    })
    .await;
    let request = api
        .http
        .post(api.url("/v1/jobs?wait=true"))
        .bearer_auth(BOB)
        .json(&python("print(1)"))
        .send();
    let stop = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while api.queued_ids().await.is_empty() {
            assert!(Instant::now() < deadline, "the job was never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        api.shutdown.cancel();
    };
    let started = Instant::now();
    let (response, ()) = tokio::join!(request, stop);
    let (status, _, view) = answer(response.unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{view}");
    assert_eq!(view["status"], "queued");
    assert!(started.elapsed() < Duration::from_secs(10));
    let server = api.server.take().unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn metrics_languages_and_probes() {
    let mut api = Api::start(Options::default()).await;
    submit_ok(&api, BOB).await;
    let _ = api.submit("bad-key-bad-key-bad", &python("1")).await;

    let response = api.http.get(api.url("/metrics")).send().await.unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4"
    );
    let metrics = response.text().await.unwrap();
    for name in [
        "code_runner_slots_used",
        "code_runner_slots_max",
        "code_runner_queue_depth",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} in\n{metrics}"
        );
    }
    assert_eq!(metric_value(&metrics, "code_runner_queue_depth"), Some(1.0));
    for reason in code_runner::api::REJECTION_REASONS {
        let series = format!("code_runner_submissions_rejected_total{{reason=\"{reason}\"}}");
        let expected = if *reason == "unauthorized" { 1.0 } else { 0.0 };
        assert_eq!(metric_value(&metrics, &series), Some(expected), "{series}");
    }
    check_with_promtool(&metrics);

    // The catalog needs no key.
    let (status, _, catalog) =
        answer(api.http.get(api.url("/v1/languages")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let languages = catalog["languages"].as_array().unwrap();
    let find = |id: &str| languages.iter().find(|l| l["id"] == id).unwrap().clone();
    let py = find("python");
    assert_eq!(py["compiled"], false);
    assert!(py["aliases"].as_array().unwrap().contains(&json!("py")));
    assert!(py["limits"]["wall_ms"].as_u64().unwrap() > 0);
    assert!(py.get("compile_limits").is_none());
    assert!(py.get("image").is_none());
    let c = find("c");
    assert_eq!(c["compiled"], true);
    assert!(c["compile_limits"]["wall_ms"].as_u64().unwrap() > 0);
    assert!(catalog["maximum_limits"]["memory_mb"].as_u64().unwrap() > 0);

    // Unknown routes and methods answer in JSON too.
    let (status, _, body) = answer(api.get(BOB, "/v2/nothing").await).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let response = api
        .http
        .put(api.url("/v1/jobs"))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    let (status, _, body) = answer(response).await;
    assert_error(
        status,
        &body,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );

    // Probes: alive always; ready while Redis answers.
    let response = api.http.get(api.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.text().await.unwrap(), "ok");
    let (status, _, body) = answer(api.http.get(api.url("/readyz")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ready"], true, "{body}");
    assert_eq!(body["failing"], json!([]), "{body}");
    // The test's Redis keeps nothing on disk: ready, with a warning.
    assert_eq!(body["warnings"][0]["check"], "redis_persistence", "{body}");

    api.redis.kill();

    let (status, _, body) = answer(api.http.get(api.url("/readyz")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["ready"], false);
    assert_eq!(body["failing"][0]["check"], "redis");
    let response = api.http.get(api.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    let (status, headers, body) = answer(api.submit(BOB, &python("print(1)")).await).await;
    assert_error(
        status,
        &body,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
    );
    assert_eq!(headers["retry-after"], "1");
    common::assert_refusal_detail(&body, 1, "store_unavailable", None);
    let (status, _, body) = answer(
        api.get(BOB, &format!("/v1/jobs/{}", uuid::Uuid::new_v4()))
            .await,
    )
    .await;
    assert_error(
        status,
        &body,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
    );
    // /metrics still answers, with the last depth it read.
    let metrics = api.metrics().await;
    assert_eq!(metric_value(&metrics, "code_runner_queue_depth"), Some(1.0));
}

#[tokio::test]
async fn readiness_checks_docker_and_every_image_when_a_worker_shares_the_process() {
    let missing = format!("code-runner-test/missing-{}", uuid::Uuid::new_v4().simple());
    let catalog = LanguageCatalog::parse(&format!(
        r#"
[[language]]
id = "python"
name = "Python"
version = "3"
image = "{missing}"
source_file = "main.py"
run = ["python3", "main.py"]
"#
    ))
    .unwrap();
    let setup = common::default_settings(None).build("api-test").unwrap();
    let engine = code_runner::sandbox::DockerEngine::connect(setup.sandbox)
        .await
        .expect("dockerd must be running for the integration tests (scripts/test starts it)");
    let engine: code_runner::sandbox::Engine = std::sync::Arc::new(engine);
    let api = Api::start(Options {
        catalog,
        engine: Some(engine),
        ..Options::default()
    })
    .await;
    let (status, _, body) = answer(api.http.get(api.url("/readyz")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let failing = body["failing"].as_array().unwrap();
    assert_eq!(failing.len(), 1, "{body}");
    assert_eq!(failing[0]["check"], format!("image {missing}:latest"));
    assert!(!failing[0]["message"].as_str().unwrap().is_empty());
}

/// `promtool check metrics` on the exposition, when promtool is installed
/// (Debian package `prometheus`); scripts/test installs it.
fn check_with_promtool(metrics: &str) {
    use std::io::Write as _;
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool is not installed; skipping `promtool check metrics`");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics failed:\n{}{}\n{metrics}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn every_replica_shares_the_token_secret_through_redis() {
    // Replicas with the same keys (in any order) and no configured secret
    // derive the same secret from the salt in Redis.
    let api = Api::start(Options::default()).await;
    let same_keys = ApiKeys::parse(&KEYS.split(',').rev().collect::<Vec<_>>().join(",")).unwrap();
    let other = TokenSigner::from_config(None, &same_keys, &api.store, Duration::from_secs(60))
        .await
        .unwrap();
    let id = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        api.state
            .tokens()
            .verify(&id, &other.sign(&id, Scope::Read)),
        Ok(Scope::Read)
    );
    let configured = TokenSigner::from_config(
        Some("a configured secret of at least 32 bytes"),
        &same_keys,
        &api.store,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(
        api.state
            .tokens()
            .verify(&id, &configured.sign(&id, Scope::Control))
            .is_err()
    );
}

#[tokio::test]
async fn a_worker_only_process_serves_the_probes_and_metrics() {
    let mut redis = RedisServer::start();
    let store = Store::new(&redis.url(), "ops-test:", Duration::from_secs(60), 2).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(code_runner::api::serve_ops(
        listener,
        Metrics::new().unwrap(),
        store,
        None,
        None,
        shutdown.clone(),
    ));
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let get = |path: &str| http.get(format!("{base}{path}")).send();

    let response = get("/healthz").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (status, _, body) = answer(get("/readyz").await.unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    assert_eq!(metric_value(&metrics, "code_runner_queue_depth"), Some(0.0));
    check_with_promtool(&metrics);
    let (status, _, body) = answer(get("/v1/languages").await.unwrap()).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    redis.kill();
    let (status, _, body) = answer(get("/readyz").await.unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
}
