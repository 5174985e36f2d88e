//! The worker: claims jobs from Redis and runs each in a sandbox,
//! never more at once than it has slots for.
//!
//! - A semaphore of `max_sandboxes` permits: the claim loop takes a permit
//!   *before* it claims, so the worker never holds a job it cannot start;
//!   the permit moves into the job's task and is returned when the job's
//!   result is durable.
//! - Claims block on a dedicated connection (`BLMOVE`, 1 s), never on the
//!   pool. The running jobs' control streams (cancel, stdin, signals) are
//!   read by one reader on one dedicated connection ([`control`]), and
//!   each job streams its stage and output events into its events stream,
//!   coalesced ([`stream`]).
//! - Redis failures are retried with backoff ([`backoff`]); the worker never
//!   exits because Redis blipped, and never drops a result silently.
//! - Warm sandboxes ([`warm`], with `CODE_RUNNER_WARM_MAX` > 0): a pool of
//!   started sandboxes per language; a claimed job whose language and limit
//!   class have one ready starts in it, else cold. Warm sandboxes are never
//!   counted as free slots.
//! - A job's result is made durable before its container is removed; the
//!   removal follows at once, still holding the slot.
//! - Shutdown: stop claiming at once (a claim that returns after shutdown
//!   began is given back to the head of the queue), empty the warm pool, let
//!   running jobs finish for up to `drain_timeout`, then kill the rest
//!   through the drain kill token (they are finished as `error`, with the
//!   reason), wait for their results, stop the heartbeat and retire it.
//!
//! # The claim loops
//!
//! `CLAIMERS` (4, no more than the slots) loops share the slots' semaphore,
//! so a burst is claimed four at a time while Redis still serves blocked
//! `BLMOVE`s in turn across a fleet. Each loop: take a permit; check that
//! Docker answers unless it answered within the last 2 s (a worker never
//! claims a job it could only fail); claim (`BLMOVE`, then the claim
//! script, both on the loop's dedicated connection); after a claim that
//! blocked, ask Docker again unless it answered meanwhile (if it does not,
//! the job is released to the head of the queue); spawn the job's task
//! ([`job`]). Before anything is claimed, and after any Redis failure, the
//! heartbeat is written first. After a failed claim the loop reads its
//! processing list back and starts any id that holds no slot (a `BLMOVE`
//! whose reply was lost: [`recover`]); it does so with no claim in flight
//! (`Claims::in_flight`, held from a claim's start until its job holds its
//! slot) and one loop at a time (`Claims::adopting`), so a job just
//! claimed is never started twice.
//!
//! # Layout
//!
//! [`job`]: one claimed job from start to a durable result; [`recover`]:
//! the processing list read back at start and after a claim error;
//! [`removals`]: finished containers removed without fighting the running
//! jobs (with the supervisor's linger, `LINGER`); [`control`]: the one
//! reader of the running jobs' control streams; [`stream`]: their events,
//! coalesced; [`heartbeat`]; [`warm`]: the pool's targets; [`backoff`].

