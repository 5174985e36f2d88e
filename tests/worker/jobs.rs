//! The worker's claims and jobs: a job runs and its keys expire, never
//! more sandboxes than slots, claims in up to four loops, cancellation
//! while queued and while running, the drain at shutdown, a claim that
//! comes after the shutdown began, and a job this worker cannot run.

use std::time::{Duration, Instant};

use code_runner::job::events::JobEvent;
use code_runner::job::{JobResult, Status};
use code_runner::store::CancelOutcome;
use tokio_util::sync::CancellationToken;

use crate::common::scripted;
use crate::common::wait_for;
use crate::world::{
    JOB_DEADLINE, World, checked_stream, claims_in_flight, run_stdout, sample, streamed_stdout,
    wait_for_stdout,
};

fn cancelled_result(language: &str) -> JobResult {
    JobResult::without_stages(Status::Cancelled, language, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_python_job_succeeds_and_its_keys_expire() {
    let world = World::new().await;
    let id = world
        .submit(&scripted::job("print hello from the worker"))
        .await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(run_stdout(&record), "hello from the worker\n");
    assert_eq!(record.worker.as_deref(), Some(world.worker_id()));
    assert_eq!(record.attempts, 1);
    world.assert_settled(&id).await;

    let heartbeat = world.heartbeat().await.expect("the worker heartbeats");
    assert_eq!(heartbeat["slots_max"], 2);
    assert_eq!(heartbeat["version"], env!("CARGO_PKG_VERSION"));
    let text = world.metrics.render();
    assert!(
        text.contains("code_runner_jobs_total{language=\"python\",status=\"succeeded\"} 1"),
        "{text}"
    );
    assert!(text.contains("code_runner_slots_max 2"), "{text}");

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    assert_eq!(world.heartbeat().await, None, "the heartbeat is retired");
    world.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_sandboxes_than_slots() {
    let world = World::new().await;
    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(world.submit(&scripted::job("sleep 500\nprint ok")).await);
    }
    let stop = CancellationToken::new();
    let sampler = sample(&world, stop.clone());
    let mut worker = world.start_worker(2, Duration::from_secs(30));

    for id in &ids {
        world.assert_succeeded(id, "ok\n", JOB_DEADLINE * 2).await;
    }
    stop.cancel();
    let samples = sampler.await.expect("the sampler ran");
    assert!(
        samples.max_containers <= 2,
        "{} sandboxes running at once: {samples:?}",
        samples.max_containers
    );
    // With the ended jobs' exited sandboxes waiting in the removal queue
    // (at most one per slot).
    assert!(
        samples.max_all <= 4,
        "{} sandboxes at once: {samples:?}",
        samples.max_all
    );
    assert_eq!(samples.max_slots_used, 2, "{samples:?}");
    assert!(samples.count > 10, "too few samples: {samples:?}");
    // The last slots are given back once their sandboxes are removed,
    // right after the results.
    wait_for("every slot back", Duration::from_secs(10), || async {
        (world.metrics.slots_used.get() == 0).then_some(())
    })
    .await;
    assert_eq!(world.processing_len().await, 0);

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_cancelled_while_queued_never_runs() {
    let world = World::new().await;
    let cancelled = world.submit(&scripted::job("print must not run")).await;
    // It lives long enough for the sampler to see its sandbox.
    let marker = world.submit(&scripted::job("sleep 300\nprint after")).await;
    assert_eq!(
        world
            .store
            .jobs()
            .cancel(&cancelled, &cancelled_result("python"))
            .await
            .expect("cancel"),
        CancelOutcome::Cancelled
    );
    let stop = CancellationToken::new();
    let sampler = sample(&world, stop.clone());
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    // Jobs are claimed in order: once the later one ended, the cancelled one
    // would have been claimed before it.
    let record = world.wait_terminal(&marker, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    stop.cancel();
    let samples = sampler.await.expect("the sampler ran");

    let record = world.record(&cancelled).await;
    assert_eq!(record.status, Status::Cancelled);
    assert_eq!(record.attempts, 0, "it never started: {record:#?}");
    assert_eq!(record.started_ms, None);
    assert_eq!(record.worker, None);
    assert!(
        !samples.jobs_seen.contains(&cancelled),
        "a sandbox ran the cancelled job: {samples:?}"
    );
    assert!(
        samples.jobs_seen.contains(&marker),
        "the sampler never saw the job that ran: {samples:?}"
    );
    assert_eq!(world.host.starts(&cancelled), 0, "a sandbox ran it");
    assert_eq!(world.host.starts(&marker), 1);
    world.assert_settled(&cancelled).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_job_cancelled_is_killed() {
    let world = World::new().await;
    let id = world
        .submit(&scripted::job("print started\nsleep 30000"))
        .await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));
    world.wait_running(&id).await;
    wait_for_stdout(&world, &id, b"started\n").await;

    let asked = Instant::now();
    assert_eq!(
        world
            .store
            .jobs()
            .cancel(&id, &cancelled_result("python"))
            .await
            .expect("cancel"),
        CancelOutcome::Requested
    );
    let record = world.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(record.status, Status::Cancelled, "{record:#?}");
    assert_eq!(record.result.as_ref().and_then(|r| r.error.clone()), None);
    // Well short of the program's own 30 s.
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    world.assert_settled(&id).await;
    // Removed right after the result is written.
    wait_for(
        "the sandbox to be removed",
        Duration::from_secs(10),
        || async { world.sandboxes().is_empty().then_some(()) },
    )
    .await;
    // The stream tells the story: the output, the end of the killed stage,
    // then `exit` with the cancelled result.
    let events = checked_stream(&world, &record).await;
    let run = record.result.as_ref().and_then(|r| r.run.as_ref());
    let run = run.expect("the killed stage is in the result");
    assert_eq!(events.first(), Some(&JobEvent::stage_start("run")));
    assert_eq!(events.last(), Some(&JobEvent::stage_end("run", run)));
    assert_eq!(streamed_stdout(&events), b"started\n");
    assert_eq!(run.stdout.as_bytes(), b"started\n");

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_lets_a_running_job_finish_within_the_drain_timeout() {
    let world = World::new().await;
    let id = world.submit(&scripted::job("sleep 2000\nprint done")).await;
    let mut worker = world.start_worker(2, Duration::from_secs(60));
    world.wait_running(&id).await;

    worker.shut_down();
    // Submitted after shutdown began: never claimed.
    let late = world.submit(&scripted::job("print late")).await;
    worker.stopped(JOB_DEADLINE).await;

    let record = world.record(&id).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(run_stdout(&record), "done\n");
    world.assert_settled(&id).await;
    let late = world.record(&late).await;
    assert_eq!(late.status, Status::Queued, "{late:#?}");
    assert_eq!(world.queue_len().await, 1);
    assert_eq!(world.heartbeat().await, None, "the heartbeat is retired");
    world.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drain_timeout_settles_what_is_left_as_an_error() {
    let world = World::new().await;
    let id = world.submit(&scripted::job("sleep 30000")).await;
    let mut worker = world.start_worker(2, Duration::from_millis(300));
    world.wait_running(&id).await;

    worker.shut_down();
    // The 300 ms drain timeout, then the kill and the removal: well short
    // of the program's own 30 s.
    let took = worker.stopped(Duration::from_secs(30)).await;
    assert!(took < Duration::from_secs(20), "the drain took {took:?}");

    let record = world.record(&id).await;
    assert_eq!(record.status, Status::Error, "{record:#?}");
    let result = record.result.as_ref().expect("a result");
    assert_eq!(
        result.error.as_deref(),
        Some("the worker shut down (drain timeout of 300 ms passed) while the job was running")
    );
    world.assert_settled(&id).await;
    // Removed right after the result is written.
    wait_for(
        "the sandbox to be removed",
        Duration::from_secs(10),
        || async { world.sandboxes().is_empty().then_some(()) },
    )
    .await;
    world.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_claims_in_four_loops_and_no_more_than_its_slots() {
    let world = World::new().await;
    // Two slots: two claims wait at once, each holding its slot.
    let mut worker = world.start_worker(2, Duration::from_secs(30));
    wait_for("two claims to block", Duration::from_secs(10), || async {
        (claims_in_flight(&world).await == 2).then_some(())
    })
    .await;
    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    wait_for("the claims to end", Duration::from_secs(10), || async {
        (claims_in_flight(&world).await == 0).then_some(())
    })
    .await;

    // Eight slots: four loops. Twelve jobs at once each run exactly once.
    let mut worker = world.start_worker(8, Duration::from_secs(30));
    wait_for("four claims to block", Duration::from_secs(10), || async {
        (claims_in_flight(&world).await == 4).then_some(())
    })
    .await;
    let mut ids = Vec::new();
    for n in 0..12 {
        ids.push(world.submit(&scripted::job(&format!("print {n}"))).await);
    }
    for (n, id) in ids.iter().enumerate() {
        let record = world.wait_terminal(id, JOB_DEADLINE).await;
        assert_eq!(record.status, Status::Succeeded, "{record:#?}");
        assert_eq!(record.attempts, 1, "{record:#?}");
        assert_eq!(run_stdout(&record), format!("{n}\n"));
        assert_eq!(world.host.starts(id), 1, "one sandbox for {id}");
    }
    // The jobs' slots come back after their results: the loops block again.
    wait_for(
        "four claims to block again",
        Duration::from_secs(10),
        || async { (claims_in_flight(&world).await == 4).then_some(()) },
    )
    .await;
    assert_eq!(world.processing_len().await, 0);
    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_claimed_after_shutdown_began_goes_back_to_the_queue() {
    let world = World::new().await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));
    wait_for(
        "the worker to block in BLMOVE",
        Duration::from_secs(10),
        || async { (claims_in_flight(&world).await > 0).then_some(()) },
    )
    .await;

    // The BLMOVE in flight takes this job after shutdown began: the worker
    // must give it back rather than start it or keep it.
    worker.shut_down();
    let id = world.submit(&scripted::job("print later")).await;
    worker.stopped(Duration::from_secs(10)).await;

    let record = world.record(&id).await;
    assert_eq!(record.status, Status::Queued, "{record:#?}");
    assert_eq!(record.attempts, 0);
    assert_eq!(world.queue_len().await, 1);
    assert_eq!(world.processing_len().await, 0);
    world.assert_clean().await;

    // The next worker runs it.
    let mut next = world.start_worker(1, Duration::from_secs(30));
    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    next.shut_down();
    next.stopped(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_this_worker_cannot_run_ends_as_an_error_without_a_sandbox() {
    let world = World::new().await;
    // Accepted by an API whose catalog had the language; this worker's has not.
    let id = world
        .submit(&crate::common::job("cobol", "main.cob", "DISPLAY 'HI'."))
        .await;
    let stop = CancellationToken::new();
    let sampler = sample(&world, stop.clone());
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    stop.cancel();
    let samples = sampler.await.expect("the sampler ran");
    assert_eq!(record.status, Status::Error, "{record:#?}");
    let error = record
        .result
        .as_ref()
        .and_then(|r| r.error.clone())
        .unwrap_or_default();
    assert!(
        error
            .starts_with("the job cannot run on this worker: language: unknown language \"cobol\""),
        "{error}"
    );
    assert!(samples.jobs_seen.is_empty(), "{samples:?}");
    assert_eq!(world.host.runs(), 0, "no run reached the engine");
    world.assert_settled(&id).await;
    let text = world.metrics.render();
    assert!(
        text.contains("code_runner_jobs_total{language=\"cobol\",status=\"error\"} 1"),
        "{text}"
    );

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}
