//! The interactive round trip: a line goes to the program's stdin, and the
//! clock runs until the program's stdout carries it back.
//!
//! The program (the built-in echo program, or the user's with `--program`)
//! must write something first, to say it is ready (the built-in ones print
//! `ready`), then write back each line it reads. The first line is sent on
//! that first output, so a round trip never includes the sandbox's start;
//! each next line is sent as soon as the previous one came back, and after
//! the last one stdin is closed, so the program ends. A line that never
//! comes back leaves the job to its idle limit; it counts as sent but not
//! echoed.
//!
//! Pure state: the caller feeds it stdout as it arrives and sends what it
//! answers (over the WebSocket, or straight to the engine).

use std::time::{Duration, Instant};

/// What to send to the program next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EchoFrame {
    Line(Vec<u8>),
    Close,
}

#[derive(Debug)]
pub(super) struct Echo {
    /// Which job of the run this is (it names the lines).
    job: u32,
    /// How many round trips to make.
    total: u32,
    sent: u32,
    /// The line on its way and when it was sent.
    waiting: Option<(Vec<u8>, Instant)>,
    /// Stdout since the line on its way was sent (only the tail that can
    /// still hold the start of the line is kept).
    seen: Vec<u8>,
    closed: bool,
    round_trips: Vec<Duration>,
}

impl Echo {
    pub(super) fn new(job: u32, total: u32) -> Self {
        Self {
            job,
            total,
            sent: 0,
            waiting: None,
            seen: Vec::new(),
            closed: false,
            round_trips: Vec::with_capacity(total as usize),
        }
    }

    /// Stdout arrived at `now`; what to send next, if anything.
    pub(super) fn output(&mut self, bytes: &[u8], now: Instant) -> Option<EchoFrame> {
        if self.closed {
            return None;
        }
        let Some((line, sent_at)) = &self.waiting else {
            // The first output: the program is ready.
            return Some(self.next_line());
        };
        self.seen.extend_from_slice(bytes);
        if !contains(&self.seen, line) {
            let keep = line.len().saturating_sub(1);
            let cut = self.seen.len().saturating_sub(keep);
            self.seen.drain(..cut);
            return None;
        }
        self.round_trips
            .push(now.saturating_duration_since(*sent_at));
        self.waiting = None;
        if self.sent < self.total {
            Some(self.next_line())
        } else {
            self.closed = true;
            Some(EchoFrame::Close)
        }
    }

    fn next_line(&mut self) -> EchoFrame {
        self.sent += 1;
        let line = format!("ping {}-{}\n", self.job, self.sent).into_bytes();
        self.seen.clear();
        self.waiting = Some((line.clone(), Instant::now()));
        EchoFrame::Line(line)
    }

    /// Lines sent.
    pub(super) fn sent(&self) -> u32 {
        self.sent
    }

    /// One duration per line that came back.
    pub(super) fn into_round_trips(self) -> Vec<Duration> {
        self.round_trips
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Option<EchoFrame> {
        Some(EchoFrame::Line(text.as_bytes().to_vec()))
    }

    #[test]
    fn lines_go_out_one_at_a_time_after_the_program_is_ready() {
        let mut echo = Echo::new(3, 2);
        assert_eq!(echo.output(b"ready\n", Instant::now()), line("ping 3-1\n"));
        // Unrelated output does not count as the echo.
        assert_eq!(echo.output(b"something else\n", Instant::now()), None);
        // The echo may come in pieces.
        assert_eq!(echo.output(b"ping 3", Instant::now()), None);
        assert_eq!(echo.output(b"-1\n", Instant::now()), line("ping 3-2\n"));
        // A line that only starts like the one sent is not its echo.
        assert_eq!(echo.output(b"ping 3-21\n", Instant::now()), None);
        assert_eq!(
            echo.output(b"ping 3-2\n", Instant::now()),
            Some(EchoFrame::Close)
        );
        assert_eq!(echo.output(b"late\n", Instant::now()), None);
        assert_eq!(echo.sent(), 2);
        assert_eq!(echo.into_round_trips().len(), 2);
    }

    #[test]
    fn a_line_that_never_comes_back_is_sent_but_not_echoed() {
        let mut echo = Echo::new(0, 5);
        assert_eq!(echo.output(b"ready\n", Instant::now()), line("ping 0-1\n"));
        assert_eq!(echo.output(b"PING 0-1\n", Instant::now()), None);
        assert_eq!(echo.sent(), 1);
        assert!(echo.into_round_trips().is_empty());
    }

    #[test]
    fn the_round_trip_runs_from_sending_to_the_echo() {
        let mut echo = Echo::new(1, 1);
        echo.output(b"ready\n", Instant::now());
        let later = Instant::now() + Duration::from_millis(7);
        assert_eq!(echo.output(b"ping 1-1\n", later), Some(EchoFrame::Close));
        let trips = echo.into_round_trips();
        assert!(trips[0] >= Duration::from_millis(7), "{trips:?}");
    }
}
