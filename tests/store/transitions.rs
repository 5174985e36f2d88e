//! Every step of the job's life against a real redis-server, from every
//! status, checked against the one transition table
//! (`code_runner::job::lifecycle::MOVES`):
//!
//! - a step that answers leaves the job in its status or makes a move the
//!   table gives that step;
//! - a step whose move the table refuses answers `Refused` and writes
//!   nothing at all (the job's hash, its lists and streams are as before);
//! - every move of the table is made by some step from some state, so the
//!   table holds no move the scripts never make.
//!
//! A job is set up by hand in each status, in three shapes: plain, with a
//! late-result record (the platform gave up on the worker's attempt), and
//! with a cancel asked for.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use code_runner::job::events::JobEvent;
use code_runner::job::lifecycle::{MOVES, Step};
use code_runner::job::{JobResult, JobSpec, Status};
use code_runner::store::{
    Admission, Control, InputBudgets, LostResults, NewJob, Quotas, ReapPolicy, Retry, RunningJob,
    Store, StoreError, TURN, now_ms,
};
use redis::AsyncCommands;

const WORKER: &str = "w-transitions";
const STARTED_MS: u64 = 1_700_000_000_000;
const USER: &str = "student-1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Plain,
    GivenUp,
    CancelAsked,
}

/// One way of calling a step.
#[derive(Debug, Clone, Copy)]
enum Call {
    Submit,
    Claim,
    Start,
    AppendEvents,
    SendInput,
    Finish(Status),
    Cancel,
    Release,
    Reap(Retry, u32),
    GiveUpOverdue,
}

impl Call {
    fn step(self) -> Step {
        match self {
            Call::Submit => Step::Submit,
            Call::Claim => Step::Claim,
            Call::Start => Step::Start,
            Call::AppendEvents => Step::AppendEvents,
            Call::SendInput => Step::SendInput,
            Call::Finish(_) => Step::Finish,
            Call::Cancel => Step::Cancel,
            Call::Release => Step::Release,
            Call::Reap(..) => Step::Reap,
            Call::GiveUpOverdue => Step::GiveUpOverdue,
        }
    }
}

fn calls() -> Vec<Call> {
    let mut calls = vec![
        Call::Submit,
        Call::Claim,
        Call::Start,
        Call::AppendEvents,
        Call::SendInput,
        Call::Cancel,
        Call::Release,
        Call::GiveUpOverdue,
    ];
    calls.extend(
        [
            Status::Succeeded,
            Status::Failed,
            Status::TimedOut,
            Status::Cancelled,
            Status::Error,
        ]
        .map(Call::Finish),
    );
    calls.extend([
        Call::Reap(Retry::Allowed, 3),
        Call::Reap(Retry::NotYet, 3),
        Call::Reap(Retry::Never, 0),
    ]);
    calls
}

fn spec() -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "language": "python",
        "files": [{"name": "main.py", "content": "print(1)\n"}],
    }))
    .expect("a valid spec")
}

fn result(status: Status) -> JobResult {
    JobResult::without_stages(status, "python", "3")
}

