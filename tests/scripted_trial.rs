mod common;

use std::time::Duration;

use common::daemon::Role;
use common::in_process::InProcessBuilder;
use common::redis_server::RedisServer;
use common::scripted;
use reqwest::StatusCode;

#[tokio::test]
async fn a_scripted_job_runs_in_process() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Serve, &redis).start().await;
    let answer = daemon
        .submit_wait(&scripted::json("print hi\neprint oops\nexit 3"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    assert_eq!(answer.body["status"], "failed", "{answer:#?}");
    assert_eq!(answer.body["result"]["run"]["stdout"], "hi\n");
    assert_eq!(answer.body["result"]["run"]["stderr"], "oops\n");
    assert_eq!(answer.body["result"]["run"]["exit_code"], 3);
    let mut job = scripted::json("sleep 5000");
    job["limits"] = serde_json::json!({"wall_ms": 300});
    let answer = daemon.submit_wait(&job).await;
    assert_eq!(answer.body["status"], "timed_out", "{answer:#?}");
    assert_eq!(answer.body["result"]["run"]["reason"], "wall_timeout");
    let id = daemon.submit(&scripted::json("sleep 60000")).await.id();
    daemon
        .wait_status(&id, &["running"], Duration::from_secs(10))
        .await;
    assert_eq!(daemon.host.sandboxes_of(&daemon.worker_id).len(), 1);
    daemon.cancel(&id).await;
    let view = daemon.wait_terminal(&id, Duration::from_secs(10)).await;
    assert_eq!(view["status"], "cancelled", "{view:#}");
    for _ in 0..50 {
        if daemon.host.sandboxes().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(daemon.host.sandboxes().is_empty());
}
