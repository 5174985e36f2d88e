//! The usage ledger, the daily quotas, `GET /v1/usage` and `code-runner
//! usage` (issue 18, items 4 and 5), against a real redis-server per test.
//!
//! The ledger and quota tests drive the job's steps directly (the test
//! plays the worker and the reaper through the store's own operations, as
//! tests/store_transitions.rs does), so every figure is one the test chose;
//! the API tests run the real API in-process over real HTTP; one test runs
//! a real job end to end in a real `code-runner serve` with real Docker and
//! reads its figures back through the API and the CLI. Every server and
//! daemon is a guard that stops it when the test ends, also on failure.

mod common;

use std::time::Duration;

use code_runner::api::{ApiConfig, ApiKeys, ApiState, TokenSigner};
use code_runner::job::{JobResult, JobSpec, Output, StageResult, Status};
use code_runner::protocol::Reason;
use code_runner::store::{
    Admission, Day, Figures, FinishOutcome, LostResults, NewJob, Quota, Quotas, ReapOutcome,
    ReapPolicy, Retry, StartOutcome, Store, SubmitOutcome, now_ms,
};
use common::redis_server::RedisServer;
use redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const KEY: &str = "k";
/// What these tests' stores keep of the ledger.
const RETENTION_DAYS: u64 = 7;
/// How long the longest test here that reads a day's ledger may take: each
/// starts at least this long before a UTC midnight.
const LEDGER_DAY_TEST_MAX: Duration = Duration::from_secs(120);

fn store(redis: &RedisServer) -> Store {
    Store::new(&redis.url(), "", Duration::from_secs(3600), 4)
        .unwrap()
        .with_usage_retention(Duration::from_secs(RETENTION_DAYS * 86_400))
}

fn spec(user: &str) -> JobSpec {
    let mut spec = common::python("print(1)");
    spec.user = (!user.is_empty()).then(|| user.to_string());
    spec
}

/// Submits a job of `user` under key `k` as the API would; the outcome
/// and the new id.
async fn submit(
    store: &Store,
    user: &str,
    max_attempts: u32,
    quotas: Quotas,
) -> (SubmitOutcome, String) {
    let id = uuid::Uuid::new_v4().to_string();
    let spec = spec(user);
    let outcome = store
        .jobs()
        .submit(NewJob {
            id: &id,
            spec: &spec,
            api_key: KEY,
            user,
            language: "python",
            idempotency: None,
            admission: Admission {
                max_queue_depth: 1000,
                key_limit: None,
                max_attempts,
                output_limit_bytes: 1 << 20,
                storage_budget: 1 << 30,
                wall_budget_ms: 10_000,
                quotas,
                weight: 1,
                user_limit: None,
                user_rate_per_minute: None,
            },
        })
        .await
        .unwrap();
    (outcome, id)
}

/// Claims the next queued job for `worker` and starts it (its attempt
/// number).
async fn claim_and_start(store: &Store, worker: &str, id: &str) -> u32 {
    let mut conn = store.dedicated().await.unwrap();
    let claimed = store.jobs().claim(&mut conn, worker).await.unwrap();
    assert_eq!(claimed.as_deref(), Some(id));
    match store
        .jobs()
        .start(id, worker, "host", false, Duration::from_secs(33))
        .await
        .unwrap()
    {
        StartOutcome::Start(started) => started.attempts,
        other => panic!("{id} did not start: {other:?}"),
    }
}

/// A stage that used `cpu_ms` and `wall_ms` and wrote `stdout`, `stderr`.
fn stage(cpu_ms: u64, wall_ms: u64, stdout: &str, stderr: &str, exit: i32) -> StageResult {
    StageResult {
        stdout: Output(stdout.as_bytes().to_vec()),
        stderr: Output(stderr.as_bytes().to_vec()),
        truncated: false,
        exit_code: Some(exit),
        signal: None,
        reason: Reason::Exited,
        wall_ms,
        cpu_ms,
        memory_peak_bytes: 7 << 20,
        pids_limit_reached: None,
    }
}

fn result(status: Status, compile: Option<StageResult>, run: Option<StageResult>) -> JobResult {
    JobResult {
        compile,
        run,
        ..JobResult::without_stages(status, "python", "3")
    }
}

/// The key's ledger of today.
async fn today(store: &Store) -> (Figures, std::collections::BTreeMap<String, Figures>) {
    let today = Day::from_ms(now_ms());
    let days = store.usage().days(KEY, today, today).await.unwrap();
    match days.as_slice() {
        [] => (Figures::default(), Default::default()),
        [day] => (day.total, day.users.clone()),
        more => panic!("one day asked, {} answered", more.len()),
    }
}

