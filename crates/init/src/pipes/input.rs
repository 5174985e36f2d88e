//! The stdin side of the [stage's pipes](super): the thread that writes
//! what the stage loop hands it, the loop's end of it, [`InputPipe`], and
//! the [`StdinProbe`] with which the tracer asks, without keeping the pipe
//! open, whether anything is buffered for the stage's stdin.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::{HandOff, PIPE_THREADS, fionread};

/// Most stdin bytes handed to the stdin thread at once: one pipe's worth,
/// so that little more than the pipe's buffer is out of the queue's hands.
pub(crate) const MAX_INPUT_CHUNK: usize = 64 * 1024;

/// The outcome of [`InputPipe::offer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    /// This many bytes from the front were handed to the stdin thread.
    Taken(usize),
    /// The thread is still busy with what it has; try again when
    /// [`InputPipe::ready`] resolves.
    Busy,
    /// The stage closed its stdin: nothing more can be written.
    Closed,
}

/// The supervisor's end of a stage's stdin.
pub(crate) struct InputPipe {
    chunks: mpsc::Sender<Vec<u8>>,
    /// Bytes handed to the thread and not yet written into the pipe.
    in_flight: Arc<AtomicUsize>,
    /// A probe of the pipe the thread writes to, once it was shared.
    probe: Option<StdinProbe>,
}

/// What [`StdinProbe::buffered`] found, asked while the reader is stopped
/// (so that it cannot take anything meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buffered {
    /// Nothing in the pipe, nothing on its way: a read waits.
    No,
    /// Bytes in the pipe.
    Yes,
    /// The pipe is empty and the stdin thread is writing: ask again once
    /// it is done.
    Unsure,
    /// The pipe is closed: no read will wait on it.
    Closed,
}

/// What [`crate::watch`] needs to know whether anything is buffered for
/// the stage's stdin, without keeping the pipe open.
#[derive(Debug, Clone)]
pub(crate) struct StdinProbe {
    pipe: Weak<File>,
    in_flight: Arc<AtomicUsize>,
    inode: u64,
}

impl StdinProbe {
    /// A probe of `pipe` that does not keep it open; `in_flight` counts the
    /// bytes on their way into it.
    fn new(pipe: &Arc<File>, in_flight: Arc<AtomicUsize>) -> Self {
        Self {
            pipe: Arc::downgrade(pipe),
            in_flight,
            inode: pipe.metadata().map_or(0, |meta| meta.ino()),
        }
    }

    /// Whether anything is in the pipe or on its way into it, asked while
    /// the reader is stopped (so that it cannot take anything meanwhile).
    /// With the pipe empty, bytes the thread was handed and has not
    /// finished writing make it [`Buffered::Unsure`]: they may be on their
    /// way in (a write into an empty pipe does not block), or already read
    /// (the reader can run before the thread counts its write done); the
    /// pipe says which once the count is down.
    pub(crate) fn buffered(&self) -> Buffered {
        let Some(pipe) = self.pipe.upgrade() else {
            return Buffered::Closed;
        };
        if fionread(pipe.as_fd()) != Some(0) {
            Buffered::Yes
        } else if self.in_flight.load(Ordering::Acquire) != 0 {
            Buffered::Unsure
        } else {
            Buffered::No
        }
    }

    /// A probe of `write_end`, with its in-flight count and the pipe it
    /// holds weakly (kept alive by the caller).
    #[cfg(test)]
    pub(crate) fn for_tests(write_end: OwnedFd) -> (Self, Arc<AtomicUsize>, Arc<File>) {
        let pipe = Arc::new(File::from(write_end));
        let in_flight = Arc::new(AtomicUsize::new(0));
        (Self::new(&pipe, Arc::clone(&in_flight)), in_flight, pipe)
    }

    /// What `/proc/<pid>/fd/0` of a process reading this pipe links to.
    pub(crate) fn link(&self) -> String {
        format!("pipe:[{}]", self.inode)
    }
}

/// The stdin pipe as the stdin thread holds it: shared with no one but
/// [`StdinProbe`]'s weak reference, so that dropping it closes the pipe.
pub(crate) struct SharedPipe(Arc<File>);

impl Write for SharedPipe {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        (&*self.0).write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl InputPipe {
    /// Takes a thread, which writes to the pipe handed to it.
    pub(crate) fn start<P: Write + Send + 'static>() -> std::io::Result<(Self, HandOff<P>)> {
        let (chunks, rx) = mpsc::channel(1);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let written = Arc::clone(&in_flight);
        let hand_off = HandOff::start(&PIPE_THREADS, move |pipe| write_input(pipe, rx, &written))?;
        Ok((
            Self {
                chunks,
                in_flight,
                probe: None,
            },
            hand_off,
        ))
    }

    /// Wraps the pipe for the thread, remembering it for [`InputPipe::probe`].
    pub(crate) fn share(&mut self, pipe: OwnedFd) -> SharedPipe {
        let pipe = Arc::new(File::from(pipe));
        self.probe = Some(StdinProbe::new(&pipe, Arc::clone(&self.in_flight)));
        SharedPipe(pipe)
    }

    /// A probe of this stdin, once the pipe was shared.
    pub(crate) fn probe(&self) -> Option<StdinProbe> {
        self.probe.clone()
    }

    /// Hands the start of `bytes` (at most [`MAX_INPUT_CHUNK`]) to the
    /// thread without waiting.
    pub(crate) fn offer(&self, bytes: &[u8]) -> Offer {
        let take = bytes.len().min(MAX_INPUT_CHUNK);
        // Counted before the thread can write (and uncount) it.
        self.in_flight.fetch_add(take, Ordering::AcqRel);
        match self.chunks.try_send(bytes[..take].to_vec()) {
            Ok(()) => Offer::Taken(take),
            Err(error) => {
                self.in_flight.fetch_sub(take, Ordering::AcqRel);
                match error {
                    TrySendError::Full(_) => Offer::Busy,
                    TrySendError::Closed(_) => Offer::Closed,
                }
            }
        }
    }

    /// Resolves once [`InputPipe::offer`] would not be [`Offer::Busy`].
    pub(crate) async fn ready(&self) {
        // Taking and dropping a permit only waits for a free slot (or for
        // the thread to be gone).
        let _ = self.chunks.reserve().await;
    }
}

fn write_input(mut pipe: impl Write, mut rx: mpsc::Receiver<Vec<u8>>, in_flight: &AtomicUsize) {
    while let Some(chunk) = rx.blocking_recv() {
        // `write_all` retries on EINTR. Any other error (EPIPE: the stage
        // closed its stdin) ends the thread, which closes the channel.
        let written = pipe.write_all(&chunk);
        in_flight.fetch_sub(chunk.len(), Ordering::AcqRel);
        if written.is_err() {
            return;
        }
    }
    // The loop dropped its end: `pipe` is closed here, and the stage reads
    // EOF after the last chunk.
}
