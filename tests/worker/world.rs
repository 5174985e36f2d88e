//! A test's world for the worker run in the test itself: a redis-server of
//! its own, a store with a key prefix of its own, and a scripted host
//! whose engine the worker runs its jobs on ([`crate::common::scripted`]).
//! Jobs are scripts; the worker's sandboxes are the host's.
//!
//! Also what several topics read of it: the job's events stream, the
//! control stream a client writes, and who is blocked in which Redis
//! command.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use code_runner::job::events::{JobEvent, StoredEvent};
use code_runner::job::limits::LimitPolicy;
use code_runner::job::{JobSpec, Status};
use code_runner::languages::LanguageCatalog;
use code_runner::metrics::Metrics;
use code_runner::store::{Admission, JobRecord, NewJob, Quotas, Store, SubmitOutcome};
use code_runner::worker::{Services, Worker, WorkerConfig};
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::common::in_process::InProcess;
use crate::common::redis_server::RedisServer;
use crate::common::scripted::{self, ScriptedHost};
use crate::common::wait_for;

pub const POLL: Duration = Duration::from_millis(50);
/// An upper bound for a job's start and end (a scripted one takes
/// milliseconds; this is for a loaded machine).
pub const JOB_DEADLINE: Duration = Duration::from_secs(60);

pub struct World {
    pub host: Arc<ScriptedHost>,
    pub redis: RedisServer,
    pub store: Store,
    pub metrics: Metrics,
    worker_id: String,
}

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

impl World {
    pub async fn new() -> Self {
        let redis = RedisServer::start();
        let prefix = format!("test-{}:", uuid::Uuid::new_v4().simple());
        let store = Store::new(&redis.url(), &prefix, Duration::from_secs(3600), 8)
            .expect("queue settings are valid");
        Self {
            host: ScriptedHost::new(),
            redis,
            store,
            metrics: Metrics::new().expect("metrics"),
            worker_id: format!("test-{}", uuid::Uuid::new_v4()),
        }
    }

    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// What a worker needs: this world's store, metrics and an engine of
    /// its host; the embedded catalog and the default limits.
    fn services(&self) -> Services {
        Services {
            store: self.store.clone(),
            engine: Arc::new(self.host.engine(&self.worker_id)),
            catalog: LanguageCatalog::embedded().expect("the embedded catalog"),
            policy: LimitPolicy::default(),
            metrics: self.metrics.clone(),
            carried: None,
        }
    }

    pub fn start_worker(&self, max_sandboxes: usize, drain_timeout: Duration) -> RunningWorker {
        self.start_worker_with(max_sandboxes, drain_timeout, |_| {})
    }

    /// A worker whose configuration `adjust` changed.
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

    /// Waits until the job is running and its sandbox exists.
    pub async fn wait_running(&self, id: &str) {
        self.wait_status(id, JOB_DEADLINE, |s| s == Status::Running)
            .await;
        wait_for("the job's sandbox", JOB_DEADLINE, || async {
            self.sandboxes().contains(&id.to_string()).then_some(())
        })
        .await;
    }

    /// Job ids of this worker's sandboxes that exist now.
    pub fn sandboxes(&self) -> Vec<String> {
        self.host
            .sandboxes_of(&self.worker_id)
            .into_iter()
            .map(|c| c.job.unwrap_or_default())
            .collect()
    }

    /// Job ids of this worker's sandboxes whose program runs now.
    pub fn running_sandboxes(&self) -> Vec<String> {
        let running = self.host.running();
        self.host
            .sandboxes_of(&self.worker_id)
            .into_iter()
            .filter(|c| running.contains(&c.id))
            .map(|c| c.job.unwrap_or_default())
            .collect()
    }

