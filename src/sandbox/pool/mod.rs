//! Warm sandboxes: containers started before any job, whose supervisor has
//! said `ready` and waits for a bundle. A job of the same language and
//! [`SandboxClass`] starts in one with no Engine API call on its path; the
//! pool refills in the background. **A warm sandbox serves exactly one job**
//! and is removed after it, like a cold one: warmth never means reuse.
//!
//! # A member's lifecycle
//!
//! Every state change goes through [`State::apply`] (in `state.rs`); the
//! table is there:
//!
//! ```text
//! Creating ──ready──► Ready ──claim──► (the job owns it; removed after the job)
//!    │                  │
//!    ├──fail──► gone     └──discard──► Discarding ──removed──► gone
//!    └──discard──► Discarding
//! ```
//!
//! A `Ready` member is discarded when its lifetime passes (images change, so
//! sandboxes are renewed), when its stream says anything or ends (the
//! container died, e.g. dockerd restarted), when its language's target falls
//! below what the pool holds, and at shutdown. Each member is one task that
//! owns its container until it hands it to a job (a claim is a message to that
//! task, answered in microseconds) or removes it. A discarded member is
//! removed by its own task (so the pool's shutdown waits for it), killed
//! and seen stopped first, at most [`DISCARDS_IN_FLIGHT`] at once: Docker
//! handed hundreds of forced removals together leaves some listed as
//! "Removal In Progress" until dockerd restarts.
//!
//! # Which job fits
//!
//! A job fits a member only if its language, image and [`SandboxClass`]
//! (memory, pids, disk: fixed at creation) are the member's, which are the
//! language's defaults ([`WarmSpec::fits`]); any other job, and every job
//! with egress, starts cold with its own limits. A member of a language
//! with a warm runtime (python, javascript, php, ruby, r) also starts that
//! runtime with a `prestart` frame after `ready` ([`WarmSpec::runtime`],
//! `CODE_RUNNER_WARM_RUNTIMES`); whether the job runs on it the supervisor
//! decides, by the rule [`crate::job::runs_on`] states, and the result's
//! `start` says so (`warm_runtime`; docs/warm-runtimes.md).
//!
//! # Bounds
//!
//! The pool never holds more than `max` members (creating, ready or being
//! removed), creates at most `parallel_starts` at once, starts none while
//! the machine has less memory available than its reserve (`memory.rs`),
//! and backs off after failed starts (Docker down) so it never spins. It
//! yields to the worker's jobs: while the slots are busy it starts one
//! sandbox at a time ([`WarmPool::set_busy`]); while jobs run, a spec that
//! still holds half its target waits for them to end before it refills (at
//! most `refill_hold`), and no spec refills beyond the slots they leave
//! free ([`WarmPool::set_running`]). Members are labelled
//! `code-runner.warm=1` with this worker's id and a deadline covering their
//! lifetime plus the longest job, so the reaper removes a dead worker's
//! members like its job containers and leaves a live worker's alone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connection::{Connection, StartFailure, start};
use super::container::{ContainerGuard, SandboxClass, SandboxShape, warm_container_name};
use super::docker::DockerEngine;
use super::engine::SandboxEngine as _;
use super::outcome::Started;
use crate::job::deadline::unix_ms;
use crate::job::{PreparedJob, StartKind};
use crate::protocol::{HostMessage, Prestart};

/// Longest wait for a member's task to hand its sandbox over.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(1);
/// Discarded members removed at the same time. Docker handles a killed
/// container's exit within its own 10 s only when it is not handed hundreds
/// at once (a pool's shutdown on 2 CPUs: 47 of 300 were not); a removal
/// that follows an exit Docker has not handled can leave the container
/// stuck as "Removal In Progress" (see `ContainerGuard::stop_then_remove`).
pub const DISCARDS_IN_FLIGHT: usize = 16;
/// After the last running job ends, how long a held refill still waits:
/// the API is answering that job then (its result was just written). The
/// worker's removal queue waits as long.
pub const JOB_END_SETTLE: Duration = Duration::from_millis(30);

pub mod memory;
mod state;

pub use state::MemberState;
use state::{Member, State, Transition};

/// What kind of sandbox a pool keeps for a language.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmSpec {
    pub language: String,
    /// The image, with its tag.
    pub image: String,
    pub class: SandboxClass,
    /// The language's runtime each member starts ahead of its job (its
    /// uid is the member's, filled in when it starts); `None`: plain warm
    /// sandboxes.
    pub runtime: Option<Prestart>,
}

