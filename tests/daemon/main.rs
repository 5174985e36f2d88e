//! The daemon end to end: the real `code-runner` binary as a child process
//! (`serve`, `api`, `worker`, the CLI, `bench`), each test with a
//! redis-server of its own, running real sandboxes on the real dockerd;
//! and what deploys it (the Fly worker image) and stresses it (bursts,
//! chaos, a restarted dockerd). The daemon's behaviour above the sandbox is
//! tested without Docker in the `store`, `worker` and `api` binaries; what
//! needs no dockerd at all of the binary and its tooling is in `tools`.
//!
//! Each test runs in a process of its own under cargo-nextest
//! (`scripts/test`); `.config/nextest.toml` keeps apart the ones that share
//! something of the machine (dockerd restarted, the CLI's worker ids, the
//! burst, the Fly worker image).

#[path = "../common/mod.rs"]
mod common;

// One module per topic, in alphabetical order.
mod bench;
mod browser;
mod burst;
mod chaos;
mod cli;
mod docker_restart;
mod drain;
mod end_to_end;
mod files;
mod fleet;
mod fly_worker;
mod notify;
mod redis_memory;
mod redis_tls;
mod run_client;
mod warm_capacity;

// Modules of other layers' tests that belong in this binary: one `mod` line
// per file added to this folder, in alphabetical order.
mod durability;
mod grading_api;
mod jobe;
mod judge0;
mod piston;
mod removals;
mod usage;
mod worker_docker;