    /// Waits (up to 10 s) until no sandbox of this worker is left; fails
    /// the test with their jobs otherwise.
    pub async fn assert_clean(&self) {
        let left = crate::common::until(
            Duration::from_secs(10),
            || async { self.sandboxes() },
            Vec::is_empty,
        )
        .await;
        assert!(left.is_empty(), "sandboxes left behind: {left:?}");
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

/// Waits (up to 10 s) until the in-process daemon `process` has no
/// sandbox left on its host.
pub async fn assert_no_sandboxes(process: &InProcess) {
    let left = crate::common::until(
        Duration::from_secs(10),
        || async { process.host.sandboxes_of(&process.worker_id) },
        Vec::is_empty,
    )
    .await;
    assert!(left.is_empty(), "sandboxes left: {left:#?}");
}

/// What a sampler saw while it ran.
#[derive(Debug, Default)]
pub struct Samples {
    /// Sandboxes whose program runs.
    pub max_containers: usize,
    /// Sandboxes in any state, with the exited ones waiting to be removed.
    pub max_all: usize,
    pub max_slots_used: i64,
    pub jobs_seen: HashSet<String>,
    pub count: usize,
}

/// Samples this worker's sandboxes and `slots_used` every 50 ms until
/// `stop`.
pub fn sample(world: &World, stop: CancellationToken) -> tokio::task::JoinHandle<Samples> {
    let host = Arc::clone(&world.host);
    let worker_id = world.worker_id.clone();
    let metrics = world.metrics.clone();
    tokio::spawn(async move {
        let mut samples = Samples::default();
        while !stop.is_cancelled() {
            let running = host.running();
            let list = host.sandboxes_of(&worker_id);
            let live = list.iter().filter(|c| running.contains(&c.id)).count();
            samples.max_containers = samples.max_containers.max(live);
            samples.max_all = samples.max_all.max(list.len());
            samples.max_slots_used = samples.max_slots_used.max(metrics.slots_used.get());
            samples
                .jobs_seen
                .extend(list.into_iter().filter_map(|c| c.job));
            samples.count += 1;
            tokio::time::sleep(POLL).await;
        }
        samples
    })
}

/// An interactive job running `script`.
pub fn interactive(script: &str) -> JobSpec {
    JobSpec {
        interactive: true,
        ..scripted::job(script)
    }
}

pub fn run_stdout(record: &JobRecord) -> String {
    let result = record.result.as_ref().expect("a terminal job has a result");
    crate::common::stdout(result)
}

// ---------------------------------------------------------------------------
// the events stream
// ---------------------------------------------------------------------------

/// Every event of the job's stream, from the start (`seq` 0), read in pages.
pub async fn stream_events(world: &World, id: &str) -> Vec<StoredEvent> {
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
pub async fn checked_stream(world: &World, record: &JobRecord) -> Vec<JobEvent> {
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
pub async fn wait_for_stdout(world: &World, id: &str, expected: &[u8]) {
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

// ---------------------------------------------------------------------------
// the control stream and blocked clients
// ---------------------------------------------------------------------------

/// Appends a control message to the job's control stream, as the API does.
pub async fn send_control(world: &World, id: &str, fields: &[(&str, &str)]) {
    let mut conn = world.redis.conn().await;
    let _: String = conn
        .xadd(world.store.keys().stdin(id), "*", fields)
        .await
        .expect("XADD");
}

/// The lines of `CLIENT LIST` of the test's Redis.
async fn clients(world: &World) -> String {
    let mut conn = world.redis.conn().await;
    redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("CLIENT LIST")
}

/// How many clients of this Redis are blocked in BLMOVE right now.
pub async fn claims_in_flight(world: &World) -> usize {
    clients(world)
        .await
        .lines()
        .filter(|line| {
            line.split(' ').any(|f| f == "cmd=blmove")
                && line
                    .split(' ')
                    .any(|f| f.starts_with("flags=") && f.contains('b'))
        })
        .count()
}

/// The ids of the test Redis's clients blocked in an `XREAD`.
pub async fn blocked_xreads(world: &World) -> Vec<String> {
    clients(world)
        .await
        .lines()
        .filter(|client| client.contains(" cmd=xread ") && client.contains(" flags=b "))
        .filter_map(|client| client.strip_prefix("id=")?.split(' ').next())
        .map(str::to_string)
        .collect()
}