impl WarmSpec {
    /// Whether `job` can run in a sandbox of this spec: same language,
    /// image and container-level limits.
    pub fn fits(&self, job: &PreparedJob) -> bool {
        // A job with egress needs its proxy's socket mounted when its
        // sandbox is created (and, under gVisor, another runtime): it
        // always starts cold.
        job.egress.is_none()
            && self.language == job.language.id
            && self.image == job.language.image_ref()
            && self.class == SandboxClass::of(&job.limits)
    }
}

/// How a pool behaves; fixed for its life.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Most members at once (creating, ready or being removed).
    pub max: usize,
    /// A ready member older than this is replaced (a little jitter spreads
    /// the renewals).
    pub lifetime: Duration,
    /// The longest a job may keep a claimed member: its deadline label is
    /// its creation + `lifetime` + this.
    pub longest_job: Duration,
    /// Members started at the same time.
    pub parallel_starts: usize,
    /// How long a refill waits for the running jobs to end while the pool
    /// still holds half its target ready (see `WarmPool::set_running`).
    pub refill_hold: Duration,
    /// The worker's slots, when refills yield to its jobs: while jobs run,
    /// a spec's pool is not refilled beyond the slots they leave free (see
    /// `WarmPool::set_running`). `None`: no such bound.
    pub slots: Option<usize>,
    /// No member is started while the machine has fewer bytes available
    /// than this (`MemAvailable`; see `memory.rs`); 0: no reserve.
    pub memory_reserve: u64,
}

/// The pool's figures for one language.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LanguageStatus {
    pub target: usize,
    pub ready: usize,
    pub creating: usize,
}

/// The pool's figures, by language, as of the last change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmStatus {
    pub languages: BTreeMap<String, LanguageStatus>,
    /// Members being removed.
    pub discarding: usize,
    /// Starts wait: the machine has less memory available than the
    /// pool's reserve ([`PoolSettings::memory_reserve`]).
    pub memory_held: bool,
}

impl WarmStatus {
    pub fn ready(&self) -> usize {
        self.languages.values().map(|l| l.ready).sum()
    }
}

/// A ready sandbox taken from the pool for one job.
pub struct WarmSandbox {
    started: Started,
}

impl WarmSandbox {
    pub(super) fn into_started(self) -> Started {
        self.started
    }
}

impl std::fmt::Debug for WarmSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmSandbox")
            .field("container", &self.started.guard.name())
            .finish()
    }
}

struct Inner {
    engine: DockerEngine,
    settings: PoolSettings,
    state: Mutex<State>,
    /// Wakes the refiller: a target changed, a member left.
    wake: Notify,
    status: watch::Sender<WarmStatus>,
    stop: CancellationToken,
    tasks: TaskTracker,
    /// Bounds the members being removed at once ([`DISCARDS_IN_FLIGHT`]).
    discards: tokio::sync::Semaphore,
}

