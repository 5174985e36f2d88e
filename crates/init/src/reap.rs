//! Reaping children with `wait4(-1)`.
//!
//! The supervisor is PID 1 (and a child subreaper when it is not), so every
//! orphan of the job is re-parented to it. It reaps every child itself,
//! always with `wait4(-1, WNOHANG)` and always on the thread that spawns
//! children, and never calls `std::process::Child::wait`: a second waiter
//! would race with it (std's own `waitpid` after a failed `exec` panics if
//! someone else reaped that child first), and `wait4` is what yields the
//! resource usage of the stage's main process.
//!
//! The same call reports the stops of traced processes (see `watch`):
//! each is handed to the tracer, which lets the process go on, and the
//! exit of a traced thread is not a child's end.

use nix::libc;

use super::watch;

/// A child that ended, with what the kernel measured about it (its own
/// usage plus that of the descendants it waited for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reaped {
    pub pid: i32,
    pub termination: Termination,
    pub cpu_ms: u64,
    pub max_rss_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Termination {
    Exited(i32),
    Signaled(i32),
}

/// What `wait4` reported.
enum Waited {
    Ended(Reaped),
    /// A traced process stopped, with its wait status.
    Stopped(i32, libc::c_int),
}

/// What [`reap_next`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reap {
    /// A child that ended, reaped.
    Ended(Reaped),
    /// No child has ended (or `wait4` failed otherwise than below).
    Nothing,
    /// The supervisor has no child at all, ended or not (`ECHILD`). Every
    /// process started in the sandbox descends from PID 1, and an orphan is
    /// re-parented to it (or to the supervisor as subreaper), so then
    /// nothing of the job is left anywhere.
    NoChildren,
}

/// Reaps one child that has ended, if any, handling the stops of traced
/// processes on the way; never blocks.
pub(crate) fn reap_next() -> Reap {
    loop {
        match wait4_any_nohang() {
            Ok(Some(Waited::Stopped(pid, status))) => watch::stopped(pid, status),
            Ok(Some(Waited::Ended(reaped))) => {
                if !watch::ended(reaped.pid) {
                    return Reap::Ended(reaped);
                }
            }
            Ok(None) => return Reap::Nothing,
            Err(libc::EINTR) => continue,
            Err(libc::ECHILD) => return Reap::NoChildren,
            Err(_) => return Reap::Nothing,
        }
    }
}

/// [`reap_next`], for callers that only want the ended child.
pub(crate) fn reap_one() -> Option<Reaped> {
    match reap_next() {
        Reap::Ended(reaped) => Some(reaped),
        Reap::Nothing | Reap::NoChildren => None,
    }
}

/// `wait4(-1, &status, WNOHANG | __WALL, &rusage)`; `Ok(None)` when no child
/// has ended or stopped, `Err(errno)` on failure.
#[allow(unsafe_code)]
fn wait4_any_nohang() -> Result<Option<Waited>, i32> {
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is a plain C struct of integers, for which all-zero
    // bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes only through the two pointers, which point to the
    // live, properly aligned locals above for the whole call; it keeps no
    // reference to them afterwards.
    let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG | libc::__WALL, &mut usage) };
    if pid < 0 {
        return Err(nix::errno::Errno::last_raw());
    }
    if pid == 0 {
        return Ok(None);
    }
    // Without WUNTRACED only a tracee's stops are reported.
    if libc::WIFSTOPPED(status) {
        return Ok(Some(Waited::Stopped(pid, status)));
    }
    let termination = if libc::WIFEXITED(status) {
        Termination::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Termination::Signaled(libc::WTERMSIG(status))
    } else {
        // Without WCONTINUED wait4 reports only ended or stopped children.
        Termination::Exited(-1)
    };
    Ok(Some(Waited::Ended(Reaped {
        pid,
        termination,
        cpu_ms: timeval_ms(usage.ru_utime).saturating_add(timeval_ms(usage.ru_stime)),
        max_rss_bytes: u64::try_from(usage.ru_maxrss)
            .unwrap_or(0)
            .saturating_mul(1024),
    })))
}

fn timeval_ms(time: libc::timeval) -> u64 {
    let seconds = u64::try_from(time.tv_sec).unwrap_or(0);
    let micros = u64::try_from(time.tv_usec).unwrap_or(0);
    seconds.saturating_mul(1000).saturating_add(micros / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeval_converts_to_milliseconds() {
        assert_eq!(
            timeval_ms(libc::timeval {
                tv_sec: 2,
                tv_usec: 345_999
            }),
            2345
        );
        assert_eq!(
            timeval_ms(libc::timeval {
                tv_sec: -1,
                tv_usec: 0
            }),
            0
        );
    }
}
