//! Capacity: a worker never runs more jobs' sandboxes than
//! `WORKER_MAX_SANDBOXES`, however many jobs arrive at once, and never keeps
//! more than as many again of ended jobs' containers (their supervisors
//! idle, or stopped) waiting to be removed (the removal queue). In a test
//! binary of its own, so nothing else competes for the machine while it
//! samples.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use bollard::models::ContainerSummary;
use std::time::{Duration, Instant};

use code_runner::sandbox::LABEL_WORKER;
use common::containers::{docker, holds_a_sandbox, list_labelled, processes};
use common::daemon;
use common::redis_server::RedisServer;
use daemon::{DaemonBuilder, Role, metric, python, run_stdout};
use reqwest::StatusCode;

const JOBS: usize = 40;
const SLOTS: usize = 3;
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_jobs_on_three_slots_all_complete_and_never_more_than_three_run_a_job() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", SLOTS)
        .start()
        .await;
    let docker = docker().await;
    let done = AtomicBool::new(false);
    let started = Instant::now();

    // Every ~50 ms: how many containers with this worker's label hold a
    // job (created, or running a process besides the supervisor), and how
    // many exist at all (with the ended jobs' ones waiting in the removal
    // queue, their supervisors idle or stopped).
    let label = format!("{LABEL_WORKER}={}", daemon.worker_id);
    let containers = async {
        let (mut max, mut max_all, mut samples) = (0, 0, 0);
        while !done.load(Ordering::Relaxed) {
            let listed = list_labelled(&docker, &label).await.expect("docker lists");
            let mut live = 0;
            for container in listed.iter().filter(|c| holds_a_sandbox(c)) {
                live += usize::from(holds_a_job(&docker, container).await);
            }
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
                    .submit(&python(&format!(
                        "import time\ntime.sleep(0.3)\nprint({i})\n"
                    )))
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
    let (submitted, (max_containers, max_all, container_samples), (max_used, slot_samples)) =
        tokio::join!(jobs, containers, slots);
    let elapsed = started.elapsed();
    eprintln!(
        "{JOBS} jobs on {SLOTS} slots: submitted in {submitted:?}, all done in {elapsed:?}; \
         {container_samples} container samples (max {max_containers} holding a job, {max_all} in all), \
         {slot_samples} metric samples (max slots_used {max_used})"
    );
    assert!(
        max_containers <= SLOTS,
        "{max_containers} sandboxes holding a job (created, or running more than the supervisor) at once"
    );
    assert!(
        max_all <= 2 * SLOTS,
        "{max_all} containers existed at once (slots plus the removal queue's bound: {})",
        2 * SLOTS
    );
    assert!(max_used <= SLOTS as f64, "slots_used reached {max_used}");
    // The samplers did see the work, and the worker used its slots.
    assert!(container_samples >= 10 && slot_samples >= 10);
    assert!(max_containers >= 1, "no container was ever seen");
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
    daemon.assert_no_containers(&docker).await;
}

/// Whether a container holds a job: created (about to run one), or
/// running a process besides its supervisor (`docker top`). A container
/// that ended meanwhile holds none.
async fn holds_a_job(docker: &bollard::Docker, container: &ContainerSummary) -> bool {
    if container.state.as_ref().map(|s| s.to_string()).as_deref() == Some("created") {
        return true;
    }
    let Some(id) = container.id.as_deref() else {
        return false;
    };
    processes(docker, id).await.len() > 1
}