fn figures(jobs: u64, cpu_ms: u64, wall_ms: u64, output_bytes: u64, submitted: u64) -> Figures {
    Figures {
        jobs,
        cpu_ms,
        wall_ms,
        output_bytes,
        submitted,
    }
}

fn reap_policy(retry: Retry) -> ReapPolicy {
    ReapPolicy {
        max_requeues: 3,
        retry,
        late_window: Duration::from_secs(600),
        own: false,
    }
}

// ---------------------------------------------------------------------------
// The ledger
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_finished_job_is_counted_once_with_the_figures_of_its_result() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let (outcome, id) = submit(&store, "ann", 1, Quotas::default()).await;
    assert_eq!(outcome, SubmitOutcome::Accepted);
    assert_eq!(today(&store).await.0, figures(0, 0, 0, 0, 1));
    claim_and_start(&store, "w1", &id).await;
    // Compile and run: 120 + 456 ms of CPU, 300 + 789 ms of wall time,
    // 5 + 6 + 2 bytes of output ("é" is two).
    let finished = result(
        Status::Failed,
        Some(stage(120, 300, "", "warn\n", 0)),
        Some(stage(456, 789, "hello\n", "é", 1)),
    );
    let outcome = store.jobs().finish(&id, "w1", 1, &finished).await.unwrap();
    assert_eq!(outcome, FinishOutcome::Finished);
    let expected = figures(1, 576, 1089, 13, 1);
    let (total, users) = today(&store).await;
    assert_eq!(total, expected);
    assert_eq!(users.len(), 1);
    assert_eq!(users["ann"], expected);

    // The same result again (a retried write) is stale: nothing more.
    let outcome = store.jobs().finish(&id, "w1", 1, &finished).await.unwrap();
    assert_eq!(outcome, FinishOutcome::Stale(Status::Failed));
    assert_eq!(today(&store).await.0, expected);

    // The day's hash expires the retention after the day ends.
    let mut conn = redis.conn().await;
    let key = store.keys().usage(KEY, &Day::from_ms(now_ms()).to_string());
    let expires: i64 = redis::cmd("EXPIRETIME")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let midnight = Day::from_ms(now_ms()).plus(1).start_ms() / 1000;
    assert_eq!(expires as u64, midnight + RETENTION_DAYS * 86_400);
}

#[tokio::test]
async fn a_graded_jobs_tests_count_with_its_compile_stages_and_its_checker() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    use code_runner::job::grading::{CheckerUsage, Grading, Restarts, TestResult};
    let redis = RedisServer::start();
    let store = store(&redis);
    let (_, id) = submit(&store, "ann", 1, Quotas::default()).await;
    claim_and_start(&store, "w1", &id).await;
    // A compile of 100 ms CPU / 200 ms wall, then two tests of 30/40 and
    // 50/60, judged by a checker program that used 1000/3000 (its compile
    // and two checks), the tests going on in a new sandbox after one died,
    // whose compile used 90/110: 1270 ms of CPU and 3410 ms of wall time
    // in all.
    let tests = [(30, 40), (50, 60)]
        .iter()
        .enumerate()
        .map(|(i, (cpu, wall))| {
            TestResult::of_run(i, &i.to_string(), 1.0, &stage(*cpu, *wall, "", "", 0))
        })
        .collect();
    let finished = JobResult {
        grading: Some(Grading {
            checker: Some(CheckerUsage {
                cpu_ms: 1000,
                wall_ms: 3000,
                checks: 2,
                compile_cached: false,
            }),
            restarts: Some(Restarts {
                count: 1,
                cpu_ms: 90,
                wall_ms: 110,
            }),
            ..Grading::of(tests, false)
        }),
        ..result(Status::Succeeded, Some(stage(100, 200, "", "", 0)), None)
    };
    let outcome = store.jobs().finish(&id, "w1", 1, &finished).await.unwrap();
    assert_eq!(outcome, FinishOutcome::Finished);
    assert_eq!(today(&store).await.0, figures(1, 1270, 3410, 0, 1));
    // The run history's summary says the same.
    let mut conn = redis.conn().await;
    let summary: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("job:{id}:summary"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        (summary["cpu_ms"].as_str(), summary["wall_ms"].as_str()),
        ("1270", "3410"),
        "{summary:?}"
    );
}

