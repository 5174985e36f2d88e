//! The run history's view of each job as it went, and every filter of
//! `GET /v1/jobs` and their combinations, on the API alone
//! ([`crate::server`]), the test playing the worker.

use std::time::Duration;

use code_runner::job::result::ErrorReason;
use code_runner::job::{JobResult, Status};
use code_runner::protocol::Reason;
use serde_json::{Value, json};

use crate::history::{Api, cursor, ids, job, newest_first, with_stages};
use crate::server::ALICE;

#[tokio::test]
async fn history_shows_each_job_as_it_went_and_every_filter_and_their_combinations() {
    let api = Api::default().await;
    let before = api.submit(ALICE, &job("python", None)).await;
    api.work(
        &before,
        Some(with_stages(Status::Succeeded, Reason::Exited, 0)),
    )
    .await;
    // Jobs after `since` only from here on.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let since = api.created_ms(&before).await + 1;

    let queued = api.submit(ALICE, &job("python", Some("u1"))).await;
    let failed = api.submit(ALICE, &job("c", Some("u1"))).await;
    let running = api.submit(ALICE, &job("python", Some("u2"))).await;
    let lost = api.submit(ALICE, &job("c", None)).await;
    let succeeded = api.submit(ALICE, &job("c", Some("u1"))).await;
    // Claims take the key's users in turn (u1, u2, the anonymous user),
    // each user's jobs oldest first.
    let mut conn = api.store.dedicated().await.unwrap();
    assert_eq!(
        api.store
            .jobs()
            .claim(&mut conn, "parked")
            .await
            .unwrap()
            .as_deref(),
        Some(queued.as_str())
    );
    api.work(&running, None).await;
    api.work(
        &lost,
        Some(
            JobResult::without_stages(Status::Error, "c", "14")
                .with_error("the worker was lost")
                .with_reason(ErrorReason::WorkerLost),
        ),
    )
    .await;
    api.work(
        &failed,
        Some(with_stages(Status::Failed, Reason::WallTimeout, 137)),
    )
    .await;
    api.work(
        &succeeded,
        Some(with_stages(Status::Succeeded, Reason::Exited, 0)),
    )
    .await;

    let all = api.list(ALICE, "").await;
    assert_eq!(
        ids(&all),
        newest_first(
            &api,
            &[
                before.clone(),
                queued.clone(),
                failed.clone(),
                running.clone(),
                lost.clone(),
                succeeded.clone()
            ]
        )
        .await
    );
    let shown = |id: &str| {
        all["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .unwrap()
            .clone()
    };
    // A finished job: its figures are compile + run; its reason the run's.
    let view = shown(&failed);
    let (_, record) = api.get(Some(ALICE), &format!("/v1/jobs/{failed}")).await;
    assert_eq!(
        view,
        json!({
            "id": failed,
            "status": "failed",
            "language": "c",
            "user": "u1",
            "created_at": record["created_at"],
            "started_at": record["started_at"],
            "finished_at": record["finished_at"],
            "reason": "wall_timeout",
            "cpu_ms": 42,
            "wall_ms": 1050,
        })
    );
    assert!(record["finished_at"].is_string());
    // Queued (claimed, not started), running, and the platform's verdict.
    let view = shown(&queued);
    assert_eq!(
        (
            &view["status"],
            &view["started_at"],
            &view["finished_at"],
            &view["reason"],
            &view["cpu_ms"]
        ),
        (
            &json!("queued"),
            &Value::Null,
            &Value::Null,
            &Value::Null,
            &Value::Null
        )
    );
    let view = shown(&running);
    assert_eq!(
        (&view["status"], &view["user"]),
        (&json!("running"), &json!("u2"))
    );
    assert!(view["started_at"].is_string() && view["finished_at"].is_null());
    let view = shown(&lost);
    assert_eq!(
        (
            &view["status"],
            &view["reason"],
            &view["user"],
            &view["cpu_ms"]
        ),
        (
            &json!("error"),
            &json!("worker_lost"),
            &Value::Null,
            &Value::Null
        )
    );
    assert!(view.get("result").is_none() && view.get("stdout").is_none());

    let listed = |query: &'static str| {
        let api = &api;
        async move { ids(&api.list(ALICE, query).await) }
    };
    assert_eq!(
        listed("user=u1").await,
        of(&api, &[&queued, &failed, &succeeded]).await
    );
    assert_eq!(listed("user=u2").await, vec![running.clone()]);
    assert_eq!(listed("user=nobody").await, Vec::<String>::new());
    assert_eq!(
        listed("status=succeeded").await,
        of(&api, &[&before, &succeeded]).await
    );
    assert_eq!(listed("status=running").await, vec![running.clone()]);
    assert_eq!(listed("status=cancelled").await, Vec::<String>::new());
    assert_eq!(
        listed("language=c").await,
        of(&api, &[&failed, &lost, &succeeded]).await
    );
    // An alias is its language.
    assert_eq!(
        listed("language=py").await,
        of(&api, &[&before, &queued, &running]).await
    );
    let since_ms = format!("since={since}");
    let since_rfc = format!("since={}", rfc3339(since));
    for query in [&since_ms, &since_rfc] {
        let page = api.list(ALICE, query).await;
        assert_eq!(
            ids(&page),
            of(&api, &[&queued, &failed, &running, &lost, &succeeded]).await,
            "{query}"
        );
    }
    // Filters combine.
    assert_eq!(
        listed("user=u1&language=c").await,
        of(&api, &[&failed, &succeeded]).await
    );
    assert_eq!(
        listed("user=u1&language=c&status=succeeded").await,
        vec![succeeded.clone()]
    );
    assert_eq!(
        listed("language=python&status=succeeded").await,
        vec![before.clone()]
    );
    let page = api
        .list(ALICE, &format!("status=succeeded&{since_ms}"))
        .await;
    assert_eq!(ids(&page), vec![succeeded.clone()]);
    // With a filter, pages go on by cursor too.
    let page = api.list(ALICE, "language=c&limit=2").await;
    let c_jobs = of(&api, &[&failed, &lost, &succeeded]).await;
    assert_eq!(ids(&page), c_jobs[..2]);
    let rest = api
        .list(
            ALICE,
            &format!("language=c&limit=2&cursor={}", cursor(&page)),
        )
        .await;
    assert_eq!(ids(&rest), c_jobs[2..]);
    assert_eq!(rest["next_cursor"], Value::Null);
}

/// `these`, newest first.
async fn of(api: &Api, these: &[&String]) -> Vec<String> {
    let these: Vec<String> = these.iter().map(|s| s.to_string()).collect();
    newest_first(api, &these).await
}

/// `ms` as the API writes times.
fn rfc3339(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(time).to_string()
}
