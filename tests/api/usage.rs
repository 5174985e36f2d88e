//! The daily quotas and `GET /v1/usage` on the API alone
//! ([`crate::server`]), the test playing the worker so that every figure
//! is one it chose; and `code-runner usage` printing a job's figures, read
//! from a whole `code-runner serve` in the test on the scripted engine. (A
//! real program's figures are counted in the `daemon` binary's `usage`.)

use std::time::Duration;

use code_runner::job::Status;
use code_runner::store::{Day, FinishOutcome, now_ms};
use redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common;
use crate::common::client::{KEY_A, KEY_B};
use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;
use crate::common::scripted;
use crate::server::{ApiServer, Setup};
use crate::usage_ledger::{LEDGER_DAY_TEST_MAX, RETENTION_DAYS, result, stage};

const TEACHER: &str = "teacher-key-0123456789abcdef";

const OPS: &str = "ops-key-0123456789abcdef";

const OTHER: &str = "other-key-0123456789abcdef";

/// The API alone, and the steps these tests take with it.
struct Api(ApiServer);

impl std::ops::Deref for Api {
    type Target = ApiServer;

    fn deref(&self) -> &ApiServer {
        &self.0
    }
}

impl Api {
    async fn start(keys: &str) -> Self {
        Self(
            Setup {
                prefix: String::new(),
                result_ttl: Duration::from_secs(3600),
                usage_retention: Some(Duration::from_secs(RETENTION_DAYS * 86_400)),
                ..Setup::new(keys)
            }
            .start()
            .await,
        )
    }

    async fn answer(request: reqwest::RequestBuilder) -> (StatusCode, Option<u64>, Value) {
        let response = request.send().await.unwrap();
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap());
        let body = serde_json::from_str(&response.text().await.unwrap()).unwrap_or(Value::Null);
        (status, retry_after, body)
    }

    async fn submit(&self, key: &str, user: &str) -> (StatusCode, Option<u64>, Value) {
        let mut body = json!({"language": "python",
            "files": [{"name": "main.py", "content": "print(1)"}]});
        if !user.is_empty() {
            body["user"] = json!(user);
        }
        Self::answer(
            self.http
                .post(format!("{}/v1/jobs", self.base))
                .bearer_auth(key)
                .json(&body),
        )
        .await
    }

    async fn usage(&self, key: &str, query: &str) -> (StatusCode, Value) {
        let (status, _, body) = Self::answer(
            self.http
                .get(format!("{}/v1/usage{query}", self.base))
                .bearer_auth(key),
        )
        .await;
        (status, body)
    }

    /// Plays the worker: runs every queued job to its end with `cpu_ms`
    /// of CPU, twice that of wall time, and `output` on stdout.
    async fn run_queued(&self, cpu_ms: u64, output: &str) {
        let jobs = self.store.jobs();
        let mut conn = self.store.dedicated().await.unwrap();
        while let Some(id) = jobs.claim(&mut conn, "w").await.unwrap() {
            jobs.start(&id, "w", "host", false, Duration::from_secs(33))
                .await
                .unwrap();
            let done = result(
                Status::Succeeded,
                None,
                Some(stage(cpu_ms, 2 * cpu_ms, output, "", 0)),
            );
            assert_eq!(
                jobs.finish(&id, "w", 1, &done).await.unwrap(),
                FinishOutcome::Finished
            );
        }
    }
}

/// The next UTC midnight as RFC 3339, and the seconds to it.
fn reset() -> (String, u64) {
    let now = now_ms();
    let midnight = Day::from_ms(now).plus(1);
    (
        format!("{midnight}T00:00:00Z"),
        (midnight.start_ms() - now).div_ceil(1000),
    )
}

