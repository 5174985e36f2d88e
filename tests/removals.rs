//! While a worker's slots are busy, the containers of jobs that ended by
//! themselves wait in a queue to be removed, one at a time (not in the job's
//! slot, not against the running jobs): the removal still happens once the
//! slots are free, and if the worker dies with containers queued, another
//! worker's reaper removes them.

mod common;

use std::time::Duration;

use common::containers::docker;
use common::daemon::{self, DaemonBuilder, Role, job_containers, sleeper};
use common::redis_server::RedisServer;
use common::wait_for;

const WITHIN: Duration = Duration::from_secs(60);

/// A worker of two slots: one busy job makes it busy (half its slots).
fn two_slots(role: Role, redis: &RedisServer) -> DaemonBuilder {
    DaemonBuilder::new(role, redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 3000)
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", 300)
        .env("CODE_RUNNER_REAPER_GRACE_MS", 0)
}

/// Submits a long job, then a quick one that ends while the long one runs;
/// returns their ids once the quick one has succeeded.
async fn quick_beside_long(server: &daemon::Daemon, long_secs: f64) -> (String, String) {
    let long = server.submit(&sleeper(long_secs)).await.id();
    server.wait_status(&long, &["running"], WITHIN).await;
    let quick = server.submit_wait(&daemon::python("print('quick')")).await;
    assert_eq!(quick.status, 200, "{quick:#?}");
    assert_eq!(quick.body["status"], "succeeded", "{quick:#?}");
    (long, quick.id())
}

#[tokio::test]
async fn a_removal_waits_while_the_slots_are_busy_and_is_done_after() {
    let redis = RedisServer::start();
    let server = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    let (long, quick) = quick_beside_long(&server, 4.0).await;
    // The quick job's container stopped by itself and waits its turn.
    server
        .wait_metric("code_runner_removals_queued", 1.0, WITHIN)
        .await;
    assert_eq!(job_containers(&docker, &quick).await.len(), 1);
    assert_eq!(server.job(&long).await["status"], "running");
    // Once the long job is over, both are removed.
    server.wait_terminal(&long, WITHIN).await;
    wait_for("both containers removed", WITHIN, || async {
        (job_containers(&docker, &quick).await.is_empty()
            && job_containers(&docker, &long).await.is_empty())
        .then_some(())
    })
    .await;
    server
        .wait_metric("code_runner_removals_queued", 0.0, WITHIN)
        .await;
}

#[tokio::test]
async fn removals_off_removes_in_the_slot_at_once() {
    let redis = RedisServer::start();
    let server = two_slots(Role::Serve, &redis)
        .env("CODE_RUNNER_YIELD_WHILE_BUSY", "off")
        .start()
        .await;
    let docker = docker().await;
    let (long, quick) = quick_beside_long(&server, 3.0).await;
    wait_for("the quick job's container removed", WITHIN, || async {
        job_containers(&docker, &quick)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert_eq!(server.job(&long).await["status"], "running");
    assert_eq!(
        daemon::metric(&server.metrics().await, "code_runner_removals_queued"),
        Some(0.0)
    );
}

#[tokio::test]
async fn queued_removals_of_a_dead_worker_are_reaped() {
    let redis = RedisServer::start();
    let mut doomed = two_slots(Role::Serve, &redis).start().await;
    let docker = docker().await;
    let (long, quick) = quick_beside_long(&doomed, 30.0).await;
    doomed
        .wait_metric("code_runner_removals_queued", 1.0, WITHIN)
        .await;
    assert_eq!(job_containers(&docker, &quick).await.len(), 1);
    doomed.kill9().await;
    // Another worker's reaper finds the dead worker's containers: the queued
    // one and the long job's.
    let _reaper = two_slots(Role::Serve, &redis).start().await;
    wait_for("the dead worker's containers reaped", WITHIN, || async {
        (job_containers(&docker, &quick).await.is_empty()
            && job_containers(&docker, &long).await.is_empty())
        .then_some(())
    })
    .await;
}
