//! The sandbox engine: runs one prepared job in one hardened sandbox. It
//! knows Docker and the frame protocol; it knows nothing of HTTP or Redis.
//!
//! Callers see the engine through one trait, [`SandboxEngine`]
//! (`engine.rs`): the worker, the reaper and the API's readiness check hold
//! an [`Engine`] and never name Docker. [`DockerEngine`] (`docker.rs`) is the
//! product's implementation; the tests of everything above the sandbox run
//! a scripted one.
//!
//! The Docker engine's cold path costs four Engine API round trips: create,
//! attach, start, remove (plus an inspect only when the sandbox died without
//! reporting); the result is ready before the remove. The warm path
//! ([`pool`]) takes a sandbox started before the job came: no Engine API
//! call before the job runs, one (remove) after.
//!
//! Inside, dependencies run one way, from the job's run down to the
//! container:
//!
//! - `docker`: [`DockerEngine`], the trait's implementation;
//! - `run`: a job's run from its container's start to its result, cold or
//!   warm, and a graded job's restarts;
//! - `session`: one started sandbox's frames until the job's end;
//! - `grading`, `checker`, [`checker_cache`]: a graded job's tests, its
//!   checker's sandbox and the compiled checkers kept;
//! - `connection`: starting a container and holding its frame connection;
//! - `outcome`: what a session leaves (its output, the container to remove);
//! - [`pool`]: warm sandboxes, their lifecycle and refill;
//! - `container`: the one function that builds a container's configuration,
//!   the labels, the guard that removes a container on every path;
//! - `config`: [`SandboxConfig`], and the limits the supervisor applies
//!   itself under gVisor;
//! - `uids`: one uid per live sandbox on a host;
//! - `egress`: a job's egress proxy on a socket mounted into its sandbox;
//! - `seccomp`: loading and checking the profile.

mod checker;
pub mod checker_cache;
mod config;
mod connection;
mod container;
mod docker;
mod egress;
mod engine;
mod grading;
mod outcome;
mod outputs;
pub mod pool;
mod run;
mod seccomp;
mod session;
mod uids;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use config::{DEFAULT_CHECKER_CACHE_MB, GvisorLimits, SandboxConfig};
pub use container::{
    ContainerGuard, KEPT_CAPABILITIES, LABEL_CREATED, LABEL_DEADLINE, LABEL_JOB, LABEL_LANGUAGE,
    LABEL_UID, LABEL_WARM, LABEL_WORKER, SandboxClass, SandboxContainer, SandboxShape,
    container_config, container_name, force_remove, list_sandboxes,
};
pub use docker::DockerEngine;
pub use egress::{DEFAULT_EGRESS_DIR, EgressConfig, parse_test_hosts};
pub use engine::{Cleanup, Engine, RunOutcome, SandboxEngine, Teardown};
pub use pool::{WarmPool, WarmSandbox, WarmSpec, WarmStatus};
pub use seccomp::{Door, EMBEDDED_PROFILE, MUST_DENY, SeccompError, SeccompProfile};
pub use uids::{DEFAULT_LOCK_DIR, DEFAULT_UID_BASE, RANGE_SIZE, UidError, UidRange};

/// How many uid ranges a host has.
pub const fn uids_ranges() -> u32 {
    uids::MAX_RANGES
}

use crate::job::StageResult;
use crate::protocol::SignalKind;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot connect to docker: {0}")]
    Connect(#[source] bollard::errors::Error),
    #[error("docker is not answering: {0}")]
    Ping(#[source] bollard::errors::Error),
    #[error("docker could not list the sandbox containers: {0}")]
    List(#[source] bollard::errors::Error),
    #[error("docker could not remove container {id}: {source}")]
    Remove {
        id: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("cannot take a range of sandbox uids: {0}")]
    Uids(#[from] UidError),
    /// An engine other than Docker's could not do what was asked.
    #[error("the sandbox engine {what}: {message}")]
    Engine { what: String, message: String },
}

/// What happens in a sandbox, as it happens.
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxEvent {
    /// The container exists and its supervisor is ready.
    Ready,
    StageStart {
        stage: String,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    StageEnd {
        stage: String,
        result: Box<StageResult>,
    },
    /// A graded job's test `index` started.
    TestStart {
        index: usize,
        name: String,
    },
    /// A graded job's test ended, with its verdict.
    TestEnd(Box<crate::job::grading::TestResult>),
    /// A process of the job waits for stdin with nothing buffered for it.
    InputWanted,
    /// A connection through the job's egress proxy ended.
    Egress(crate::egress::EgressEvent),
}

/// Input for a running job (interactive jobs, or signals for any job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobInput {
    Stdin(Vec<u8>),
    StdinClose,
    Signal(SignalKind),
}

/// The channels a caller attaches to a job. All optional.
#[derive(Debug, Default)]
pub struct JobIo {
    /// Receives events as they happen; a full channel slows the job down (the
    /// sandbox blocks on its output) rather than losing output.
    pub events: Option<mpsc::Sender<SandboxEvent>>,
    /// Input for the job; stdin given in the job itself is sent first.
    pub input: Option<mpsc::Receiver<JobInput>>,
    /// Cancelling kills the job; its status is then `cancelled`.
    pub cancel: CancellationToken,
    /// The job's deadline as the store keeps it (unix ms, set when the job
    /// started): the sandbox is killed by then at the latest and its
    /// container is labelled with it. `None` (a run outside the daemon):
    /// the engine takes the job's whole budget from now
    /// ([`Budget::deadline_ms`](crate::job::deadline::Budget::deadline_ms)).
    pub deadline_ms: Option<u64>,
}
