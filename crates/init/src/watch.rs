//! Every process of a stage runs under the stage filter; a watched stage's
//! processes are also traced, so that the supervisor notices when the job
//! waits for its stdin with nothing buffered for it (`input_wanted`).
//!
//! # The stage filter
//! A seccomp filter installed in every process the supervisor starts, just
//! before it executes the program, stacked on the container's profile and
//! inherited by everything the program starts:
//! - `ptrace` answers `EPERM`. The container's profile allows the few
//!   `ptrace` requests the supervisor itself needs (it is the only process
//!   of the sandbox without this filter); the job can make none of them.
//! - In a watched stage, the system calls that can wait for stdin stop the
//!   process for its tracer (`SECCOMP_RET_TRACE`), and nothing else does:
//!   `read`/`readv` of descriptor 0; `epoll_ctl` adding or removing
//!   descriptor 0 (event loops, such as node's); a blocking `epoll_wait`,
//!   `epoll_pwait` or `epoll_pwait2` (a timeout of 0 never waits); `dup2`,
//!   `dup3` onto descriptor 0 and `close`/`close_range` from it, after
//!   which descriptor 0 may be another file. The filter puts what the
//!   supervisor needs (which call, the epoll descriptor) in the stop's
//!   data, so no register or memory of the process is ever read.
//!
//! # Tracing
//! The stage's first process asks to be traced (`PTRACE_TRACEME`) before
//! it executes the program; every process and thread it starts is traced
//! from its first instruction (`PTRACE_O_TRACEFORK`, `_VFORK`, `_CLONE`).
//! The tracer is the supervisor's main thread, which already reaps every
//! child with `wait4(-1)`: a stop arrives there like an exit does (see
//! `reap`), is handled on the spot and the process goes on. At a stop for
//! a read of stdin (or a blocking wait with descriptor 0 registered), and
//! *before* the process goes on, the supervisor looks whether anything is
//! buffered for it: the pipe's `FIONREAD`, the bytes handed to the stdin
//! thread and not yet written, the queue. When nothing is, the read will
//! wait (and while the stdin thread is still writing, the reader is held at
//! its stop until the write is done, at most [`HOLD_LIMIT`], since only
//! then does the pipe tell): the stage's loop says `input_wanted` once the
//! output written before the read has been sent (see `stage`). Whether descriptor 0 of
//! that process is the stage's stdin pipe is known for the first process,
//! inherited across fork and clone, and checked again in `/proc` (from a
//! thread with the job's ids, while the process is stopped) at its first
//! read after a `dup2` or `close` of it — so a shell reading a file through
//! `< file` says nothing.
//!
//! This works alike under runc and under gVisor, whose own kernel
//! implements ptrace and `SECCOMP_RET_TRACE`; gVisor has no
//! `/proc/<pid>/syscall` or `wchan` to look at, and refuses seccomp user
//! notification.
//!
//! # Cost
//! Nothing is polled. A traced process stops only at the calls above: for
//! an interactive program about once per line it reads (a program reading
//! stdin one byte at a time stops once per byte), for an event loop once
//! per blocking wait. Forks, clones, execs and the signals a traced process
//! gets stop it too, briefly. A stage that is not watched (batch stdin, no
//! stdin) is not traced at all.
//!
//! # What it does not see
//! `poll`, `select` and `io_uring` waits (none of the runner images' line
//! readers use them for a pipe); a process that paused reading in an event
//! loop whose epoll set still holds descriptor 0 (libuv removes it only
//! lazily) counts as waiting. A traced process cannot stop itself with
//! SIGSTOP: the stop is resumed (the supervisor could only hold it with
//! `PTRACE_LISTEN`, which needs `PTRACE_SEIZE` and so `CAP_SYS_PTRACE`).
//! A reader held past [`HOLD_LIMIT`] (a stdin thread that could not finish
//! its write) goes on unsaid.
//!
//! # Layout
//!
//! This file holds the tracer: what it knows of each traced process and
//! what it does at each stop. [`filter`] holds the stage filter,
//! [`ptrace`] the ptrace requests the tracer makes. What a stop's data
//! means ([`KIND_SHIFT`] and the kinds) is here, for both.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use nix::libc;

use super::creds::drop_thread_to;
use super::pipes::{Buffered, StdinProbe};

