//! The worker against a real redis-server (started by each test on a free
//! loopback port) and the real dockerd: claims, capacity, cancellation,
//! drain, Redis outages, and the live events stream of a job.
//!
//! Every test uses its own worker id (so its containers carry a label only
//! it uses), its own Redis and its own key prefix; the guards kill the
//! redis-server and remove leftover containers also when a test fails.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use code_runner::job::events::{JobEvent, StageState, StoredEvent};
use code_runner::job::limits::LimitsRequest;
use code_runner::job::{JobResult, JobSpec, StartKind, Status};
use code_runner::metrics::Metrics;
use code_runner::sandbox::{LABEL_JOB, LABEL_WORKER};
use code_runner::store::{
    Admission, CancelOutcome, JobRecord, NewJob, Quotas, ReleaseOutcome, Store, SubmitOutcome,
};
use code_runner::worker::{Worker, WorkerConfig};
use common::containers::{holds_a_sandbox, list_labelled};
use common::redis_server::RedisServer;
use common::{Harness, python, wait_for};
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

const POLL: Duration = Duration::from_millis(50);
/// Long enough for a cold container start on a loaded CI machine.
const JOB_DEADLINE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// The test's world: redis, queue, docker, worker
// ---------------------------------------------------------------------------

struct World {
    harness: Harness,
    redis: RedisServer,
    store: Store,
    metrics: Metrics,
}

