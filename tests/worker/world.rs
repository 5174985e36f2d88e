//! A test's world for the worker run in the test itself
//! ([`crate::common::worker_world`]) on a scripted host whose engine the
//! worker runs its jobs on ([`crate::common::scripted`]). Jobs are
//! scripts; the worker's sandboxes are the host's.
//!
//! Also what several topics read of it: the job's events stream, the
//! control stream a client writes, and who is blocked in which Redis
//! command.

use std::collections::HashSet;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use code_runner::job::events::JobEvent;
use code_runner::job::limits::LimitPolicy;
use code_runner::job::{JobSpec, Status};
use code_runner::languages::LanguageCatalog;
use code_runner::store::JobRecord;
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::common::in_process::InProcess;
use crate::common::scripted::{self, ScriptedHost};
use crate::common::wait_for;
pub use crate::common::worker_world::{
    JOB_DEADLINE, POLL, WorkerWorld, run_stdout, stream_events, streamed_stdout, wait_for_stdout,
};

/// The worker's world on a scripted host: what [`WorkerWorld`] has, and
/// the host whose sandboxes the test looks at.
pub struct World {
    pub host: Arc<ScriptedHost>,
    base: WorkerWorld,
}

impl Deref for World {
    type Target = WorkerWorld;

    fn deref(&self) -> &WorkerWorld {
        &self.base
    }
}

impl DerefMut for World {
    fn deref_mut(&mut self) -> &mut WorkerWorld {
        &mut self.base
    }
}

impl World {
    /// A redis-server and a scripted host of the test's own; the worker
    /// runs the embedded catalog with the default limits.
    pub async fn new() -> Self {
        let host = ScriptedHost::new();
        let worker_id = format!("test-{}", uuid::Uuid::new_v4());
        let engine = Arc::new(host.engine(&worker_id));
        Self {
            base: WorkerWorld::new(
                worker_id,
                engine,
                LanguageCatalog::embedded().expect("the embedded catalog"),
                LimitPolicy::default(),
            ),
            host,
        }
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

// ---------------------------------------------------------------------------
// the events stream
// ---------------------------------------------------------------------------

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
