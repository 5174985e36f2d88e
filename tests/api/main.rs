//! The HTTP API without Docker: the API alone on a real redis-server
//! ([`server`]), or a whole `code-runner serve|api|worker` process in the
//! test on the scripted engine
//! ([`common::in_process::InProcessBuilder`]), driven through real HTTP,
//! WebSockets and Server-Sent Events by reqwest, tokio-tungstenite and
//! clients not written in this project (Python's `websockets`, `curl`, the
//! published Piston client, promtool). What a real sandbox or a real
//! language does is tested against Docker in the `sandbox` and `daemon`
//! binaries.
//!
//! Each test starts its own redis-server and its own server on a loopback
//! port; both stop when the test ends, also when it fails.

#[path = "../common/mod.rs"]
mod common;

/// Helpers of this binary.
mod server;
mod ws;

// One module per topic, in alphabetical order.
mod admission;
mod capacity;
mod compat_edges;
mod cors;
mod fanout;
mod files;
mod files_s3;
mod grading;
mod history;
mod history_filters;
mod http_limits;
mod jobe;
mod jobs;
mod judge0;
mod judge0_ops;
mod ops;
mod piston;
mod stream_checks;
mod stream_places;
mod streams;
mod tenancy;
mod tokens;
mod usage;
mod usage_ledger;
mod wait;
mod web;
