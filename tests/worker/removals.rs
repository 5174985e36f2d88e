//! The worker's removal queue on sandboxes that exited by themselves: one
//! waits while the slots are busy and is removed after, removals off
//! removes in the slot at once, a sandbox that did not end by itself is
//! removed at once anyway, and a dead worker's queued removals are reaped
//! by another worker.
//!
//! The scripted engine keeps no warm pool: what a lingering warm
//! sandbox's supervisor holds (nothing of its job) is tested on real
//! containers (`tests/daemon/removals.rs`).

use std::sync::Arc;
use std::time::Duration;

use crate::common::client::metric;
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;
use crate::common::scripted::{self, ScriptedHost};
use crate::common::wait_for;

const WITHIN: Duration = Duration::from_secs(60);
const QUICK: &str = "print quick";
const QUEUED: &str = "code_runner_removals_queued";

/// A worker (with an API) of two slots: one busy job makes it busy (half
/// its slots).
fn two_slots(redis: &RedisServer, host: &Arc<ScriptedHost>) -> InProcessBuilder {
    InProcessBuilder::new(Role::Serve, redis)
        .host(host)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 3000)
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", 300)
        .env("CODE_RUNNER_REAPER_GRACE_MS", 0)
}

/// A job that sleeps `seconds` then prints `done`.
fn sleeper(seconds: u64) -> serde_json::Value {
    scripted::json(&format!("sleep {}\nprint done", seconds * 1000))
}

/// Submits a long job, then a quick one (`quick`) that ends while the long
/// one runs; returns their ids once the quick one has ended as it should.
async fn quick_beside_long(
    server: &InProcess,
    long_secs: u64,
    quick: &str,
    status: &str,
) -> (String, String) {
    let long = server.submit(&sleeper(long_secs)).await.id();
    server.wait_status(&long, &["running"], WITHIN).await;
    let answer = server.submit_wait(&scripted::json(quick)).await;
    assert_eq!(answer.status, 200, "{answer:#?}");
    assert_eq!(answer.body["status"], status, "{answer:#?}");
    assert_eq!(answer.body["result"]["start"], "cold", "{answer:#?}");
    (long, answer.id())
}

/// Whether a sandbox of job `id` is on the host.
fn has_sandbox(host: &ScriptedHost, id: &str) -> bool {
    host.sandboxes()
        .iter()
        .any(|c| c.job.as_deref() == Some(id))
}

/// Whether the program of job `id` runs in a sandbox of the host.
fn runs(host: &ScriptedHost, id: &str) -> bool {
    let running = host.running();
    host.sandboxes()
        .iter()
        .any(|c| c.job.as_deref() == Some(id) && running.contains(&c.id))
}

#[tokio::test]
async fn a_cold_jobs_removal_waits_while_the_slots_are_busy_and_is_done_after() {
    let redis = RedisServer::start();
    let host = ScriptedHost::new();
    let server = two_slots(&redis, &host).start().await;
    let (long, quick) = quick_beside_long(&server, 4, QUICK, "succeeded").await;
    server.wait_metric(QUEUED, 1.0, WITHIN).await;
    // It exited by itself, and waits: its program no longer runs.
    assert!(has_sandbox(&host, &quick), "{:#?}", host.sandboxes());
    assert!(!runs(&host, &quick));
    // The long job still runs (so the queued sandbox waited for it); once
    // it is over, the queued sandbox is removed.
    assert_eq!(server.job(&long).await["status"], "running");
    server.wait_terminal(&long, WITHIN).await;
    wait_for("the queued sandboxes removed", WITHIN, || async {
        let text = server.metrics().await;
        (metric(&text, QUEUED) == Some(0.0) && host.sandboxes().is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn removals_off_removes_in_the_slot_at_once() {
    let redis = RedisServer::start();
    let host = ScriptedHost::new();
    let server = two_slots(&redis, &host)
        .env("CODE_RUNNER_YIELD_WHILE_BUSY", "off")
        .start()
        .await;
    let (long, quick) = quick_beside_long(&server, 3, QUICK, "succeeded").await;
    wait_for("the quick job's sandbox removed", WITHIN, || async {
        (!has_sandbox(&host, &quick)).then_some(())
    })
    .await;
    assert_eq!(server.job(&long).await["status"], "running");
    assert_eq!(metric(&server.metrics().await, QUEUED), Some(0.0));
}

/// A sandbox that died (its job an `error`) did not end by itself: it is
/// removed in its slot at once, busy or not, and never queued.
#[tokio::test]
async fn a_sandbox_that_did_not_end_by_itself_is_removed_at_once() {
    let redis = RedisServer::start();
    let host = ScriptedHost::new();
    let server = two_slots(&redis, &host).start().await;
    let (long, crashed) = quick_beside_long(&server, 4, "print up\ncrash", "error").await;
    wait_for("the crashed job's sandbox removed", WITHIN, || async {
        (!has_sandbox(&host, &crashed)).then_some(())
    })
    .await;
    assert_eq!(server.job(&long).await["status"], "running");
    assert_eq!(metric(&server.metrics().await, QUEUED), Some(0.0));
}

#[tokio::test]
async fn a_dead_workers_queued_removals_are_reaped() {
    let redis = RedisServer::start();
    let host = ScriptedHost::new();
    let mut doomed = two_slots(&redis, &host).start().await;
    let doomed_id = doomed.worker_id.clone();
    let (_long, quick) = quick_beside_long(&doomed, 30, QUICK, "succeeded").await;
    doomed.wait_metric(QUEUED, 1.0, WITHIN).await;
    assert!(has_sandbox(&host, &quick));
    doomed.crash();
    assert_eq!(
        host.sandboxes_of(&doomed_id).len(),
        2,
        "the queued one and the long job's"
    );
    // Another worker's reaper finds the dead worker's sandboxes: the
    // queued one and the long job's.
    let _reaper = two_slots(&redis, &host).start().await;
    wait_for("the dead worker's sandboxes reaped", WITHIN, || async {
        host.sandboxes_of(&doomed_id).is_empty().then_some(())
    })
    .await;
}
