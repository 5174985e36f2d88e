//! The usage ledger and the daily quotas at the store, against a real
//! redis-server per test: the test plays the API, the worker and the
//! reaper through the store's own steps, so every figure is one the test
//! chose. (`GET /v1/usage` and the quotas' 429s are in [`crate::usage`].)

use std::time::Duration;

use code_runner::job::{JobResult, JobSpec, Output, StageResult, Status};
use code_runner::protocol::Reason;
use code_runner::store::{
    Admission, Day, Figures, FinishOutcome, LostResults, NewJob, Quota, Quotas, ReapOutcome,
    ReapPolicy, Retry, StartOutcome, Store, SubmitOutcome, now_ms,
};

use crate::common;
use crate::common::redis_server::RedisServer;

const KEY: &str = "k";

/// What these tests' stores keep of the ledger.
pub const RETENTION_DAYS: u64 = 7;

/// How long the longest test here that reads a day's ledger may take: each
/// starts at least this long before a UTC midnight.
pub const LEDGER_DAY_TEST_MAX: Duration = Duration::from_secs(120);

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
pub fn stage(cpu_ms: u64, wall_ms: u64, stdout: &str, stderr: &str, exit: i32) -> StageResult {
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

pub fn result(status: Status, compile: Option<StageResult>, run: Option<StageResult>) -> JobResult {
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
/// 2270, at its first and last millisecond and once in between. (A script
/// of 20,000 days can take more than the client's default half second on a
/// loaded machine: the connection waits up to a minute.)
#[tokio::test]
async fn the_ledger_day_lua_computes_is_the_utc_date() {
    let redis = RedisServer::start();
    let mut conn = redis.patient_conn(Duration::from_secs(60)).await;
    let script = redis::Script::new(&format!(
        "{}\nlocal out = {{}}\nfor i, ms in ipairs(ARGV) do out[i] = usage_day(ms) end\nreturn out",
        include_str!("../../src/store/job/lib.lua")
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
