//! The usage ledger counts a real program's figures: a busy loop run in a
//! real sandbox by `code-runner serve`, read back through `GET /v1/usage`.
//! (The ledger's arithmetic, the quotas and `code-runner usage` are tested
//! without Docker in the `api` binary.)

use crate::common;

use code_runner::store::{Day, now_ms};
use common::daemon::{DaemonBuilder, KEY_A, KEY_B, Role};
use common::redis_server::RedisServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// How long the test may take: it starts at least this long before a UTC
/// midnight, so that "today" does not change under it.
const LEDGER_DAY_TEST_MAX: std::time::Duration = std::time::Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_job_is_counted_with_its_results_figures() {
    common::clear_of_utc_midnight(LEDGER_DAY_TEST_MAX).await;
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
    daemon.assert_no_containers(&docker).await;
}
