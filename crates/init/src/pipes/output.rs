//! The stdout and stderr side of the [stage's pipes](super): the thread
//! that reads a pipe in chunks of at most [`MAX_OUTPUT_CHUNK`] and hands
//! them to the stage loop, and the loop's end of it, [`OutputPipe`], which
//! can also tell whether everything written so far was given out.

use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use code_runner_protocol::MAX_OUTPUT_CHUNK;
use tokio::sync::mpsc;

use super::{HandOff, PIPE_THREADS, PipeThreads, fionread};

/// What an output thread saw.
#[derive(Debug)]
pub(crate) enum Output {
    /// Bytes the stage wrote, at most [`MAX_OUTPUT_CHUNK`].
    Data(Vec<u8>),
    /// End of stream: every process holding the pipe has closed it.
    Eof,
    /// Reading failed; nothing follows.
    Failed(std::io::Error),
}

/// The supervisor's end of a stage's stdout or stderr.
pub(crate) struct OutputPipe {
    chunks: mpsc::Receiver<Output>,
    /// Bytes a counting thread took out of the pipe (or is about to) that
    /// [`OutputPipe::recv`] has not given out yet.
    pending: Arc<AtomicUsize>,
    /// A copy of the pipe's read end, only to ask how much is in it (see
    /// [`OutputPipe::drained`]); an extra reader changes nothing for the
    /// writers.
    probe: Option<OwnedFd>,
}

/// What an output thread is handed: the pipe, and whether to count what
/// it reads (for [`OutputPipe::drained`]).
pub(crate) type OutputHandOff<P> = HandOff<(P, bool)>;

impl OutputPipe {
    /// Takes a thread, which reads the pipe handed to it.
    pub(crate) fn start<P: Read + AsFd + Send + 'static>()
    -> std::io::Result<(Self, OutputHandOff<P>)> {
        Self::start_on(&PIPE_THREADS)
    }

    pub(super) fn start_on<P: Read + AsFd + Send + 'static>(
        threads: &'static PipeThreads,
    ) -> std::io::Result<(Self, OutputHandOff<P>)> {
        let (tx, chunks) = mpsc::channel(1);
        let pending = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&pending);
        let hand_off = HandOff::start(threads, move |(pipe, count): (P, bool)| {
            read_output(pipe, &tx, count.then_some(&*counted));
        })?;
        Ok((
            Self {
                chunks,
                pending,
                probe: None,
            },
            hand_off,
        ))
    }

    /// Gives `pipe` to the thread `hand_off` starts; `counted`: the thread
    /// counts what it reads, and a copy of the read end is kept to look
    /// into the pipe with (see [`OutputPipe::drained`]).
    pub(crate) fn hand_over<P: AsFd + Send + 'static>(
        &mut self,
        hand_off: OutputHandOff<P>,
        pipe: P,
        counted: bool,
    ) -> std::io::Result<()> {
        if counted {
            self.probe = Some(pipe.as_fd().try_clone_to_owned()?);
        }
        hand_off.give((pipe, counted));
        Ok(())
    }

    /// Everything the stage wrote before now has been given out by
    /// [`OutputPipe::recv`]: no byte is counted out of the pipe and not yet
    /// given, and the pipe is empty (asked in that order: the thread counts
    /// bytes before it takes them out). Without a probe: `true`.
    pub(crate) fn drained(&self) -> bool {
        let Some(probe) = &self.probe else {
            return true;
        };
        self.pending.load(Ordering::Acquire) == 0 && fionread(probe.as_fd()) == Some(0)
    }

    /// The next chunk, or the end of the stream.
    pub(crate) async fn recv(&mut self) -> Output {
        // The thread sends `Eof` or `Failed` last; a channel closed without
        // either means it is gone, which is an end of stream all the same.
        let output = self.chunks.recv().await.unwrap_or(Output::Eof);
        if let Output::Data(data) = &output {
            let _ = self
                .pending
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |pending| {
                    Some(pending.saturating_sub(data.len()))
                });
        }
        output
    }
}

/// Waits until `fd` is readable (or hung up) and counts what is there into
/// `pending`, before it is read: at most `limit` bytes, the amount the
/// next read takes.
#[allow(unsafe_code)]
fn count_before_reading(fd: BorrowedFd<'_>, pending: &AtomicUsize, limit: usize) -> usize {
    let mut poll = nix::libc::pollfd {
        fd: fd.as_raw_fd(),
        events: nix::libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: poll reads and writes the one pollfd it is given, a live
        // local, for the duration of the call.
        let ready = unsafe { nix::libc::poll(&mut poll, 1, -1) };
        if ready >= 0 || nix::errno::Errno::last() != nix::errno::Errno::EINTR {
            break;
        }
    }
    let count = fionread(fd).unwrap_or(0).min(limit);
    pending.fetch_add(count, Ordering::AcqRel);
    count
}

fn read_output<P: Read + AsFd>(
    mut pipe: P,
    tx: &mpsc::Sender<Output>,
    pending: Option<&AtomicUsize>,
) {
    let mut buffer = vec![0u8; MAX_OUTPUT_CHUNK];
    loop {
        // Counted: exactly what the read will take, counted first (more
        // than nothing, so that the end of the stream is read too).
        let (want, counted) = match pending {
            Some(pending) => {
                let counted = count_before_reading(pipe.as_fd(), pending, MAX_OUTPUT_CHUNK);
                (counted.max(1), counted)
            }
            None => (MAX_OUTPUT_CHUNK, 0),
        };
        let read = pipe.read(&mut buffer[..want]);
        if let Some(pending) = pending {
            // What came in between the count and the read (a byte, at
            // most) is counted late; a read that failed took nothing.
            let took = read.as_ref().map_or(0, |read| *read);
            if took > counted {
                pending.fetch_add(took - counted, Ordering::AcqRel);
            } else if took < counted {
                pending.fetch_sub(counted - took, Ordering::AcqRel);
            }
        }
        let output = match read {
            Ok(0) => Output::Eof,
            Ok(read) => Output::Data(buffer[..read].to_vec()),
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => Output::Failed(error),
        };
        let last = !matches!(output, Output::Data(_));
        // An error here: the loop dropped this pipe (the stage is over).
        if tx.blocking_send(output).is_err() || last {
            return;
        }
    }
}
