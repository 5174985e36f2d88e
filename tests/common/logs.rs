//! What the code under test logs, for the tests that check a log line of a
//! process run in the test (a child process's log is its file; here it is
//! this process's own tracing).
//!
//! The capture is this process's global subscriber (`code_runner` at info
//! and above), set by the first [`capture`]. Under nextest every test is a
//! process of its own, so a test sees its own lines only; under `cargo
//! test` the tests of the binary share it, and a test's lines are told
//! apart by what they name (a job or worker id).

use std::io::Write;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Appends to [`LOG`].
struct ToLog;

impl Write for ToLog {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        LOG.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The lines logged since [`capture`] made it.
pub struct Logs {
    from: usize,
}

/// Captures what is logged from now on.
pub fn capture() -> Logs {
    let _ = tracing_subscriber::fmt()
        .with_writer(|| ToLog)
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new("code_runner=info"))
        .try_init();
    Logs {
        from: LOG.lock().unwrap_or_else(PoisonError::into_inner).len(),
    }
}

impl Logs {
    /// Everything logged since the capture began.
    pub fn text(&self) -> String {
        let log = LOG.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&log[self.from.min(log.len())..]).into_owned()
    }

    /// Waits (up to `within`) for a line containing every one of `parts`;
    /// fails the test with the log otherwise.
    pub async fn wait_for_line(&self, parts: &[&str], within: Duration) -> String {
        let text = crate::common::until(
            within,
            || async { self.text() },
            |text: &String| has_line(text, parts),
        )
        .await;
        assert!(has_line(&text, parts), "no line with {parts:?} in:\n{text}");
        text
    }
}

fn has_line(text: &str, parts: &[&str]) -> bool {
    text.lines()
        .any(|line| parts.iter().all(|part| line.contains(part)))
}
