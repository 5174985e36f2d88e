//! Admission on the API alone ([`crate::server`]): an `Idempotency-Key`
//! returns the same job, a full queue and a key at its `max_active`
//! refuse with 429 until room comes back.

use reqwest::StatusCode;
use serde_json::Value;

use crate::common;
use crate::common::client::{metric, python};
use crate::server::{ALICE, BOB, KEYS, Setup, answer, assert_error, submit_ok};

#[tokio::test]
async fn idempotency_key_returns_the_same_job_or_409() {
    let api = Setup::new(KEYS).start().await;
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
        metric(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"conflict\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_full_queue_refuses_with_429_until_it_drains() {
    let api = Setup {
        max_queue_depth: 3,
        ..Setup::new(KEYS)
    }
    .start()
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
    assert_eq!(metric(&metrics, "code_runner_queue_depth"), Some(3.0));

    // A worker takes one: there is room again.
    let mut claiming = api.store.dedicated().await.unwrap();
    let claimed = api.store.jobs().claim(&mut claiming, "w-1").await.unwrap();
    assert!(claimed.is_some());
    submit_ok(&api, BOB).await;
    let (status, _, _) = answer(api.submit(BOB, &python("print(1)")).await).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    let metrics = api.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"queue_full\"}"
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn one_keys_limit_does_not_affect_another_key() {
    let api = Setup::new(KEYS).start().await;
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
        metric(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"key_limit\"}"
        ),
        Some(1.0)
    );
}