fn assert_quota_refusal(
    answer: (StatusCode, Option<u64>, Value),
    message: &str,
    limit: (&str, u64, u64),
) {
    let (status, retry_after, body) = answer;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    let (resets, seconds) = reset();
    assert_eq!(
        body["error"]["message"],
        format!("{message}; it resets at {resets}"),
        "{body}"
    );
    let retry_after = retry_after.expect("a Retry-After header");
    assert!(
        retry_after.abs_diff(seconds) <= 2,
        "Retry-After {retry_after}, {seconds} s to midnight"
    );
    common::assert_refusal_detail(&body, retry_after, "quota_exceeded", Some(limit));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_quota_refuses_with_429_its_message_and_retry_after() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    let api = Api::start(&format!(
        "teacher:{TEACHER}:cpu_seconds_per_day=3:user_cpu_seconds_per_day=1:user_jobs_per_day=2,other:{OTHER}"
    ))
    .await;
    // Jobs per user per day: the third of ann's is refused, bo's first not.
    for _ in 0..2 {
        assert_eq!(api.submit(TEACHER, "ann").await.0, StatusCode::ACCEPTED);
    }
    assert_quota_refusal(
        api.submit(TEACHER, "ann").await,
        "user \"ann\"'s quota of 2 jobs per day (user_jobs_per_day) is used up: 2 jobs submitted today (UTC)",
        ("user_jobs_per_day", 2, 2),
    );
    // ann's two jobs use 1.25 s of CPU: ann's CPU quota refuses before
    // her jobs quota would; bo may still submit.
    api.run_queued(625, "").await;
    assert_quota_refusal(
        api.submit(TEACHER, "ann").await,
        "user \"ann\"'s quota of 1 cpu seconds per day (user_cpu_seconds_per_day) is used up: 1.250 s used today (UTC)",
        ("user_cpu_seconds_per_day", 1000, 1250),
    );
    assert_eq!(api.submit(TEACHER, "bo").await.0, StatusCode::ACCEPTED);
    assert_eq!(api.submit(TEACHER, "bo").await.0, StatusCode::ACCEPTED);
    api.run_queued(900, "").await;
    // 1250 + 1800 ms: the key's 3 s are used up, for a new user too.
    assert_quota_refusal(
        api.submit(TEACHER, "cy").await,
        "this api key's quota of 3 cpu seconds per day (cpu_seconds_per_day) is used up: 3.050 s used today (UTC)",
        ("cpu_seconds_per_day", 3000, 3050),
    );
    // Another key has its own ledger and no quotas.
    assert_eq!(api.submit(OTHER, "ann").await.0, StatusCode::ACCEPTED);

    // The compatible APIs submit through the same path: 429 too, in their
    // own shapes, with Retry-After.
    let (_, seconds) = reset();
    let piston = json!({"language": "python", "version": "*",
        "files": [{"content": "print(1)"}]});
    let (status, retry_after, body) = Api::answer(
        api.http
            .post(format!("{}/api/v2/execute", api.base))
            .header("Authorization", TEACHER)
            .json(&piston),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("this api key's quota of 3 cpu seconds per day"),
        "{body}"
    );
    assert!(retry_after.unwrap().abs_diff(seconds) <= 2);
    let judge0 = json!({"source_code": "print(1)", "language_id": 71});
    let (status, retry_after, body) = Api::answer(
        api.http
            .post(format!("{}/judge0/submissions", api.base))
            .header("X-Auth-Token", TEACHER)
            .header("X-Code-Runner-User", "dee")
            .json(&judge0),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("this api key's quota of 3 cpu seconds per day"),
        "{body}"
    );
    assert!(retry_after.unwrap().abs_diff(seconds) <= 2);

    // Every refusal is counted under its reason.
    let metrics = api
        .http
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("code_runner_submissions_rejected_total{reason=\"quota_exceeded\"} 5"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_answers_per_day_and_per_user_and_an_admin_may_ask_for_any_key() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    let api = Api::start(&format!("teacher:{TEACHER},ops:{OPS}:admin,other:{OTHER}")).await;
    for user in ["ann", "ann", ""] {
        assert_eq!(api.submit(TEACHER, user).await.0, StatusCode::ACCEPTED);
    }
    api.run_queued(40, "hello\n").await;
    assert_eq!(api.submit(TEACHER, "bo").await.0, StatusCode::ACCEPTED);
    // A day before, as the ledger kept it then.
    let today = Day::from_ms(now_ms());
    let yesterday = today.plus(-1);
    let mut conn = api.store.dedicated().await.unwrap();
    let _: () = conn
        .hset_multiple(
            api.store.keys().usage("teacher", &yesterday.to_string()),
            &[
                ("jobs", 1),
                ("cpu_ms", 7),
                ("wall_ms", 9),
                ("output_bytes", 2),
                ("submitted", 1),
                ("jobs:bo", 1),
                ("cpu_ms:bo", 7),
                ("wall_ms:bo", 9),
                ("output_bytes:bo", 2),
                ("submitted:bo", 1),
            ],
        )
        .await
        .unwrap();
    let f = |jobs, cpu_ms, wall_ms, output_bytes, submitted| {
        json!({"jobs": jobs, "cpu_ms": cpu_ms, "wall_ms": wall_ms,
            "output_bytes": output_bytes, "submitted": submitted})
    };
    let with_users = |mut figures: Value, users: Value| {
        figures["users"] = users;
        figures
    };
    let (d0, d1) = (yesterday.to_string(), today.to_string());
    let day = |date: &str, figures: Value| {
        let mut figures = figures;
        figures["date"] = json!(date);
        figures
    };
    let today_figures = with_users(
        f(3, 120, 240, 18, 4),
        json!({"": f(1, 40, 80, 6, 1), "ann": f(2, 80, 160, 12, 2), "bo": f(0, 0, 0, 0, 1)}),
    );
    let yesterday_figures = with_users(f(1, 7, 9, 2, 1), json!({"bo": f(1, 7, 9, 2, 1)}));

    let (status, body) = api.usage(TEACHER, &format!("?from={d0}&to={d1}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"key": "teacher", "from": d0, "to": d1,
            "days": [day(&d0, yesterday_figures.clone()), day(&d1, today_figures.clone())],
            "total": with_users(f(4, 127, 249, 20, 5), json!({
                "": f(1, 40, 80, 6, 1), "ann": f(2, 80, 160, 12, 2), "bo": f(1, 7, 9, 2, 2)}))})
    );
    // Default: today only.
    let (status, body) = api.usage(TEACHER, "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["days"], json!([day(&d1, today_figures.clone())]));
    assert_eq!(
        (body["from"].as_str(), body["to"].as_str()),
        (Some(d1.as_str()), Some(d1.as_str()))
    );
    // One user.
    let (status, body) = api
        .usage(TEACHER, &format!("?from={d0}&to={d1}&user=bo"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["user"], "bo");
    assert_eq!(
        body["days"],
        json!([
            day(
                &d0,
                with_users(f(1, 7, 9, 2, 1), json!({"bo": f(1, 7, 9, 2, 1)}))
            ),
            day(
                &d1,
                with_users(f(0, 0, 0, 0, 1), json!({"bo": f(0, 0, 0, 0, 1)}))
            )
        ])
    );
    assert_eq!(
        body["total"],
        with_users(f(1, 7, 9, 2, 2), json!({"bo": f(1, 7, 9, 2, 2)}))
    );
    // The anonymous user is `user=` with no value.
    let (_, body) = api.usage(TEACHER, "?user=").await;
    assert_eq!(
        body["total"],
        with_users(f(1, 40, 80, 6, 1), json!({"": f(1, 40, 80, 6, 1)}))
    );

    // Another key sees only its own ledger; naming a key needs admin.
    let (status, body) = api.usage(OTHER, "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["key"], "other");
    assert_eq!(body["days"], json!([]));
    assert_eq!(body["total"], with_users(f(0, 0, 0, 0, 0), json!({})));
    let (status, body) = api.usage(OTHER, "?key=teacher").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    assert_eq!(
        body["error"]["message"],
        "this needs an api key with the admin scope"
    );
    let (status, body) = api.usage(OTHER, "?key=other").await;
    assert_eq!(
        (status, body["key"].as_str()),
        (StatusCode::OK, Some("other"))
    );
    let (status, body) = api
        .usage(OPS, &format!("?key=teacher&from={d0}&to={d1}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["key"], "teacher");
    assert_eq!(
        body["days"],
        json!([day(&d0, yesterday_figures), day(&d1, today_figures)])
    );
    let (status, body) = api.usage(OPS, "").await;
    assert_eq!(
        (status, body["key"].as_str()),
        (StatusCode::OK, Some("ops"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_refuses_bad_dates_and_ranges_naming_the_parameter() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    let api = Api::start(&format!("teacher:{TEACHER}")).await;
    let today = Day::from_ms(now_ms());
    let earliest = today.plus(-(RETENTION_DAYS as i64));
    let (status, _) = api
        .usage(TEACHER, &format!("?from={earliest}&to={today}"))
        .await;
    assert_eq!(status, StatusCode::OK, "the whole retention is one range");
    let before = earliest.plus(-1);
    let cases = [
        (
            "?from=2026-02-30".to_string(),
            "from",
            "\"2026-02-30\" is not a date like 2026-12-01 (YYYY-MM-DD, UTC)".to_string(),
        ),
        (
            "?to=tomorrow".to_string(),
            "to",
            "\"tomorrow\" is not a date like 2026-12-01 (YYYY-MM-DD, UTC)".to_string(),
        ),
        (
            format!("?from={today}&to={}", today.plus(-1)),
            "from",
            format!("{today} is after to ({})", today.plus(-1)),
        ),
        (
            format!("?from={before}&to={today}"),
            "from",
            format!(
                "{before} is older than the usage kept: 7 days (CODE_RUNNER_USAGE_RETENTION_DAYS), from {earliest}"
            ),
        ),
        (
            format!("?from={today}&to={}", today.plus(8)),
            "to",
            format!(
                "the range from {today} to {} is longer than the usage kept: 7 days (CODE_RUNNER_USAGE_RETENTION_DAYS)",
                today.plus(8)
            ),
        ),
        (
            "?day=2026-12-01".to_string(),
            "query",
            "unknown parameter \"day\"; the parameters are from, to, user and key".to_string(),
        ),
    ];
    for (query, field, message) in cases {
        let (status, body) = api.usage(TEACHER, &query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(
            body["error"],
            json!({"code": "invalid_request", "field": field, "message": message}),
            "{query}"
        );
    }
    let (status, _, body) = Api::answer(api.http.get(format!("{}/v1/usage", api.base))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_figures_are_counted_and_the_cli_prints_them() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A},b:{KEY_B}:admin"))
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 1)
        .start()
        .await;
    // A program that used 321 ms of CPU and wrote 12 + 10 bytes.
    let mut job = scripted::json("usage 321 1048576\nprint 44999850000\neprint to stderr\n");
    job["user"] = json!("ann");
    let answer = daemon.submit_as(Some(KEY_A), &job, true).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    let view = &answer.body;
    assert_eq!(view["status"], "succeeded", "{view:#}");
    let run = &view["result"]["run"];
    assert_eq!(
        view["result"]["compile"],
        Value::Null,
        "python has no compile stage"
    );
    let cpu_ms = run["cpu_ms"].as_u64().unwrap();
    assert_eq!(cpu_ms, 321, "{view:#}");
    let wall_ms = run["wall_ms"].as_u64().unwrap();
    let output_bytes =
        (run["stdout"].as_str().unwrap().len() + run["stderr"].as_str().unwrap().len()) as u64;
    assert_eq!(
        output_bytes,
        "44999850000\n".len() as u64 + "to stderr\n".len() as u64
    );
    let expected = json!({"jobs": 1, "cpu_ms": cpu_ms, "wall_ms": wall_ms,
        "output_bytes": output_bytes, "submitted": 1});
    let usage = daemon.get("/v1/usage", Some(KEY_A)).await;
    assert_eq!(usage.status, StatusCode::OK, "{usage:#?}");
    let today = Day::from_ms(now_ms()).to_string();
    let mut day = expected.clone();
    day["date"] = json!(today);
    day["users"] = json!({"ann": expected.clone()});
    assert_eq!(usage.body["days"], json!([day]), "{:#}", usage.body);

    // The CLI prints the same figures: a table, or the API's JSON.
    let url = daemon.url.clone();
    let cli = |args: Vec<&'static str>, key: &'static str| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            common::code_runner()
                .arg("usage")
                .args(args)
                .env("CODE_RUNNER_URL", url)
                .env("CODE_RUNNER_API_KEY", key)
                .output()
                .unwrap()
        })
    };
    let table = cli(vec![], KEY_A).await.unwrap();
    assert!(table.status.success(), "{table:?}");
    let text = String::from_utf8(table.stdout).unwrap();
    let lines: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    let row = |date: &str, user: &str| {
        vec![
            date.to_string(),
            user.to_string(),
            "1".into(),
            "1".into(),
            cpu_ms.to_string(),
            wall_ms.to_string(),
            output_bytes.to_string(),
        ]
    };
    assert_eq!(
        lines,
        vec![
            vec![
                "key".to_string(),
                "a,".into(),
                today.clone(),
                "to".into(),
                today.clone(),
                "(UTC)".into()
            ],
            [
                "DATE",
                "USER",
                "JOBS",
                "SUBMITTED",
                "CPU_MS",
                "WALL_MS",
                "OUTPUT_BYTES"
            ]
            .map(String::from)
            .to_vec(),
            row(&today, "*"),
            row(&today, "ann"),
            row("total", "*"),
            row("total", "ann"),
        ],
        "{text}"
    );
    // An admin key reads key a's usage as JSON; a key without the scope
    // is refused, exit 64, one line naming why.
    let json_out = cli(vec!["--json", "--key", "a", "--user", "ann"], KEY_B)
        .await
        .unwrap();
    assert!(json_out.status.success(), "{json_out:?}");
    let printed: Value = serde_json::from_slice(&json_out.stdout).unwrap();
    assert_eq!(printed["key"], "a");
    assert_eq!(printed["days"], json!([day]));
    let refused = cli(vec!["--key", "b"], KEY_A).await.unwrap();
    assert_eq!(refused.status.code(), Some(64));
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "code-runner: the API answered 403: this needs an api key with the admin scope\n"
    );
    let bad = cli(vec!["--from", "2026-13-01"], KEY_A).await.unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr),
        "code-runner: the API answered 400: from: \"2026-13-01\" is not a date like 2026-12-01 (YYYY-MM-DD, UTC)\n"
    );
    daemon.assert_no_sandboxes().await;
}