/// A worker running in-process; shut down (without waiting) on drop.
struct RunningWorker {
    shutdown: CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl RunningWorker {
    /// Begins the graceful shutdown (as SIGTERM does).
    fn shut_down(&self) {
        self.shutdown.cancel();
    }

    /// Waits until `Worker::run` returned; fails the test after `within`.
    async fn stopped(&mut self, within: Duration) -> Duration {
        let started = Instant::now();
        let handle = self.handle.take().expect("the worker is running");
        tokio::time::timeout(within, handle)
            .await
            .unwrap_or_else(|_| panic!("the worker did not stop within {within:?}"))
            .expect("the worker task did not panic");
        started.elapsed()
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl World {
    async fn new() -> Self {
        let redis = RedisServer::start();
        let prefix = format!("test-{}:", uuid::Uuid::new_v4().simple());
        let store = Store::new(&redis.url(), &prefix, Duration::from_secs(3600), 8)
            .expect("queue settings are valid");
        Self {
            harness: Harness::new().await,
            redis,
            store,
            metrics: Metrics::new().expect("metrics"),
        }
    }

    fn worker_id(&self) -> &str {
        &self.harness.worker_id
    }

    fn start_worker(&self, max_sandboxes: usize, drain_timeout: Duration) -> RunningWorker {
        self.start_worker_with(max_sandboxes, drain_timeout, |_| {})
    }

    /// A worker whose configuration `adjust` changed (a warm pool, say).
    fn start_worker_with(
        &self,
        max_sandboxes: usize,
        drain_timeout: Duration,
        adjust: impl FnOnce(&mut WorkerConfig),
    ) -> RunningWorker {
        let mut config = WorkerConfig {
            id: self.worker_id().to_string(),
            max_sandboxes,
            heartbeat_interval: Duration::from_millis(500),
            heartbeat_ttl: Duration::from_secs(5),
            drain_timeout,
            warm_floors: Default::default(),
            warm_max: 0,
            warm_lifetime: Duration::from_secs(600),
            warm_runtimes: true,
            yield_while_busy: true,
            refill_hold: code_runner::worker::REFILL_HOLD,
            warm_memory_reserve: 0,
            max_requeues: 3,
        };
        adjust(&mut config);
        let worker = Worker::new(
            config,
            self.harness
                .services(self.store.clone(), self.metrics.clone()),
        );
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(worker.run(shutdown.clone()));
        RunningWorker {
            shutdown,
            handle: Some(handle),
        }
    }

    async fn submit(&self, spec: &JobSpec) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let outcome = self
            .store
            .jobs()
            .submit(NewJob {
                id: &id,
                spec,
                api_key: "test",
                user: "",
                language: &spec.language,
                idempotency: None,
                admission: Admission {
                    max_queue_depth: 1000,
                    key_limit: None,
                    max_attempts: 1,
                    output_limit_bytes: 0,
                    storage_budget: u64::MAX >> 1,
                    // The default wall limit, as the API resolves it.
                    wall_budget_ms: 10_000,
                    weight: 1,
                    user_limit: None,
                    user_rate_per_minute: None,
                    quotas: Quotas::default(),
                },
            })
            .await
            .expect("submit");
        assert_eq!(outcome, SubmitOutcome::Accepted);
        id
    }

    async fn record(&self, id: &str) -> JobRecord {
        self.store
            .jobs()
            .get(id)
            .await
            .expect("redis answers")
            .unwrap_or_else(|| panic!("job {id} exists"))
    }

    async fn wait_status(&self, id: &str, within: Duration, done: fn(Status) -> bool) -> JobRecord {
        wait_for(&format!("job {id} to reach the status"), within, || async {
            self.store
                .jobs()
                .get(id)
                .await
                .ok()
                .flatten()
                .filter(|record| done(record.status))
        })
        .await
    }

    async fn wait_terminal(&self, id: &str, within: Duration) -> JobRecord {
        self.wait_status(id, within, Status::is_terminal).await
    }

    /// Waits for the job's end: it succeeded, printed `stdout` and left
    /// nothing behind in Redis.
    async fn assert_succeeded(&self, id: &str, stdout: &str, within: Duration) {
        let record = self.wait_terminal(id, within).await;
        assert_eq!(record.status, Status::Succeeded, "{record:#?}");
        assert_eq!(run_stdout(&record), stdout);
        self.assert_settled(id).await;
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

    async fn processing_len(&self) -> u64 {
        let mut conn = self.redis.conn().await;
        conn.llen(self.store.keys().processing(self.worker_id()))
            .await
            .expect("LLEN")
    }

    async fn queue_len(&self) -> u64 {
        let mut conn = self.redis.conn().await;
        conn.llen(self.store.keys().queue()).await.expect("LLEN")
    }

    async fn job_ttl(&self, id: &str) -> i64 {
        let mut conn = self.redis.conn().await;
        conn.ttl(self.store.keys().job(id)).await.expect("TTL")
    }

    async fn heartbeat(&self) -> Option<serde_json::Value> {
        let mut conn = self.redis.conn().await;
        let value: Option<String> = conn
            .get(self.store.keys().heartbeat(self.worker_id()))
            .await
            .expect("GET");
        value.map(|v| serde_json::from_str(&v).expect("the heartbeat is JSON"))
    }

    /// What must hold for every job that ended: it left the processing
    /// list, and its key expires.
    async fn assert_settled(&self, id: &str) {
        let mut conn = self.redis.conn().await;
        let processing: Vec<String> = conn
            .lrange(self.store.keys().processing(self.worker_id()), 0, -1)
            .await
            .expect("LRANGE");
        assert!(
            !processing.contains(&id.to_string()),
            "job {id} is still in the processing list {processing:?}"
        );
        let ttl = self.job_ttl(id).await;
        assert!(ttl > 0, "job {id} has no TTL ({ttl})");
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

/// The job ids of this worker's containers that are running.
async fn running_containers(harness: &Harness, worker_id: &str) -> Vec<String> {
    let label = format!("{LABEL_WORKER}={worker_id}");
    list_labelled(harness.engine.docker(), &label)
        .await
        .expect("docker lists containers")
        .into_iter()
        .filter(|c| c.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING))
        .map(|c| {
            c.labels
                .and_then(|mut labels| labels.remove(LABEL_JOB))
                .unwrap_or_default()
        })
        .collect()
}

/// What a sampler saw while it ran.
#[derive(Debug, Default)]
struct Samples {
    /// Containers not exited (created or running): sandboxes.
    max_containers: usize,
    /// Containers in any state, with the stopped ones waiting to be removed.
    max_all: usize,
    max_slots_used: i64,
    jobs_seen: HashSet<String>,
    count: usize,
}

/// Samples this worker's containers (`docker ps` by label) and
/// `slots_used` every 50 ms until `stop`.
fn sample(world: &World, stop: CancellationToken) -> tokio::task::JoinHandle<Samples> {
    let harness_engine = world.harness.engine.clone();
    let worker_id = world.worker_id().to_string();
    let metrics = world.metrics.clone();
    tokio::spawn(async move {
        let mut samples = Samples::default();
        let label = format!("{LABEL_WORKER}={worker_id}");
        while !stop.is_cancelled() {
            let list = list_labelled(harness_engine.docker(), &label)
                .await
                .expect("docker lists containers");
            let live = list.iter().filter(|c| holds_a_sandbox(c)).count();
            samples.max_containers = samples.max_containers.max(live);
            samples.max_all = samples.max_all.max(list.len());
            samples.max_slots_used = samples.max_slots_used.max(metrics.slots_used.get());
            for container in list {
                if let Some(job) = container.labels.and_then(|mut l| l.remove(LABEL_JOB)) {
                    samples.jobs_seen.insert(job);
                }
            }
            samples.count += 1;
            tokio::time::sleep(POLL).await;
        }
        samples
    })
}

/// An interactive python job running `source`.
fn interactive(source: &str) -> JobSpec {
    JobSpec {
        interactive: true,
        ..python(source)
    }
}

fn run_stdout(record: &JobRecord) -> String {
    let result = record.result.as_ref().expect("a terminal job has a result");
    common::stdout(result)
}

fn cancelled_result(language: &str) -> JobResult {
    JobResult::without_stages(Status::Cancelled, language, "")
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_python_job_succeeds_and_its_keys_expire() {
    let world = World::new().await;
    let id = world
        .submit(&python("print('hello from the worker')"))
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
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_sandboxes_than_slots() {
    let world = World::new().await;
    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(
            world
                .submit(&python("import time\ntime.sleep(0.5)\nprint('ok')"))
                .await,
        );
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
        "{} sandboxes (created or running) at once: {samples:?}",
        samples.max_containers
    );
    // With the ended jobs' stopped containers waiting in the removal queue
    // (at most one per slot).
    assert!(
        samples.max_all <= 4,
        "{} containers at once: {samples:?}",
        samples.max_all
    );
    assert_eq!(samples.max_slots_used, 2, "{samples:?}");
    assert!(samples.count > 10, "too few samples: {samples:?}");
    // The last slots are given back once their containers are removed,
    // right after the results.
    wait_for("every slot back", Duration::from_secs(10), || async {
        (world.metrics.slots_used.get() == 0).then_some(())
    })
    .await;
    assert_eq!(world.processing_len().await, 0);

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_cancelled_while_queued_never_runs() {
    let world = World::new().await;
    let cancelled = world.submit(&python("print('must not run')")).await;
    let marker = world.submit(&python("print('after')")).await;
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
        "a container ran the cancelled job: {samples:?}"
    );
    assert!(
        samples.jobs_seen.contains(&marker),
        "the sampler never saw the job that ran: {samples:?}"
    );
    world.assert_settled(&cancelled).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_job_cancelled_is_killed() {
    let world = World::new().await;
    let id = world
        .submit(&python(
            "import time\nprint('started', flush=True)\ntime.sleep(30)",
        ))
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
    // The kill, docker's wait and the removal on a loaded machine, well
    // short of the program's own 30 s.
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    world.assert_settled(&id).await;
    // Removed right after the result is written.
    wait_for(
        "the container to be removed",
        Duration::from_secs(10),
        || async {
            containers(&world.harness, world.worker_id())
                .await
                .is_empty()
                .then_some(())
        },
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
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_lets_a_running_job_finish_within_the_drain_timeout() {
    let world = World::new().await;
    let id = world
        .submit(&python("import time\ntime.sleep(2)\nprint('done')"))
        .await;
    let mut worker = world.start_worker(2, Duration::from_secs(60));
    world.wait_running(&id).await;

    worker.shut_down();
    // Submitted after shutdown began: never claimed.
    let late = world.submit(&python("print('late')")).await;
    worker.stopped(JOB_DEADLINE).await;

    let record = world.record(&id).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(run_stdout(&record), "done\n");
    world.assert_settled(&id).await;
    let late = world.record(&late).await;
    assert_eq!(late.status, Status::Queued, "{late:#?}");
    assert_eq!(world.queue_len().await, 1);
    assert_eq!(world.heartbeat().await, None, "the heartbeat is retired");
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drain_timeout_settles_what_is_left_as_an_error() {
    let world = World::new().await;
    let id = world.submit(&python("import time\ntime.sleep(30)")).await;
    let mut worker = world.start_worker(2, Duration::from_millis(300));
    world.wait_running(&id).await;

    worker.shut_down();
    // The 300 ms drain timeout, then the kill, docker's wait and the removal
    // on a loaded machine: well short of the program's own 30 s.
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
        "the container to be removed",
        Duration::from_secs(10),
        || async {
            containers(&world.harness, world.worker_id())
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

/// Whether a client of this Redis is blocked in BLMOVE right now.
async fn claim_in_flight(world: &World) -> bool {
    claims_in_flight(world).await > 0
}

/// How many clients of this Redis are blocked in BLMOVE right now.
async fn claims_in_flight(world: &World) -> usize {
    let mut conn = world.redis.conn().await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("CLIENT LIST");
    clients
        .lines()
        .filter(|line| {
            line.split(' ').any(|f| f == "cmd=blmove")
                && line
                    .split(' ')
                    .any(|f| f.starts_with("flags=") && f.contains('b'))
        })
        .count()
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
        ids.push(world.submit(&python(&format!("print({n})"))).await);
    }
    for (n, id) in ids.iter().enumerate() {
        let record = world.wait_terminal(id, JOB_DEADLINE).await;
        assert_eq!(record.status, Status::Succeeded, "{record:#?}");
        assert_eq!(record.attempts, 1, "{record:#?}");
        assert_eq!(run_stdout(&record), format!("{n}\n"));
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
    world.harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_claimed_after_shutdown_began_goes_back_to_the_queue() {
    let world = World::new().await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));
    wait_for(
        "the worker to block in BLMOVE",
        Duration::from_secs(10),
        || async { claim_in_flight(&world).await.then_some(()) },
    )
    .await;

    // The BLMOVE in flight takes this job after shutdown began: the worker
    // must give it back rather than start it or keep it.
    worker.shut_down();
    let id = world.submit(&python("print('later')")).await;
    worker.stopped(Duration::from_secs(10)).await;

    let record = world.record(&id).await;
    assert_eq!(record.status, Status::Queued, "{record:#?}");
    assert_eq!(record.attempts, 0);
    assert_eq!(world.queue_len().await, 1);
    assert_eq!(world.processing_len().await, 0);
    world.harness.assert_clean().await;

    // The next worker runs it.
    let mut next = world.start_worker(1, Duration::from_secs(30));
    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    next.shut_down();
    next.stopped(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_puts_a_claimed_job_back_at_the_head_unless_cancelled() {
    let world = World::new().await;
    let worker = world.worker_id().to_string();
    let first = world.submit(&python("print(1)")).await;
    let second = world.submit(&python("print(2)")).await;
    let mut conn = world.store.dedicated().await.expect("connection");

    let claimed = world
        .store
        .jobs()
        .claim(&mut conn, &worker)
        .await
        .expect("claim");
    assert_eq!(claimed.as_deref(), Some(first.as_str()));
    assert_eq!(
        world
            .store
            .jobs()
            .release(&first, &worker)
            .await
            .expect("release"),
        ReleaseOutcome::Requeued
    );
    assert_eq!(world.processing_len().await, 0);
    // Back at the head: claimed again before the second job.
    let claimed = world
        .store
        .jobs()
        .claim(&mut conn, &worker)
        .await
        .expect("claim");
    assert_eq!(claimed.as_deref(), Some(first.as_str()));

    world
        .store
        .jobs()
        .cancel(&first, &cancelled_result("python"))
        .await
        .expect("cancel");
    assert_eq!(
        world
            .store
            .jobs()
            .release(&first, &worker)
            .await
            .expect("release"),
        ReleaseOutcome::Dropped
    );
    assert_eq!(
        world
            .store
            .jobs()
            .release(&first, &worker)
            .await
            .expect("release"),
        ReleaseOutcome::Absent
    );
    assert_eq!(world.processing_len().await, 0);
    assert_eq!(world.queue_len().await, 1);
    let claimed = world
        .store
        .jobs()
        .claim(&mut conn, &worker)
        .await
        .expect("claim");
    assert_eq!(claimed.as_deref(), Some(second.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_outage_delays_the_result_but_loses_nothing() {
    let mut world = World::new().await;
    let id = world
        .submit(&python("import time\ntime.sleep(3)\nprint('survived')"))
        .await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));
    world.wait_running(&id).await;

    // Redis goes away while the job runs, and stays away until the job's
    // program has ended (its container stopped): the worker then holds a
    // result it cannot write. The container stays until the result is
    // durable: it is removed after, never before.
    world.redis.stop();
    wait_for("the job's container to stop", JOB_DEADLINE, || async {
        (!running_containers(&world.harness, world.worker_id())
            .await
            .contains(&id))
        .then_some(())
    })
    .await;
    assert!(
        containers(&world.harness, world.worker_id())
            .await
            .contains(&id),
        "the container was removed before the result was written"
    );
    world.redis.restart();

    world
        .assert_succeeded(&id, "survived\n", Duration::from_secs(30))
        .await;

    // The worker kept going: it claims and runs new jobs.
    let next = world.submit(&python("print('next')")).await;
    let record = world.wait_terminal(&next, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    wait_for(
        "the heartbeat to be back",
        Duration::from_secs(10),
        || async { world.heartbeat().await },
    )
    .await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

/// Appends a control message to the job's control stream, as the API does.
async fn send_control(world: &World, id: &str, fields: &[(&str, &str)]) {
    let mut conn = world.redis.conn().await;
    let _: String = conn
        .xadd(world.store.keys().stdin(id), "*", fields)
        .await
        .expect("XADD");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_stdin_and_signals_reach_the_running_job() {
    let world = World::new().await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));

    let spec = interactive("import sys\nprint(sys.stdin.read().upper(), end='')");
    let echo = world.submit(&spec).await;
    world.wait_running(&echo).await;
    // Stdin is stored raw in the control stream.
    send_control(
        &world,
        &echo,
        &[("type", "stdin"), ("data", "hello, worker\n")],
    )
    .await;
    send_control(&world, &echo, &[("type", "stdin_close")]).await;
    world
        .assert_succeeded(&echo, "HELLO, WORKER\n", JOB_DEADLINE)
        .await;

    let sleeper = world
        .submit(&python(
            "import time\nprint('up', flush=True)\ntime.sleep(30)",
        ))
        .await;
    world.wait_running(&sleeper).await;
    // Once its output is in the events stream the program runs, and one
    // interrupt reaches it.
    wait_for_stdout(&world, &sleeper, b"up\n").await;
    send_control(
        &world,
        &sleeper,
        &[("type", "signal"), ("signal", "interrupt")],
    )
    .await;
    let record = world.wait_terminal(&sleeper, Duration::from_secs(20)).await;
    assert_eq!(record.status, Status::Failed, "{record:#?}");
    let result = record.result.as_ref().expect("a result");
    let run = result.run.as_ref().expect("a run stage");
    assert!(
        common::stderr(result).contains("KeyboardInterrupt"),
        "{result:#?}"
    );
    assert_eq!(run.reason, code_runner::protocol::Reason::Exited);
    let events = checked_stream(&world, &record).await;
    let streamed_stderr: Vec<u8> = events
        .iter()
        .filter(|e| matches!(e, JobEvent::Stderr { .. }))
        .flat_map(|e| e.output_bytes().expect("output decodes"))
        .collect();
    assert_eq!(streamed_stderr, run.stderr.as_bytes());
    world.assert_settled(&sleeper).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

/// The ids of the test Redis's clients blocked in an `XREAD` (`CLIENT
/// LIST`).
async fn blocked_xreads(world: &World) -> Vec<String> {
    let mut conn = world.redis.conn().await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("CLIENT LIST");
    clients
        .lines()
        .filter(|client| client.contains(" cmd=xread ") && client.contains(" flags=b "))
        .filter_map(|client| client.strip_prefix("id=")?.split(' ').next())
        .map(str::to_string)
        .collect()
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

/// Four interactive jobs at once: one connection reads all their control
/// streams (not one each), and each job gets its own input, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn running_jobs_share_one_control_connection_and_each_gets_its_input() {
    let world = World::new().await;
    let mut worker = world.start_worker(4, Duration::from_secs(30));
    let spec = interactive("for _ in range(2):\n    print(input().upper(), flush=True)");
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(world.submit(&spec).await);
    }
    for id in &ids {
        world.wait_running(id).await;
    }
    // Every job is followed once its relay runs; give the relays a moment
    // to start, then the reader's connection is the only one blocked.
    wait_for("one blocked control read", JOB_DEADLINE, || async {
        (blocked_xreads(&world).await.len() == 1).then_some(())
    })
    .await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(blocked_xreads(&world).await.len(), 1, "one control reader");
    }
    for round in ["first", "second"] {
        for (i, id) in ids.iter().enumerate() {
            let line = format!("{round} of job {i}\n");
            send_control(&world, id, &[("type", "stdin"), ("data", &line)]).await;
        }
    }
    for (i, id) in ids.iter().enumerate() {
        world
            .assert_succeeded(
                id,
                &format!("FIRST OF JOB {i}\nSECOND OF JOB {i}\n"),
                JOB_DEADLINE,
            )
            .await;
    }

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

/// A job that starts while the control reader is blocked in its read
/// rings the worker's doorbell, and the read is issued again with the
/// job's stream (not only when the blocked read times out): MONITOR shows
/// the ring between the last read without the job's stream and the first
/// read with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_started_during_a_blocked_control_read_rings_the_doorbell() {
    let world = World::new().await;
    let mut worker = world.start_worker(4, Duration::from_secs(30));
    let spec = interactive("print(input().upper(), flush=True)");
    let first = world.submit(&spec).await;
    world.wait_running(&first).await;
    wait_for("the control reader's read", JOB_DEADLINE, || async {
        (blocked_xreads(&world).await.len() == 1).then_some(())
    })
    .await;
    let monitor = Monitor::start(&world.redis).await;
    // A job followed in the instant between two reads needs no ring; each
    // of these starts while the reader is blocked (the one before it was
    // answered, and nothing else is sent), so at most the rare one does.
    let mut later = Vec::new();
    for i in 0..3 {
        let id = world.submit(&spec).await;
        world.wait_running(&id).await;
        send_control(
            &world,
            &id,
            &[("type", "stdin"), ("data", &format!("job {i}\n"))],
        )
        .await;
        wait_for_stdout(&world, &id, format!("JOB {i}\n").as_bytes()).await;
        later.push(id);
    }
    let lines = monitor.stop().await;
    let is_read = |line: &String| line.contains("\"XREAD\"") && line.contains(":doorbell\"");
    let is_ring = |line: &String| line.contains("\"XADD\"") && line.contains(":doorbell\"");
    let rung = later
        .iter()
        .filter(|id| {
            let stream = format!("\"{}\"", world.store.keys().stdin(id));
            let Some(first_read) = lines
                .iter()
                .position(|line| is_read(line) && line.contains(&stream))
            else {
                panic!("no read of {stream} in {lines:#?}");
            };
            let since = lines[..first_read]
                .iter()
                .rposition(is_read)
                .map_or(0, |read| read + 1);
            lines[since..first_read].iter().any(is_ring)
        })
        .count();
    assert!(
        rung >= 1,
        "no job's first read followed a ring of the doorbell: {lines:#?}"
    );
    send_control(&world, &first, &[("type", "stdin"), ("data", "first\n")]).await;
    for (id, stdout) in std::iter::once((&first, "FIRST\n".to_string())).chain(
        later
            .iter()
            .enumerate()
            .map(|(i, id)| (id, format!("JOB {i}\n"))),
    ) {
        world.assert_succeeded(id, &stdout, JOB_DEADLINE).await;
    }

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

/// A server that closes idle clients (`timeout 2`) does not close the
/// control reader's connection between jobs: kept after the last job, it
/// stays blocked in a read of the doorbell, and the next job's input comes
/// on that same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_connection_outlives_the_servers_idle_timeout_between_jobs() {
    let world = World::new().await;
    let mut conn = world.redis.conn().await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("timeout")
        .arg("2")
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET timeout");
    let mut worker = world.start_worker(1, Duration::from_secs(30));
    let spec = interactive("print(input().upper(), flush=True)");
    let mut reader = None;
    for (i, pause) in [Duration::ZERO, Duration::from_secs(5)]
        .into_iter()
        .enumerate()
    {
        tokio::time::sleep(pause).await;
        if let Some(reader) = &reader {
            assert_eq!(
                &blocked_xreads(&world).await,
                std::slice::from_ref(reader),
                "after {pause:?} without a job, the reader's connection is still blocked in its read"
            );
        }
        let id = world.submit(&spec).await;
        world.wait_running(&id).await;
        let line = format!("job {i}\n");
        send_control(&world, &id, &[("type", "stdin"), ("data", &line)]).await;
        world
            .assert_succeeded(&id, &format!("JOB {i}\n"), JOB_DEADLINE)
            .await;
        let blocked = wait_for("the control reader's read", JOB_DEADLINE, || async {
            blocked_xreads(&world).await.into_iter().next()
        })
        .await;
        assert_eq!(
            reader.get_or_insert_with(|| blocked.clone()),
            &blocked,
            "one connection for both jobs"
        );
    }

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

/// The control reader's connection is killed mid-read: it connects
/// again, input still reaches its job, and a job whose cancel was asked
/// for (its `cancel_requested` flag, without the message) is cancelled,
/// as the flags are read again on every new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_reader_reconnects_and_reads_the_cancel_flags_again() {
    let world = World::new().await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));
    let echo = world
        .submit(&interactive("print(input().upper(), flush=True)"))
        .await;
    let sleeper = world
        .submit(&python(
            "import time\nprint('up', flush=True)\ntime.sleep(60)",
        ))
        .await;
    world.wait_running(&echo).await;
    world.wait_running(&sleeper).await;
    wait_for_stdout(&world, &sleeper, b"up\n").await;
    let mut conn = world.redis.conn().await;
    let _: () = conn
        .hset(world.store.keys().job(&sleeper), "cancel_requested", "1")
        .await
        .expect("HSET");
    let reader = wait_for("the control reader's read", JOB_DEADLINE, || async {
        blocked_xreads(&world).await.into_iter().next()
    })
    .await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&reader)
        .query_async(&mut conn)
        .await
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);
    send_control(
        &world,
        &echo,
        &[("type", "stdin"), ("data", "after reconnect\n")],
    )
    .await;
    let record = world.wait_terminal(&echo, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(run_stdout(&record), "AFTER RECONNECT\n");
    let record = world.wait_terminal(&sleeper, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Cancelled, "{record:#?}");
    world.assert_settled(&echo).await;
    world.assert_settled(&sleeper).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

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

/// A program that reads its input late is sent far more messages than
/// the reader hands out before it waits: nothing is lost or reordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_input_to_a_slow_reader_arrives_whole_and_in_order() {
    let world = World::new().await;
    let mut worker = world.start_worker(2, Duration::from_secs(30));
    let spec = interactive(
        "import sys, time\nprint('up', flush=True)\ntime.sleep(3)\n\
         lines = sys.stdin.read().splitlines()\nprint(len(lines), lines[0], lines[-1])\n\
         print(lines == [f'line {i}' for i in range(500)])",
    );
    let id = world.submit(&spec).await;
    world.wait_running(&id).await;
    wait_for_stdout(&world, &id, b"up\n").await;
    send_stdin_lines(&world, &id, (0..500).map(|i| format!("line {i}\n"))).await;
    send_control(&world, &id, &[("type", "stdin_close")]).await;
    world
        .assert_succeeded(&id, "up\n500 line 0 line 499\nTrue\n", JOB_DEADLINE)
        .await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_this_worker_cannot_run_ends_as_an_error_without_a_sandbox() {
    let world = World::new().await;
    // Accepted by an API whose catalog had the language; this worker's has not.
    let id = world
        .submit(&common::job("cobol", "main.cob", "DISPLAY 'HI'."))
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
    world.assert_settled(&id).await;
    let text = world.metrics.render();
    assert!(
        text.contains("code_runner_jobs_total{language=\"cobol\",status=\"error\"} 1"),
        "{text}"
    );

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
    assert_eq!(world.processing_len().await, 0);
}

// ---------------------------------------------------------------------------
// The live events stream
// ---------------------------------------------------------------------------

/// Every event of the job's stream, from the start (`seq` 0), read in pages.
async fn stream_events(world: &World, id: &str) -> Vec<StoredEvent> {
    let mut events: Vec<StoredEvent> = Vec::new();
    loop {
        let after = events.last().map_or(0, |e| e.seq);
        let page = world
            .store
            .events()
            .since(id, after, 1000)
            .await
            .expect("XRANGE");
        if page.is_empty() {
            return events;
        }
        events.extend(page);
    }
}

/// Checks what every finished job's stream must be — `seq` 1..N without
/// gaps; `queued`, then `running` on this worker, first; the `exit` event
/// with the job's result last, and no other status or exit between — and
/// returns the events between (stages and output).
async fn checked_stream(world: &World, record: &JobRecord) -> Vec<JobEvent> {
    let stored = stream_events(world, &record.id).await;
    let seqs: Vec<u64> = stored.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=stored.len() as u64).collect::<Vec<_>>(),
        "seq numbers have gaps"
    );
    let events: Vec<JobEvent> = stored
        .iter()
        .map(|e| e.event().unwrap_or_else(|err| panic!("{}: {err}", e.json)))
        .collect();
    assert!(events.len() >= 3, "{events:#?}");
    assert_eq!(
        events[0],
        JobEvent::Status {
            status: Status::Queued,
            worker: None
        }
    );
    assert_eq!(
        events[1],
        JobEvent::Status {
            status: Status::Running,
            worker: Some(world.worker_id().to_string())
        }
    );
    let result = record.result.clone().expect("a terminal job has a result");
    assert_eq!(
        events[events.len() - 1],
        JobEvent::Exit {
            status: record.status,
            replaces: None,
            result: Box::new(result)
        }
    );
    let middle = events[2..events.len() - 1].to_vec();
    for event in &middle {
        assert!(
            matches!(
                event,
                JobEvent::Stage { .. } | JobEvent::Stdout { .. } | JobEvent::Stderr { .. }
            ),
            "{event:?} in the middle of {events:#?}"
        );
    }
    middle
}

/// Waits until the job's streamed stdout is `expected`.
async fn wait_for_stdout(world: &World, id: &str, expected: &[u8]) {
    wait_for("the output in the events stream", JOB_DEADLINE, || async {
        let events: Vec<JobEvent> = stream_events(world, id)
            .await
            .iter()
            .filter_map(|e| e.event().ok())
            .collect();
        (streamed_stdout(&events) == expected).then_some(())
    })
    .await;
}

/// The concatenated bytes of the stdout events.
fn streamed_stdout(events: &[JobEvent]) -> Vec<u8> {
    events
        .iter()
        .filter(|e| matches!(e, JobEvent::Stdout { .. }))
        .flat_map(|e| e.output_bytes().expect("output decodes"))
        .collect()
}

fn output_events(events: &[JobEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, JobEvent::Stdout { .. } | JobEvent::Stderr { .. }))
        .count()
}

/// Calls of EVAL and EVALSHA this Redis served (every script the store
/// runs: submit, start, append_events, finish).
async fn script_calls(world: &World) -> u64 {
    let mut conn = world.redis.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_jobs_events_are_streamed_as_they_happen() {
    let world = World::new().await;
    let id = world
        .submit(&python(
            "import time\nfor i in range(3):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)",
        ))
        .await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    // Live: the first line is in the stream while the job still runs.
    wait_for("the first line in the stream", JOB_DEADLINE, || async {
        let events = stream_events(&world, &id).await;
        streamed_stdout(
            &events
                .iter()
                .filter_map(|e| e.event().ok())
                .collect::<Vec<_>>(),
        )
        .starts_with(b"line 0\n")
        .then_some(())
    })
    .await;
    assert_eq!(world.record(&id).await.status, Status::Running);

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let events = checked_stream(&world, &record).await;
    let result = record.result.as_ref().expect("a result");
    let run = result.run.as_ref().expect("a run stage");
    // The run's start, its output, its end, in that order.
    let last = events.len() - 1;
    assert_eq!(events[0], JobEvent::stage_start("run"));
    assert_eq!(events[last], JobEvent::stage_end("run", run));
    let chunks: Vec<Vec<u8>> = events[1..last]
        .iter()
        .map(|e| match e {
            JobEvent::Stdout { .. } => e.output_bytes().expect("output decodes"),
            other => panic!("only stdout between the stage's start and end: {other:?}"),
        })
        .collect();
    // Each line was written 300 ms after the one before, so no event holds
    // two lines. (Python under -u writes a line's text and its newline as two
    // writes; the first output after a quiet spell is sent at once, so one
    // line may come as two events.)
    assert_eq!(chunks.concat(), b"line 0\nline 1\nline 2\n");
    for chunk in &chunks {
        let newlines = chunk.iter().filter(|b| **b == b'\n').count();
        assert!(
            newlines == 0 || (newlines == 1 && chunk.ends_with(b"\n")),
            "one event held more than one line: {:?}",
            String::from_utf8_lossy(chunk)
        );
    }
    let JobEvent::Stage {
        exit_code, reason, ..
    } = &events[last]
    else {
        unreachable!()
    };
    assert_eq!(*exit_code, Some(0));
    assert_eq!(*reason, Some(code_runner::protocol::Reason::Exited));
    assert_eq!(streamed_stdout(&events), run.stdout.as_bytes());
    world.assert_settled(&id).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

/// What a redis-server was asked, as `MONITOR` prints it (a script's own
/// commands follow its `EVALSHA` line, each marked `[0 lua]`), until
/// [`Monitor::stop`].
struct Monitor {
    child: tokio::process::Child,
    lines: tokio::task::JoinHandle<Vec<String>>,
    /// What `stop` asks the server to `ECHO`: the line it prints is the last read.
    marker: String,
    redis: String,
}

impl Monitor {
    async fn start(redis: &RedisServer) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &redis.port.to_string(), "monitor"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-cli runs");
        let mut reader = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        // MONITOR answers OK once it is on.
        let first = tokio::time::timeout(Duration::from_secs(10), reader.next_line())
            .await
            .expect("MONITOR answers")
            .expect("redis-cli's output");
        assert_eq!(first.as_deref(), Some("OK"));
        let marker = format!("monitor-end-{}", uuid::Uuid::new_v4().simple());
        let end = marker.clone();
        let lines = tokio::spawn(async move {
            let mut lines = Vec::new();
            while let Ok(Some(line)) = reader.next_line().await {
                if line.contains(&end) {
                    break;
                }
                lines.push(line);
            }
            lines
        });
        Self {
            child,
            lines,
            marker,
            redis: redis.url(),
        }
    }

    /// Every command the server ran before this call: MONITOR's output
    /// comes after the commands themselves, so it reads up to a marker
    /// command sent now, which the server prints after all of them.
    async fn stop(mut self) -> Vec<String> {
        let client = redis::Client::open(self.redis.as_str()).expect("redis url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis connects");
        let _: String = redis::cmd("ECHO")
            .arg(&self.marker)
            .query_async(&mut conn)
            .await
            .expect("ECHO");
        let lines = tokio::time::timeout(Duration::from_secs(10), &mut self.lines)
            .await
            .expect("MONITOR prints the marker")
            .expect("the reader did not panic");
        self.child.kill().await.expect("redis-cli stops");
        lines
    }
}

/// The job's last stage end goes with its result: appended by the same
/// script call (FINISH) as its `exit` event, not by an append of its own
/// just before: one Redis step less at the end of every job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_last_stage_end_is_written_with_the_result() {
    let world = World::new().await;
    let monitor = Monitor::start(&world.redis).await;
    let id = world.submit(&python("print(42)")).await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));
    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let lines = monitor.stop().await;

    let stored = stream_events(&world, &id).await;
    let run = record
        .result
        .as_ref()
        .and_then(|r| r.run.as_ref())
        .expect("ran");
    let end = stored
        .iter()
        .find(|e| e.event().ok() == Some(JobEvent::stage_end("run", run)))
        .expect("the run's end is in the stream");
    let exit = stored.last().expect("events");
    assert_eq!(exit.seq, end.seq + 1, "{stored:#?}");
    // The XADD of each, by its stream id `<seq>-0`.
    let xadd = |seq: u64| {
        let needle = format!("\"{seq}-0\"");
        lines
            .iter()
            .position(|l| l.contains("\"XADD\"") && l.contains(&id) && l.contains(&needle))
            .unwrap_or_else(|| panic!("no XADD of seq {seq} in {lines:#?}"))
    };
    let (end_at, exit_at) = (xadd(end.seq), xadd(exit.seq));
    assert!(end_at < exit_at, "{:#?}", &lines[end_at..=exit_at]);
    assert!(
        lines[end_at..=exit_at]
            .iter()
            .all(|l| l.contains("[0 lua]")),
        "another command came between the stage end and the exit: {:#?}",
        &lines[end_at..=exit_at]
    );
    // And that call is FINISH's: a script call, which wrote the result.
    let call = lines[..end_at]
        .iter()
        .rposition(|l| !l.contains("[0 lua]"))
        .expect("the script's call");
    assert!(
        lines[call].contains("\"EVALSHA\"") || lines[call].contains("\"EVAL\""),
        "{}",
        lines[call]
    );
    assert!(
        lines[end_at..exit_at]
            .iter()
            .any(|l| l.contains("\"HSET\"") && l.contains("\"result\"")),
        "the call that appended the stage end did not write the result: {:#?}",
        &lines[call..=exit_at]
    );
    world.assert_settled(&id).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compiled_jobs_stages_are_streamed_in_order() {
    let world = World::new().await;
    let (language, name, source) = common::programs::HELLO
        .iter()
        .find(|(language, ..)| *language == "c")
        .copied()
        .expect("a C program");
    let id = world.submit(&common::job(language, name, source)).await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let events = checked_stream(&world, &record).await;
    let result = record.result.as_ref().expect("a result");
    let stages: Vec<&JobEvent> = events
        .iter()
        .filter(|e| matches!(e, JobEvent::Stage { .. }))
        .collect();
    assert_eq!(
        stages,
        [
            &JobEvent::stage_start("compile"),
            &JobEvent::stage_end("compile", result.compile.as_ref().expect("compiled")),
            &JobEvent::stage_start("run"),
            &JobEvent::stage_end("run", result.run.as_ref().expect("ran")),
        ]
    );
    // The run's output is between the run's start and end.
    let run_start = events
        .iter()
        .position(|e| *e == JobEvent::stage_start("run"))
        .expect("run start");
    assert_eq!(
        events[run_start + 1..events.len() - 1],
        [JobEvent::stdout(b"hello from c\n".to_vec())]
    );
    world.assert_settled(&id).await;

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_tiny_writes_is_coalesced() {
    let world = World::new().await;
    let id = world
        .submit(&python(
            "import sys\nfor i in range(20000):\n    sys.stdout.write('x')\n    sys.stdout.flush()",
        ))
        .await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let events = checked_stream(&world, &record).await;
    let expected = "x".repeat(20_000);
    assert_eq!(run_stdout(&record), expected);
    assert_eq!(streamed_stdout(&events), expected.as_bytes());
    let count = output_events(&events);
    assert!(
        (1..500).contains(&count),
        "{count} output events for 20000 writes"
    );
    // And as few Redis commands: every script call of the whole test
    // (submit, start, the appends, finish).
    let calls = script_calls(&world).await;
    assert!(calls < 500, "{calls} script calls for 20000 writes");
    assert_eq!(events.first(), Some(&JobEvent::stage_start("run")));
    assert!(
        matches!(
            events.last(),
            Some(JobEvent::Stage {
                state: StageState::End,
                ..
            })
        ),
        "{:?}",
        events.last()
    );

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_output_stops_at_the_output_limit() {
    let world = World::new().await;
    let spec = JobSpec {
        limits: LimitsRequest {
            output_bytes: Some(1000),
            ..Default::default()
        },
        ..python("import sys\nwhile True:\n    sys.stdout.write('y' * 7)\n    sys.stdout.flush()")
    };
    let id = world.submit(&spec).await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    let events = checked_stream(&world, &record).await;
    let result = record.result.as_ref().expect("a result");
    let run = result.run.as_ref().expect("a run stage");
    assert_eq!(run.stdout.as_bytes(), "y".repeat(1000).as_bytes());
    assert_eq!(streamed_stdout(&events), "y".repeat(1000).as_bytes());
    assert_eq!(
        output_events(&events),
        events
            .iter()
            .filter(|e| matches!(e, JobEvent::Stdout { .. }))
            .count()
    );
    let end = events.last().expect("a stage end");
    assert_eq!(*end, JobEvent::stage_end("run", run));
    let JobEvent::Stage {
        state,
        truncated,
        reason,
        ..
    } = end
    else {
        panic!("{end:?}")
    };
    assert_eq!(*state, StageState::End);
    assert_eq!(*truncated, Some(true));
    assert_eq!(*reason, Some(code_runner::protocol::Reason::OutputLimit));

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_events_stream_expires_with_the_job() {
    let world = World::new().await;
    let id = world.submit(&python("print('soon gone')")).await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));

    let record = world.wait_terminal(&id, JOB_DEADLINE).await;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let events = checked_stream(&world, &record).await;
    assert_eq!(streamed_stdout(&events), b"soon gone\n");
    // Both TTLs read at one instant (one MULTI), in milliseconds.
    let mut conn = world.redis.conn().await;
    let (ttl, job_ttl): (i64, i64) = redis::pipe()
        .atomic()
        .pttl(world.store.keys().events(&id))
        .pttl(world.store.keys().job(&id))
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(
        (1..=3_600_000).contains(&ttl),
        "the events stream's TTL is {ttl} ms"
    );
    assert!(
        ttl.abs_diff(job_ttl) <= 1000,
        "the stream ({ttl} ms) and the job ({job_ttl} ms) expire together"
    );
    // Nothing is appended after the exit event, even by a late append.
    assert_eq!(
        world
            .store
            .jobs()
            .append_events(
                &id,
                world.worker_id(),
                1,
                &[JobEvent::stdout(b"late".to_vec())]
            )
            .await
            .expect("redis answers"),
        None
    );
    assert_eq!(
        stream_events(&world, &id).await.len(),
        events.len() + 3,
        "queued, running and exit around the middle"
    );

    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
    world.harness.assert_clean().await;
}

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
