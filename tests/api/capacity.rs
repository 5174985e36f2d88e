//! Capacity: a worker never runs more jobs' sandboxes than
//! `WORKER_MAX_SANDBOXES`, however many jobs arrive at once, and never keeps
//! more than as many again of ended jobs' sandboxes waiting to be removed
//! (the removal queue). A whole `code-runner serve` in the test on the
//! scripted engine, whose host says how many sandboxes exist and how many
//! run a job's program.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::common::client::{metric, run_stdout};
use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;
use crate::common::scripted;

const JOBS: usize = 40;
const SLOTS: usize = 3;
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_jobs_on_three_slots_all_complete_and_never_more_than_three_run_a_job() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", SLOTS)
        .start()
        .await;
    let done = AtomicBool::new(false);
    let started = Instant::now();

    // Every ~50 ms: how many of this worker's sandboxes hold a job (run
    // its program), and how many exist at all (with the ended jobs' ones
    // waiting in the removal queue).
    let sandboxes = async {
        let (mut max, mut max_all, mut samples) = (0, 0, 0);
        while !done.load(Ordering::Relaxed) {
            let listed = daemon.host.sandboxes_of(&daemon.worker_id);
            let live = daemon.host.running().len();
            max = max.max(live);
            max_all = max_all.max(listed.len());
            samples += 1;
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        (max, max_all, samples)
    };
    // Every ~50 ms: the worker's own view of its slots.
    let slots = async {
        let (mut max, mut samples) = (0.0f64, 0);
        while !done.load(Ordering::Relaxed) {
            let text = daemon.metrics().await;
            let used = metric(&text, "code_runner_slots_used").expect("code_runner_slots_used");
            assert_eq!(
                metric(&text, "code_runner_slots_max"),
                Some(SLOTS as f64),
                "{text}"
            );
            max = max.max(used);
            samples += 1;
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        (max, samples)
    };
    let jobs = async {
        // All at once.
        let submissions = (0..JOBS).map(|i| {
            let daemon = &daemon;
            async move {
                let answer = daemon
                    .submit(&scripted::json(&format!("sleep 300\nprint {i}\n")))
                    .await;
                assert_eq!(answer.status, StatusCode::ACCEPTED, "job {i}: {answer:#?}");
                answer.id()
            }
        });
        let ids = futures_util::future::join_all(submissions).await;
        let submitted = started.elapsed();
        // They run in parallel in the daemon; waiting for them one by one
        // costs no time and keeps the polling light.
        for (i, id) in ids.iter().enumerate() {
            let view = daemon.wait_terminal(id, Duration::from_secs(240)).await;
            assert_eq!(view["status"], "succeeded", "job {i}: {view:#}");
            assert_eq!(run_stdout(&view), format!("{i}\n"), "job {i}: {view:#}");
            assert_eq!(view["attempts"], 1, "job {i}: {view:#}");
        }
        done.store(true, Ordering::Relaxed);
        submitted
    };
    let (submitted, (max_sandboxes, max_all, sandbox_samples), (max_used, slot_samples)) =
        tokio::join!(jobs, sandboxes, slots);
    let elapsed = started.elapsed();
    eprintln!(
        "{JOBS} jobs on {SLOTS} slots: submitted in {submitted:?}, all done in {elapsed:?}; \
         {sandbox_samples} sandbox samples (max {max_sandboxes} holding a job, {max_all} in all), \
         {slot_samples} metric samples (max slots_used {max_used})"
    );
    assert!(
        max_sandboxes <= SLOTS,
        "{max_sandboxes} sandboxes holding a job at once"
    );
    assert!(
        max_all <= 2 * SLOTS,
        "{max_all} sandboxes existed at once (slots plus the removal queue's bound: {})",
        2 * SLOTS
    );
    assert!(max_used <= SLOTS as f64, "slots_used reached {max_used}");
    // The samplers did see the work, and the worker used its slots.
    assert!(sandbox_samples >= 10 && slot_samples >= 10);
    assert!(max_sandboxes >= 1, "no sandbox was ever seen");
    assert_eq!(
        max_used, SLOTS as f64,
        "the worker never used all its slots"
    );

    let text = daemon
        .wait_metric("code_runner_slots_used", 0.0, Duration::from_secs(10))
        .await;
    assert_eq!(
        metric(
            &text,
            "code_runner_jobs_total{language=\"python\",status=\"succeeded\"}"
        ),
        Some(JOBS as f64),
        "{text}"
    );
    assert_eq!(metric(&text, "code_runner_queue_depth"), Some(0.0));
    assert_eq!(redis.queue_depth(), 0);
    daemon.assert_no_sandboxes().await;
}
