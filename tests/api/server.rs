//! The API alone, served in the test: its router on 127.0.0.1:0 over a
//! store on a redis-server of the test's own, with no worker and no
//! engine. Nothing runs a job unless the test plays the worker through the
//! store's own steps (claim, start, finish), so every figure a job reports
//! is one the test chose.
//!
//! The tests that need a whole process (a worker beside the API, its
//! settings as the binary reads them) use
//! [`crate::common::in_process::InProcessBuilder`] instead.

use std::time::Duration;

use code_runner::api::{
    ApiConfig, ApiKeys, ApiLimits, ApiState, PlaygroundKey, TokenSigner, WebUi,
};
use code_runner::job::{JobResult, Status};
use code_runner::languages::LanguageCatalog;
use code_runner::sandbox::Engine;
use code_runner::store::{Keys, Store};
use reqwest::StatusCode;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common;
use crate::common::client::python;
use crate::common::redis_server::RedisServer;

/// Two keys: `alice` may have 2 jobs queued or running, `bob` any number.
pub const KEYS: &str = "alice:alice-key-0123456789abcdef:2,bob:bob-key-0123456789abcdef";
pub const ALICE: &str = "alice-key-0123456789abcdef";
pub const BOB: &str = "bob-key-0123456789abcdef";

/// How the API under test is set up. [`Setup::new`] gives what most tests
/// use; a test changes the fields it is about.
pub struct Setup {
    /// The keys, as `CODE_RUNNER_API_KEYS` writes them.
    pub keys: String,
    /// The store's key prefix (default: `test-<uuid>:`).
    pub prefix: String,
    /// How long a finished job is kept.
    pub result_ttl: Duration,
    /// How long a job is listed in the run history (default: the store's).
    pub history_window: Option<Duration>,
    /// How long the usage ledger keeps a day (default: the store's).
    pub usage_retention: Option<Duration>,
    pub max_queue_depth: u64,
    pub max_body_bytes: usize,
    pub max_wait: Duration,
    pub catalog: LanguageCatalog,
    /// The engine whose Docker and images `/readyz` checks (a worker in the
    /// same process); `None` for an API alone.
    pub engine: Option<Engine>,
    pub limits: ApiLimits,
    /// The name of the key the playground at `/playground` shares with its
    /// visitors; `None` leaves the pages as they are by default.
    pub playground_key: Option<&'static str>,
}

impl Setup {
    pub fn new(keys: &str) -> Self {
        Self {
            keys: keys.to_string(),
            prefix: format!("test-{}:", uuid::Uuid::new_v4().simple()),
            result_ttl: Duration::from_secs(60),
            history_window: None,
            usage_retention: None,
            max_queue_depth: 100,
            max_body_bytes: 64 << 10,
            max_wait: Duration::from_secs(10),
            catalog: LanguageCatalog::embedded().unwrap(),
            engine: None,
            limits: ApiLimits::default(),
            playground_key: None,
        }
    }

    /// The store these settings describe, on `redis`.
    pub fn store(&self, redis: &RedisServer) -> Store {
        let mut store = Store::new(&redis.url(), &self.prefix, self.result_ttl, 4).unwrap();
        if let Some(window) = self.history_window {
            store = store.with_history_window(window);
        }
        if let Some(retention) = self.usage_retention {
            store = store.with_usage_retention(retention);
        }
        store
    }

    /// Starts a redis-server and the API on it.
    pub async fn start(self) -> ApiServer {
        let redis = RedisServer::start();
        let store = self.store(&redis);
        let keys = ApiKeys::parse(&self.keys).unwrap();
        let tokens = TokenSigner::from_config(None, &keys, &store, Duration::from_secs(600))
            .await
            .unwrap();
        let playground = self
            .playground_key
            .map(|name| PlaygroundKey::from_config(name, &self.keys, &keys).unwrap());
        let mut state = ApiState::new(ApiConfig {
            catalog: self.catalog,
            max_queue_depth: self.max_queue_depth,
            max_body_bytes: self.max_body_bytes,
            max_wait: self.max_wait,
            engine: self.engine,
            limits: self.limits,
            ..common::api_config(store.clone(), keys, tokens)
        });
        if let Some(playground) = playground {
            state = state.with_web_ui(WebUi::new(
                Some("/playground".into()),
                None,
                Some(playground),
            ));
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(code_runner::api::serve(
            listener,
            state.clone(),
            shutdown.clone(),
        ));
        ApiServer {
            base,
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            keys: Keys::new(&self.prefix),
            store,
            state,
            shutdown,
            server: Some(server),
            redis,
        }
    }
}

/// The API under test; stops its server when dropped.
pub struct ApiServer {
    pub base: String,
    pub http: reqwest::Client,
    pub store: Store,
    /// The store's keys, to read Redis as the store writes it.
    pub keys: Keys,
    pub state: ApiState,
    pub shutdown: CancellationToken,
    pub server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    pub redis: RedisServer,
}

impl ApiServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /v1/jobs` of `body` with `key`.
    pub async fn submit(&self, key: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url("/v1/jobs"))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, key: &str, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
    }

    pub async fn delete(&self, key: &str, path: &str) -> reqwest::Response {
        self.http
            .delete(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
    }

    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        self.redis.conn().await
    }

    pub async fn queued_ids(&self) -> Vec<String> {
        self.store.jobs().queued_ids().await.unwrap()
    }

    /// `GET /metrics` as text.
    pub async fn metrics(&self) -> String {
        let response = self.http.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Status, headers, then the JSON body (`Null` when it is not JSON).
pub async fn answer(
    response: reqwest::Response,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    (status, headers, body)
}

/// The documented error shape: `expected`, `code` and a message with no
/// final full stop.
pub fn assert_error(status: StatusCode, body: &Value, expected: StatusCode, code: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty() && !message.ends_with('.'), "{body}");
}

/// Submits `print(1)` with `key`, which must be accepted; the job's id.
pub async fn submit_ok(api: &ApiServer, key: &str) -> String {
    let (status, _, body) = answer(api.submit(key, &python("print(1)")).await).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body["id"].as_str().unwrap().to_string()
}

/// The result a worker reports for a job that succeeded.
pub fn succeeded() -> JobResult {
    JobResult::without_stages(Status::Succeeded, "python", "3")
}
