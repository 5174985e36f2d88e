//! What needs no dockerd: the deployment and install tooling (the Fly
//! configs, `deploy-fly/provision-pool` against a fake flyctl,
//! `scripts/install`, the keys of `scripts/up`) and the `code-runner`
//! binary where it stops before any sandbox (configuration refusals, bad
//! flags, the language list, a Redis or an API it cannot use).
//!
//! `scripts/test --fast` runs it with `DOCKER_HOST` pointing nowhere: a test
//! here that reaches for Docker fails. It needs redis-server, redis-cli,
//! promtool and systemd-analyze (installed by `scripts/test`).

#[path = "../common/mod.rs"]
mod common;

// One module per topic, in alphabetical order.
mod cli;
mod fly_config;
mod fly_provision;
mod redis_tls;
mod up_keys;
mod vps_install;

// Modules of other layers' tests that belong in this binary: one `mod` line
// per file added to this folder, in alphabetical order.
