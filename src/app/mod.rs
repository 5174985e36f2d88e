//! Wires the roles of the daemon (`serve`, `api`, `worker`, `reaper`) together
//! (every process with a worker runs the reaper too), in two steps:
//!
//! - [`plan`]: validates every setting into a [`Plan`] (or the one
//!   [`ConfigError`](crate::config::ConfigError)) before anything binds or
//!   connects;
//! - [`process`]: runs the plan: binds, connects, starts the roles, serves
//!   until SIGTERM/SIGINT, then drains (the worker finishes its jobs; the
//!   API stops accepting) under the root cancellation token and the task
//!   tracker it owns. It also tells systemd `READY=1` and `STOPPING=1`.
//!
//! [`run`] is the two together, as the `serve`, `api`, `worker` and `reaper`
//! commands call it.

mod plan;
mod process;

pub use plan::{ApiPlan, Plan, Roles};
pub use process::installed_catalog;

use crate::config::{RedisSettings, SandboxSettings};
use crate::exit;

/// Runs `roles` until SIGTERM or SIGINT; returns the exit code. A bad
/// setting is one line naming it, and exit 64, before anything binds or
/// connects.
pub async fn run(sandbox: &SandboxSettings, redis: &RedisSettings, roles: Roles<'_>) -> u8 {
    match Plan::validate(sandbox, redis, roles) {
        Ok(plan) => plan.run().await,
        Err(error) => {
            eprintln!("code-runner: {error}");
            exit::USAGE
        }
    }
}