/// Sets up job `id` in `status` (`None`: no job), claimed by [`WORKER`]
/// (and queued in its user's queue with its turn, when it is), whose
/// heartbeat has expired; the worker also holds a turn of a claim it
/// stopped halfway through.
async fn seed(
    conn: &mut redis::aio::MultiplexedConnection,
    store: &Store,
    id: &str,
    status: Option<Status>,
    shape: Shape,
) {
    let keys = store.keys();
    let _: () = redis::cmd("FLUSHDB").query_async(conn).await.unwrap();
    let _: () = conn.lpush(keys.processing(WORKER), id).await.unwrap();
    let _: () = conn.lpush(keys.processing(WORKER), TURN).await.unwrap();
    let _: () = conn.sadd(keys.workers(), WORKER).await.unwrap();
    let Some(status) = status else {
        return;
    };
    let spec = serde_json::to_string(&spec()).unwrap();
    let mut fields: Vec<(&str, String)> = vec![
        ("id", id.to_string()),
        ("status", status.as_str().to_string()),
        ("spec", spec),
        ("api_key", "k".into()),
        ("language", "python".into()),
        ("attempts", "1".into()),
        ("max_attempts", "2".into()),
        ("created_ms", (STARTED_MS - 1000).to_string()),
        ("active_key", keys.active("k")),
        ("stored_key", keys.stored("k")),
        ("expiry_key", keys.expiry("k")),
        ("wall_budget_ms", "1000".into()),
        ("user", USER.into()),
        ("user_queue", keys.user_queue("k", USER)),
        ("users_ring", keys.users("k")),
        ("user_active_key", keys.user_active("k")),
        ("event_seq", "3".into()),
        ("metadata", "{}".into()),
    ];
    if status != Status::Queued {
        fields.push(("worker", WORKER.into()));
        fields.push(("started_ms", STARTED_MS.to_string()));
    }
    if status.is_terminal() {
        let stored = serde_json::to_string(&result(status)).unwrap();
        fields.push(("result", stored));
        fields.push(("finished_ms", (STARTED_MS + 10).to_string()));
    }
    match shape {
        Shape::Plain => {}
        Shape::GivenUp => {
            fields.push(("lost_worker", WORKER.into()));
            fields.push(("lost_attempt", "1".into()));
            fields.push(("lost_until", (now_ms() + 600_000).to_string()));
            fields.push(("verdict_seq", "3".into()));
        }
        Shape::CancelAsked => fields.push(("cancel_requested", "1".into())),
    }
    let _: () = conn.hset_multiple(keys.job(id), &fields).await.unwrap();
    if !status.is_terminal() {
        let _: () = conn.sadd(keys.active("k"), id).await.unwrap();
        let _: () = conn.hset(keys.user_active("k"), USER, 1).await.unwrap();
    }
    if status == Status::Queued {
        let _: () = conn.lpush(keys.user_queue("k", USER), id).await.unwrap();
        let _: () = conn
            .rpush(keys.users("k"), keys.user_queue("k", USER))
            .await
            .unwrap();
        let _: () = conn.rpush(keys.tenants(), keys.users("k")).await.unwrap();
        let _: () = conn.lpush(keys.queue(), TURN).await.unwrap();
    }
}

/// Everything of the job and the lists a step may touch, as it is now.
async fn snapshot(
    conn: &mut redis::aio::MultiplexedConnection,
    store: &Store,
    id: &str,
) -> Vec<String> {
    let keys = store.keys();
    let hash: BTreeMap<String, Vec<u8>> = conn.hgetall(keys.job(id)).await.unwrap();
    let queue: Vec<String> = conn.lrange(keys.queue(), 0, -1).await.unwrap();
    let claimed: Vec<String> = conn.lrange(keys.processing(WORKER), 0, -1).await.unwrap();
    let events: u64 = conn.xlen(keys.events(id)).await.unwrap();
    let stdin: u64 = conn.xlen(keys.stdin(id)).await.unwrap();
    let dead: Vec<String> = conn.lrange(keys.dead(), 0, -1).await.unwrap();
    let active: BTreeSet<String> = conn.smembers(keys.active("k")).await.unwrap();
    let user_queue: Vec<String> = conn
        .lrange(keys.user_queue("k", USER), 0, -1)
        .await
        .unwrap();
    let users: Vec<String> = conn.lrange(keys.users("k"), 0, -1).await.unwrap();
    let tenants: Vec<String> = conn.lrange(keys.tenants(), 0, -1).await.unwrap();
    let user_active: BTreeMap<String, String> = conn.hgetall(keys.user_active("k")).await.unwrap();
    vec![
        format!("{user_queue:?} {users:?} {tenants:?} {user_active:?}"),
        format!("{hash:?}"),
        format!("{queue:?}"),
        format!("{claimed:?}"),
        format!("{events} {stdin}"),
        format!("{dead:?}"),
        format!("{active:?}"),
    ]
}

