//! The run history (`GET /v1/jobs`) on the API alone ([`crate::server`]):
//! pages by cursor while jobs are added, the 400s, one key never seeing
//! another's jobs, a job still listed after its full result expired, the
//! window's trim, a retry and a late result, and the playground's jobs
//! with and without a user (the filters are in
//! [`crate::history_filters`]). A test plays the worker through the
//! store's own steps (claim, start, finish); waits poll with a deadline.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use code_runner::job::result::ErrorReason;
use code_runner::job::{JobResult, Output, StageResult, Status};
use code_runner::protocol::Reason;
use code_runner::store::{LostResults, ReapOutcome, ReapPolicy, Retry, StartOutcome};
use redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::server::{ALICE, ApiServer, BOB, Setup};

pub const PLAY: &str = "play-key-0123456789abcdef";

pub const KEYS: &str = "alice:alice-key-0123456789abcdef,bob:bob-key-0123456789abcdef,play:play-key-0123456789abcdef:4";

pub const WORKER: &str = "history-worker";

/// Longest a test waits for something that must happen.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// The API alone, and the steps these tests take with it.
pub struct Api(ApiServer);

impl std::ops::Deref for Api {
    type Target = ApiServer;

    fn deref(&self) -> &ApiServer {
        &self.0
    }
}

impl Api {
    /// An API whose finished jobs are kept `result_ttl`, and listed in the
    /// history for `window`.
    pub async fn start(result_ttl: Duration, window: Duration) -> Self {
        Self(
            Setup {
                result_ttl,
                history_window: Some(window),
                max_queue_depth: 1000,
                playground_key: Some("play"),
                ..Setup::new(KEYS)
            }
            .start()
            .await,
        )
    }

    pub async fn default() -> Self {
        Self::start(Duration::from_secs(60), Duration::from_secs(7 * 86_400)).await
    }

