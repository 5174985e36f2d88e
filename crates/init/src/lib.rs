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
//! - `pipes`: the threads that read the stage's stdout and stderr and write
//!   its stdin.
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
//! - `watch`: the filter of every stage (no ptrace), and tracing a watched
//!   stage to notice that it waits for stdin (`input_wanted`).
//! - `bpf`: the BPF opcodes of both filters, and installing one.
//! - `egress`: the relay from `127.0.0.1:<port>` to the job's egress proxy
//!   on a Unix socket, one thread polling every connection.

// `unsafe` only where a system call needs it, each block allowed and
// explained where it is (`spawn`, `reap`, `creds`, `egress`).
#![deny(unsafe_code)]

mod accounting;
mod bpf;
mod creds;
mod egress;
mod files;
mod io;
mod job_thread;
mod kill;
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
    std::thread::Builder::new()
        .name(name.into())
        .spawn(body)
        .map_err(|source| InitError::Thread {
            thread: name,
            source,
        })
}