mod filter;
mod ptrace;

pub(crate) use filter::StageFilter;
use ptrace::{event_message, is_signal_delivery, resume, set_options};

/// Longest a reader is held at its stop while the stdin thread finishes a
/// write (see [`Tracer::held`]); past it, the reader goes on as if input
/// were there.
const HOLD_LIMIT: Duration = Duration::from_millis(200);

/// What a trace stop is for, in bits 13–15 of the filter's data; bits 0–12
/// hold the epoll descriptor where there is one.
const KIND_SHIFT: u32 = 13;
const KIND_READ: u32 = 1;
const KIND_EPOLL_ADD: u32 = 2;
const KIND_EPOLL_DEL: u32 = 3;
const KIND_EPOLL_WAIT: u32 = 4;
const KIND_STDIN_CHANGED: u32 = 5;
/// Epoll descriptors from here up are not watched (no stage may open that
/// many files).
const MAX_EPOLL_FD: u32 = 1 << KIND_SHIFT;

/// What descriptor 0 of a traced process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stdin {
    /// The stage's stdin pipe.
    Ours,
    /// Something else (a file, /dev/null, another pipe).
    Other,
    /// Not known since a dup2 or close of it, or never known.
    Unknown,
}

#[derive(Debug)]
struct Tracee {
    /// Its first stop (exec of a TRACEME child, SIGSTOP of a new one) was seen.
    started: bool,
    /// A thread (reported by a clone), whose end is no process's end.
    thread: bool,
    stdin: Stdin,
    /// The epoll descriptors descriptor 0 was added to.
    epolls: Vec<u32>,
}

impl Tracee {
    /// Not seen stopped yet, a process (until a clone says otherwise).
    fn new(stdin: Stdin) -> Self {
        Self {
            started: false,
            thread: false,
            stdin,
            epolls: Vec::new(),
        }
    }
}

/// The stdin being watched and the ids of the job that reads it (to look
/// at a process's descriptor 0 with).
struct Watched {
    probe: StdinProbe,
    uid: u32,
    gid: u32,
}

#[derive(Default)]
struct Tracer {
    tracees: HashMap<i32, Tracee>,
    /// The watched stage's stdin (none: nothing is watched now).
    watched: Option<Watched>,
    /// A process went to wait for stdin with nothing buffered, since the
    /// last [`take_waiting`].
    waited: bool,
    /// Readers kept at their stop since when, because the stdin thread was
    /// writing when they came ([`Buffered::Unsure`]): only once it is done
    /// does the pipe tell whether the read will wait. Let go by [`settle`].
    held: Vec<(i32, Instant)>,
}

thread_local! {
    /// Only the thread that spawned the traced processes may make ptrace
    /// requests for them: the supervisor's main thread, which also reaps.
    static TRACER: RefCell<Tracer> = RefCell::new(Tracer::default());
}

/// Starts watching the stdin `probe` stands for, read by processes of
/// `uid`/`gid`.
pub(crate) fn watch(probe: StdinProbe, uid: u32, gid: u32) {
    TRACER.with_borrow_mut(|tracer| {
        tracer.unwatch();
        tracer.watched = Some(Watched { probe, uid, gid });
    });
}

/// Stops watching, and lets every held reader go on.
pub(crate) fn unwatch() {
    TRACER.with_borrow_mut(Tracer::unwatch);
}

/// Lets the held readers go on whose question the stdin thread has
/// answered (or that were held for [`HOLD_LIMIT`]); `true` while some are
/// still held (the caller looks again soon).
pub(crate) fn settle() -> bool {
    TRACER.with_borrow_mut(Tracer::settle)
}

/// A traced process started by the supervisor itself (its descriptor 0 is
/// the watched pipe, once a stage watches it).
pub(crate) fn adopt(pid: i32) {
    TRACER.with_borrow_mut(|tracer| {
        tracer.tracees.insert(pid, Tracee::new(Stdin::Ours));
    });
}

/// Forgets a child that ended; `true` when it was a traced thread, whose
/// end is not a process's end (and whose resource usage is its process's).
pub(crate) fn ended(pid: i32) -> bool {
    TRACER.with_borrow_mut(|tracer| {
        tracer.held.retain(|(held, _)| *held != pid);
        tracer.tracees.remove(&pid).is_some_and(|t| t.thread)
    })
}