    /// Submits `body` with `key`; the new job's id.
    pub async fn submit(&self, key: &str, body: &Value) -> String {
        let response = self
            .http
            .post(format!("{}/v1/jobs", self.base))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap();
        let (status, body) = answer(response).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    /// `GET path` with `key`: status and JSON body.
    pub async fn get(&self, key: Option<&str>, path: &str) -> (StatusCode, Value) {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        answer(request.send().await.unwrap()).await
    }

    /// `GET /v1/jobs?<query>` with `key`, which must answer 200.
    pub async fn list(&self, key: &str, query: &str) -> Value {
        let (status, body) = self.get(Some(key), &format!("/v1/jobs?{query}")).await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
        body
    }

    /// Plays a worker: claims the next job (which must be `id`), starts
    /// it, and when `result` is given finishes it with that.
    pub async fn work(&self, id: &str, result: Option<JobResult>) {
        let mut conn = self.store.dedicated().await.unwrap();
        let claimed = self.store.jobs().claim(&mut conn, WORKER).await.unwrap();
        assert_eq!(claimed.as_deref(), Some(id));
        let started = self
            .store
            .jobs()
            .start(id, WORKER, "test-host", false, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(matches!(started, StartOutcome::Start(_)), "{started:?}");
        if let Some(result) = result {
            self.store
                .jobs()
                .finish(id, WORKER, 1, &result)
                .await
                .unwrap();
        }
    }

    /// The job's `created_ms` as stored.
    pub async fn created_ms(&self, id: &str) -> u64 {
        self.redis()
            .await
            .hget(self.keys.job(id), "created_ms")
            .await
            .unwrap()
    }
}

pub async fn answer(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

pub fn job(language: &str, user: Option<&str>) -> Value {
    let (name, content) = match language {
        "c" => ("main.c", "int main(void) { return 0; }\n"),
        _ => ("main.py", "print(1)\n"),
    };
    let mut body = json!({"language": language, "files": [{"name": name, "content": content}]});
    if let Some(user) = user {
        body["user"] = json!(user);
    }
    body
}

pub fn ids(page: &Value) -> Vec<String> {
    page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect()
}

pub fn cursor(page: &Value) -> String {
    page["next_cursor"]
        .as_str()
        .unwrap_or_else(|| panic!("no next_cursor: {page}"))
        .to_string()
}

/// A result whose compile and run stages took these times.
pub fn with_stages(status: Status, run_reason: Reason, run_exit: i32) -> JobResult {
    let stage = |reason, exit_code, cpu_ms, wall_ms| StageResult {
        stdout: Output(b"out\n".to_vec()),
        stderr: Output(Vec::new()),
        truncated: false,
        exit_code: Some(exit_code),
        signal: None,
        reason,
        wall_ms,
        cpu_ms,
        memory_peak_bytes: 1 << 20,
        pids_limit_reached: None,
    };
    let mut result = JobResult::without_stages(status, "c", "14");
    result.compile = Some(stage(Reason::Exited, 0, 30, 50));
    result.run = Some(stage(run_reason, run_exit, 12, 1000));
    result
}

/// Ids newest first: `created_ms` descending, then id descending.
pub async fn newest_first(api: &Api, ids: &[String]) -> Vec<String> {
    let mut keyed = Vec::new();
    for id in ids {
        keyed.push((api.created_ms(id).await, id.clone()));
    }
    keyed.sort_by(|a, b| b.cmp(a));
    keyed.into_iter().map(|(_, id)| id).collect()
}

#[tokio::test]
async fn history_pages_by_cursor_while_jobs_are_added() {
    let api = Api::default().await;
    let mut first = Vec::new();
    for _ in 0..25 {
        first.push(api.submit(ALICE, &job("python", None)).await);
    }
    let expected = newest_first(&api, &first).await;

    let page1 = api.list(ALICE, "limit=10").await;
    assert_eq!(ids(&page1), expected[0..10]);
    // Jobs added between pages are newer than the cursor: they do not
    // shift the pages after it.
    let mut added = Vec::new();
    for _ in 0..3 {
        added.push(api.submit(ALICE, &job("python", None)).await);
    }
    let page2 = api
        .list(ALICE, &format!("limit=10&cursor={}", cursor(&page1)))
        .await;
    assert_eq!(ids(&page2), expected[10..20]);
    // Jobs added while pages are read, concurrently this time.
    let adding = {
        let (http, base) = (api.http.clone(), api.base.clone());
        tokio::spawn(async move {
            let mut added = Vec::new();
            for _ in 0..10 {
                let response = http
                    .post(format!("{base}/v1/jobs"))
                    .bearer_auth(ALICE)
                    .json(&job("python", None))
                    .send()
                    .await
                    .unwrap();
                let (status, body) = answer(response).await;
                assert_eq!(status, StatusCode::ACCEPTED, "{body}");
                added.push(body["id"].as_str().unwrap().to_string());
            }
            added
        })
    };
    let page3 = api
        .list(ALICE, &format!("limit=10&cursor={}", cursor(&page2)))
        .await;
    assert_eq!(ids(&page3), expected[20..25]);
    assert_eq!(page3["next_cursor"], Value::Null, "{page3}");
    added.extend(adding.await.unwrap());

    let seen: Vec<String> = [&page1, &page2, &page3].into_iter().flat_map(ids).collect();
    assert_eq!(seen, expected, "no gap, no duplicate, in order");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 25);

    // From the top again: the 13 added jobs first, then the first 25,
    // across pages of 7 (a full last page has no next_cursor either).
    let everything = newest_first(&api, &[first, added].concat()).await;
    assert_eq!(everything.len(), 38);
    let mut listed = Vec::new();
    let mut query = "limit=7".to_string();
    loop {
        let page = api.list(ALICE, &query).await;
        let page_ids = ids(&page);
        assert!(page_ids.len() <= 7);
        listed.extend(page_ids);
        match page["next_cursor"].as_str() {
            Some(next) => query = format!("limit=7&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(listed, everything);
    // The default page is 50 jobs: all 38 at once, and no cursor.
    let all = api.list(ALICE, "").await;
    assert_eq!(ids(&all), everything);
    assert_eq!(all["next_cursor"], Value::Null);
}

#[tokio::test]
async fn jobs_with_the_same_created_ms_page_by_id() {
    let api = Api::default().await;
    let mut submitted = Vec::new();
    for _ in 0..6 {
        submitted.push(api.submit(ALICE, &job("python", None)).await);
    }
    // Every job in the same millisecond, as a burst of submits may be.
    let mut conn = api.redis().await;
    for id in &submitted {
        let _: () = conn
            .hset(api.keys.summary(id), "created_ms", 5_000_000_000_000u64)
            .await
            .unwrap();
        let _: () = conn
            .zadd(api.keys.history("alice"), id, 5_000_000_000_000u64)
            .await
            .unwrap();
    }
    let mut expected = submitted.clone();
    expected.sort_by(|a, b| b.cmp(a));
    let mut listed = Vec::new();
    let mut query = "limit=4".to_string();
    loop {
        let page = api.list(ALICE, &query).await;
        listed.extend(ids(&page));
        match page["next_cursor"].as_str() {
            Some(next) => query = format!("limit=4&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(listed, expected);
}

#[tokio::test]
async fn bad_history_parameters_are_400s_naming_the_parameter() {
    let api = Api::default().await;
    let id = api.submit(ALICE, &job("python", None)).await;
    for (query, field) in [
        ("user=", "user"),
        ("status=done", "status"),
        ("language=cobol", "language"),
        ("since=yesterday", "since"),
        ("since=2026-05-01T09:00:00%2B02:00", "since"),
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=-1", "limit"),
        ("cursor=not-a-cursor", "cursor"),
        ("limit=5&limit=6", "limit"),
        ("page=2", "query"),
    ] {
        let (status, body) = api.get(Some(ALICE), &format!("/v1/jobs?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty() && !message.ends_with('.'), "{body}");
    }
    let (status, body) = api.get(None, "/v1/jobs").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // The limits themselves are fine.
    assert_eq!(ids(&api.list(ALICE, "limit=1").await), vec![id.clone()]);
    assert_eq!(ids(&api.list(ALICE, "limit=200").await), vec![id]);
}

#[tokio::test]
async fn another_key_sees_nothing_of_this_keys_history() {
    let api = Api::default().await;
    let mine = [
        api.submit(ALICE, &job("python", None)).await,
        api.submit(ALICE, &job("python", Some("u1"))).await,
        api.submit(ALICE, &job("python", Some("u1"))).await,
    ];
    let page = api.list(ALICE, "limit=1").await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 1);
    let alices_cursor = cursor(&page);

    for query in [
        String::new(),
        "user=u1".to_string(),
        "language=python".to_string(),
        "status=queued".to_string(),
        format!("cursor={alices_cursor}"),
    ] {
        let page = api.list(BOB, &query).await;
        assert_eq!(page, json!({"jobs": [], "next_cursor": null}), "{query}");
    }
    // Bob's own jobs, even for the same user name, are Bob's alone.
    let bobs = api.submit(BOB, &job("python", Some("u1"))).await;
    assert_eq!(ids(&api.list(BOB, "").await), vec![bobs.clone()]);
    assert_eq!(ids(&api.list(BOB, "user=u1").await), vec![bobs.clone()]);
    assert_eq!(
        ids(&api.list(ALICE, "").await),
        newest_first(&api, &mine).await
    );
    assert_eq!(
        ids(&api.list(ALICE, "user=u1").await),
        newest_first(&api, &mine[1..]).await
    );
}

#[tokio::test]
async fn a_job_is_listed_after_its_result_expired_within_the_window() {
    let api = Api::start(Duration::from_secs(1), Duration::from_secs(7 * 86_400)).await;
    let id = api.submit(ALICE, &job("c", Some("u1"))).await;
    api.work(&id, Some(with_stages(Status::Succeeded, Reason::Exited, 0)))
        .await;
    let (status, record) = api.get(Some(ALICE), &format!("/v1/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    let deadline = Instant::now() + DEADLINE;
    while api.get(Some(ALICE), &format!("/v1/jobs/{id}")).await.0 != StatusCode::NOT_FOUND {
        assert!(Instant::now() < deadline, "the job's result never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exists: bool = api.redis().await.exists(api.keys.job(&id)).await.unwrap();
    assert!(!exists, "job:<id> is gone");
    let expected = json!({"jobs": [{
        "id": id,
        "status": "succeeded",
        "language": "c",
        "user": "u1",
        "created_at": record["created_at"],
        "started_at": record["started_at"],
        "finished_at": record["finished_at"],
        "reason": "exited",
        "cpu_ms": 42,
        "wall_ms": 1050,
    }], "next_cursor": null});
    assert_eq!(api.list(ALICE, "").await, expected);
    assert_eq!(api.list(ALICE, "user=u1&status=succeeded").await, expected);
    // The summary expires with the window, not with the result.
    let ttl_ms: i64 = api.redis().await.pttl(api.keys.summary(&id)).await.unwrap();
    assert!(ttl_ms > 6 * 86_400_000, "{ttl_ms}");
}

#[tokio::test]
async fn the_window_drops_older_jobs_and_their_entries() {
    let api = Api::start(Duration::from_secs(60), Duration::from_millis(1500)).await;
    let old = api.submit(ALICE, &job("python", Some("u1"))).await;
    assert_eq!(ids(&api.list(ALICE, "").await), vec![old.clone()]);
    let deadline = Instant::now() + DEADLINE;
    while !ids(&api.list(ALICE, "").await).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the job stayed listed past the window"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new = api.submit(ALICE, &job("python", Some("u1"))).await;
    assert_eq!(ids(&api.list(ALICE, "").await), vec![new.clone()]);
    assert_eq!(ids(&api.list(ALICE, "user=u1").await), vec![new.clone()]);
    // The submit trimmed the older entry from both sets.
    let mut conn = api.redis().await;
    for set in [
        api.keys.history("alice"),
        api.keys.user_history("alice", "u1"),
    ] {
        let members: Vec<String> = conn.zrange(&set, 0, -1).await.unwrap();
        assert_eq!(members, vec![new.clone()], "{set}");
        let ttl_ms: i64 = conn.pttl(&set).await.unwrap();
        assert!((1..=1500).contains(&ttl_ms), "{set}: {ttl_ms}");
    }
    let summary_left: bool = conn.exists(api.keys.summary(&old)).await.unwrap();
    assert!(
        !summary_left,
        "the old job's summary expired with the window"
    );
}

#[tokio::test]
async fn a_retry_and_a_late_result_show_in_the_history_as_they_happen() {
    let api = Api::default().await;
    let mut body = job("python", None);
    body["max_attempts"] = json!(2);
    let id = api.submit(ALICE, &body).await;
    api.work(&id, None).await;
    let shown = |page: Value| page["jobs"][0].clone();
    let view = shown(api.list(ALICE, "").await);
    assert_eq!(view["status"], "running");
    assert!(view["started_at"].is_string());

    // Its worker is lost: the job goes back to the queue for attempt 2.
    let lost = || JobResult::without_stages(Status::Error, "python", "3");
    let outcome = api
        .store
        .jobs()
        .reap(
            WORKER,
            &id,
            ReapPolicy {
                max_requeues: 3,
                retry: Retry::Allowed,
                late_window: Duration::from_secs(600),
                own: false,
            },
            &LostResults {
                running: lost().with_reason(ErrorReason::WorkerLost),
                dead: lost().with_reason(ErrorReason::WorkerLost),
                cancelled: JobResult::without_stages(Status::Cancelled, "python", "3"),
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome, ReapOutcome::Retried { attempt: 1 });
    let view = shown(api.list(ALICE, "").await);
    assert_eq!(
        (&view["status"], &view["started_at"], &view["finished_at"]),
        (&json!("queued"), &Value::Null, &Value::Null)
    );
    assert_eq!(
        ids(&api.list(ALICE, "status=queued").await),
        vec![id.clone()]
    );

    // The lost attempt's real result comes after all and wins.
    let mut late = with_stages(Status::Succeeded, Reason::Exited, 0);
    late.compile = None;
    api.store
        .jobs()
        .finish(&id, WORKER, 1, &late)
        .await
        .unwrap();
    let view = shown(api.list(ALICE, "").await);
    assert_eq!(
        (
            &view["status"],
            &view["reason"],
            &view["cpu_ms"],
            &view["wall_ms"]
        ),
        (
            &json!("succeeded"),
            &json!("exited"),
            &json!(12),
            &json!(1000)
        )
    );
    assert!(view["finished_at"].is_string());
    assert_eq!(api.list(ALICE, "status=queued").await["jobs"], json!([]));
}

#[tokio::test]
async fn playground_jobs_with_and_without_a_user_are_listed_for_the_shared_key() {
    let api = Api::default().await;
    let submit = |body: Value| {
        let request = api
            .http
            .post(format!("{}/v1/playground/jobs", api.base))
            .json(&body)
            .send();
        async move { answer(request.await.unwrap()).await }
    };
    let (status, anonymous) = submit(job("python", None)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{anonymous}");
    let (status, tab) = submit(job("python", Some("tab-0123456789abcdef"))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{tab}");
    let (anonymous, tab) = (
        anonymous["id"].as_str().unwrap().to_string(),
        tab["id"].as_str().unwrap().to_string(),
    );
    let (_, view) = api.get(Some(PLAY), &format!("/v1/jobs/{anonymous}")).await;
    assert_eq!(
        (&view["status"], &view["user"]),
        (&json!("queued"), &Value::Null)
    );
    let (_, view) = api.get(Some(PLAY), &format!("/v1/jobs/{tab}")).await;
    assert_eq!(view["user"], "tab-0123456789abcdef");

    assert_eq!(
        ids(&api.list(PLAY, "").await),
        newest_first(&api, &[anonymous.clone(), tab.clone()]).await
    );
    assert_eq!(
        ids(&api.list(PLAY, "user=tab-0123456789abcdef").await),
        vec![tab.clone()]
    );
    // The anonymous job runs like any other.
    api.work(
        &anonymous,
        Some(with_stages(Status::Succeeded, Reason::Exited, 0)),
    )
    .await;
    let page = api.list(PLAY, "status=succeeded").await;
    assert_eq!(ids(&page), vec![anonymous.clone()]);
    assert_eq!(page["jobs"][0]["user"], Value::Null);
    assert_eq!(api.list(ALICE, "").await["jobs"], json!([]));
}