pub(crate) mod backoff;
mod control;
mod heartbeat;
mod job;
mod outputs;
mod recover;
mod removals;
mod stream;
pub mod warm;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use tokio::sync::{OwnedSemaphorePermit, RwLock, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::job::carry::CarriedJobs;
use crate::job::limits::LimitPolicy;
use crate::languages::LanguageCatalog;
use crate::metrics::Metrics;
use crate::sandbox::pool::PoolSettings;
use crate::sandbox::{Engine, WarmPool};
use crate::store::{Store, now_ms};
use backoff::{Backoff, sleep_unless_cancelled};
use removals::Removals;

pub use outputs::OutputsPolicy;

/// After the drain kill: how long killed jobs get to be finished (the engine
/// removes the container, the result is written) before the worker gives up
/// on writing results that Redis still refuses.
const FINISH_TIMEOUT: Duration = Duration::from_secs(15);
/// How long Docker may take to answer the check before a claim.
const DOCKER_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// A claim is preceded by a check that Docker answers unless Docker
/// answered a call of this worker within this long (under load it always
/// did: the previous job's removal).
const DOCKER_FRESH: Duration = Duration::from_secs(2);
/// At shutdown: how long the warm pool's removals may take. They go
/// `DISCARDS_IN_FLIGHT` at a time, each killed and seen stopped first: a
/// pool of 300 on 2 CPUs removed about 16 a second (234 in 15 s), so 30 s.
/// What is left then goes to the reaper.
const POOL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Warm sandboxes started at the same time.
const WARM_PARALLEL_STARTS: usize = 2;
/// How long a refill waits for running jobs to end (see
/// `WarmPool::set_running`): a short job ends within it, so its own refill
/// does not run beside it; a long one keeps the pool short this long at most.
pub const REFILL_HOLD: Duration = Duration::from_millis(500);
/// With yielding on, how long a job's supervisor may stay idle after `done`
/// (`SandboxConfig::linger`) before it exits by itself: the removal queue
/// ends it sooner, when the slots are not busy (see `removals`).
pub const LINGER: Duration = Duration::from_secs(60);
/// Claim loops a worker runs at once (no more than it has slots). One loop
/// made a claim at a time, three round trips each with the wait for its
/// task's turn on a runtime busy with every running job: in the 300-student
/// burst the last claim came 2.6-4.8 s after the submissions, with four
/// 1.0-1.4 s (docs/performance.md). Redis serves blocked claims in turn, so
/// jobs still spread over a fleet's workers as before.
const CLAIMERS: usize = 4;
/// A claim that took this long blocked on an empty queue: Docker is asked
/// again after it (see `claim_loop`).
const CLAIM_BLOCKED: Duration = Duration::from_millis(100);
/// After giving up: how long tasks get to log what they could not write.
const GIVE_UP_TIMEOUT: Duration = Duration::from_secs(2);

/// What the claim loops share.
struct Claims {
    /// One permit a slot.
    slots: Arc<Semaphore>,
    /// Held shared from a claim's start until its job holds its slot, and
    /// alone while the processing list is read back after an error: a job
    /// another loop has just claimed is never taken for a stranded one.
    in_flight: RwLock<()>,
    /// One loop at a time starts the stranded jobs it found.
    adopting: tokio::sync::Mutex<()>,
    /// Docker or Redis stopped answering a claim loop: the first loop to
    /// see it says so, and the first to see it answer again.
    docker_down: AtomicBool,
    redis_down: AtomicBool,
}

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This worker's id: in its heartbeat, processing list and container labels.
    pub id: String,
    /// Most sandboxes running at once.
    pub max_sandboxes: usize,
    /// How often the heartbeat is refreshed.
    pub heartbeat_interval: Duration,
    /// How long the heartbeat lives without a refresh.
    pub heartbeat_ttl: Duration,
    /// On shutdown: how long running jobs may go on before they are killed.
    pub drain_timeout: Duration,
    /// Warm sandboxes kept ready per language when no schedule says
    /// otherwise (`CODE_RUNNER_WARM`).
    pub warm_floors: std::collections::BTreeMap<String, usize>,
    /// Most warm sandboxes (0: no pool).
    pub warm_max: usize,
    /// A warm sandbox older than this is replaced.
    pub warm_lifetime: Duration,
    /// Whether warm sandboxes hold their language's runtime started ahead
    /// (`CODE_RUNNER_WARM_RUNTIMES`; a schedule entry may say otherwise).
    pub warm_runtimes: bool,
    /// While at least half the slots are busy, the pool starts one sandbox
    /// at a time and finished containers wait to be removed
    /// (`CODE_RUNNER_YIELD_WHILE_BUSY`; see `removals`).
    pub yield_while_busy: bool,
    /// How long a refill waits for running jobs to end while the pool
    /// still holds half its target ready ([`REFILL_HOLD`] as served;
    /// yielding off: no wait).
    pub refill_hold: Duration,
    /// No warm sandbox is started while the machine has fewer bytes
    /// available than this (`CODE_RUNNER_WARM_MEMORY_RESERVE_MB`); 0: no
    /// reserve.
    pub warm_memory_reserve: u64,
    /// Times a job claimed but never started is put back in the queue when
    /// its worker is lost (here: when this worker recovers its own list).
    pub max_requeues: u32,
    /// What becomes of a job's output files (inline, stored).
    pub outputs: OutputsPolicy,
}