/// Handles the stop `status` of the traced `pid` and lets it go on.
pub(crate) fn stopped(pid: i32, status: libc::c_int) {
    TRACER.with_borrow_mut(|tracer| tracer.on_stop(pid, status));
}

/// Whether a process whose descriptor 0 is the watched pipe went to wait
/// for it since the last call.
pub(crate) fn take_waiting() -> bool {
    TRACER.with_borrow_mut(|tracer| std::mem::take(&mut tracer.waited))
}

impl Tracer {
    fn unwatch(&mut self) {
        self.watched = None;
        self.waited = false;
        for (pid, _) in std::mem::take(&mut self.held) {
            resume(pid, 0);
        }
    }

    fn settle(&mut self) -> bool {
        if self.held.is_empty() {
            return false;
        }
        let buffered = self
            .watched
            .as_ref()
            .map_or(Buffered::Closed, |watched| watched.probe.buffered());
        let now = Instant::now();
        for (pid, since) in std::mem::take(&mut self.held) {
            match buffered {
                Buffered::Unsure if now.duration_since(since) < HOLD_LIMIT => {
                    self.held.push((pid, since));
                    continue;
                }
                Buffered::No => self.waited = true,
                Buffered::Yes | Buffered::Unsure | Buffered::Closed => {}
            }
            resume(pid, 0);
        }
        !self.held.is_empty()
    }

    fn on_stop(&mut self, pid: i32, status: libc::c_int) {
        let signal = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        let tracee = self
            .tracees
            .entry(pid)
            .or_insert_with(|| Tracee::new(Stdin::Unknown));
        if !tracee.started {
            tracee.started = true;
            // A TRACEME child stops at its exec with SIGTRAP before the
            // options are set; a new process or thread inherits them.
            set_options(pid);
            if event == 0 && (signal == libc::SIGTRAP || signal == libc::SIGSTOP) {
                resume(pid, 0);
                return;
            }
        }
        if event == 0 {
            // A signal for the process, or the group stop it caused: the
            // signal is delivered, the stop is resumed (see the docs).
            let deliver = if is_signal_delivery(pid) { signal } else { 0 };
            resume(pid, deliver);
            return;
        }
        match event {
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE => {
                if let Some(child) = event_message(pid).and_then(|m| i32::try_from(m).ok()) {
                    let stdin = tracee.stdin;
                    let epolls = tracee.epolls.clone();
                    // Its first stop may have come first: that is kept.
                    let child = self
                        .tracees
                        .entry(child)
                        .or_insert_with(|| Tracee::new(stdin));
                    child.stdin = stdin;
                    child.epolls = epolls;
                    child.thread = event == libc::PTRACE_EVENT_CLONE;
                }
            }
            libc::PTRACE_EVENT_EXEC => tracee.epolls.clear(),
            libc::PTRACE_EVENT_SECCOMP => {
                if let Some(data) = event_message(pid).and_then(|m| u32::try_from(m).ok())
                    && self.on_call(pid, data) == Stop::Hold
                {
                    self.held.push((pid, Instant::now()));
                    return;
                }
            }
            _ => {}
        }
        resume(pid, 0);
    }

    /// A stop of the filter's (`data` from its return value). Runs before
    /// the process goes on, so an empty stdin seen here is one the call
    /// will find empty, unless input arrives meanwhile.
    fn on_call(&mut self, pid: i32, data: u32) -> Stop {
        let Some(tracee) = self.tracees.get_mut(&pid) else {
            return Stop::Resume;
        };
        let kind = data >> KIND_SHIFT;
        let epoll = data & (MAX_EPOLL_FD - 1);
        let waits = match kind {
            KIND_READ => true,
            KIND_EPOLL_WAIT => tracee.epolls.contains(&epoll),
            KIND_EPOLL_ADD => {
                if !tracee.epolls.contains(&epoll) {
                    tracee.epolls.push(epoll);
                }
                false
            }
            KIND_EPOLL_DEL => {
                tracee.epolls.retain(|e| *e != epoll);
                false
            }
            KIND_STDIN_CHANGED => {
                tracee.stdin = Stdin::Unknown;
                false
            }
            _ => false,
        };
        if !waits || tracee.stdin == Stdin::Other {
            return Stop::Resume;
        }
        let Some(Watched { probe, uid, gid }) = &self.watched else {
            return Stop::Resume;
        };
        let buffered = probe.buffered();
        if matches!(buffered, Buffered::Yes | Buffered::Closed) {
            return Stop::Resume;
        }
        if tracee.stdin == Stdin::Unknown {
            // Looked at now, while the process is stopped: a moment later
            // it may have put the pipe back on descriptor 0 (a shell done
            // with `< file`).
            tracee.stdin = match stdin_is(pid, *uid, *gid, &probe.link()) {
                Some(true) => Stdin::Ours,
                Some(false) => Stdin::Other,
                // Cannot tell: no wait is said, and it is asked again.
                None => return Stop::Resume,
            };
            if tracee.stdin == Stdin::Other {
                return Stop::Resume;
            }
        }
        match buffered {
            Buffered::No => {
                self.waited = true;
                Stop::Resume
            }
            _ => Stop::Hold,
        }
    }
}

