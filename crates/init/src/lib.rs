//! `code-runner-init`: the supervisor that runs as PID 1 inside every sandbox.
//!
//! It speaks the frames of [`code_runner_protocol`] on its stdin and stdout: it
//! sends `ready`, reads the job bundle, writes the job's files into the
//! workspace as the job's unprivileged uid, runs the stages one after another
//! as that uid and reports each of them.
//!
//! # Privileges
//!
//! The supervisor starts as uid 0 with only `CAP_SETUID` and `CAP_SETGID`.
//! Without `CAP_KILL` it cannot signal the job's processes, so one thread of
//! it switches its own effective uid to the job's to send each signal, in a
//! way no job process can reach (`kill`). Without `CAP_CHOWN` it cannot hand files over,
//! so it writes them as the job's uid in the first place, from a thread that
//! alone takes the job's ids (`job_thread`, `files`, `creds`).
//!
//! # Layout
//!
//! - `supervisor`: the top-level sequence (ready, bundle, files, stages, done).
//! - `stage`: the event loop that watches one stage, and its report.
//! - `spawn`: starting a stage: credentials, session, rlimits, pipes.
//! - `pipes`: the threads that read the stage's stdout and stderr
//!   (`pipes/output.rs`) and write its stdin (`pipes/input.rs`).
//! - `report`: what a stage's end means (its reason).
//! - `io`: the frame writer thread (stdout) and the frame reader thread (stdin).
//! - `stdin`: the bounded queue of stdin bytes waiting for a stage.
//! - `files`: path checks and writing the bundle's files.
//! - `creds`: switching the credentials of one thread only.
//! - `job_thread`: running work as the job's ids, on the one thread
//!   started for that ahead of the job.
//! - `kill`: signalling the job's processes from the signaller thread.
//! - `reap`: `wait4(-1)`: reaping every child with its resource usage.
//! - `accounting`: CPU time from `/proc`, OOM counters from the cgroup.
//! - `runs`: the runs after the stages (a graded job's tests): what each
//!   run finds, and removing what the last one added.
//! - `runtime`: a warm runtime, started before the bundle and released
//!   into the first stage when it fits.
//! - `runs_filter`: the seccomp filter that keeps a run from creating IPC
//!   objects and keys, which would outlive it.
//! - `watch`: tracing a watched stage to notice that it waits for stdin
//!   (`input_wanted`); `watch/filter.rs` the filter of every stage (no
//!   ptrace), `watch/ptrace.rs` the ptrace requests.
//! - `bpf`: the BPF opcodes of both filters, and installing one.
//! - `egress`: the relay from `127.0.0.1:<port>` to the job's egress proxy
//!   on a Unix socket, one thread polling every connection
//!   (`egress/connection.rs`: one connection's two directions).
//!
//! A module split in files keeps its tests in `<module>/tests.rs` where
//! they are long.
//!
//! # Dependencies
//!
//! A crate of its own (a library and the `code-runner-init` binary), so
//! that the compiler keeps it off the daemon's dependencies: the protocol,
//! nix, thiserror, and tokio with `rt`, `sync`, `time`, `signal` and
//! `macros` only. No `net`, no HTTP, Docker or Redis client, no metrics:
//! `tests/dependencies.rs` (and `scripts/test`) fails, naming the crate, if
//! `cargo tree -p code-runner-init -e features` ever shows one. Without
//! `net`, a stage's pipes are served by plain threads (`pipes`). Every
//! thread but the main one blocks `SIGCHLD`, `SIGTERM` and `SIGINT`, so the
//! kernel delivers them to the main thread's loop. `scripts/build-images`
//! builds it alone, statically (`crt-static`), and copies it into every
//! runner image.

// `unsafe` only where a system call needs it, each block allowed and
// explained where it is (`spawn`, `reap`, `creds`, `bpf`, `runs_filter`,
// `pipes`, `watch/ptrace.rs`, `egress/connection.rs`).
#![deny(unsafe_code)]

mod accounting;
mod bpf;
mod creds;
mod egress;
mod files;
mod io;
mod job_thread;
mod kill;
mod outputs;
mod pipes;
mod reap;
mod report;
mod runs;
mod runs_filter;
mod runtime;
mod spawn;
mod stage;
mod stdin;
mod supervisor;
mod watch;

use std::ffi::OsString;

use code_runner_protocol::FrameError;

pub use files::{MAX_PATH_BYTES, MAX_PATH_DEPTH, validate_relative_path};

/// Exit status when the supervisor itself failed (after a `fatal` frame).
pub const EXIT_FATAL: i32 = 70;

/// Exit status for a command line the binary does not understand.
pub const EXIT_USAGE: i32 = 64;