#[tokio::test]
async fn a_retried_job_is_counted_once_when_it_finally_ends() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let (_, id) = submit(&store, "", 2, Quotas::default()).await;
    assert_eq!(claim_and_start(&store, "lost", &id).await, 1);
    // Its worker is lost (no heartbeat): the job goes back for a retry.
    let lost = LostResults::new("lost", "python", "3", 3);
    let outcome = store
        .jobs()
        .reap("lost", &id, reap_policy(Retry::Allowed), &lost)
        .await
        .unwrap();
    assert!(
        matches!(outcome, ReapOutcome::Retried { .. }),
        "{outcome:?}"
    );
    assert_eq!(today(&store).await.0, figures(0, 0, 0, 0, 1));
    assert_eq!(claim_and_start(&store, "w2", &id).await, 2);
    let finished = result(Status::Succeeded, None, Some(stage(40, 90, "ok\n", "", 0)));
    let outcome = store.jobs().finish(&id, "w2", 2, &finished).await.unwrap();
    assert_eq!(outcome, FinishOutcome::Finished);
    let expected = figures(1, 40, 90, 3, 1);
    assert_eq!(today(&store).await.0, expected);
    // The lost attempt's own result, after the retry ended, changes nothing.
    let late = result(
        Status::Succeeded,
        None,
        Some(stage(500, 900, "late\n", "", 0)),
    );
    let outcome = store.jobs().finish(&id, "lost", 1, &late).await.unwrap();
    assert_eq!(outcome, FinishOutcome::Stale(Status::Succeeded));
    let (total, users) = today(&store).await;
    assert_eq!(total, expected);
    assert_eq!(users[""], expected, "the key's anonymous user");
}

#[tokio::test]
async fn a_late_result_that_replaces_a_verdict_is_counted_once() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let (_, id) = submit(&store, "bo", 1, Quotas::default()).await;
    claim_and_start(&store, "w1", &id).await;
    // Lost with no attempts left: the `worker_lost` verdict, which counts
    // the job (it ran) with nothing reported.
    let lost = LostResults::new("w1", "python", "3", 3);
    let outcome = store
        .jobs()
        .reap("w1", &id, reap_policy(Retry::Allowed), &lost)
        .await
        .unwrap();
    assert!(matches!(outcome, ReapOutcome::WorkerLost), "{outcome:?}");
    assert_eq!(today(&store).await.0, figures(1, 0, 0, 0, 1));
    // Its real result comes within the window and replaces the verdict.
    let late = result(
        Status::TimedOut,
        None,
        Some(stage(2000, 3000, "tick\n", "", 0)),
    );
    let outcome = store.jobs().finish(&id, "w1", 1, &late).await.unwrap();
    assert_eq!(outcome, FinishOutcome::Late);
    let expected = figures(1, 2000, 3000, 5, 1);
    let (total, users) = today(&store).await;
    assert_eq!(total, expected);
    assert_eq!(users["bo"], expected);
}

#[tokio::test]
async fn a_job_cancelled_while_queued_is_not_counted_and_one_cancelled_while_running_is() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let cancelled = JobResult::without_stages(Status::Cancelled, "python", "3");
    let (_, queued) = submit(&store, "cy", 1, Quotas::default()).await;
    store.jobs().cancel(&queued, &cancelled).await.unwrap();
    assert_eq!(today(&store).await.0, figures(0, 0, 0, 0, 1));
    let (_, running) = submit(&store, "cy", 1, Quotas::default()).await;
    claim_and_start(&store, "w1", &running).await;
    let killed = StageResult {
        reason: Reason::Killed,
        ..stage(15, 250, "partial", "", 137)
    };
    let result = result(Status::Cancelled, None, Some(killed));
    store
        .jobs()
        .finish(&running, "w1", 1, &result)
        .await
        .unwrap();
    let (total, users) = today(&store).await;
    assert_eq!(total, figures(1, 15, 250, 7, 2));
    assert_eq!(users["cy"], figures(1, 15, 250, 7, 2));
}

/// The day a job ends is computed in Lua (`usage_day` in lib.lua), the day
/// `/v1/usage` reads in Rust (`Day`): they agree on every day of 1970 to
/// 2270, at its first and last millisecond and once in between.
#[tokio::test]
async fn the_ledger_day_lua_computes_is_the_utc_date() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    let script = redis::Script::new(&format!(
        "{}\nlocal out = {{}}\nfor i, ms in ipairs(ARGV) do out[i] = usage_day(ms) end\nreturn out",
        include_str!("../src/store/job/lib.lua")
    ));
    let times: Vec<u64> = (0..300 * 365_u64)
        .flat_map(|day| {
            let start = day * 86_400_000;
            [start, start + (day * 7919) % 86_400_000, start + 86_399_999]
        })
        .collect();
    for chunk in times.chunks(20_000) {
        let mut invocation = script.prepare_invoke();
        for ms in chunk {
            invocation.arg(*ms);
        }
        let days: Vec<String> = invocation.invoke_async(&mut conn).await.unwrap();
        for (ms, day) in chunk.iter().zip(days) {
            assert_eq!(day, Day::from_ms(*ms).to_string(), "at {ms} ms");
        }
    }
}

