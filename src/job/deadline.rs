//! A job's time budget and its deadline: computed here, read everywhere.
//!
//! A job may take the wall limits of its stages (summed:
//! [`PreparedJob::stages_wall_ms`](super::PreparedJob::stages_wall_ms), stored
//! with the job at submit) plus the platform's slack: how long its sandbox may
//! take to start ([`Budget::start_timeout`]) and a grace after the walls
//! ([`Budget::grace`]). When a worker starts a job, the store's start step
//! stores its deadline, `started + slack + walls` (`start.lua` adds the slack
//! [`Budget::slack`] gives to the stored walls). From then on that one figure
//! is read, never derived again:
//!
//! - the engine kills the job's sandbox by then at the latest and labels its
//!   container with it (`JobIo::deadline_ms`);
//! - the reaper removes a dead worker's container past it and gives up on a
//!   job past it on a live worker;
//! - the API's waiting clients wait no longer than it.
//!
//! [`Budget::deadline_ms`] is for a run that has no stored deadline (a run
//! outside the daemon, or a job started before deadlines were stored).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The platform's share of every job's time; fixed for a worker's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Longest wait from a sandbox's creation until its supervisor is ready.
    pub start_timeout: Duration,
    /// Allowed past the sum of the stages' wall limits before the engine
    /// kills the sandbox itself, whatever its supervisor says.
    pub grace: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            start_timeout: Duration::from_secs(30),
            grace: Duration::from_secs(3),
        }
    }
}

impl Budget {
    /// What a deadline adds to a job's walls: the start timeout and the
    /// grace.
    pub fn slack(&self) -> Duration {
        self.start_timeout + self.grace
    }

    /// The longest a job whose stages may run `walls` in all may take,
    /// from its start to its end.
    pub fn total(&self, walls: Duration) -> Duration {
        self.slack() + walls
    }

    /// The deadline (unix ms) of a job started at `started_ms` whose stages
    /// may run `walls` in all.
    pub fn deadline_ms(&self, started_ms: u64, walls: Duration) -> u64 {
        started_ms.saturating_add(self.total(walls).as_millis() as u64)
    }

    /// Once a job's first stage has started: how long its stages and the
    /// grace may still take (the start is behind it).
    pub fn after_first_stage(&self, walls: Duration) -> Duration {
        walls + self.grace
    }
}

/// `at` as unix milliseconds (0 before 1970).
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Now, as unix milliseconds.
pub fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

/// How long from now until `deadline_ms` (zero once it has passed).
pub fn until(deadline_ms: u64) -> Duration {
    Duration::from_millis(deadline_ms.saturating_sub(now_ms()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_the_start_plus_the_slack_and_the_walls() {
        let budget = Budget {
            start_timeout: Duration::from_secs(30),
            grace: Duration::from_secs(3),
        };
        assert_eq!(budget.slack(), Duration::from_secs(33));
        assert_eq!(
            budget.total(Duration::from_millis(2_500)),
            Duration::from_millis(35_500)
        );
        assert_eq!(
            budget.deadline_ms(1_000_000, Duration::from_millis(2_500)),
            1_035_500
        );
        assert_eq!(
            budget.after_first_stage(Duration::from_millis(2_500)),
            Duration::from_millis(5_500)
        );
        assert_eq!(
            budget.deadline_ms(u64::MAX - 5, Duration::from_secs(1)),
            u64::MAX
        );
    }

    #[test]
    fn until_a_passed_deadline_is_zero() {
        assert_eq!(until(0), Duration::ZERO);
        let ahead = until(now_ms() + 60_000);
        assert!(ahead > Duration::from_secs(59) && ahead <= Duration::from_secs(60));
    }
}
