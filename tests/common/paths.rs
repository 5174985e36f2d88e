//! The start paths of a job, for the tests that must hold on each of them:
//! a container made for the job (`cold`), a warm pool's sandbox started
//! before the job came (`warm`), and a warm sandbox whose language runtime
//! was started ahead too (`warm_runtime`, docs/warm-runtimes.md). A warm
//! sandbox must hold a job to exactly the limits and the isolation of a
//! cold one.
//!
//! [`on_every_start_path!`] turns test bodies into tests on every path:
//!
//! ```ignore
//! use crate::common::paths::on_every_start_path;
//!
//! async fn fork_bomb_is_contained_by_the_pids_limit(harness: Harness) { … }
//!
//! on_every_start_path!(fork_bomb_is_contained_by_the_pids_limit, …);
//! // under gVisor, skipped unless CODE_RUNNER_TEST_RUNSC=1:
//! on_every_start_path!(runsc: hello_world_runs_under_gvisor, …);
//! ```
//!
//! For each `name` it writes `cold::name`, `warm::name` and
//! `warm_runtime::name`, three `#[tokio::test]`s that each call the body
//! `name(harness)` with a [`Harness`] on runc (or on runsc) whose
//! [`Harness::run`] takes that path (see [`Harness::on`]).

use code_runner::job::StartKind;

use super::{Harness, runsc_harness};

/// A harness on `runtime` (`"runc"` or `"runsc"`) that starts jobs on
/// `start`; `None` (with a line saying so) for runsc when runsc tests are
/// not enabled.
pub async fn harness_on(runtime: &str, start: StartKind, test: &str) -> Option<Harness> {
    let harness = match runtime {
        "runc" => Harness::new().await,
        "runsc" => runsc_harness(test).await?,
        other => panic!("no runtime {other:?} to test on (runc or runsc)"),
    };
    Some(harness.on(start))
}

/// Writes, for each test body `name(harness: Harness)`, a test of it on
/// each start path: modules `cold`, `warm` and `warm_runtime`, each with a
/// test `name`. `runsc:` first runs them under gVisor (skipped, saying so,
/// unless `CODE_RUNNER_TEST_RUNSC=1`); the default is runc. See the
/// [module documentation](self).
#[allow(unused_macros)] // a test binary without such tests
macro_rules! on_every_start_path {
    (runsc: $($name:ident),+ $(,)?) => {
        $crate::common::paths::on_every_start_path!(@paths "runsc", $($name),+);
    };
    (@paths $runtime:literal, $($name:ident),+) => {
        $crate::common::paths::on_every_start_path!(@path cold, Cold, $runtime, $($name),+);
        $crate::common::paths::on_every_start_path!(@path warm, Warm, $runtime, $($name),+);
        $crate::common::paths::on_every_start_path!(@path warm_runtime, WarmRuntime, $runtime, $($name),+);
    };
    (@path $module:ident, $start:ident, $runtime:literal, $($name:ident),+) => {
        mod $module {
            $(#[tokio::test]
            async fn $name() {
                let start = code_runner::job::StartKind::$start;
                let test = stringify!($name);
                if let Some(harness) =
                    $crate::common::paths::harness_on($runtime, start, test).await
                {
                    super::$name(harness).await;
                }
            })+
        }
    };
    ($($name:ident),+ $(,)?) => {
        $crate::common::paths::on_every_start_path!(@paths "runc", $($name),+);
    };
}

#[allow(unused_imports)] // a test binary without such tests
pub(crate) use on_every_start_path;
