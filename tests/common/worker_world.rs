//! A worker run in the test itself, whatever its sandbox engine: a
//! redis-server of the test's own, a store with a key prefix of its own, a
//! worker id, and the engine the worker runs its jobs on (the scripted one
//! in `tests/worker`, Docker's in `tests/daemon/worker_docker.rs`; each
//! wraps [`WorkerWorld`] in a `World` that adds what only its engine shows).
//!
//! Also what reads a job's events stream.

use std::time::{Duration, Instant};

use code_runner::job::events::{JobEvent, StoredEvent};
use code_runner::job::limits::LimitPolicy;
use code_runner::job::{JobSpec, Status};
use code_runner::languages::LanguageCatalog;
use code_runner::metrics::Metrics;
use code_runner::sandbox::Engine;
use code_runner::store::{JobRecord, NewJob, Store, SubmitOutcome};
use code_runner::worker::{Services, Worker, WorkerConfig};
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::common::redis_server::RedisServer;
use crate::common::wait_for;

/// How often the waits look.
pub const POLL: Duration = Duration::from_millis(50);
/// An upper bound for a job's start and end: a scripted job takes
/// milliseconds, a cold container on a loaded CI machine seconds.
pub const JOB_DEADLINE: Duration = Duration::from_secs(60);

/// A worker running in-process; shut down (without waiting) on drop.
pub struct RunningWorker {
    shutdown: CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl RunningWorker {
    /// Begins the graceful shutdown (as SIGTERM does).
    pub fn shut_down(&self) {
        self.shutdown.cancel();
    }

    /// Waits until `Worker::run` returned; fails the test after `within`.
    pub async fn stopped(&mut self, within: Duration) -> Duration {
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

/// Redis, store, metrics and the engine of one worker under test.
pub struct WorkerWorld {
    pub redis: RedisServer,
    pub store: Store,
    pub metrics: Metrics,
    pub worker_id: String,
    engine: Engine,
    catalog: LanguageCatalog,
    policy: LimitPolicy,
}

impl WorkerWorld {
    /// Starts the test's redis-server; the worker `worker_id` will run its
    /// jobs on `engine`, with `catalog` and `policy`.
    pub fn new(
        worker_id: String,
        engine: Engine,
        catalog: LanguageCatalog,
        policy: LimitPolicy,
    ) -> Self {
        let redis = RedisServer::start();
        let prefix = format!("test-{}:", uuid::Uuid::new_v4().simple());
        let store = Store::new(&redis.url(), &prefix, Duration::from_secs(3600), 8)
            .expect("queue settings are valid");
        Self {
            redis,
            store,
            metrics: Metrics::new().expect("metrics"),
            worker_id,
            engine,
            catalog,
            policy,
        }
    }

    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// What a worker needs: this world's store, metrics and engine.
    fn services(&self) -> Services {
        Services {
            store: self.store.clone(),
            engine: self.engine.clone(),
            catalog: self.catalog.clone(),
            policy: self.policy.clone(),
            metrics: self.metrics.clone(),
            carried: None,
        }
    }

    pub fn start_worker(&self, max_sandboxes: usize, drain_timeout: Duration) -> RunningWorker {
        self.start_worker_with(max_sandboxes, drain_timeout, |_| {})
    }

    /// A worker whose configuration `adjust` changed (a warm pool, say).
    pub fn start_worker_with(
        &self,
        max_sandboxes: usize,
        drain_timeout: Duration,
        adjust: impl FnOnce(&mut WorkerConfig),
    ) -> RunningWorker {
        let mut config = WorkerConfig {
            id: self.worker_id.clone(),
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
            outputs: Default::default(),
        };
        adjust(&mut config);
        let worker = Worker::new(config, self.services());
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(worker.run(shutdown.clone()));
        RunningWorker {
            shutdown,
            handle: Some(handle),
        }
    }

    pub async fn submit(&self, spec: &JobSpec) -> String {
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
                admission: crate::common::admission(),
            })
            .await
            .expect("submit");
        assert_eq!(outcome, SubmitOutcome::Accepted);
        id
    }

    pub async fn record(&self, id: &str) -> JobRecord {
        self.store
            .jobs()
            .get(id)
            .await
            .expect("redis answers")
            .unwrap_or_else(|| panic!("job {id} exists"))
    }

    pub async fn wait_status(
        &self,
        id: &str,
        within: Duration,
        done: fn(Status) -> bool,
    ) -> JobRecord {
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

    pub async fn wait_terminal(&self, id: &str, within: Duration) -> JobRecord {
        self.wait_status(id, within, Status::is_terminal).await
    }

    /// Waits for the job's end: it succeeded, printed `stdout` and left
    /// nothing behind in Redis.
    pub async fn assert_succeeded(&self, id: &str, stdout: &str, within: Duration) {
        let record = self.wait_terminal(id, within).await;
        assert_eq!(record.status, Status::Succeeded, "{record:#?}");
        assert_eq!(run_stdout(&record), stdout);
        self.assert_settled(id).await;
    }

    pub async fn processing_len(&self) -> u64 {
        let mut conn = self.redis.conn().await;
        conn.llen(self.store.keys().processing(&self.worker_id))
            .await
            .expect("LLEN")
    }

    pub async fn queue_len(&self) -> u64 {
        let mut conn = self.redis.conn().await;
        conn.llen(self.store.keys().queue()).await.expect("LLEN")
    }

    pub async fn job_ttl(&self, id: &str) -> i64 {
        let mut conn = self.redis.conn().await;
        conn.ttl(self.store.keys().job(id)).await.expect("TTL")
    }

    pub async fn heartbeat(&self) -> Option<serde_json::Value> {
        let mut conn = self.redis.conn().await;
        let value: Option<String> = conn
            .get(self.store.keys().heartbeat(&self.worker_id))
            .await
            .expect("GET");
        value.map(|v| serde_json::from_str(&v).expect("the heartbeat is JSON"))
    }

    /// What must hold for every job that ended: it left the processing
    /// list, and its key expires.
    pub async fn assert_settled(&self, id: &str) {
        let mut conn = self.redis.conn().await;
        let processing: Vec<String> = conn
            .lrange(self.store.keys().processing(&self.worker_id), 0, -1)
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

/// The stdout of a finished job's run.
pub fn run_stdout(record: &JobRecord) -> String {
    let result = record.result.as_ref().expect("a terminal job has a result");
    crate::common::stdout(result)
}

/// Every event of the job's stream, from the start (`seq` 0), read in pages.
pub async fn stream_events(world: &WorkerWorld, id: &str) -> Vec<StoredEvent> {
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

/// Waits until the job's streamed stdout is `expected`.
pub async fn wait_for_stdout(world: &WorkerWorld, id: &str, expected: &[u8]) {
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
pub fn streamed_stdout(events: &[JobEvent]) -> Vec<u8> {
    events
        .iter()
        .filter(|e| matches!(e, JobEvent::Stdout { .. }))
        .flat_map(|e| e.output_bytes().expect("output decodes"))
        .collect()
}
