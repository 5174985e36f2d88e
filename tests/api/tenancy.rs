//! Who a job is for and the per-user limits, through a whole
//! `code-runner api` process in the test and a real redis-server: an API
//! only, so every accepted job stays queued. Each refusal: its status,
//! code, message and `Retry-After`; nothing accepted is dropped; the other
//! users of the key and the other keys are not held back.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common;
use crate::common::client::{Answer, KEY_A, KEY_B, metric, python};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;

async fn api(redis: &RedisServer, keys: &str) -> InProcess {
    InProcessBuilder::new(Role::Api, redis)
        .env("CODE_RUNNER_API_KEYS", keys)
        .start()
        .await
}

fn for_user(user: &str) -> Value {
    let mut job = python("print(1)");
    job["user"] = json!(user);
    job
}

fn assert_refusal(answer: &Answer, code: &str, message: &str, retry_after: &str) {
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{answer:#?}");
    assert_eq!(answer.body["error"]["code"], code, "{answer:#?}");
    assert_eq!(answer.body["error"]["message"], message, "{answer:#?}");
    assert_eq!(answer.headers["retry-after"], retry_after, "{answer:#?}");
}

#[tokio::test]
async fn max_active_per_user_refuses_that_user_only_and_frees_up_as_jobs_end() {
    let redis = RedisServer::start();
    let api = api(
        &redis,
        &format!("a:{KEY_A}:max_active_per_user=2,b:{KEY_B}"),
    )
    .await;
    let first = api.submit(&for_user("student-1")).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:#?}");
    assert_eq!(first.body["user"], "student-1");
    let second = api.submit(&for_user("student-1")).await;
    assert_eq!(second.status, StatusCode::ACCEPTED, "{second:#?}");
    let third = api.submit(&for_user("student-1")).await;
    assert_refusal(
        &third,
        "user_active_limit",
        "this user already has 2 queued or running jobs, the key's max_active_per_user of 2; retry when one of them ends",
        "1",
    );
    common::assert_refusal_detail(
        &third.body,
        1,
        "user_active_limit",
        Some(("max_active_per_user", 2, 2)),
    );
    // Another user of the key, the key's anonymous user and another key
    // are not held back.
    for (key, job) in [
        (KEY_A, for_user("student-2")),
        (KEY_A, python("print(1)")),
        (KEY_B, for_user("student-1")),
    ] {
        let answer = api.submit_as(Some(key), &job, false).await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
    }
    // A job of the user ends (cancelled while queued): room again.
    let cancelled = api
        .http
        .delete(format!("{}/v1/jobs/{}", api.url, first.id()))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), StatusCode::OK);
    let again = api.submit(&for_user("student-1")).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{again:#?}");

    // Nothing accepted was dropped: 5 queued (the cancelled one is not).
    assert_eq!(redis.queue_depth(), 5);
    let metrics = api.metrics().await;
    assert_eq!(metric(&metrics, "code_runner_queue_depth"), Some(5.0));
    assert_eq!(metric(&metrics, "code_runner_queue_tenants"), Some(2.0));
    assert_eq!(
        metric(
            &metrics,
            "code_runner_submissions_rejected_total{reason=\"user_active_limit\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn user_rate_per_minute_refuses_past_the_burst_with_the_wait() {
    let redis = RedisServer::start();
    let api = api(&redis, &format!("a:{KEY_A}:user_rate_per_minute=3")).await;
    for _ in 0..3 {
        let answer = api.submit(&for_user("student-1")).await;
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
    }
    let refused = api.submit(&for_user("student-1")).await;
    // Three a minute: the next one 20 s after the first.
    let wait: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((19..=20).contains(&wait), "{refused:#?}");
    assert_refusal(
        &refused,
        "user_rate_limit",
        &format!(
            "this user submitted 3 jobs in the last minute, the key's user_rate_per_minute of 3; retry after {wait} s"
        ),
        &wait.to_string(),
    );
    common::assert_refusal_detail(
        &refused.body,
        wait,
        "user_rate_limit",
        Some(("user_rate_per_minute", 3, 3)),
    );
    // Another user has its own allowance.
    let other = api.submit(&for_user("student-2")).await;
    assert_eq!(other.status, StatusCode::ACCEPTED, "{other:#?}");
    assert_eq!(redis.queue_depth(), 4);
}

#[tokio::test]
async fn the_compatible_apis_name_the_user_in_a_header() {
    let redis = RedisServer::start();
    let api = InProcessBuilder::new(Role::Api, &redis)
        .env(
            "CODE_RUNNER_API_KEYS",
            format!("a:{KEY_A}:max_active_per_user=1"),
        )
        .start()
        .await;
    let submit = |user: Option<&str>| {
        let mut request = api
            .http
            .post(format!("{}/judge0/submissions", api.url))
            .header("X-Auth-Token", KEY_A)
            .json(&json!({"source_code": "print(1)", "language_id": 71}));
        if let Some(user) = user {
            request = request.header("X-Code-Runner-User", user);
        }
        request.send()
    };
    let first = submit(Some("student-1")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let token = first.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let view = api
        .http
        .get(format!("{}/v1/jobs/{token}", api.url))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(view["user"], "student-1");
    // The same user is at its limit; a bad user id is Judge0's 422.
    let again = submit(Some("student-1")).await.unwrap();
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    let bad = submit(Some("")).await.unwrap();
    assert!(bad.status().is_client_error(), "{bad:?}");
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        bad.json::<Value>().await.unwrap(),
        json!({"X-Code-Runner-User": ["must be 1-128 printable characters; it has 0"]})
    );
    let anonymous = submit(None).await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::CREATED);
    assert_eq!(redis.queue_depth(), 2);
}
