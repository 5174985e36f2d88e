//! Process exit codes: how a job's outcome becomes the exit status of the
//! `sandbox run` (and later `run`) command.
//!
//! | outcome                         | exit code                          |
//! |---------------------------------|------------------------------------|
//! | succeeded                       | 0                                  |
//! | program exited non-zero         | its exit code                      |
//! | program killed by signal N      | 128 + N                            |
//! | compile error                   | the compiler's exit code           |
//! | wall, idle or cpu timeout       | 124 (as `timeout(1)`)              |
//! | memory limit                    | 137                                |
//! | output limit                    | 153                                |
//! | cancelled                       | 130                                |
//! | platform error                  | 125 (as `docker run`)              |
//! | invalid job or configuration    | 64 (EX_USAGE)                      |
//! | Docker or an image unavailable  | 69 (EX_UNAVAILABLE)                |

use crate::job::{JobResult, Status};
use crate::protocol::Reason;

pub const USAGE: u8 = 64;
pub const UNAVAILABLE: u8 = 69;
pub const TIMEOUT: u8 = 124;
pub const PLATFORM_ERROR: u8 = 125;
pub const CANCELLED: u8 = 130;
pub const MEMORY_LIMIT: u8 = 137;
pub const OUTPUT_LIMIT: u8 = 153;

/// The exit code for a result, and a one-line explanation when the program's
/// own exit code does not tell the story.
pub fn for_result(result: &JobResult) -> (u8, Option<String>) {
    match result.status {
        Status::Succeeded => (0, None),
        Status::Cancelled => (CANCELLED, Some("the job was cancelled".into())),
        Status::Error => (
            PLATFORM_ERROR,
            Some(format!(
                "platform error: {}",
                result.error.as_deref().unwrap_or("unknown")
            )),
        ),
        Status::Queued | Status::Running => {
            (PLATFORM_ERROR, Some("the job has not finished".into()))
        }
        Status::Failed | Status::TimedOut => {
            let Some(stage) = result.deciding_stage() else {
                return (PLATFORM_ERROR, Some("no stage ran".into()));
            };
            let compile = result.run.is_none();
            let what = if compile { "compile stage" } else { "program" };
            match stage.reason {
                Reason::WallTimeout => (
                    TIMEOUT,
                    Some(format!("{what} exceeded its wall time limit")),
                ),
                Reason::IdleTimeout => (TIMEOUT, Some(format!("{what} was idle too long"))),
                Reason::CpuTimeout => {
                    (TIMEOUT, Some(format!("{what} exceeded its cpu time limit")))
                }
                Reason::MemoryLimit => (
                    MEMORY_LIMIT,
                    Some(format!("{what} exceeded its memory limit")),
                ),
                Reason::OutputLimit => (
                    OUTPUT_LIMIT,
                    Some(format!("{what} exceeded its output limit")),
                ),
                Reason::Killed => (MEMORY_LIMIT, Some(format!("{what} was killed"))),
                Reason::Exited => match (stage.exit_code, &stage.signal) {
                    (Some(code), _) => (
                        u8::try_from(code).unwrap_or(1),
                        compile.then(|| format!("compilation failed (exit code {code})")),
                    ),
                    (None, Some(signal)) => (
                        128 + signal_number(signal),
                        Some(format!("{what} was killed by {signal}")),
                    ),
                    (None, None) => (PLATFORM_ERROR, Some(format!("{what} ended unexplained"))),
                },
            }
        }
    }
}

fn signal_number(name: &str) -> u8 {
    name.parse::<nix::sys::signal::Signal>()
        .map_or(0, |s| s as i32 as u8)
}
