//! The machine's memory, as the warm pool sees it: no member is started
//! while the kernel says less than the pool's reserve is available
//! ([`PoolSettings::memory_reserve`](super::PoolSettings::memory_reserve)).
//! A warm sandbox holds memory from its start, before any job: its
//! container's processes, its runtime (about 4 MB for python, 50 MB for R:
//! docs/warm-runtimes.md) and, under gVisor, its sandbox kernel. A pool
//! sized by count alone (`CODE_RUNNER_WARM`, a capacity schedule) could
//! otherwise fill the machine and leave the kernel to kill what it picks.

use std::time::Duration;

use super::state::State;

/// How often a refill waiting for memory looks again.
pub(super) const RECHECK: Duration = Duration::from_secs(1);

pub use crate::host::machine_bytes;

/// The reserve when none is configured: a tenth of the machine's memory
/// (`MemTotal`); 0 (no reserve) when that cannot be read.
pub fn default_reserve() -> u64 {
    machine_bytes("MemTotal").map_or(0, |total| total / 10)
}

/// Whether the machine has at least `reserve` bytes available (0: no
/// reserve); notes in `state` (and says, when it changes) whether starts
/// wait for memory, and when to look again.
pub(super) fn allows(reserve: u64, state: &mut State) -> bool {
    if reserve == 0 {
        return true;
    }
    allows_with(reserve, machine_bytes("MemAvailable"), state)
}

/// [`allows`] with `available` bytes (`None`: unreadable, so nothing to go
/// by, and nothing is held).
fn allows_with(reserve: u64, available: Option<u64>, state: &mut State) -> bool {
    let held = available.is_some_and(|available| available < reserve);
    let mib = |bytes: u64| bytes / (1024 * 1024);
    if held && !state.memory_held() {
        tracing::warn!(
            available_mib = available.map(mib),
            reserve_mib = mib(reserve),
            "warm sandboxes wait to be started: the machine has less memory available than the pool's reserve (CODE_RUNNER_WARM_MEMORY_RESERVE_MB)"
        );
    } else if !held && state.memory_held() {
        tracing::info!(
            available_mib = available.map(mib),
            reserve_mib = mib(reserve),
            "warm sandboxes are started again: memory is available"
        );
    }
    state.memory_recheck_at = held.then(|| tokio::time::Instant::now() + RECHECK);
    !held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_wait_while_less_than_the_reserve_is_available_and_look_again() {
        let mut state = State::default();
        let before = tokio::time::Instant::now();
        assert!(!allows_with(100, Some(99), &mut state));
        assert!(state.memory_held());
        let again = state.memory_recheck_at.expect("looked at again");
        assert!(again >= before + RECHECK, "{again:?}");
        // Still short: still held, looked at again later.
        assert!(!allows_with(100, Some(0), &mut state));
        assert!(state.memory_held() && state.memory_recheck_at >= Some(again));
        // Enough (the reserve exactly): starts go on, nothing to look at.
        assert!(allows_with(100, Some(100), &mut state));
        assert!(!state.memory_held());
        assert_eq!(state.memory_recheck_at, None);
        // Unreadable: nothing is held.
        assert!(allows_with(100, None, &mut state));
        assert!(!state.memory_held());
        // No reserve: nothing is read or held.
        assert!(allows(0, &mut state));
        assert!(!state.memory_held());
    }

    #[test]
    fn this_machine_has_memory_available_and_a_reserve_below_it() {
        let available = machine_bytes("MemAvailable").expect("/proc/meminfo has MemAvailable");
        let total = machine_bytes("MemTotal").expect("/proc/meminfo has MemTotal");
        assert!(
            0 < available && available <= total,
            "{available} of {total}"
        );
        assert_eq!(default_reserve(), total / 10);
    }
}