/// What becomes of a process at a stop of the filter's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Resume,
    /// Kept stopped until [`settle`] lets it go.
    Hold,
}

/// Whether descriptor 0 of `pid` is `link` (`pipe:[inode]`), read from a
/// thread with the job's ids (the supervisor may not look into another
/// uid's descriptors). `None`: cannot tell.
fn stdin_is(pid: i32, uid: u32, gid: u32, link: &str) -> Option<bool> {
    let path = format!("/proc/{pid}/fd/0");
    let target = super::spawn_named("stdin-check", move || {
        drop_thread_to(uid, gid).ok()?;
        std::fs::read_link(path).ok()
    })
    .ok()?
    .join()
    .ok()??;
    Some(target.as_os_str() == link)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that comes while the stdin thread is writing into an empty
    /// pipe is held until the write is done; then the pipe says whether it
    /// waits. (The pid is no process of this test: its resumes fail with
    /// ESRCH and touch nothing.)
    #[test]
    fn a_read_during_a_write_is_held_until_the_pipe_can_tell() {
        use std::io::Write as _;
        use std::sync::atomic::Ordering;
        let (read_end, write_end) = nix::unistd::pipe().expect("pipe");
        let (probe, in_flight, pipe) = StdinProbe::for_tests(write_end);
        let pid = i32::MAX - 7;
        let watched = |probe| Watched {
            probe,
            uid: 0,
            gid: 0,
        };
        let mut tracer = Tracer {
            watched: Some(watched(probe)),
            ..Tracer::default()
        };
        tracer.tracees.insert(pid, Tracee::new(Stdin::Ours));
        let read = KIND_READ << KIND_SHIFT;
        // Nothing anywhere: it waits.
        assert_eq!(tracer.on_call(pid, read), Stop::Resume);
        assert!(std::mem::take(&mut tracer.waited));
        // A write in progress, the pipe empty: held, still held.
        in_flight.store(3, Ordering::Release);
        assert_eq!(tracer.on_call(pid, read), Stop::Hold);
        tracer.held.push((pid, Instant::now()));
        assert!(tracer.settle());
        // The write done and the bytes read already: it waits.
        in_flight.store(0, Ordering::Release);
        assert!(!tracer.settle());
        assert!(std::mem::take(&mut tracer.waited));
        // The write done with the bytes still there: it does not wait.
        in_flight.store(3, Ordering::Release);
        assert_eq!(tracer.on_call(pid, read), Stop::Hold);
        tracer.held.push((pid, Instant::now()));
        (&*pipe).write_all(b"abc").expect("write");
        in_flight.store(0, Ordering::Release);
        assert!(!tracer.settle());
        assert!(!tracer.waited);
        // With bytes in the pipe nothing is held at all.
        assert_eq!(tracer.on_call(pid, read), Stop::Resume);
        assert!(!tracer.waited);
        // A write that never ends is given up after the limit.
        drop(read_end);
        let (_read_end, write_end) = nix::unistd::pipe().expect("pipe");
        let (probe, in_flight, _pipe) = StdinProbe::for_tests(write_end);
        tracer.watched = Some(watched(probe));
        in_flight.store(3, Ordering::Release);
        tracer.held.push((pid, Instant::now() - HOLD_LIMIT));
        assert!(!tracer.settle());
        assert!(!tracer.waited);
    }
}
