//! The stage's pipes, each served by a thread of its own.
//!
//! The supervisor's crate does without tokio's `net` feature (see
//! `tests/dependencies.rs`), and with it without any way for the stage loop
//! to wait until a pipe is readable or writable. So each pipe gets a plain
//! thread that does blocking I/O on it and talks to the loop through a
//! bounded channel of one message, which the loop waits on like any other
//! event:
//!
//! - [`OutputPipe`] (stdout, stderr): the thread reads at most
//!   [`MAX_OUTPUT_CHUNK`] bytes at a time and hands each chunk over, then
//!   the end of the stream. The loop takes a chunk only while the frame sink
//!   has room, so a slow host still stops the reading and the stage blocks on
//!   its full pipe; at most two chunks per stream (one in the channel, one in
//!   the thread) are read ahead of the sink.
//! - [`InputPipe`] (stdin): the thread writes what the loop hands it, at most
//!   [`MAX_INPUT_CHUNK`] bytes at a time, as fast as the stage reads it. The
//!   loop keeps the rest in its [`super::stdin::StdinQueue`]. When the stage
//!   has closed its stdin the write fails (`EPIPE`), the thread ends, and the
//!   loop sees the channel closed. Dropping the [`InputPipe`] closes the
//!   stage's stdin once the chunks already handed over are written.
//!
//! Each thread is taken before the stage is forked and handed its pipe
//! after ([`HandOff`]): a fork bomb leaves no room for a thread once it runs.
//!
//! The threads are not joined. An output thread is done with its pipe at
//! the end of its stream (every writer gone), when its read fails, or at the
//! first chunk after the loop dropped its [`OutputPipe`]; the stdin thread
//! when its channel closes or a write fails. Between two stages the
//! supervisor kills every process of the job's uid and checks that none is
//! left (or stops), so no pipe outlives its stage's processes and no thread
//! waits on it for long.
//!
//! A thread done with its pipe does not end: it waits in [`PipeThreads`]
//! for the next stage's (or run's) pipe, up to [`MAX_IDLE_PIPE_THREADS`] of
//! them. Under gVisor a thread's exit unmaps its stack (0.3 to 1 ms each,
//! measured with strace) right when the stage's own exit is being reported,
//! and starting three new ones costs again at the next stage; a kept thread
//! costs neither.
//!
//! # Layout
//!
//! This file holds what both kinds of pipe share: the [`HandOff`] of a pipe
//! to its thread, the [`PipeThreads`] kept waiting, and `FIONREAD`.
//! [`output`] holds the stdout and stderr side ([`OutputPipe`]), [`input`]
//! the stdin side ([`InputPipe`], and the [`StdinProbe`] that [`super::watch`]
//! asks whether anything is buffered).
//!
//! [`MAX_OUTPUT_CHUNK`]: code_runner_protocol::MAX_OUTPUT_CHUNK
//! [`MAX_INPUT_CHUNK`]: input::MAX_INPUT_CHUNK

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Mutex;

mod input;
mod output;

pub(crate) use input::{Buffered, InputPipe, Offer, SharedPipe, StdinProbe};
pub(crate) use output::{Output, OutputPipe};

/// Where a pipe thread, started before its pipe exists, gets it from.
///
/// The threads are started before the stage is forked: once the stage runs,
/// a fork bomb can fill the pids cgroup within a millisecond, and the
/// supervisor could then start no thread at all. Dropped without
/// [`HandOff::give`] (the stage did not start), the thread ends, and its
/// pipe end reads as the end of the stream or as closed.
pub(crate) struct HandOff<P>(std::sync::mpsc::SyncSender<P>);

impl<P: Send + 'static> HandOff<P> {
    /// Takes a thread of `threads` (a kept one if there is one, else a new
    /// one), which waits for its pipe and then serves it with `serve`.
    fn start(
        threads: &'static PipeThreads,
        serve: impl FnOnce(P) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (hand_off, pipe) = std::sync::mpsc::sync_channel(1);
        threads.run(Box::new(move || {
            if let Ok(pipe) = pipe.recv() {
                serve(pipe);
            }
        }))?;
        Ok(Self(hand_off))
    }

    pub(crate) fn give(self, pipe: P) {
        // Room for one, and the thread is waiting or gone: never blocks.
        let _ = self.0.send(pipe);
    }
}

/// Most threads kept waiting for a pipe: a stage's three, and as many
/// again for a stage whose threads are still busy with the last one's.
const MAX_IDLE_PIPE_THREADS: usize = 6;

/// The supervisor's pipe threads.
static PIPE_THREADS: PipeThreads = PipeThreads::new(MAX_IDLE_PIPE_THREADS);

/// Work for a pipe thread: wait for a pipe and serve it.
type PipeWork = Box<dyn FnOnce() + Send>;

/// Threads that serve pipes one after another: each one, done with its
/// work, waits here for the next until `max_idle` others already wait, and
/// then ends.
struct PipeThreads {
    /// How to reach each waiting thread; a send fails only if it is gone.
    idle: Mutex<Vec<std::sync::mpsc::Sender<PipeWork>>>,
    max_idle: usize,
}

impl PipeThreads {
    const fn new(max_idle: usize) -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            max_idle,
        }
    }

    /// Runs `work` on a waiting thread, or on a new one when none waits.
    /// It fails only if no thread could be started.
    fn run(&'static self, mut work: PipeWork) -> std::io::Result<()> {
        loop {
            let waiting = self.lock().pop();
            let Some(thread) = waiting else { break };
            match thread.send(work) {
                Ok(()) => return Ok(()),
                Err(std::sync::mpsc::SendError(back)) => work = back,
            }
        }
        super::spawn_named("stage-pipe", move || self.serve(work)).map(drop)
    }

    /// A pipe thread's life: `work`, then whatever it is handed while it
    /// waits, until there is no room to wait.
    fn serve(&self, mut work: PipeWork) {
        let (to_me, mine) = std::sync::mpsc::channel();
        loop {
            work();
            {
                let mut idle = self.lock();
                if idle.len() >= self.max_idle {
                    return;
                }
                idle.push(to_me.clone());
            }
            match mine.recv() {
                Ok(next) => work = next,
                // Cannot happen while this thread holds `to_me`.
                Err(_) => return,
            }
        }
    }

    /// How many threads wait for work.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<std::sync::mpsc::Sender<PipeWork>>> {
        // The lock guards a list of senders only; a panic elsewhere with it
        // held leaves the list whole.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How many bytes are in the pipe `fd` (`FIONREAD`); `None` if it cannot
/// be asked.
#[allow(unsafe_code)]
fn fionread(fd: BorrowedFd<'_>) -> Option<usize> {
    let mut count: nix::libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points to
    // the live local above; the descriptor is borrowed, so open.
    let result = unsafe { nix::libc::ioctl(fd.as_raw_fd(), nix::libc::FIONREAD, &mut count) };
    if result == 0 {
        usize::try_from(count).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
