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

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use code_runner_protocol::MAX_OUTPUT_CHUNK;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

/// Most stdin bytes handed to the stdin thread at once: one pipe's worth,
/// so that little more than the pipe's buffer is out of the queue's hands.
pub(crate) const MAX_INPUT_CHUNK: usize = 64 * 1024;

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

    fn start_on<P: Read + AsFd + Send + 'static>(
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

/// What [`super::watch`] needs to know whether anything is buffered for
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn os_pipe() -> (std::fs::File, std::fs::File) {
        let (read, write) = nix::unistd::pipe().expect("pipe");
        (std::fs::File::from(read), std::fs::File::from(write))
    }

    /// Runs `work` on `pool` and returns the id of the thread it ran on,
    /// once it ran.
    fn thread_of(pool: &'static PipeThreads) -> std::thread::ThreadId {
        let (tx, rx) = std::sync::mpsc::channel();
        pool.run(Box::new(move || {
            let _ = tx.send(std::thread::current().id());
        }))
        .expect("run");
        rx.recv_timeout(Duration::from_secs(10)).expect("work ran")
    }

    /// Waits until `count` threads of `pool` wait for work.
    fn await_idle(pool: &PipeThreads, count: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pool.idle() != count {
            assert!(
                std::time::Instant::now() < deadline,
                "{} threads idle, not {count}",
                pool.idle()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_thread_done_with_its_pipe_serves_the_next_one() {
        static POOL: PipeThreads = PipeThreads::new(2);
        let first = thread_of(&POOL);
        await_idle(&POOL, 1);
        assert_eq!(thread_of(&POOL), first);
        await_idle(&POOL, 1);
        assert_eq!(thread_of(&POOL), first);
    }

    #[test]
    fn a_busy_thread_is_not_given_more_work() {
        static POOL: PipeThreads = PipeThreads::new(2);
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let (started, busy) = std::sync::mpsc::channel();
        POOL.run(Box::new(move || {
            let _ = started.send(std::thread::current().id());
            let _ = hold.recv();
        }))
        .expect("run");
        let busy = busy.recv_timeout(Duration::from_secs(10)).expect("started");
        assert_eq!(POOL.idle(), 0);
        let other = thread_of(&POOL);
        assert_ne!(other, busy);
        drop(release);
        await_idle(&POOL, 2);
    }

    /// Sends on its channel when its thread ends.
    struct OnThreadEnd(std::sync::mpsc::Sender<()>);

    impl Drop for OnThreadEnd {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }

    thread_local! {
        static ON_END: std::cell::RefCell<Option<OnThreadEnd>> =
            const { std::cell::RefCell::new(None) };
    }

    /// Four threads busy at once, then all done: two stay waiting, the
    /// other two end.
    #[test]
    fn no_more_threads_wait_than_the_pool_keeps() {
        static POOL: PipeThreads = PipeThreads::new(2);
        let (ended, ends) = std::sync::mpsc::channel();
        let barrier = Arc::new(std::sync::Barrier::new(5));
        for _ in 0..4 {
            let ended = ended.clone();
            let barrier = Arc::clone(&barrier);
            POOL.run(Box::new(move || {
                ON_END.with(|slot| *slot.borrow_mut() = Some(OnThreadEnd(ended)));
                // All four at once: none can take another's work.
                barrier.wait();
            }))
            .expect("run");
        }
        barrier.wait();
        drop(ended);
        for _ in 0..2 {
            ends.recv_timeout(Duration::from_secs(10))
                .expect("a thread ended");
        }
        await_idle(&POOL, 2);
        assert!(
            ends.try_recv().is_err(),
            "a third thread ended although it could wait"
        );
    }

    /// A read end that notes the thread that reads it.
    struct Spy {
        pipe: std::fs::File,
        reader: std::sync::mpsc::Sender<std::thread::ThreadId>,
    }

    impl Read for Spy {
        fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
            let _ = self.reader.send(std::thread::current().id());
            self.pipe.read(buffer)
        }
    }

    impl AsFd for Spy {
        fn as_fd(&self) -> BorrowedFd<'_> {
            self.pipe.as_fd()
        }
    }

    /// The thread that served one stage's output pipe to its end serves
    /// the next stage's.
    #[test]
    fn the_next_stages_pipe_is_served_by_the_same_thread() {
        static POOL: PipeThreads = PipeThreads::new(MAX_IDLE_PIPE_THREADS);
        runtime().block_on(async {
            let mut served_by = Vec::new();
            for _ in 0..2 {
                let (read, write) = os_pipe();
                let (reader, readers) = std::sync::mpsc::channel();
                let (mut pipe, hand_off) = OutputPipe::start_on(&POOL).expect("start");
                let spy = Spy { pipe: read, reader };
                pipe.hand_over(hand_off, spy, false).expect("hand over");
                drop(write);
                assert!(matches!(pipe.recv().await, Output::Eof));
                served_by.push(readers.recv().expect("read by a thread"));
                // The thread goes back to wait once it is done.
                await_idle(&POOL, 1);
            }
            assert_eq!(served_by[0], served_by[1]);
        });
    }

    #[test]
    fn output_comes_in_order_then_eof() {
        runtime().block_on(async {
            let (read, mut write) = os_pipe();
            let (mut pipe, hand_off) = OutputPipe::start().expect("start");
            pipe.hand_over(hand_off, read, false).expect("hand over");
            let writer = std::thread::spawn(move || {
                for i in 0..100u32 {
                    write.write_all(&i.to_be_bytes()).expect("write");
                }
                let big = vec![7u8; 3 * MAX_OUTPUT_CHUNK];
                write.write_all(&big).expect("write");
            });
            let mut received = Vec::new();
            loop {
                match pipe.recv().await {
                    Output::Data(data) => {
                        assert!(!data.is_empty() && data.len() <= MAX_OUTPUT_CHUNK);
                        received.extend(data);
                    }
                    Output::Eof => break,
                    Output::Failed(error) => panic!("read failed: {error}"),
                }
            }
            writer.join().expect("writer");
            let mut expected: Vec<u8> = (0..100u32).flat_map(u32::to_be_bytes).collect();
            expected.extend(vec![7u8; 3 * MAX_OUTPUT_CHUNK]);
            assert_eq!(received, expected);
        });
    }

    /// A counting thread: `drained` only once every byte written was given
    /// out by `recv`, whether it is still in the pipe, in the thread or in
    /// the channel.
    #[test]
    fn counted_output_is_drained_only_once_all_of_it_was_received() {
        runtime().block_on(async {
            let (read, mut write) = os_pipe();
            let (mut pipe, hand_off) = OutputPipe::start().expect("start");
            pipe.hand_over(hand_off, read, true).expect("hand over");
            assert!(pipe.drained());
            let mut sent = 0usize;
            for round in 0..50u32 {
                let chunk =
                    vec![u8::try_from(round % 251).expect("byte"); 1 + 997 * round as usize];
                write.write_all(&chunk).expect("write");
                sent += chunk.len();
                let mut received = 0usize;
                while received < chunk.len() {
                    assert!(
                        !pipe.drained(),
                        "drained with {} bytes not received",
                        chunk.len() - received
                    );
                    match pipe.recv().await {
                        Output::Data(data) => received += data.len(),
                        other => panic!("{other:?}"),
                    }
                }
                assert_eq!(received, chunk.len());
                assert!(pipe.drained(), "not drained after round {round}");
            }
            drop(write);
            assert!(matches!(pipe.recv().await, Output::Eof));
            assert!(sent > 0);
        });
    }

    #[test]
    fn input_is_written_in_order_and_closed_when_dropped() {
        runtime().block_on(async {
            let (mut read, write) = os_pipe();
            let reader = std::thread::spawn(move || {
                let mut all = Vec::new();
                read.read_to_end(&mut all).expect("read");
                all
            });
            let (pipe, hand_off) = InputPipe::start().expect("start");
            hand_off.give(write);
            let mut queued: Vec<u8> = (0..(3 * MAX_INPUT_CHUNK + 5))
                .map(|i| u8::try_from(i % 251).expect("byte"))
                .collect();
            let expected = queued.clone();
            while !queued.is_empty() {
                match pipe.offer(&queued) {
                    Offer::Taken(taken) => {
                        assert!(taken <= MAX_INPUT_CHUNK);
                        queued.drain(..taken);
                    }
                    Offer::Busy => pipe.ready().await,
                    Offer::Closed => panic!("closed"),
                }
            }
            drop(pipe);
            // EOF reaches the reader only once everything was written.
            assert_eq!(reader.join().expect("reader"), expected);
        });
    }

    #[test]
    fn input_to_a_closed_pipe_reports_closed() {
        runtime().block_on(async {
            let (read, write) = os_pipe();
            drop(read);
            let (pipe, hand_off) = InputPipe::start().expect("start");
            hand_off.give(write);
            // The first chunk is taken; its write fails with EPIPE and the
            // thread ends, after which the pipe reports closed.
            assert_eq!(pipe.offer(b"lost"), Offer::Taken(4));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                match pipe.offer(b"more") {
                    Offer::Closed => break,
                    Offer::Taken(_) | Offer::Busy => {
                        assert!(tokio::time::Instant::now() < deadline, "never closed");
                        tokio::time::timeout(Duration::from_millis(20), pipe.ready())
                            .await
                            .ok();
                    }
                }
            }
        });
    }
}
