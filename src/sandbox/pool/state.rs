//! The warm pool's state: each member's [`MemberState`] and the one place it changes ([`State::apply`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{WarmSpec, WarmStatus};
use crate::sandbox::outcome::Started;

/// First and longest pause after a member failed to start.
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A member's state (see the lifecycle in the pool's module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Creating,
    Ready,
    Discarding,
}

/// What happens to a member.
#[derive(Debug)]
pub(super) enum Transition {
    /// Its supervisor said ready; claims go through this sender.
    Ready(mpsc::Sender<oneshot::Sender<Started>>),
    /// It could not be started (it leaves the pool; its container is being
    /// removed).
    Fail,
    /// It is to be removed.
    Discard,
    /// A job took it: it leaves the pool.
    Claim,
    /// Its container is gone.
    Removed,
}

#[derive(Debug, thiserror::Error)]
#[error("warm sandbox {id}: {transition} is not allowed in state {state:?}")]
pub(super) struct BadTransition {
    id: u64,
    state: Option<MemberState>,
    transition: &'static str,
}

pub(super) struct Member {
    pub(super) spec: WarmSpec,
    pub(super) state: MemberState,
    /// Set once ready.
    pub(super) claim: Option<mpsc::Sender<oneshot::Sender<Started>>>,
    /// Cancelled to make the member's task discard it.
    pub(super) discard: CancellationToken,
    pub(super) ready_since: Option<Instant>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) targets: BTreeMap<String, (WarmSpec, usize)>,
    pub(super) members: BTreeMap<u64, Member>,
    pub(super) next_id: u64,
    /// Consecutive failed starts, and when the next start may be tried.
    failures: u32,
    pub(super) retry_at: Option<tokio::time::Instant>,
    pub(super) stopping: bool,
    /// The worker's slots are busy (see `WarmPool::set_busy`): one start
    /// at a time.
    pub(super) busy: bool,
    /// Jobs running on the worker (see `WarmPool::set_running`).
    pub(super) jobs_running: usize,
    /// When the last of them ended.
    pub(super) job_ended: Option<tokio::time::Instant>,
    /// Until when refills wait for those jobs to end.
    pub(super) refill_hold_until: Option<tokio::time::Instant>,
    /// While starts wait for memory (`memory::allows`): when it is looked
    /// at again. `None`: they do not.
    pub(super) memory_recheck_at: Option<tokio::time::Instant>,
}

impl State {
    /// The one place a member changes state.
    pub(super) fn apply(&mut self, id: u64, transition: Transition) -> Result<(), BadTransition> {
        let state = self.members.get(&id).map(|m| m.state);
        let bad = |name| BadTransition {
            id,
            state,
            transition: name,
        };
        match (state, transition) {
            (Some(MemberState::Creating), Transition::Ready(claim)) => {
                let member = self.members.get_mut(&id).ok_or_else(|| bad("ready"))?;
                member.state = MemberState::Ready;
                member.claim = Some(claim);
                member.ready_since = Some(Instant::now());
                self.failures = 0;
                self.retry_at = None;
            }
            (Some(MemberState::Creating), Transition::Fail) => {
                self.members.remove(&id);
                self.failures = self.failures.saturating_add(1);
                let delay = FIRST_RETRY
                    .saturating_mul(1 << self.failures.min(16).saturating_sub(1))
                    .min(MAX_RETRY);
                self.retry_at = Some(tokio::time::Instant::now() + delay);
            }
            (Some(MemberState::Creating | MemberState::Ready), Transition::Discard) => {
                let member = self.members.get_mut(&id).ok_or_else(|| bad("discard"))?;
                member.state = MemberState::Discarding;
                member.claim = None;
                member.discard.cancel();
            }
            (Some(MemberState::Ready), Transition::Claim) => {
                self.members.remove(&id);
            }
            (Some(MemberState::Discarding), Transition::Removed) => {
                self.members.remove(&id);
            }
            (_, transition) => {
                return Err(bad(match transition {
                    Transition::Ready(_) => "ready",
                    Transition::Fail => "fail",
                    Transition::Discard => "discard",
                    Transition::Claim => "claim",
                    Transition::Removed => "removed",
                }));
            }
        }
        Ok(())
    }

    /// When the refiller must look again by itself (besides its wake-ups):
    /// the soonest of a failed start's pause, the refill hold, `settled`
    /// (the settle after the last job) and the memory's next look, of those
    /// still to come. One that has passed is left out: the pass that just
    /// ran saw it (the memory's, passed during a failed start's pause, is
    /// looked at when the pause ends), and waiting for it would only wake
    /// the loop at once, again and again, while a start is under way.
    pub(super) fn next_wake(
        &self,
        now: tokio::time::Instant,
        settled: Option<tokio::time::Instant>,
    ) -> Option<tokio::time::Instant> {
        [
            self.retry_at,
            self.refill_hold_until,
            settled,
            self.memory_recheck_at,
        ]
        .into_iter()
        .flatten()
        .filter(|at| *at > now)
        .min()
    }

    /// Whether starts wait for memory.
    pub(super) fn memory_held(&self) -> bool {
        self.memory_recheck_at.is_some()
    }

