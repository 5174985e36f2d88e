//! Warm capacity end to end, with the real binary and a redis-server of the
//! test's own: a killed worker's warm sandboxes are reaped while a live
//! worker's are left alone; a schedule entry (`PUT /v1/capacity`, admin
//! scope) raises the pool within its window and lets it fall after `until`;
//! two workers split a floor; `code-runner capacity` does the same from the
//! shell.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use code_runner::sandbox::{LABEL_WARM, LABEL_WORKER};
use common::daemon::{self, DaemonBuilder, KEY_A, Role, run_to_end};
use common::redis_server::RedisServer;
use common::{containers::docker, containers::list_labelled, wait_for};
use reqwest::StatusCode;
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(60);
const KEY_OPS: &str = "key-ops-0123456789";

/// The keys of these tests: `a` and `b` as usual, and `ops` with the admin
/// scope.
fn keys() -> String {
    format!("a:{KEY_A},b:{},ops:{KEY_OPS}:admin", daemon::KEY_B)
}

/// The ids of a worker's warm containers (idle ones; claimed ones too).
async fn warm_containers(worker_id: &str) -> BTreeSet<String> {
    let docker = docker().await;
    list_labelled(&docker, &format!("{LABEL_WORKER}={worker_id}"))
        .await
        .expect("docker lists containers")
        .into_iter()
        .filter(|c| {
            c.labels
                .as_ref()
                .is_some_and(|l| l.get(LABEL_WARM).is_some_and(|v| v == "1"))
        })
        .filter_map(|c| c.id)
        .collect()
}

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

