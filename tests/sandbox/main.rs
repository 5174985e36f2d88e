//! The sandbox itself, against the real dockerd and the runner images: each
//! module runs real programs in real containers (runc, and gVisor's `runsc`
//! when `CODE_RUNNER_TEST_RUNSC=1`) and asserts what they could and could
//! not do. Everything above the sandbox (the worker, the API, the store) is
//! tested without Docker in the `store`, `worker` and `api` binaries.
//!
//! Many tests run on every start path a job can take (a container made for
//! it, a warm pool's sandbox, a warm runtime): see [`common::paths`].
//!
//! Each test runs in a process of its own under cargo-nextest
//! (`scripts/test`); `.config/nextest.toml` keeps apart the ones that share
//! something of the machine.

#[path = "../common/mod.rs"]
mod common;
mod jobs;

// One module per topic, in alphabetical order.
mod basics;
mod cleanup;
mod create_cut_short;
mod egress;
mod escape;
mod grading;
mod input_wanted;
mod installed_languages;
mod kill;
mod languages;
mod libraries;
mod limits;
mod outputs;
mod runsc;
mod runsc_hostile;
mod seccomp;
mod validation;
mod warm_pool;
mod warm_runtime;

// Modules of other layers' tests that belong in this binary: one `mod` line
// per file added to this folder, in alphabetical order.
