//! What operators call, on the API alone ([`crate::server`]) and on a
//! worker's own endpoint: `/metrics` (checked by promtool), the language
//! catalog, JSON answers to unknown routes, and the probes while Redis
//! answers, once it is gone, and when an image is missing.

use std::process::{Command, Stdio};
use std::time::Duration;

use code_runner::languages::LanguageCatalog;
use code_runner::metrics::Metrics;
use code_runner::store::Store;
use reqwest::StatusCode;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common;
use crate::common::client::{metric, python};
use crate::common::redis_server::RedisServer;
use crate::common::scripted::ScriptedHost;
use crate::server::{BOB, KEYS, Setup, answer, assert_error, submit_ok};

#[tokio::test]
async fn metrics_languages_and_probes() {
    let mut api = Setup::new(KEYS).start().await;
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
    assert_eq!(metric(&metrics, "code_runner_queue_depth"), Some(1.0));
    for reason in code_runner::api::REJECTION_REASONS {
        let series = format!("code_runner_submissions_rejected_total{{reason=\"{reason}\"}}");
        let expected = if *reason == "unauthorized" { 1.0 } else { 0.0 };
        assert_eq!(metric(&metrics, &series), Some(expected), "{series}");
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
    assert_eq!(metric(&metrics, "code_runner_queue_depth"), Some(1.0));
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
    // The engine of a worker in the same process, on a host without the
    // catalog's image.
    let host = ScriptedHost::new();
    host.set_missing_images(&[&format!("{missing}:latest")]);
    let engine: code_runner::sandbox::Engine = std::sync::Arc::new(host.engine("api-test"));
    let api = Setup {
        catalog,
        engine: Some(engine),
        ..Setup::new(KEYS)
    }
    .start()
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
    assert_eq!(metric(&metrics, "code_runner_queue_depth"), Some(0.0));
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