async fn put_capacity(daemon: &daemon::Daemon, key: &str, body: &Value) -> (StatusCode, Value) {
    let response = daemon
        .http
        .put(format!("{}/v1/capacity", daemon.url))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("PUT /v1/capacity is answered");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn capacity(daemon: &daemon::Daemon) -> Value {
    let answer = daemon.get("/v1/capacity", Some(KEY_OPS)).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    answer.body
}

#[tokio::test]
async fn a_killed_workers_warm_sandboxes_are_reaped_and_a_live_ones_are_not() {
    let redis = RedisServer::start();
    let warm = |role| {
        DaemonBuilder::new(role, &redis)
            .env("CODE_RUNNER_API_KEYS", keys())
            .env("CODE_RUNNER_WARM_MAX", 2)
            .env("CODE_RUNNER_WARM", "python=2")
            .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
            .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 3000)
            .env("CODE_RUNNER_REAPER_INTERVAL_MS", 300)
            .env("CODE_RUNNER_REAPER_GRACE_MS", 0)
    };
    let alive = warm(Role::Serve).start().await;
    let mut doomed = warm(Role::Worker).start().await;
    let alive_ids = wait_for("the live worker's pool", WITHIN, || async {
        let ids = warm_containers(&alive.worker_id).await;
        (ids.len() == 2).then_some(ids)
    })
    .await;
    let doomed_ids = wait_for("the doomed worker's pool", WITHIN, || async {
        let ids = warm_containers(&doomed.worker_id).await;
        (ids.len() == 2).then_some(ids)
    })
    .await;

    doomed.kill9().await;
    // Its heartbeat expires; the live worker's reaper removes its sandboxes.
    wait_for(
        "the dead worker's warm sandboxes reaped",
        WITHIN,
        || async {
            warm_containers(&doomed.worker_id)
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    // The counter is raised once a removal returned, just after.
    alive
        .wait_metric(
            "code_runner_reaper_orphans_total{kind=\"container\"}",
            doomed_ids.len() as f64,
            WITHIN,
        )
        .await;
    // The live worker's pool was never touched.
    assert_eq!(warm_containers(&alive.worker_id).await, alive_ids);

    // A job on the live worker starts warm, on the runtime started ahead.
    let answer = alive.submit_wait(&daemon::python("print('warm')")).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    assert_eq!(
        answer.body["result"]["start"], "warm_runtime",
        "{answer:#?}"
    );
    assert_eq!(daemon::run_stdout(&answer.body), "warm\n");
}

/// A worker whose warm pool's memory reserve the machine does not have
/// starts no warm sandbox, says so in its log, on /metrics and in the
/// capacity view, and runs its jobs cold.
#[tokio::test]
async fn a_worker_short_of_its_memory_reserve_starts_no_warm_sandbox() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_API_KEYS", keys())
        .env("CODE_RUNNER_WARM_MAX", 2)
        .env("CODE_RUNNER_WARM", "python=2")
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
        // A petabyte: more than this machine has available.
        .env("CODE_RUNNER_WARM_MEMORY_RESERVE_MB", 1u64 << 30)
        .start()
        .await;
    let metrics = daemon
        .wait_metric("code_runner_warm_memory_held", 1.0, WITHIN)
        .await;
    assert_eq!(
        daemon::metric(&metrics, "code_runner_warm_target{language=\"python\"}"),
        Some(2.0),
        "{metrics}"
    );
    assert!(
        daemon.log().contains(
            "warm sandboxes wait to be started: the machine has less memory available than the pool's reserve"
        ),
        "{}",
        daemon.log()
    );
    // The capacity view counts the worker, and the shell says why.
    let view = wait_for("the worker counted as held", WITHIN, || async {
        let view = capacity(&daemon).await;
        (view["memory_held_workers"] == 1).then_some(view)
    })
    .await;
    assert_eq!(view["workers"], 1, "{view}");
    let output = run_to_end(
        &["capacity", "list"],
        &[
            ("CODE_RUNNER_URL", daemon.url.as_str()),
            ("CODE_RUNNER_API_KEY", KEY_OPS),
        ],
    );
    assert!(output.status.success(), "{output:?}");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("live workers: 1\n1 of them start no warm sandbox: their machine has less memory available than CODE_RUNNER_WARM_MEMORY_RESERVE_MB\n"),
        "{table}"
    );
    let answer = daemon.submit_wait(&daemon::python("print('cold')")).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    assert_eq!(answer.body["result"]["start"], "cold", "{answer:#?}");
    assert_eq!(daemon::run_stdout(&answer.body), "cold\n");
    // Looked at again every second since: still nothing started.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(warm_containers(&daemon.worker_id).await.is_empty());
    let metrics = daemon.metrics().await;
    assert_eq!(
        daemon::metric(&metrics, "code_runner_warm_ready{language=\"python\"}"),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        daemon::metric(&metrics, "code_runner_warm_memory_held"),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_schedule_entry_raises_the_pool_in_its_window_and_lets_it_fall_after() {
    let redis = RedisServer::start();
    let serve = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_API_KEYS", keys())
        .env("CODE_RUNNER_WARM_MAX", 4)
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 3000)
        .start()
        .await;

    // Only an admin key may change the schedule, and bad entries say why.
    // The window is long enough for three sandboxes to start (two at a
    // time) and a job to run on a busy machine.
    let now = SystemTime::now();
    let until = now + Duration::from_secs(40);
    let entry = json!({
        "language": "python",
        "warm": 3,
        "until": rfc3339(until),
    });
    let (status, body) = put_capacity(&serve, KEY_A, &entry).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    assert_eq!(
        serve.get("/v1/capacity", Some(KEY_A)).await.status,
        StatusCode::FORBIDDEN
    );
    for (bad, field) in [
        (
            json!({"language": "cobol", "warm": 3, "until": entry["until"]}),
            "language",
        ),
        (
            json!({"language": "python", "warm": 0, "until": entry["until"]}),
            "warm",
        ),
        (
            json!({"language": "python", "warm": 3, "until": "soon"}),
            "until",
        ),
        (
            json!({"language": "python", "warm": 3, "until": rfc3339(now - Duration::from_secs(60))}),
            "until",
        ),
        (
            json!({"language": "python", "warm": 3, "from": "yesterday", "until": entry["until"]}),
            "from",
        ),
    ] {
        let (status, body) = put_capacity(&serve, KEY_OPS, &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["error"]["field"], field, "{bad}: {body}");
    }
    // Nothing is warm before the entry.
    assert!(warm_containers(&serve.worker_id).await.is_empty());

    let (status, created) = put_capacity(&serve, KEY_OPS, &entry).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["language"], "python");
    assert_eq!(created["warm"], 3);
    assert_eq!(created["active"], true);
    assert_eq!(created["created_by"], "ops");

    // Within the window the pool holds the floor.
    let view = wait_for("three ready python sandboxes", WITHIN, || async {
        let view = capacity(&serve).await;
        (view["languages"]["python"]["ready"] == 3).then_some(view)
    })
    .await;
    assert_eq!(view["workers"], 1);
    assert_eq!(view["entries"][0]["id"], created["id"]);
    assert_eq!(view["languages"]["python"]["floor"], 3);
    assert_eq!(view["languages"]["python"]["target"], 3);
    assert_eq!(view["languages"]["python"]["short"], false);
    assert_eq!(warm_containers(&serve.worker_id).await.len(), 3);
    serve
        .wait_metric("code_runner_warm_ready{language=\"python\"}", 3.0, WITHIN)
        .await;
    serve
        .wait_metric("code_runner_warm_target{language=\"python\"}", 3.0, WITHIN)
        .await;
    let answer = serve.submit_wait(&daemon::python("print(7)")).await;
    assert_eq!(
        answer.body["result"]["start"], "warm_runtime",
        "{answer:#?}"
    );

    // After `until`, it falls back to the worker's own floor (none).
    let fall = until.duration_since(SystemTime::now()).unwrap_or_default() + WITHIN;
    wait_for("the pool to fall after until", fall, || async {
        warm_containers(&serve.worker_id)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let view = capacity(&serve).await;
    assert_eq!(view["entries"], json!([]), "{view}");
    let answer = serve.submit_wait(&daemon::python("print(8)")).await;
    assert_eq!(answer.body["result"]["start"], "cold", "{answer:#?}");
}

#[tokio::test]
async fn two_workers_split_the_floor_and_the_cli_manages_the_schedule() {
    let redis = RedisServer::start();
    let node = |role| {
        DaemonBuilder::new(role, &redis)
            .env("CODE_RUNNER_API_KEYS", keys())
            .env("CODE_RUNNER_WARM_MAX", 2)
            .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
            .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 3000)
    };
    let serve = node(Role::Serve).start().await;
    let worker = node(Role::Worker).start().await;
    let env = [
        ("CODE_RUNNER_URL", serve.url.as_str()),
        ("CODE_RUNNER_API_KEY", KEY_OPS),
    ];
    let until = rfc3339(SystemTime::now() + Duration::from_secs(600));

    // 3 over two workers: 2 + 1.
    let output = run_to_end(
        &[
            "capacity",
            "set",
            "--language",
            "py",
            "--warm",
            "3",
            "--until",
            &until,
            "--json",
        ],
        &env,
    );
    assert!(output.status.success(), "{output:?}");
    let created: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(created["language"], "python");
    let id = created["id"].as_str().unwrap().to_string();

    // The heartbeats and the containers must both show the split, in one
    // probe: before a worker saw the other one it held 2 (its WARM_MAX),
    // and an older heartbeat or a container not yet removed can say so.
    wait_for(
        "the floor held by two workers, 2 + 1, target 3",
        WITHIN,
        || async {
            let view = capacity(&serve).await;
            let python = &view["languages"]["python"];
            if view["workers"] != 2 || python["ready"] != 3 || python["target"] != 3 {
                return None;
            }
            let mut shares = [
                warm_containers(&serve.worker_id).await.len(),
                warm_containers(&worker.worker_id).await.len(),
            ];
            shares.sort();
            (shares == [1, 2]).then_some(())
        },
    )
    .await;

    // A floor the fleet cannot hold (2 workers × WARM_MAX 2) says so.
    let output = run_to_end(
        &[
            "capacity",
            "set",
            "--language",
            "python",
            "--warm",
            "3",
            "--until",
            &until,
        ],
        &env,
    );
    assert!(output.status.success(), "{output:?}");
    let view = wait_for("the shortfall", WITHIN, || async {
        let view = capacity(&serve).await;
        (view["languages"]["python"]["floor"] == 6 && view["languages"]["python"]["target"] == 4)
            .then_some(view)
    })
    .await;
    assert_eq!(view["languages"]["python"]["short"], true, "{view}");
    assert_eq!(view["languages"]["python"]["missing"], 2, "{view}");
    let output = run_to_end(&["capacity", "list"], &env);
    assert!(output.status.success(), "{output:?}");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains(&id), "{table}");
    assert!(
        table.contains("short by 2: add workers or raise CODE_RUNNER_WARM_MAX"),
        "{table}"
    );

    // Clearing every entry lets both pools fall.
    let listed = capacity(&serve).await;
    for entry in listed["entries"].as_array().unwrap() {
        let output = run_to_end(&["capacity", "clear", entry["id"].as_str().unwrap()], &env);
        assert!(output.status.success(), "{output:?}");
    }
    let output = run_to_end(&["capacity", "clear", &id], &env);
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("404: capacity entry not found"),
        "{output:?}"
    );
    // A key without the admin scope is refused with a line saying why.
    let output = run_to_end(
        &["capacity", "list"],
        &[
            ("CODE_RUNNER_URL", serve.url.as_str()),
            ("CODE_RUNNER_API_KEY", KEY_A),
        ],
    );
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("admin scope"),
        "{output:?}"
    );
    wait_for("both pools to fall", WITHIN, || async {
        (warm_containers(&serve.worker_id).await.is_empty()
            && warm_containers(&worker.worker_id).await.is_empty())
        .then_some(())
    })
    .await;
}