/// The handles a worker and a reaper both work with (each cheap to clone).
#[derive(Debug, Clone)]
pub struct Services {
    pub store: Store,
    pub engine: Engine,
    pub catalog: LanguageCatalog,
    pub policy: LimitPolicy,
    pub metrics: Metrics,
    /// Jobs the API of this process prepared (`serve`), for its worker.
    pub carried: Option<CarriedJobs>,
}

/// Claims and runs jobs; see the module documentation.
pub struct Worker {
    config: WorkerConfig,
    services: Services,
}

/// What the claim loop and the job tasks share.
struct Shared {
    config: WorkerConfig,
    store: Store,
    engine: Engine,
    catalog: LanguageCatalog,
    policy: LimitPolicy,
    metrics: Metrics,
    carried: Option<CarriedJobs>,
    /// The warm pool, when `warm_max` > 0.
    pool: Option<WarmPool>,
    /// Finished jobs' containers waiting to be removed.
    removals: Removals,
    /// Reads the running jobs' control streams.
    controls: control::ControlReader,
    started_ms: u64,
    /// Cancelled when shutdown begins (SIGTERM).
    shutdown: CancellationToken,
    /// Cancelled when the drain timeout passes: every job's cancel token is
    /// a child of it.
    drain_kill: CancellationToken,
    /// Cancelled when the worker stops waiting for results Redis refuses.
    give_up: CancellationToken,
    /// Ids of the claimed jobs holding a slot.
    running: Mutex<BTreeSet<String>>,
    /// A job was left in the processing list (Redis refused its result or
    /// its release): do not retire, so the reaper recovers it once the
    /// heartbeat expires.
    abandoned: AtomicBool,
}

/// A slot taken by a claimed job: its semaphore permit and its place in
/// `slots_used`, both given back on drop (also if the task panics).
struct Slot {
    shared: Arc<Shared>,
    id: String,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    fn take(shared: Arc<Shared>, id: String, permit: OwnedSemaphorePermit) -> Self {
        shared.update_running(|running| {
            running.insert(id.clone());
        });
        Self {
            shared,
            id,
            _permit: permit,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.update_running(|running| {
            running.remove(&self.id);
        });
    }
}

impl Worker {
    pub fn new(config: WorkerConfig, services: Services) -> Self {
        Self { config, services }
    }

