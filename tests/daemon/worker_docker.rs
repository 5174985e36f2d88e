//! The worker on the Docker engine, run in the test against a real
//! redis-server: what only real sandboxes show. A warm pool starts jobs
//! warm, refills as the running jobs and its hold allow, and is emptied at
//! shutdown (the scripted engine keeps no pool); a cancel reaches a job
//! behind more input than its sandbox's pipes hold (the supervisor queues
//! the rest). The worker's own logic is tested on the scripted engine in
//! `tests/worker`.
//!
//! Every test uses its own worker id (so its containers carry a label only
//! it uses), its own Redis and its own key prefix; the guards kill the
//! redis-server and remove leftover containers also when a test fails.

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use code_runner::job::limits::LimitsRequest;
use code_runner::job::{JobResult, JobSpec, StartKind, Status};
use code_runner::sandbox::{LABEL_JOB, LABEL_WORKER};
use code_runner::store::CancelOutcome;

use crate::common::containers::list_labelled;
use crate::common::worker_world::{JOB_DEADLINE, POLL, WorkerWorld, run_stdout, wait_for_stdout};
use crate::common::{Harness, python, wait_for};

// ---------------------------------------------------------------------------
// The test's world: redis, queue, docker, worker
// ---------------------------------------------------------------------------

/// The worker's world on the real dockerd: what [`WorkerWorld`] has, and
/// the harness that removes the test's containers.
struct World {
    harness: Harness,
    base: WorkerWorld,
}

impl Deref for World {
    type Target = WorkerWorld;

    fn deref(&self) -> &WorkerWorld {
        &self.base
    }
}

impl World {
    async fn new() -> Self {
        let harness = Harness::new().await;
        Self {
            base: WorkerWorld::new(
                harness.worker_id.clone(),
                Arc::new(harness.engine.clone()),
                harness.catalog.clone(),
                harness.policy.clone(),
            ),
            harness,
        }
    }

    /// Waits until the job is running and its container exists.
    async fn wait_running(&self, id: &str) {
        self.wait_status(id, JOB_DEADLINE, |s| s == Status::Running)
            .await;
        wait_for("the job's container", JOB_DEADLINE, || async {
            containers(&self.harness, self.worker_id())
                .await
                .contains(&id.to_string())
                .then_some(())
        })
        .await;
    }
}

/// Job ids (from their labels) of this worker's containers that exist now.
async fn containers(harness: &Harness, worker_id: &str) -> Vec<String> {
    let label = format!("{LABEL_WORKER}={worker_id}");
    list_labelled(harness.engine.docker(), &label)
        .await
        .expect("docker lists containers")
        .into_iter()
        .map(|c| {
            c.labels
                .and_then(|mut labels| labels.remove(LABEL_JOB))
                .unwrap_or_default()
        })
        .collect()
}

/// An interactive python job running `source`.
fn interactive(source: &str) -> JobSpec {
    JobSpec {
        interactive: true,
        ..python(source)
    }
}

fn cancelled_result(language: &str) -> JobResult {
    JobResult::without_stages(Status::Cancelled, language, "")
}

/// Appends stdin messages to the job's control stream in one round trip,
/// as the API would one by one.
async fn send_stdin_lines(world: &World, id: &str, lines: impl IntoIterator<Item = String>) {
    let mut conn = world.redis.conn().await;
    let mut pipe = redis::pipe();
    for line in lines {
        pipe.xadd(
            world.store.keys().stdin(id),
            "*",
            &[("type", "stdin"), ("data", line.as_str())],
        )
        .ignore();
    }
    let () = pipe.query_async(&mut conn).await.expect("XADD");
}

// ---------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------

/// A cancel sent after more input than the pipes hold (3 MiB to a program
/// that never reads stdin; the supervisor queues what they do not) still
/// kills the job at once: it does not wait behind the input for the
/// program's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_behind_a_flood_of_unread_input_still_kills_the_job() {
    let world = World::new().await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));
    let id = world
        .submit(&interactive(
            "import time\nprint('up', flush=True)\ntime.sleep(8)\nprint('slept')",
        ))
        .await;
    world.wait_running(&id).await;
    wait_for_stdout(&world, &id, b"up\n").await;
    let line = format!("{}\n", "x".repeat(8191));
    send_stdin_lines(&world, &id, std::iter::repeat_n(line, 384)).await;
    // Time for the input to fill what it can.
    tokio::time::sleep(Duration::from_millis(500)).await;
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
    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Cancelled, "{record:#?}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the cancel took {:?}",
        asked.elapsed()
    );
    world.assert_settled(&id).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

