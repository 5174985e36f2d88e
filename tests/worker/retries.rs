//! Retries of lost batch jobs: a batch job whose worker is killed while
//! it runs runs again on another worker (an `attempt` event in its stream,
//! its output from the new attempt only, never two sandboxes of it at
//! once); an interactive job on the same worker is never run again. And
//! the API's bounds on a job's attempts.
//!
//! In-process daemons on one scripted host, a real redis-server; every
//! process is stopped when its guard drops, also when the test fails.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use code_runner::job::Encoding;
use code_runner::job::events::JobEvent;
use code_runner::store::Store;
use serde_json::json;

use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;
use crate::common::scripted::{self, ScriptedHost};
use crate::common::wait_for;
use crate::world::assert_no_sandboxes;

fn fast(builder: InProcessBuilder) -> InProcessBuilder {
    builder
        .env("CODE_RUNNER_HEARTBEAT_INTERVAL_MS", 300)
        .env("CODE_RUNNER_HEARTBEAT_TTL_MS", 1000)
        .env("CODE_RUNNER_REAPER_INTERVAL_MS", 300)
        .env("CODE_RUNNER_REAPER_GRACE_MS", 1000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_batch_job_runs_again_and_a_lost_interactive_one_never() {
    let redis = RedisServer::start();
    let host = ScriptedHost::new();
    // Every job may be started twice unless it says otherwise.
    let api = InProcessBuilder::new(Role::Api, &redis)
        .host(&host)
        .env("CODE_RUNNER_MAX_ATTEMPTS", 2)
        .start()
        .await;
    let mut doomed = fast(InProcessBuilder::new(Role::Worker, &redis))
        .host(&host)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .start()
        .await;
    let batch = api
        .submit(&scripted::json(
            "print attempt output\nsleep 3000\nprint done",
        ))
        .await
        .id();
    let mut interactive = scripted::json("readline");
    interactive["interactive"] = json!(true);
    let interactive = api.submit(&interactive).await.id();
    for id in [&batch, &interactive] {
        api.wait_status(id, &["running"], Duration::from_secs(60))
            .await;
        wait_for("the job's sandbox", Duration::from_secs(30), || async {
            has_sandbox(&host, id).then_some(())
        })
        .await;
    }
    let view = api.job(&batch).await;
    assert_eq!(view["max_attempts"], 2, "{view:#}");
    assert_eq!(api.job(&interactive).await["max_attempts"], 1);
    let store = Store::new(&redis.url(), "", Duration::from_secs(3600), 2).unwrap();
    wait_for(
        "the first attempt's output",
        Duration::from_secs(30),
        || async {
            let events = store.events().since(&batch, 0, 100).await.unwrap();
            events
                .iter()
                .any(|e| e.json.contains("attempt output"))
                .then_some(())
        },
    )
    .await;

    // As SIGKILL: its sandboxes stay until a reaper removes them.
    doomed.crash();
    let survivor = fast(InProcessBuilder::new(Role::Worker, &redis))
        .host(&host)
        .start()
        .await;

    let view = api.wait_terminal(&batch, Duration::from_secs(60)).await;
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(view["attempts"], 2, "{view:#}");
    assert_eq!(view["worker"], survivor.worker_id.as_str());
    assert_eq!(view["result"]["run"]["stdout"], "attempt output\ndone\n");
    let events: Vec<JobEvent> = store
        .events()
        .since(&batch, 0, 1000)
        .await
        .unwrap()
        .iter()
        .map(|e| e.event().unwrap())
        .collect();
    let attempt = events
        .iter()
        .position(|e| matches!(e, JobEvent::Attempt { .. }))
        .unwrap_or_else(|| panic!("no attempt event: {events:#?}"));
    match &events[attempt] {
        JobEvent::Attempt {
            attempt,
            reason,
            worker,
        } => {
            assert_eq!(*attempt, 2);
            assert_eq!(reason, "worker_lost");
            assert_eq!(worker.as_deref(), Some(doomed.worker_id.as_str()));
        }
        other => panic!("{other:?}"),
    }
    // The first attempt's output comes before the attempt event, the
    // second attempt's after it.
    let stdout = |events: &[JobEvent]| -> String {
        events
            .iter()
            .filter_map(|e| match e {
                JobEvent::Stdout { data, encoding } => Some(match encoding {
                    Encoding::Utf8 => data.clone(),
                    Encoding::Base64 => String::from_utf8(STANDARD.decode(data).unwrap()).unwrap(),
                }),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        stdout(&events[..attempt]),
        "attempt output\n",
        "{events:#?}"
    );
    assert_eq!(
        stdout(&events[attempt..]),
        "attempt output\ndone\n",
        "{events:#?}"
    );
    assert_eq!(host.starts(&batch), 2, "two sandboxes, one after the other");

    let view = api
        .wait_terminal(&interactive, Duration::from_secs(30))
        .await;
    assert_eq!(view["status"], "error", "{view:#}");
    assert_eq!(view["result"]["reason"], "worker_lost", "{view:#}");
    assert_eq!(view["attempts"], 1, "{view:#}");
    assert_eq!(host.starts(&interactive), 1);

    let overlaps = host.overlaps();
    assert!(
        overlaps.is_empty(),
        "a job ran twice at once: {overlaps:#?}"
    );
    assert_no_sandboxes(&survivor).await;
    assert_no_sandboxes(&doomed).await;
}

/// Whether a sandbox of job `id` is on the host.
fn has_sandbox(host: &Arc<ScriptedHost>, id: &str) -> bool {
    host.sandboxes()
        .iter()
        .any(|c| c.job.as_deref() == Some(id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_attempts_is_checked_per_job() {
    let redis = RedisServer::start();
    let api = InProcessBuilder::new(Role::Api, &redis).start().await;
    for (max_attempts, interactive, field_says) in [
        (json!(0), false, "0 is not between 1 and 10"),
        (json!(11), false, "11 is not between 1 and 10"),
        (json!(2), true, "an interactive job runs at most once"),
    ] {
        let mut job = scripted::json("print 1");
        job["max_attempts"] = max_attempts;
        job["interactive"] = json!(interactive);
        let answer = api.submit(&job).await;
        assert_eq!(answer.status.as_u16(), 400, "{answer:#?}");
        let (code, message) = answer.error();
        assert_eq!(code, "invalid_job");
        assert_eq!(answer.body["error"]["field"], "max_attempts");
        assert!(message.contains(field_says), "{message}");
    }
}