async fn status_of(
    conn: &mut redis::aio::MultiplexedConnection,
    store: &Store,
    id: &str,
) -> Option<Status> {
    let status: Option<String> = conn.hget(store.keys().job(id), "status").await.unwrap();
    status.map(|s| serde_json::from_value(serde_json::Value::String(s)).expect("a known status"))
}

/// Runs `call` on job `id`; `Ok(())` whatever its outcome, or the error.
async fn run(store: &Store, id: &str, call: Call) -> Result<(), StoreError> {
    let jobs = store.jobs();
    match call {
        Call::Submit => {
            let spec = spec();
            jobs.submit(NewJob {
                id,
                spec: &spec,
                api_key: "k",
                user: USER,
                language: "python",
                idempotency: None,
                admission: Admission {
                    max_queue_depth: 1000,
                    key_limit: None,
                    max_attempts: 2,
                    output_limit_bytes: 1024,
                    storage_budget: 1 << 30,
                    wall_budget_ms: 1000,
                    weight: 1,
                    user_limit: None,
                    user_rate_per_minute: None,
                    quotas: Quotas::default(),
                },
            })
            .await
            .map(drop)
        }
        Call::Claim => jobs.take_turn(WORKER).await.map(drop),
        Call::Start => jobs
            .start(id, WORKER, "host", true, Duration::from_secs(33))
            .await
            .map(drop),
        Call::AppendEvents => jobs
            .append_events(id, WORKER, 1, &[JobEvent::stdout(b"hi".to_vec())])
            .await
            .map(drop),
        Call::SendInput => {
            let budgets = InputBudgets {
                stdin_bytes: 1 << 20,
                signals: 10,
                messages: 100,
                key_storage: 1 << 30,
            };
            jobs.send_input(id, &Control::Stdin(b"x\n".to_vec()), budgets)
                .await
                .map(drop)
        }
        Call::Finish(status) => jobs.finish(id, WORKER, 1, &result(status)).await.map(drop),
        Call::Cancel => jobs.cancel(id, &result(Status::Cancelled)).await.map(drop),
        Call::Release => jobs.release(id, WORKER).await.map(drop),
        Call::Reap(retry, max_requeues) => {
            let policy = ReapPolicy {
                max_requeues,
                retry,
                late_window: Duration::from_secs(600),
                own: false,
            };
            let results = LostResults::new(WORKER, "python", "3", max_requeues);
            jobs.reap(WORKER, id, policy, &results).await.map(drop)
        }
        Call::GiveUpOverdue => {
            let running = RunningJob {
                id: id.to_string(),
                language: "python".into(),
                started_ms: STARTED_MS,
                deadline_ms: Some(STARTED_MS + 34_000),
            };
            jobs.give_up_overdue(
                WORKER,
                &running,
                &result(Status::Error),
                Duration::from_secs(600),
            )
            .await
            .map(drop)
        }
    }
}

/// The only states where a step meets a move the table refuses, both made
/// up by hand: a job submitted again under the id of one that exists, and
/// a late result for an attempt given up on at a job that has since ended
/// otherwise (a late `error` never replaces anything, so it is not one).
fn expects_refusal(call: Call, shape: Shape, from: Option<Status>) -> bool {
    match call {
        Call::Submit => from.is_some(),
        Call::Finish(status) => {
            shape == Shape::GivenUp
                && status != Status::Error
                && from.is_some_and(|s| s.is_terminal() && s != Status::Error)
        }
        _ => false,
    }
}

