//! The retry schedule for Redis failures: short at first, so a blip costs
//! little, doubling up to a cap, so an outage is not hammered (or logged)
//! more than once per cap.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// First delay after a failure.
pub(crate) const INITIAL: Duration = Duration::from_millis(100);
/// Longest delay between two attempts of the claim loop or a result write.
pub(crate) const CAP: Duration = Duration::from_secs(5);

/// Delays that double from `initial` up to `cap`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, cap: Duration) -> Self {
        let initial = initial.min(cap);
        Self {
            initial,
            cap,
            next: initial,
        }
    }

    /// The schedule of the claim loop and of result writes: 100 ms doubling
    /// to 5 s.
    pub(crate) fn redis() -> Self {
        Self::new(INITIAL, CAP)
    }

    /// The delay before the next attempt; each call doubles the one after.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.cap);
        delay
    }

    /// Back to the first delay, after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Sleeps for `delay` unless `token` is cancelled first; `false` when it was.
pub(crate) async fn sleep_unless_cancelled(delay: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        () = token.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut backoff = Backoff::redis();
        let delays: Vec<u64> = (0..9)
            .map(|_| backoff.next_delay().as_millis() as u64)
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn an_initial_delay_above_the_cap_is_the_cap() {
        let mut backoff = Backoff::new(Duration::from_secs(10), Duration::from_secs(2));
        assert_eq!(backoff.next_delay(), Duration::from_secs(2));
        assert_eq!(backoff.next_delay(), Duration::from_secs(2));
    }

    #[tokio::test]
    async fn sleeping_stops_at_cancellation() {
        let token = CancellationToken::new();
        assert!(sleep_unless_cancelled(Duration::from_millis(10), &token).await);
        token.cancel();
        assert!(!sleep_unless_cancelled(Duration::from_secs(3600), &token).await);
    }
}
