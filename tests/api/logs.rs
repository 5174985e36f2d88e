//! What a process run in the test logs, for the tests that check what it
//! says (a child process's log is its stderr; an in-process one logs
//! through `tracing`).
//!
//! [`capture`] makes the calling thread's logs go to a buffer until the
//! guard drops. Only that thread's: run the test on a current-thread
//! runtime (`#[tokio::test]`), so every task of the process it starts runs
//! there too.

use std::sync::{Arc, Mutex, PoisonError};

use tracing::subscriber::DefaultGuard;

/// The logs written since [`capture`], and the guard that keeps capturing.
pub struct Captured {
    buffer: Arc<Mutex<Vec<u8>>>,
    _guard: DefaultGuard,
}

impl Captured {
    /// Everything logged so far, as text.
    pub fn text(&self) -> String {
        let bytes = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Captures this thread's logs (every level of `code_runner`'s, info of the
/// rest) until the returned guard drops.
pub fn capture() -> Captured {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let buffer = Arc::clone(&buffer);
        move || Writer(Arc::clone(&buffer))
    };
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info,code_runner=trace"))
        .with_writer(writer)
        .with_ansi(false)
        .finish();
    Captured {
        buffer,
        _guard: tracing::subscriber::set_default(subscriber),
    }
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