#[tokio::test]
async fn every_step_from_every_status_follows_the_transition_table() {
    let redis = RedisServer::start();
    let store = Store::new(&redis.url(), "", Duration::from_secs(3600), 4).expect("valid settings");
    let mut conn = redis.conn().await;
    let mut made: HashSet<(Step, Option<Status>, Status)> = HashSet::new();
    let mut refusals: BTreeSet<String> = BTreeSet::new();
    let froms = std::iter::once(None).chain(Status::ALL.map(Some));
    for from in froms {
        for shape in [Shape::Plain, Shape::GivenUp, Shape::CancelAsked] {
            for call in calls() {
                let id = uuid::Uuid::new_v4().to_string();
                seed(&mut conn, &store, &id, from, shape).await;
                let before = snapshot(&mut conn, &store, &id).await;
                let outcome = run(&store, &id, call).await;
                let after = status_of(&mut conn, &store, &id).await;
                let what = format!("{call:?} on a {shape:?} job in {from:?}");
                match outcome {
                    Ok(()) => {}
                    Err(StoreError::Refused {
                        step,
                        from: was,
                        to,
                    }) => {
                        refusals.insert(format!("{:?} {shape:?} {from:?}", call.step()));
                        assert!(expects_refusal(call, shape, from), "{what}: refused");
                        assert_eq!(step, call.step().name(), "{what}");
                        assert_eq!(was, from.map_or("-", |s| s.as_str()), "{what}");
                        let to: Status =
                            serde_json::from_value(serde_json::Value::String(to)).unwrap();
                        assert!(
                            !call.step().allows(from, to),
                            "{what}: refused an allowed move to {to:?}"
                        );
                        assert_eq!(
                            snapshot(&mut conn, &store, &id).await,
                            before,
                            "{what}: a refused step wrote something"
                        );
                        continue;
                    }
                    Err(error) => panic!("{what}: {error}"),
                }
                assert!(!expects_refusal(call, shape, from), "{what}: not refused");
                if after == from {
                    continue;
                }
                let to = after.unwrap_or_else(|| panic!("{what}: the job vanished"));
                assert!(
                    call.step().allows(from, to),
                    "{what}: moved to {to:?}, which the table does not give {:?}",
                    call.step()
                );
                made.insert((call.step(), from, to));
            }
        }
    }
    let table: HashSet<(Step, Option<Status>, Status)> = MOVES
        .iter()
        .flat_map(|m| m.to.iter().map(move |to| (m.step, m.from, *to)))
        .collect();
    let never: Vec<_> = table.difference(&made).collect();
    assert!(
        never.is_empty(),
        "moves of the table no step made: {never:?}"
    );
    // The artificial states (a late-result record on an ended job, a job
    // submitted again under its id) are where the table refuses.
    assert_eq!(refusals.len(), 7 * 3 + 4, "{refusals:#?}");
}

/// The table's Lua function itself: a move it does not give the step is
/// refused before anything is written, in every script alike.
#[tokio::test]
async fn a_refused_move_writes_nothing() {
    let redis = RedisServer::start();
    let store = Store::new(&redis.url(), "", Duration::from_secs(3600), 4).expect("valid settings");
    let mut conn = redis.conn().await;
    let id = uuid::Uuid::new_v4().to_string();
    // A job already running, submitted again under its id.
    seed(&mut conn, &store, &id, Some(Status::Running), Shape::Plain).await;
    let before = snapshot(&mut conn, &store, &id).await;
    match run(&store, &id, Call::Submit).await {
        Err(StoreError::Refused { step, from, to }) => {
            assert_eq!(
                (step, from.as_str(), to.as_str()),
                ("submit", "running", "queued")
            );
        }
        other => panic!("submit over a running job answered {other:?}"),
    }
    assert_eq!(snapshot(&mut conn, &store, &id).await, before);
    // A late result of an attempt given up on, for a job that has since
    // succeeded (an ended job takes no late result).
    seed(
        &mut conn,
        &store,
        &id,
        Some(Status::Succeeded),
        Shape::GivenUp,
    )
    .await;
    let before = snapshot(&mut conn, &store, &id).await;
    match run(&store, &id, Call::Finish(Status::Failed)).await {
        Err(StoreError::Refused { step, from, to }) => {
            assert_eq!(
                (step, from.as_str(), to.as_str()),
                ("finish", "succeeded", "failed")
            );
        }
        other => panic!("a late result over a succeeded job answered {other:?}"),
    }
    assert_eq!(snapshot(&mut conn, &store, &id).await, before);
}
