//! code-runner: runs untrusted code in per-job hardened containers.
//!
//! # Layout
//!
//! - [`protocol`]: the frames spoken between the worker and the in-sandbox
//!   supervisor (`code-runner-init`): the crate `code-runner-protocol`
//!   (`crates/protocol`), which both depend on. The supervisor itself is the
//!   crate `code-runner-init` (`crates/init`), which the daemon does not
//!   depend on.
//! - [`job`]: the job as submitted, its validation and limits, and its result.
//! - [`languages`]: the language catalog (`runner-images/languages.toml`).
//! - [`sandbox`]: the engine that runs one job in one hardened container
//!   through the Docker Engine API. Knows Docker, not HTTP or Redis.
//! - [`store`]: Redis, the shared state; the only module that names a key.
//!   The job's life is one file per step there, checked against the one
//!   transition table of [`job::lifecycle`].
//! - [`worker`]: claims jobs (a semaphore permit first), runs them in the
//!   engine, writes results, heartbeats, drains on shutdown.
//! - [`reaper`]: removes the containers and reaps the jobs of workers
//!   that died; runs in every worker process and as `code-runner reaper`.
//! - [`api`]: the HTTP API (axum). Knows HTTP, not bollard or Redis keys.
//! - [`follow`]: what an API process follows in the store for its clients
//!   (jobs' events, queued jobs' places). Knows the store, not HTTP.
//! - [`app`]: wires the roles (`serve`, `api`, `worker`, `reaper`), owns the root
//!   cancellation token; [`metrics`]: every Prometheus metric.
//! - [`client`]: the `run` command, a client of a running API.
//! - [`bench`](mod@bench): the `bench` command, a load generator for a running API or
//!   the sandbox engine alone.
//! - [`config`]: settings shared by every role, validated before use;
//!   [`host`]: the machine the process runs on, from `/proc`.
//! - [`cli`]: the command line; [`exit`]: how outcomes become exit codes.
#![deny(unsafe_code)]
// The module documentation describes the code as it is put together, private
// parts included (`cargo doc --document-private-items` shows it whole); its
// links to private items are meant.
#![allow(rustdoc::private_intra_doc_links)]

pub mod api;
pub mod app;
pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod egress;
pub mod exit;
pub mod follow;
pub mod host;
pub mod job;
pub mod languages;
pub mod metrics;
pub mod reaper;
pub mod sandbox;
pub mod store;
pub mod worker;

/// The frame protocol, from its own crate; `code_runner::protocol` is its
/// path in the daemon.
pub use code_runner_protocol as protocol;