    /// Claims and runs jobs until `shutdown`, then drains: returns once
    /// every claimed job is finished (or given up on) and the heartbeat is
    /// retired.
    pub async fn run(self, shutdown: CancellationToken) {
        let Services {
            store,
            engine,
            catalog,
            policy,
            metrics,
            carried,
        } = self.services;
        let pool = (self.config.warm_max > 0)
            .then(|| {
                let longest_job = engine.budget().total(policy.longest_wall());
                engine.warm_pool(PoolSettings {
                    max: self.config.warm_max,
                    lifetime: self.config.warm_lifetime,
                    longest_job,
                    parallel_starts: WARM_PARALLEL_STARTS,
                    // Yielding off: refills never wait for a job.
                    refill_hold: if self.config.yield_while_busy {
                        self.config.refill_hold
                    } else {
                        Duration::ZERO
                    },
                    slots: self
                        .config
                        .yield_while_busy
                        .then_some(self.config.max_sandboxes),
                    memory_reserve: self.config.warm_memory_reserve,
                })
            })
            .flatten();
        let removals = Removals::new(
            self.config.max_sandboxes,
            self.config.yield_while_busy,
            metrics.clone(),
        );
        let controls = control::ControlReader::new(store.clone(), &self.config.id);
        let shared = Arc::new(Shared {
            config: self.config,
            controls,
            store,
            engine,
            catalog,
            policy,
            metrics,
            carried,
            pool,
            removals,
            started_ms: now_ms(),
            shutdown,
            drain_kill: CancellationToken::new(),
            give_up: CancellationToken::new(),
            running: Mutex::new(BTreeSet::new()),
            abandoned: AtomicBool::new(false),
        });
        let id = shared.config.id.clone();
        shared
            .metrics
            .slots_max
            .set(shared.config.max_sandboxes as i64);
        shared.metrics.slots_used.set(0);
        tracing::info!(
            worker.id = %id,
            max_sandboxes = shared.config.max_sandboxes,
            "worker started"
        );

        // The first heartbeat goes out before anything is claimed.
        let first_delay = match shared.beat().await {
            Ok(()) => shared.config.heartbeat_interval,
            Err(error) => {
                tracing::warn!(worker.id = %id, %error, "could not write the first heartbeat; retrying");
                backoff::INITIAL
            }
        };
        let heartbeat_stop = CancellationToken::new();
        // Nothing of this process runs before what an earlier process under
        // this worker id left is recovered.
        let recovered = CancellationToken::new();
        let warm = async {
            tokio::select! {
                () = recovered.cancelled() => {}
                () = shared.shutdown.cancelled() => return,
            }
            if let Some(pool) = shared.pool.clone() {
                shared.warm_loop(pool, shared.shutdown.clone()).await;
            }
        };
        let work = async {
            shared.recover_own().await;
            recovered.cancel();
            let tracker = TaskTracker::new();
            // Ends once the claim loop stopped (at shutdown) and every job
            // task it spawned ended.
            let jobs = async {
                Arc::clone(&shared).claim_loops(&tracker).await;
                tracker.close();
                tracker.wait().await;
            };
            shared.drain(jobs).await;
            heartbeat_stop.cancel();
        };
        let removals = shared
            .removals
            .run(&*shared.engine, || shared.busy(), &heartbeat_stop);
        tokio::join!(
            shared.heartbeat_loop(heartbeat_stop.clone(), first_delay),
            work,
            warm,
            removals,
            shared.controls.run(&heartbeat_stop)
        );
        // Every job has ended: what is left to remove goes now.
        shared.removals.drain(&*shared.engine).await;

        if shared.abandoned.load(Ordering::SeqCst) {
            tracing::error!(
                worker.id = %id,
                "jobs were left in this worker's processing list; not retiring, so they are recovered once the heartbeat expires"
            );
        } else if let Err(error) = shared.store.workers().retire(&id).await {
            tracing::warn!(worker.id = %id, %error, "could not remove the heartbeat; it expires on its own");
        }
        tracing::info!(worker.id = %id, "worker stopped");
    }
}

impl Shared {
    fn update_running(&self, change: impl FnOnce(&mut BTreeSet<String>)) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut running);
        self.metrics.slots_used.set(running.len() as i64);
        let busy = self.config.yield_while_busy && self.is_busy(running.len());
        let count = running.len();
        drop(running);
        if let Some(pool) = &self.pool {
            pool.set_busy(busy);
            pool.set_running(count);
        }
    }

    /// At least half the slots are taken: background work yields.
    pub(super) fn is_busy(&self, used: usize) -> bool {
        used * 2 >= self.config.max_sandboxes.max(1)
    }

    fn busy(&self) -> bool {
        self.is_busy(self.slots_used())
    }

    fn running_ids(&self) -> Vec<String> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.iter().cloned().collect()
    }

    pub(super) fn slots_used(&self) -> usize {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn mark_abandoned(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
    }

    /// Runs [`CLAIMERS`] claim loops over the worker's slots until shutdown.
    async fn claim_loops(self: Arc<Self>, tracker: &TaskTracker) {
        let claims = Arc::new(Claims {
            slots: Arc::new(Semaphore::new(self.config.max_sandboxes)),
            in_flight: RwLock::new(()),
            adopting: tokio::sync::Mutex::new(()),
            docker_down: AtomicBool::new(false),
            redis_down: AtomicBool::new(false),
        });
        let loops = (0..CLAIMERS.min(self.config.max_sandboxes.max(1)))
            .map(|_| Arc::clone(&self).claim_loop(tracker, Arc::clone(&claims)));
        futures_util::future::join_all(loops).await;
    }

    /// Takes a slot, claims a job into it and spawns its task, until
    /// shutdown. Returns at once when shutdown begins while waiting for a
    /// slot; a claim in flight is let finish (at most the 1 s block), and
    /// the job it returns given back.
    async fn claim_loop(self: Arc<Self>, tracker: &TaskTracker, claims: Arc<Claims>) {
        let worker = self.config.id.as_str();
        let slots = &claims.slots;
        let mut conn: Option<MultiplexedConnection> = None;
        let mut backoff = Backoff::redis();
        let mut failing = false;
        let mut docker_backoff = Backoff::redis();
        let mut docker_failing = false;
        // After a claim error: a BLMOVE may have moved an id into the list
        // with its reply lost; the list is read back before the next claim.
        let mut check_list = false;
        loop {
            if check_list {
                if !self.reannounce(&self.shutdown).await {
                    return;
                }
                match self.adopt_stranded(&claims, tracker).await {
                    Ok(()) => check_list = false,
                    Err(error) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(worker.id = %worker, %error, retry_ms = delay.as_millis() as u64, "could not read this worker's processing list; retrying");
                        if !sleep_unless_cancelled(delay, &self.shutdown).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let permit = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return,
                permit = Arc::clone(slots).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    // The semaphore is never closed.
                    Err(_) => return,
                },
            };
            if self.shutdown.is_cancelled() {
                return;
            }
            // Claim only while Docker answers: a job claimed while it is down
            // could only fail, while a queued one waits for a worker that can
            // run it (this one, once Docker is back, or another). Asked only
            // when Docker has not answered lately.
            if let Some(problem) = self.docker_problem(DOCKER_FRESH).await {
                drop(permit);
                if !claims.docker_down.swap(true, Ordering::SeqCst) {
                    tracing::warn!(worker.id = %worker, error = %problem, "docker does not answer; not claiming jobs until it does");
                }
                docker_failing = true;
                let delay = docker_backoff.next_delay();
                if !sleep_unless_cancelled(delay, &self.shutdown).await {
                    return;
                }
                continue;
            }
            if docker_failing {
                if claims.docker_down.swap(false, Ordering::SeqCst) {
                    tracing::info!(worker.id = %worker, "docker answers again; claiming jobs");
                }
                docker_failing = false;
                docker_backoff.reset();
            }
            let claiming = claims.in_flight.read().await;
            let claim_began = std::time::Instant::now();
            let claimed = match conn.as_mut() {
                // Not raced with shutdown: a BLMOVE in flight may still move
                // an id into the processing list, and only its reply says
                // which one to give back.
                Some(conn) => self.store.jobs().claim(conn, worker).await,
                None => match self.store.dedicated().await {
                    Ok(new) => {
                        conn = Some(new);
                        continue;
                    }
                    Err(error) => Err(error),
                },
            };
            match claimed {
                Ok(claimed) => {
                    if failing && claims.redis_down.swap(false, Ordering::SeqCst) {
                        tracing::info!(worker.id = %worker, "redis answers again; claiming jobs");
                    }
                    failing = false;
                    backoff.reset();
                    let Some(id) = claimed else {
                        continue;
                    };
                    if self.shutdown.is_cancelled() {
                        self.release(&id).await;
                        return;
                    }
                    // Docker may have gone away while the claim blocked:
                    // unless Docker answered since the claim began (under
                    // load it did: other jobs' calls), it is asked; a job
                    // claimed while it is down goes back to the head of the
                    // queue, and the check before the next claim waits for
                    // Docker. A claim that did not block (the queue had
                    // jobs) is covered by the check just before it: asking
                    // Docker after every one of them made a burst of warm
                    // jobs, which make no Docker call, claim one per ping
                    // (17 a second on 2 loaded CPUs).
                    let blocked = claim_began.elapsed();
                    if blocked >= CLAIM_BLOCKED
                        && let Some(problem) = self.docker_problem(blocked).await
                    {
                        drop(permit);
                        tracing::debug!(worker.id = %worker, job.id = %id, error = %problem, "docker stopped answering while claiming; giving the job back");
                        self.release(&id).await;
                        continue;
                    }
                    tracing::debug!(job.id = %id, worker.id = %worker, "claimed a job");
                    Arc::clone(&self).spawn_claimed(tracker, id, permit);
                    drop(claiming);
                }
                Err(error) => {
                    drop(permit);
                    conn = None;
                    failing = true;
                    claims.redis_down.store(true, Ordering::SeqCst);
                    check_list = true;
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        worker.id = %worker,
                        %error,
                        retry_ms = delay.as_millis() as u64,
                        "could not claim a job; retrying"
                    );
                    if !sleep_unless_cancelled(delay, &self.shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// Runs the claimed job `id` in the slot `permit` holds, as a task of
    /// `tracker`.
    fn spawn_claimed(
        self: Arc<Self>,
        tracker: &TaskTracker,
        id: String,
        permit: OwnedSemaphorePermit,
    ) {
        let claimed_at = std::time::Instant::now();
        let slot = Slot::take(self, id, permit);
        tracker.spawn(async move {
            slot.shared.run_claimed(&slot.id, claimed_at).await;
            drop(slot);
        });
    }

    /// Why Docker cannot run a job now, if it cannot: asked of Docker only
    /// when it has not answered within `fresh`.
    async fn docker_problem(&self, fresh: Duration) -> Option<String> {
        if self.engine.answered_within(fresh) {
            return None;
        }
        self.engine
            .readiness(&[], DOCKER_CHECK_TIMEOUT)
            .await
            .into_iter()
            .next()
            .map(|(_, problem)| problem)
    }

    /// Runs `jobs` (the claim loop, then the wait for every job task) until
    /// shutdown, then for up to `drain_timeout` more, counted from the
    /// shutdown (not from the end of a claim still in flight); then kills
    /// what is left and waits for it to be finished, giving up on results
    /// Redis still refuses after [`FINISH_TIMEOUT`].
    async fn drain(&self, jobs: impl Future<Output = ()>) {
        let worker = self.config.id.as_str();
        let drain_timeout_ms = self.config.drain_timeout.as_millis() as u64;
        tokio::pin!(jobs);
        tokio::select! {
            () = &mut jobs => return,
            () = self.shutdown.cancelled() => {}
        }
        let deadline = Instant::now() + self.config.drain_timeout;
        if let Some(pool) = &self.pool {
            // Idle sandboxes first: they hold no job, only resources.
            tokio::select! {
                () = pool.shutdown(POOL_SHUTDOWN_TIMEOUT) => {}
                () = &mut jobs => {
                    pool.shutdown(POOL_SHUTDOWN_TIMEOUT).await;
                    return;
                }
            }
        }
        let running = self.running_ids();
        if running.is_empty() {
            tracing::info!(worker.id = %worker, "shutting down; no job is running");
        } else {
            tracing::info!(
                worker.id = %worker,
                jobs = running.len(),
                drain_timeout_ms,
                "shutting down; letting the running jobs finish"
            );
        }
        if tokio::time::timeout_at(deadline, &mut jobs).await.is_ok() {
            return;
        }
        tracing::warn!(
            worker.id = %worker,
            jobs = ?self.running_ids(),
            drain_timeout_ms,
            "the drain timeout passed; killing the jobs still running"
        );
        self.drain_kill.cancel();
        if tokio::time::timeout(FINISH_TIMEOUT, &mut jobs)
            .await
            .is_ok()
        {
            return;
        }
        self.give_up.cancel();
        if tokio::time::timeout(GIVE_UP_TIMEOUT, &mut jobs)
            .await
            .is_err()
        {
            self.mark_abandoned();
            tracing::error!(
                worker.id = %worker,
                jobs = ?self.running_ids(),
                "jobs did not end after they were killed; leaving them"
            );
        }
    }
}