    pub(super) fn status(&self) -> WarmStatus {
        let mut status = WarmStatus {
            memory_held: self.memory_held(),
            ..WarmStatus::default()
        };
        for (language, (_, target)) in &self.targets {
            status.languages.entry(language.clone()).or_default().target = *target;
        }
        for member in self.members.values() {
            let entry = status
                .languages
                .entry(member.spec.language.clone())
                .or_default();
            match member.state {
                MemberState::Creating => entry.creating += 1,
                MemberState::Ready => entry.ready += 1,
                MemberState::Discarding => status.discarding += 1,
            }
        }
        status
    }

    /// Members that are not being removed, of `spec`.
    pub(super) fn live(&self, spec: &WarmSpec) -> usize {
        self.members
            .values()
            .filter(|m| m.state != MemberState::Discarding && &m.spec == spec)
            .count()
    }

    pub(super) fn ready(&self, spec: &WarmSpec) -> usize {
        self.members
            .values()
            .filter(|m| m.state == MemberState::Ready && &m.spec == spec)
            .count()
    }

    pub(super) fn creating(&self) -> usize {
        self.members
            .values()
            .filter(|m| m.state == MemberState::Creating)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::container::SandboxClass;
    use crate::sandbox::pool::LanguageStatus;

    fn spec(language: &str) -> WarmSpec {
        WarmSpec {
            language: language.into(),
            image: format!("code-runner/{language}:latest"),
            class: SandboxClass {
                memory_mb: 256,
                pids: 64,
                disk_mb: 64,
            },
            runtime: None,
        }
    }

    fn member(spec: WarmSpec) -> Member {
        Member {
            spec,
            state: MemberState::Creating,
            claim: None,
            discard: CancellationToken::new(),
            ready_since: None,
        }
    }

    #[test]
    fn the_lifecycle_allows_only_its_transitions() {
        let mut state = State::default();
        state.members.insert(1, member(spec("python")));
        assert!(state.apply(1, Transition::Claim).is_err(), "not ready yet");
        assert!(state.apply(1, Transition::Removed).is_err());
        let (tx, _rx) = mpsc::channel(1);
        state.apply(1, Transition::Ready(tx)).unwrap();
        assert_eq!(state.members[&1].state, MemberState::Ready);
        let (tx, _rx) = mpsc::channel(1);
        assert!(state.apply(1, Transition::Ready(tx)).is_err());
        state.apply(1, Transition::Claim).unwrap();
        assert!(!state.members.contains_key(&1), "a claimed member leaves");
        assert!(state.apply(1, Transition::Discard).is_err());

        state.members.insert(2, member(spec("python")));
        let discard = state.members[&2].discard.clone();
        state.apply(2, Transition::Discard).unwrap();
        assert!(discard.is_cancelled(), "discarding tells the member's task");
        assert_eq!(state.status().discarding, 1);
        assert!(state.apply(2, Transition::Claim).is_err());
        state.apply(2, Transition::Removed).unwrap();
        assert!(state.members.is_empty());
    }

    #[test]
    fn failed_starts_back_off_and_a_ready_member_resets_it() {
        let mut state = State::default();
        for id in 0..3 {
            state.members.insert(id, member(spec("python")));
            state.apply(id, Transition::Fail).unwrap();
        }
        assert_eq!(state.failures, 3);
        let wait = state.retry_at.unwrap() - tokio::time::Instant::now();
        assert!(
            wait > FIRST_RETRY * 3 && wait <= FIRST_RETRY * 4,
            "{wait:?}"
        );
        state.members.insert(9, member(spec("python")));
        let (tx, _rx) = mpsc::channel(1);
        state.apply(9, Transition::Ready(tx)).unwrap();
        assert_eq!((state.failures, state.retry_at), (0, None));
    }

    #[test]
    fn the_refiller_wakes_for_the_soonest_time_still_to_come_only() {
        let now = tokio::time::Instant::now();
        let ms = |n| Duration::from_millis(n);
        let mut state = State::default();
        assert_eq!(state.next_wake(now, None), None);
        state.retry_at = Some(now + ms(500));
        state.refill_hold_until = Some(now + ms(300));
        state.memory_recheck_at = Some(now + ms(1000));
        assert_eq!(state.next_wake(now, Some(now + ms(30))), Some(now + ms(30)));
        assert_eq!(state.next_wake(now, None), Some(now + ms(300)));
        // A failed start's pause that has passed while the next start is
        // under way: nothing to wake for but what is still to come.
        state.retry_at = Some(now - ms(1));
        state.refill_hold_until = None;
        assert_eq!(state.next_wake(now, None), Some(now + ms(1000)));
        // Everything passed (now itself included): no wake-up of its own.
        state.memory_recheck_at = Some(now);
        assert_eq!(state.next_wake(now, Some(now - ms(5))), None);
    }

    #[test]
    fn status_counts_by_language_and_state() {
        let mut state = State::default();
        state.targets.insert("python".into(), (spec("python"), 3));
        state.members.insert(1, member(spec("python")));
        state.members.insert(2, member(spec("python")));
        state.members.insert(3, member(spec("c")));
        let (tx, _rx) = mpsc::channel(1);
        state.apply(2, Transition::Ready(tx)).unwrap();
        state.apply(3, Transition::Discard).unwrap();
        let status = state.status();
        assert_eq!(
            status.languages["python"],
            LanguageStatus {
                target: 3,
                ready: 1,
                creating: 1
            }
        );
        assert_eq!(status.discarding, 1);
        assert_eq!(status.ready(), 1);
        assert_eq!(state.live(&spec("python")), 2);
        assert_eq!(state.live(&spec("c")), 0);
    }
}
