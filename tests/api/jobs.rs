//! The job endpoints of `/v1` on the API alone ([`crate::server`]): who
//! may call them, how a bad submission is refused (a 400 naming the
//! problem, counted by reason), a job's view, and cancelling a queued or
//! running job.

use code_runner::api::Scope;
use code_runner::languages::LanguageCatalog;
use redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common;
use crate::common::client::{metric, python};
use crate::server::{ALICE, BOB, KEYS, Setup, answer, assert_error, submit_ok, succeeded};

#[tokio::test]
async fn requests_without_a_valid_key_are_refused() {
    let api = Setup::new(KEYS).start().await;
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
        metric(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"unauthorized\"}"
        ),
        Some(3.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn bad_bodies_are_400_naming_the_problem() {
    let api = Setup::new(KEYS).start().await;
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
    // Output patterns: each bad one named by its place.
    for (outputs, field, says) in [
        (
            json!(["ok.txt", "../etc/passwd"]),
            "outputs[1]",
            "contains \"..\"",
        ),
        (json!(["/etc/passwd"]), "outputs[0]", "is absolute"),
        (json!(["out/[a.png"]), "outputs[0]", "not a valid glob"),
        (json!(["a\tb"]), "outputs[0]", "control character"),
        (json!([""]), "outputs[0]", "empty"),
        (
            json!((0..33).map(|i| format!("f{i}")).collect::<Vec<_>>()),
            "outputs",
            "32",
        ),
    ] {
        let mut job = python("print(1)");
        job["outputs"] = outputs;
        let (status, _, body) = answer(api.submit(ALICE, &job).await).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_job");
        assert_eq!(body["error"]["field"], field, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{body}"
        );
    }
    let job = json!({"language": "python", "files": [{"name": "../x.py", "content": ""}]});
    let (_, _, body) = answer(api.submit(ALICE, &job).await).await;
    assert_eq!(body["error"]["field"], "files[0].name");
    assert_eq!(body["error"]["message"], "\"../x.py\" contains \"..\"");
    // A control character in a name (a newline, a tab, an escape) is a 400
    // naming the file.
    for (name, shown) in [
        ("a\nb.py", "\\n"),
        ("t\tab.py", "\\t"),
        ("\u{1b}[2J.py", "\\u{1b}"),
    ] {
        let job = json!({"language": "python", "files": [
            {"name": "main.py", "content": "print(1)"},
            {"name": name, "content": ""},
        ]});
        let (status, _, body) = answer(api.submit(ALICE, &job).await).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_job");
        assert_eq!(body["error"]["field"], "files[1].name");
        assert_eq!(
            body["error"]["message"],
            format!(
                "{name:?} contains the control character '{shown}'; file names must be printable"
            )
        );
    }

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
    for (reason, count) in [("malformed", 5.0), ("invalid", 19.0), ("too_large", 1.0)] {
        assert_eq!(
            metric(
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
    let api = Setup::new(KEYS).start().await;
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

#[tokio::test]
async fn cancel_of_a_running_job_is_requested_and_a_finished_one_conflicts() {
    let api = Setup::new(KEYS).start().await;
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
