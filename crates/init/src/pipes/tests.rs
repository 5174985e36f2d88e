//! The pipes' unit tests: the kept threads, and real pipes read and
//! written through [`OutputPipe`] and [`InputPipe`].

use super::input::MAX_INPUT_CHUNK;
use super::*;
use code_runner_protocol::MAX_OUTPUT_CHUNK;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
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
            let chunk = vec![u8::try_from(round % 251).expect("byte"); 1 + 997 * round as usize];
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