// ---------------------------------------------------------------------------
// Quotas, at the store
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_quota_refuses_from_the_submission_that_finds_it_used_up() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    let redis = RedisServer::start();
    let store = store(&redis);
    let resets_ms = Day::from_ms(now_ms()).plus(1).start_ms();
    let jobs = Quotas {
        user_jobs: Some(2),
        ..Quotas::default()
    };
    for _ in 0..2 {
        assert_eq!(
            submit(&store, "ann", 1, jobs).await.0,
            SubmitOutcome::Accepted
        );
    }
    assert_eq!(
        submit(&store, "ann", 1, jobs).await.0,
        SubmitOutcome::QuotaExceeded {
            quota: Quota::UserJobs,
            limit: 2,
            used: 2,
            resets_ms
        }
    );
    // Another user of the key has a count of their own; a refusal counts
    // nothing.
    assert_eq!(
        submit(&store, "bo", 1, jobs).await.0,
        SubmitOutcome::Accepted
    );
    let (total, users) = today(&store).await;
    assert_eq!(total.submitted, 3);
    assert_eq!((users["ann"].submitted, users["bo"].submitted), (2, 1));

    // One job of bo's uses 1.5 CPU seconds: bo's 1-second quota is used
    // up, ann's not; the key's 2-second quota not yet.
    let cpu = Quotas {
        key_cpu_seconds: Some(2),
        user_cpu_seconds: Some(1),
        user_jobs: None,
    };
    let mut conn = store.dedicated().await.unwrap();
    while let Some(id) = store.jobs().claim(&mut conn, "w1").await.unwrap() {
        store
            .jobs()
            .start(&id, "w1", "host", false, Duration::from_secs(33))
            .await
            .unwrap();
        let user = store.jobs().get(&id).await.unwrap().unwrap();
        let cpu_ms = if user.user.as_deref() == Some("bo") {
            1500
        } else {
            100
        };
        let done = result(
            Status::Succeeded,
            None,
            Some(stage(cpu_ms, cpu_ms, "", "", 0)),
        );
        store.jobs().finish(&id, "w1", 1, &done).await.unwrap();
    }
    assert_eq!(today(&store).await.0.cpu_ms, 1700);
    assert_eq!(
        submit(&store, "bo", 1, cpu).await.0,
        SubmitOutcome::QuotaExceeded {
            quota: Quota::UserCpuSeconds,
            limit: 1,
            used: 1500,
            resets_ms
        }
    );
    let (outcome, id) = submit(&store, "ann", 1, cpu).await;
    assert_eq!(outcome, SubmitOutcome::Accepted);
    claim_and_start(&store, "w1", &id).await;
    let done = result(Status::Succeeded, None, Some(stage(300, 300, "", "", 0)));
    store.jobs().finish(&id, "w1", 1, &done).await.unwrap();
    // 2000 ms: the key's quota, checked first, is used up for everyone.
    assert_eq!(
        submit(&store, "cy", 1, cpu).await.0,
        SubmitOutcome::QuotaExceeded {
            quota: Quota::KeyCpuSeconds,
            limit: 2,
            used: 2000,
            resets_ms
        }
    );
}

// ---------------------------------------------------------------------------
// The API in-process: quotas, `GET /v1/usage`
// ---------------------------------------------------------------------------

const TEACHER: &str = "teacher-key-0123456789abcdef";
const OPS: &str = "ops-key-0123456789abcdef";
const OTHER: &str = "other-key-0123456789abcdef";

struct Api {
    base: String,
    http: reqwest::Client,
    store: Store,
    shutdown: CancellationToken,
    _redis: RedisServer,
}

impl Api {
    async fn start(keys: &str) -> Self {
        let redis = RedisServer::start();
        let store = store(&redis);
        let keys = ApiKeys::parse(keys).unwrap();
        let tokens = TokenSigner::from_config(None, &keys, &store, Duration::from_secs(600))
            .await
            .unwrap();
        let state = ApiState::new(ApiConfig {
            max_queue_depth: 100,
            ..common::api_config(store.clone(), keys, tokens)
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(code_runner::api::serve(listener, state, shutdown.clone()));
        Self {
            base,
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            store,
            shutdown,
            _redis: redis,
        }
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

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
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

// ---------------------------------------------------------------------------
// End to end: a real job in a real daemon, read back by API and CLI
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_job_is_counted_with_its_results_figures_and_the_cli_prints_them() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
    use common::daemon::{DaemonBuilder, KEY_A, KEY_B, Role};
    let redis = RedisServer::start();
    let docker = common::containers::docker().await;
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A},b:{KEY_B}:admin"))
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 1)
        .start()
        .await;
    let mut job = common::daemon::python(
        "import sys\nx = 0\nfor i in range(300000):\n    x += i\nprint(x)\nprint('to stderr', file=sys.stderr)\n",
    );
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
    daemon.assert_no_containers(&docker).await;
}