/// Why the supervisor could not go on; each variant names the failed step.
/// Every one of them ends in a `fatal` frame carrying its message.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("cannot mark the supervisor non-dumpable: {0}")]
    NonDumpable(nix::errno::Errno),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot install the {signal} handler: {source}")]
    SignalHandler {
        signal: &'static str,
        source: std::io::Error,
    },
    #[error("cannot start the {thread} thread: {source}")]
    Thread {
        thread: &'static str,
        source: std::io::Error,
    },
    #[error("cannot set the stage's limits on the warm runtime (pid {pid}): {source}")]
    RuntimeLimits { pid: i32, source: std::io::Error },
    #[error("the {thread} thread panicked")]
    ThreadPanicked { thread: &'static str },
    #[error("the host stopped reading the supervisor's output")]
    HostGone,
    #[error("the host closed stdin before sending the bundle")]
    EofBeforeBundle,
    #[error("expected a bundle frame first, got a {0} frame")]
    NotBundle(&'static str),
    #[error("malformed frame from the host: {0}")]
    MalformedFrame(FrameError),
    #[error("unexpected {0} frame from the host after the bundle")]
    UnexpectedFrame(&'static str),
    #[error("terminated by a signal before the bundle arrived")]
    TerminatedBeforeBundle,
    #[error("cannot listen for the egress relay on 127.0.0.1:{port}: {source}")]
    EgressListen { port: u16, source: std::io::Error },
    #[error("invalid bundle: {0}")]
    InvalidBundle(String),
    #[error("invalid bundle file path {path:?}: {reason}")]
    BadPath { path: String, reason: &'static str },
    #[error("cannot switch a thread to the job's uid {uid} gid {gid}: {source}")]
    SwitchIds {
        uid: u32,
        gid: u32,
        source: std::io::Error,
    },
    #[error("cannot open the workspace {workspace:?}: {source}")]
    OpenWorkspace {
        workspace: String,
        source: std::io::Error,
    },
    #[error("cannot list the descriptors of process {pid}: {source}")]
    ListDescriptors { pid: i32, source: std::io::Error },
    #[error("cannot write bundle file {path:?} ({step}): {source}")]
    WriteFile {
        path: String,
        step: &'static str,
        source: std::io::Error,
    },
    #[error(
        "processes of the job survived every kill for {seconds} s after stage {stage:?}; no further stage runs"
    )]
    Survivors { stage: String, seconds: u64 },
    #[error("cannot prepare the sandbox for the next run: {0}")]
    Runs(String),
    /// Emptying the job's directories before lingering failed (the same
    /// tree steps as [`InitError::Runs`], said plainly).
    #[error("{0}")]
    Wipe(String),
    #[error("cannot set up the pipes of stage {stage:?}: {source}")]
    StagePipes {
        stage: String,
        source: std::io::Error,
    },
}

/// Entry point of the `code-runner-init` binary; returns its exit status.
///
/// It takes no arguments: it is the supervisor.
pub fn main(args: Vec<OsString>) -> i32 {
    match args.get(1) {
        None => supervisor::run(),
        Some(_) => {
            eprintln!("code-runner-init: takes no arguments; it reads a job bundle from stdin");
            EXIT_USAGE
        }
    }
}

/// Starts a thread named `name` (as the system shows it, and as a failure
/// to start it says).
fn spawn_thread<T: Send + 'static>(
    name: &'static str,
    body: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<T>, InitError> {
    spawn_named(name, body).map_err(|source| InitError::Thread {
        thread: name,
        source,
    })
}

/// The signals the supervisor's main thread handles, in the order of
/// `supervisor::Signals`' fields (child, terminate, interrupt), which
/// installs their handlers from this list.
const HANDLED_SIGNALS: [nix::sys::signal::Signal; 3] = [
    nix::sys::signal::Signal::SIGCHLD,
    nix::sys::signal::Signal::SIGTERM,
    nix::sys::signal::Signal::SIGINT,
];

/// Starts a helper thread named `name`, which first blocks the
/// [`HANDLED_SIGNALS`]. Every thread of the supervisor but the main one is
/// started here: a signal goes to a thread that does not block it, and one
/// that lands on a helper (blocked in a read, or exiting) reaches the main
/// thread's loop late. Under gVisor a `SIGCHLD` delivered to a pipe thread
/// on its way out reached the loop 1.6 ms after the stage's exit
/// (measured); with the helpers blocking them, the kernel delivers each
/// one to the main thread, which waits for exactly these.
///
/// A process forked from a thread keeps that thread's mask (std does not
/// reset it): a stage's child clears it before its exec (`spawn`).
fn spawn_named<T: Send + 'static>(
    name: &'static str,
    body: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            block_handled_signals();
            body()
        })
}

/// Blocks the [`HANDLED_SIGNALS`] in the calling thread. It cannot fail
/// with a valid set; if it did, the thread would only take signals as
/// before.
fn block_handled_signals() {
    let mut set = nix::sys::signal::SigSet::empty();
    for signal in HANDLED_SIGNALS {
        set.add(signal);
    }
    let _ = set.thread_block();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked_in_this_thread() -> Vec<nix::sys::signal::Signal> {
        let mask = nix::sys::signal::SigSet::thread_get_mask().expect("sigmask");
        HANDLED_SIGNALS
            .into_iter()
            .filter(|signal| mask.contains(*signal))
            .collect()
    }

    #[test]
    fn helper_threads_block_the_handled_signals_and_their_caller_does_not() {
        let blocked = spawn_named("test-helper", blocked_in_this_thread)
            .expect("spawn")
            .join()
            .expect("join");
        assert_eq!(blocked, HANDLED_SIGNALS.to_vec());
        // The spawning thread keeps its own mask.
        assert_eq!(blocked_in_this_thread(), Vec::new());
    }
}