// ---------------------------------------------------------------------------
// The warm pool
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_warm_pool_starts_jobs_warm_and_is_emptied_at_shutdown() {
    let world = World::new().await;
    let mut worker = world.start_worker_with(2, Duration::from_secs(30), |config| {
        config.warm_max = 3;
        config.warm_floors = [("python".to_string(), 2)].into();
    });
    // The heartbeat says what the pool holds.
    let warm = wait_for("two ready warm sandboxes", JOB_DEADLINE, || async {
        let heartbeat = world.heartbeat().await?;
        (heartbeat["warm"]["python"]["ready"] == 2).then_some(heartbeat["warm"].clone())
    })
    .await;
    assert_eq!(
        warm,
        serde_json::json!({"python": {"ready": 2, "target": 2}})
    );
    // The gauges are set by a task of their own: they follow soon after.
    let mut text = String::new();
    let gauges = [
        "code_runner_warm_ready{language=\"python\"} 2",
        "code_runner_warm_target{language=\"python\"} 2",
    ];
    let gauges_set = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            text = world.metrics.render();
            if gauges.iter().all(|gauge| text.contains(gauge)) {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert!(gauges_set.is_ok(), "the warm gauges in\n{text}");
    // Idle warm sandboxes are not slots.
    assert_eq!(world.metrics.slots_used.get(), 0);

    let id = world.submit(&python("print('warm')")).await;
    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(run_stdout(&record), "warm\n");
    let result = record.result.as_ref().unwrap();
    // The worker starts python's runtime ahead in its warm sandboxes.
    assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
    assert_eq!(result.timings.container_start_ms, 0);

    // Limits outside the pool's class: a sandbox of its own, cold.
    let spec = JobSpec {
        limits: LimitsRequest {
            memory_mb: Some(96),
            ..Default::default()
        },
        ..python("print('cold')")
    };
    let cold = world.submit(&spec).await;
    let record = world.wait_terminal(&cold, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(record.result.as_ref().unwrap().start, Some(StartKind::Cold));

    let text = world.metrics.render();
    for line in [
        "code_runner_job_starts_total{language=\"python\",start=\"warm_runtime\"} 1",
        "code_runner_job_starts_total{language=\"python\",start=\"cold\"} 1",
        "code_runner_claim_to_start_seconds_count{start=\"warm_runtime\"} 1",
        "code_runner_claim_to_start_seconds_count{start=\"cold\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    // The pool refills what the warm job took.
    wait_for("the pool refilled", JOB_DEADLINE, || async {
        let heartbeat = world.heartbeat().await?;
        (heartbeat["warm"]["python"]["ready"] == 2).then_some(())
    })
    .await;

    // Shutdown empties the pool: nothing of this worker is left.
    worker.shut_down();
    worker.stopped(Duration::from_secs(30)).await;
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

/// The program of the pool tests' jobs.
const SIX_SECONDS: &str = "import time\ntime.sleep(6)\nprint('done')\n";

/// The warm pool's `ready` count in the worker's heartbeat.
async fn warm_ready(world: &World) -> Option<u64> {
    world.heartbeat().await?["warm"]["python"]["ready"].as_u64()
}

/// Waits until the pool in the worker's heartbeat holds `ready` ready
/// sandboxes.
async fn wait_ready(world: &World, what: &str, ready: u64) {
    wait_for(what, JOB_DEADLINE, || async {
        (warm_ready(world).await == Some(ready)).then_some(())
    })
    .await;
}

/// The pool's ready count every 250 ms for 2 s, from 0.6 s on: a heartbeat
/// written after the claims (one every 500 ms), then 2 s of samples (a
/// refill that is started is ready within that here).
async fn ready_samples(world: &World) -> Vec<u64> {
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut samples = Vec::new();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        samples.push(warm_ready(world).await.expect("a heartbeat with the pool"));
    }
    samples
}

/// The 6 s job `id` of these pool tests succeeded on a pool sandbox.
async fn assert_done_on_the_pool(world: &World, id: &str) {
    let record = world.wait_terminal(id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(run_stdout(&record), "done\n");
    assert_eq!(
        record.result.as_ref().unwrap().start,
        Some(StartKind::WarmRuntime),
        "the job took a pool sandbox"
    );
}

/// What the pool did while a 6 s job took one of its sandboxes.
struct WhileRunning {
    /// The ready count every 250 ms from 0.6 s to 2.6 s after the start.
    samples: Vec<u64>,
    /// The pool was full again while the job still ran.
    refilled_while_running: bool,
}

impl WhileRunning {
    /// The pool refilled to `ready` while the job still ran.
    fn assert_refilled_to(&self, ready: u64) {
        assert_eq!(
            self.samples.last(),
            Some(&ready),
            "ready sandboxes while the job ran: {:?}",
            self.samples
        );
        assert!(self.refilled_while_running);
    }
}

/// Runs a 6 s python job on a worker (yielding as asked, refills holding
/// `hold`) whose pool keeps `floor` ready sandboxes, and watches the pool's
/// ready count while the job runs. Checks that the job ran on a pool
/// sandbox and that the pool is full again after it.
async fn while_a_job_runs(floor: usize, yield_while_busy: bool, hold: Duration) -> WhileRunning {
    let world = World::new().await;
    let mut worker = world.start_worker_with(4, Duration::from_secs(30), |config| {
        config.warm_max = 4;
        config.warm_floors = [("python".to_string(), floor)].into();
        config.yield_while_busy = yield_while_busy;
        config.refill_hold = hold;
    });
    let full = floor as u64;
    wait_ready(&world, "a full pool", full).await;
    let id = world.submit(&python(SIX_SECONDS)).await;
    world
        .wait_status(&id, JOB_DEADLINE, |s| s == Status::Running)
        .await;
    let samples = ready_samples(&world).await;
    assert_eq!(
        world.record(&id).await.status,
        Status::Running,
        "sampled while the job ran"
    );
    // The status is read first: a full pool seen after it was seen while
    // the job ran (or once it had ended).
    let refilled_while_running = wait_for(
        "the pool full again or the job ended",
        JOB_DEADLINE,
        || async {
            let running = world.record(&id).await.status == Status::Running;
            if warm_ready(&world).await == Some(full) {
                return Some(running);
            }
            (!running).then_some(false)
        },
    )
    .await;
    assert_done_on_the_pool(&world, &id).await;
    wait_ready(&world, "the pool refilled after the job", full).await;
    worker.shut_down();
    worker.stopped(Duration::from_secs(30)).await;
    world.harness.assert_clean().await;
    WhileRunning {
        samples,
        refilled_while_running,
    }
}

/// A refill takes CPU from the job running: while a job runs and the pool
/// still holds at least half its target ready, the sandbox the job took is
/// replaced once the job has ended, or once the hold is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_holding_half_its_target_refills_after_the_running_job_or_the_hold() {
    let seen = while_a_job_runs(2, true, Duration::from_secs(3)).await;
    assert_eq!(
        seen.samples,
        vec![1; 8],
        "ready sandboxes within the 3 s hold"
    );
    assert!(
        seen.refilled_while_running,
        "the hold ended before the 6 s job: the pool refilled"
    );
}

/// While jobs run, a pool is not refilled beyond the slots they leave
/// free: with 3 slots, a target of 3 and two jobs running, it holds the
/// one sandbox the free slot could take (the pool is under half, which
/// alone would refill it at once), and refills once the jobs have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_is_not_refilled_beyond_the_slots_the_running_jobs_leave_free() {
    let world = World::new().await;
    let mut worker = world.start_worker_with(3, Duration::from_secs(30), |config| {
        config.warm_max = 3;
        config.warm_floors = [("python".to_string(), 3)].into();
    });
    wait_ready(&world, "a full pool", 3).await;
    let program = python(SIX_SECONDS);
    let ids = [world.submit(&program).await, world.submit(&program).await];
    for id in &ids {
        world
            .wait_status(id, JOB_DEADLINE, |s| s == Status::Running)
            .await;
    }
    let samples = ready_samples(&world).await;
    for id in &ids {
        assert_eq!(
            world.record(id).await.status,
            Status::Running,
            "sampled while both jobs ran"
        );
    }
    assert_eq!(
        samples,
        vec![1; 8],
        "ready sandboxes while two of three slots ran"
    );
    for id in &ids {
        assert_done_on_the_pool(&world, id).await;
    }
    wait_ready(&world, "the pool refilled after the jobs", 3).await;
    worker.shut_down();
    worker.stopped(Duration::from_secs(30)).await;
    world.harness.assert_clean().await;
}

/// A pool left under half its target refills at once, job or no job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_under_half_its_target_refills_while_the_job_runs() {
    while_a_job_runs(1, true, Duration::from_secs(60))
        .await
        .assert_refilled_to(1);
}

/// With yielding off (`CODE_RUNNER_YIELD_WHILE_BUSY=off`) the pool refills
/// at once, however many it still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_yielding_off_a_pool_refills_while_the_job_runs() {
    while_a_job_runs(2, false, Duration::from_secs(60))
        .await
        .assert_refilled_to(2);
}