/// A worker's pool of warm sandboxes; cheap to clone. See the module
/// documentation.
#[derive(Clone)]
pub struct WarmPool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for WarmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmPool")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl WarmPool {
    /// Starts the pool's refiller; it holds nothing until targets are set.
    pub fn start(engine: &DockerEngine, settings: PoolSettings) -> Self {
        let (status, _) = watch::channel(WarmStatus::default());
        let pool = Self {
            inner: Arc::new(Inner {
                engine: engine.clone(),
                settings,
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                status,
                stop: CancellationToken::new(),
                tasks: TaskTracker::new(),
                discards: tokio::sync::Semaphore::new(DISCARDS_IN_FLIGHT),
            }),
        };
        let refiller = pool.clone();
        pool.inner
            .tasks
            .spawn(async move { refiller.refill().await });
        pool
    }

    /// The figures as of now, and a receiver that sees every change.
    pub fn status(&self) -> watch::Receiver<WarmStatus> {
        self.inner.status.subscribe()
    }

    /// Sets how many ready sandboxes to keep per language (a language left
    /// out is 0); the sum is cut to the pool's `max`. Members above a
    /// lowered target are discarded, the oldest first.
    pub fn set_targets(&self, targets: Vec<(WarmSpec, usize)>) {
        let mut room = self.inner.settings.max;
        let mut state = self.inner.lock();
        if state.stopping {
            return;
        }
        state.targets = targets
            .into_iter()
            .map(|(spec, count)| {
                let count = count.min(room);
                room -= count;
                (spec.language.clone(), (spec, count))
            })
            .collect();
        // Discard what no target wants any more.
        let mut surplus: Vec<u64> = Vec::new();
        let mut kept: BTreeMap<String, usize> = BTreeMap::new();
        let mut members: Vec<(&u64, &Member)> = state
            .members
            .iter()
            .filter(|(_, m)| m.state != MemberState::Discarding)
            .collect();
        // Newest first, so the oldest are the surplus.
        members.sort_by_key(|(id, _)| std::cmp::Reverse(**id));
        for (id, member) in members {
            let wanted = state
                .targets
                .get(&member.spec.language)
                .filter(|(spec, _)| *spec == member.spec)
                .map_or(0, |(_, count)| *count);
            let have = kept.entry(member.spec.language.clone()).or_default();
            if *have < wanted {
                *have += 1;
            } else {
                surplus.push(*id);
            }
        }
        for id in surplus {
            if let Err(error) = state.apply(id, Transition::Discard) {
                tracing::warn!(%error, "cannot discard a surplus warm sandbox");
            }
        }
        self.inner.publish(&state);
        drop(state);
        self.inner.wake.notify_one();
    }

    /// Says whether the worker's slots are busy. While they are, the pool
    /// starts one sandbox at a time instead of `parallel_starts`: the
    /// containers it starts, and the runtimes in them, take CPU from the
    /// jobs running (a burst that emptied the pool refills after it, not
    /// against it).
    pub fn set_busy(&self, busy: bool) {
        let mut state = self.inner.lock();
        if state.busy == busy {
            return;
        }
        state.busy = busy;
        drop(state);
        if !busy {
            self.inner.wake.notify_one();
        }
    }

    /// Says how many jobs the worker runs. While one runs and the pool
    /// still holds at least half its target of a spec ready, that spec's
    /// refill waits until no job runs and [`JOB_END_SETTLE`] has passed
    /// since the last one ended, for at most `refill_hold`: a start takes
    /// CPU from the job running and from the answer of the one that just
    /// ended (measured on the job's own latency, docs/performance.md), and
    /// a long job does not keep the pool short.
    ///
    /// And while jobs run, a spec's pool is not refilled beyond the slots
    /// they leave free ([`PoolSettings::slots`]): a sandbox no slot could
    /// take now would be started on the CPUs those jobs use (a burst's own
    /// refills, measured in docs/performance.md), and every job that can
    /// start still finds a ready one. Once a job ends, its slot is free
    /// and the refill goes on.
    pub fn set_running(&self, running: usize) {
        let mut state = self.inner.lock();
        let fewer = running < state.jobs_running;
        state.jobs_running = running;
        if fewer {
            state.job_ended = Some(tokio::time::Instant::now());
        }
        drop(state);
        if fewer {
            self.inner.wake.notify_one();
        }
    }

    /// A ready sandbox for `job`, if the pool has one of its spec; `None`
    /// sends the job down the cold path.
    pub async fn claim(&self, job: &PreparedJob) -> Option<WarmSandbox> {
        loop {
            let sender = {
                let mut state = self.inner.lock();
                let id = state
                    .members
                    .iter()
                    .filter(|(_, m)| m.state == MemberState::Ready && m.spec.fits(job))
                    .min_by_key(|(_, m)| m.ready_since)
                    .map(|(id, _)| *id)?;
                let sender = state.members.get_mut(&id).and_then(|m| m.claim.take());
                if let Err(error) = state.apply(id, Transition::Claim) {
                    tracing::warn!(%error, "cannot claim a warm sandbox");
                    return None;
                }
                self.inner.publish(&state);
                sender
            };
            self.inner.wake.notify_one();
            let Some(sender) = sender else { continue };
            let (reply, answer) = oneshot::channel();
            if sender.try_send(reply).is_err() {
                continue;
            }
            // The member's task answers at once unless its sandbox broke
            // at this very moment: then try another, or go cold.
            if let Ok(Ok(started)) = tokio::time::timeout(HANDOVER_TIMEOUT, answer).await {
                return Some(WarmSandbox { started });
            }
        }
    }

    /// Stops refilling, removes every member not claimed by a job, and
    /// waits (up to `within`) until they are gone.
    pub async fn shutdown(&self, within: Duration) {
        {
            let mut state = self.inner.lock();
            state.stopping = true;
            state.targets.clear();
            let ids: Vec<u64> = state
                .members
                .iter()
                .filter(|(_, m)| m.state != MemberState::Discarding)
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                if let Err(error) = state.apply(id, Transition::Discard) {
                    tracing::warn!(%error, "cannot discard a warm sandbox at shutdown");
                }
            }
            self.inner.publish(&state);
        }
        self.inner.stop.cancel();
        self.inner.tasks.close();
        if tokio::time::timeout(within, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = self.inner.lock().members.len(),
                "warm sandboxes were not all removed in time; the reaper removes them"
            );
        }
    }

    /// Starts members where targets are not met, until stopped.
    async fn refill(&self) {
        loop {
            let retry_at = {
                let mut state = self.inner.lock();
                if state.stopping {
                    return;
                }
                let now = tokio::time::Instant::now();
                if state.retry_at.is_none_or(|at| at <= now) {
                    self.start_missing(&mut state);
                }
                state.next_wake(now, self.settles_at(&state))
            };
            tokio::select! {
                () = self.inner.stop.cancelled() => return,
                () = self.inner.wake.notified() => {}
                () = sleep_until(retry_at), if retry_at.is_some() => {}
            }
        }
    }

    /// Until when a refill still waits after the last job's end (the API
    /// is answering it): [`JOB_END_SETTLE`], within the hold.
    fn settles_at(&self, state: &State) -> Option<tokio::time::Instant> {
        let settle = self.inner.settings.refill_hold.min(JOB_END_SETTLE);
        state.job_ended.map(|at| at + settle)
    }

    /// Spawns a member task for each missing sandbox, within the bounds.
    fn start_missing(&self, state: &mut State) {
        let settings = &self.inner.settings;
        let parallel = if state.busy {
            1
        } else {
            settings.parallel_starts
        };
        let specs: Vec<(WarmSpec, usize)> = state.targets.values().cloned().collect();
        // The hold begins when a start is first needed while jobs run.
        let now = tokio::time::Instant::now();
        let needed = specs
            .iter()
            .any(|(spec, target)| state.live(spec) < *target);
        let settling = self.settles_at(state).is_some_and(|at| now < at);
        if !needed || (state.jobs_running == 0 && !settling) {
            state.refill_hold_until = None;
        } else if state.refill_hold_until.is_none() {
            state.refill_hold_until = Some(now + settings.refill_hold);
        }
        let holding = state.refill_hold_until.is_some_and(|until| now < until);
        let free_slots = settings
            .slots
            .filter(|_| state.jobs_running > 0)
            .map(|slots| slots.saturating_sub(state.jobs_running));
        // Looked at once a pass, when a start is about to be made.
        let mut memory_allows = None;
        'specs: for (spec, target) in specs {
            if holding && 2 * state.ready(&spec) >= target {
                continue;
            }
            let wanted = free_slots.map_or(target, |free| target.min(free));
            while state.live(&spec) < wanted
                && state.members.len() < settings.max
                && state.creating() < parallel
            {
                if !*memory_allows
                    .get_or_insert_with(|| memory::allows(settings.memory_reserve, state))
                {
                    break 'specs;
                }
                let id = state.next_id;
                state.next_id += 1;
                let discard = CancellationToken::new();
                state.members.insert(
                    id,
                    Member {
                        spec: spec.clone(),
                        state: MemberState::Creating,
                        claim: None,
                        discard: discard.clone(),
                        ready_since: None,
                    },
                );
                let inner = Arc::clone(&self.inner);
                let spec = spec.clone();
                self.inner
                    .tasks
                    .spawn(async move { inner.member(id, spec, discard).await });
            }
        }
        if memory_allows.is_none() {
            // No start was wanted: nothing waits for memory.
            state.memory_recheck_at = None;
        }
        self.inner.publish(state);
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, state: &State) {
        self.status.send_replace(state.status());
    }

    /// Applies a transition and publishes the new figures; `false` when it
    /// was not allowed (the member changed state meanwhile).
    fn transition(&self, id: u64, transition: Transition) -> bool {
        let mut state = self.lock();
        let applied = match state.apply(id, transition) {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%error, "warm sandbox transition skipped");
                false
            }
        };
        self.publish(&state);
        drop(state);
        self.wake.notify_one();
        applied
    }

    /// One member's task: starts its sandbox, idles until claimed, broken,
    /// expired or discarded, then hands it over or removes it.
    async fn member(self: Arc<Self>, id: u64, spec: WarmSpec, discard: CancellationToken) {
        let lease = match self.engine.uids().lease() {
            Ok(lease) => lease,
            Err(error) => {
                tracing::warn!(%error, language = %spec.language, "cannot start a warm sandbox");
                self.transition(id, Transition::Fail);
                return;
            }
        };
        let uid = lease.uid();
        let name = warm_container_name(&uuid::Uuid::new_v4().to_string());
        let guard = ContainerGuard::new(self.engine.docker().clone(), name, Some(lease));
        let now = SystemTime::now();
        let lifetime = self.jittered_lifetime(id);
        let shape = SandboxShape {
            image: spec.image.clone(),
            language: spec.language.clone(),
            class: spec.class,
            uid,
            job_id: None,
            created_ms: unix_ms(now),
            deadline_ms: unix_ms(now + lifetime + self.settings.longest_job),
            checker: false,
            egress_dir: None,
        };
        // Not raced with `discard`: a create call in flight may still make
        // the container, and only its end says there is one to remove.
        let started = self.start_ready(&guard, &shape, &spec).await;
        let mut connection = match started {
            Ok(connection) => connection,
            Err(StartFailure(message)) => {
                if discard.is_cancelled() {
                    guard.remove().await;
                    self.transition(id, Transition::Removed);
                } else {
                    tracing::warn!(language = %spec.language, error = %message, "a warm sandbox did not start");
                    self.transition(id, Transition::Fail);
                    guard.remove().await;
                }
                return;
            }
        };
        let (claims, mut claim_rx) = mpsc::channel(1);
        if !self.transition(id, Transition::Ready(claims)) {
            // Discarded while starting.
            self.discard(guard).await;
            self.transition(id, Transition::Removed);
            return;
        }
        tracing::debug!(language = %spec.language, container = %guard.name(), "a warm sandbox is ready");
        let why = tokio::select! {
            biased;
            reply = claim_rx.recv() => match reply {
                Some(reply) => {
                    hand_over(reply, guard, connection);
                    return;
                }
                // The pool discarded it (a target fell, or shutdown): its
                // claim sender is gone. Removed here, where the pool's
                // tasks (and so its shutdown) wait for it.
                None => None,
            },
            () = discard.cancelled() => None,
            () = tokio::time::sleep(lifetime) => Some("its lifetime passed".to_string()),
            why = connection.idle_until_broken() => Some(why),
        };
        let broken = why.as_deref().is_some_and(|w| w != "its lifetime passed");
        if why.is_some() && !self.transition(id, Transition::Discard) {
            // A job claimed it at this very moment: its request is on the
            // way. Hand it over unless it is broken (the job then goes cold).
            if !broken && let Some(reply) = claim_rx.recv().await {
                hand_over(reply, guard, connection);
                return;
            }
            self.discard(guard).await;
            return;
        }
        if let Some(why) = &why {
            tracing::debug!(language = %spec.language, container = %guard.name(), %why, "discarding a warm sandbox");
        }
        self.discard(guard).await;
        self.transition(id, Transition::Removed);
    }

    /// Removes a member's container, still running (its supervisor waits
    /// for a job): killed and seen stopped first, and no more than
    /// [`DISCARDS_IN_FLIGHT`] at once, which Docker does not manage by
    /// itself when hundreds go together (see `stop_then_remove`).
    async fn discard(&self, guard: ContainerGuard) {
        let _permit = self.discards.acquire().await;
        guard.stop_then_remove().await;
    }

    async fn start_ready(
        &self,
        guard: &ContainerGuard,
        shape: &SandboxShape,
        spec: &WarmSpec,
    ) -> Result<Connection, StartFailure> {
        let engine = &self.engine;
        let mut connection = match start(engine.docker(), engine.config(), guard, shape).await {
            Ok(connection) => connection,
            Err(failure) => {
                engine.note_unanswered();
                return Err(failure);
            }
        };
        engine.docker_answered();
        connection
            .await_ready(engine.config().budget.start_timeout)
            .await?;
        if let Some(template) = &spec.runtime {
            let prestart = Prestart {
                uid: shape.uid,
                gid: shape.uid,
                ..template.clone()
            };
            let frame = HostMessage::Prestart(Box::new(prestart)).encode();
            if connection.frames.send(frame).await.is_err() {
                return Err(StartFailure(
                    "the sandbox's stdin closed before its runtime could start".into(),
                ));
            }
        }
        Ok(connection)
    }

    /// The lifetime less up to a tenth, by member, so members started
    /// together are not all renewed at once.
    fn jittered_lifetime(&self, id: u64) -> Duration {
        let lifetime = self.settings.lifetime;
        let tenth = lifetime / 10;
        let step = (id.wrapping_mul(2_654_435_761) % 1000) as u32;
        lifetime - tenth * step / 1000
    }
}

fn hand_over(reply: oneshot::Sender<Started>, guard: ContainerGuard, connection: Connection) {
    let started = Started {
        guard,
        connection,
        kind: StartKind::Warm,
    };
    // A claimer that gave up drops the sandbox: its guard removes it.
    let _ = reply.send(started);
}
