//! Signalling the job's processes without `CAP_KILL`.
//!
//! The supervisor runs as uid 0 but holds only `CAP_SETUID`/`CAP_SETGID`, so
//! the kernel refuses its signals to the job's processes (another uid). It
//! signals them as their own uid instead:
//!
//! 1. **The helper** (the normal way): this same binary, started with the
//!    job's uid and gid and a hidden argument, `--signal-all SIGNO` or
//!    `--signal-group PGID SIGNO`. It calls `kill(-1, SIGNO)` — which, from
//!    uid U, reaches every process of uid U but itself: the stage and
//!    anything it forked, `setsid`ed or daemonised — or `kill(-PGID, SIGNO)`,
//!    and exits. The supervisor reaps it like any other child.
//! 2. **The signaller thread** (the fallback, when no process can be
//!    started, e.g. a fork bomb filled the pids cgroup): a thread created at
//!    start-up that, per request, switches *its own* credentials to the job's
//!    uid with the raw `setresuid` system call (Linux keeps credentials per
//!    thread; glibc's wrapper would switch every thread), sends the signal,
//!    and switches back to root through the saved uid 0. The main thread,
//!    whose credentials govern signals aimed at the process, stays root.
//!
//! Both refuse to run `kill(-1)` as root: from uid 0 it would hit every
//! process of the machine when the supervisor is not in a container.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, getuid};

use super::creds::set_thread_resuid;
use super::{EXIT_USAGE, InitError};

pub(crate) const SIGNAL_ALL_FLAG: &str = "--signal-all";
pub(crate) const SIGNAL_GROUP_FLAG: &str = "--signal-group";

/// Which of the uid's processes to signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Every process of the uid (`kill(-1)`).
    All,
    /// One process group (`kill(-pgid)`); the stage's main process leads its own.
    Group(i32),
}

/// Signals the processes of one uid; see the module docs.
pub(crate) struct Killer {
    exe: PathBuf,
    uid: u32,
    gid: u32,
    signaller: Signaller,
}

impl Killer {
    pub(crate) fn new(exe: PathBuf, uid: u32, gid: u32, signaller: Signaller) -> Self {
        Self {
            exe,
            uid,
            gid,
            signaller,
        }
    }

    /// Sends `signal` to `target`. Returns the pid of the helper process,
    /// which the caller must reap, or `None` when the signal was sent by the
    /// signaller thread (already done) or could not be sent at all.
    pub(crate) fn signal(&self, target: Target, signal: Signal) -> Option<i32> {
        match self.spawn_helper(target, signal) {
            Ok(pid) => Some(pid),
            Err(error) => {
                eprintln!(
                    "code-runner-init: cannot start the signal helper ({error}); \
                     signalling from the signaller thread"
                );
                if let Err(error) = self.signaller.signal(self.uid, target, signal) {
                    eprintln!("code-runner-init: the signaller thread failed too: {error}");
                }
                None
            }
        }
    }

    fn spawn_helper(&self, target: Target, signal: Signal) -> std::io::Result<i32> {
        let mut command = Command::new(&self.exe);
        match target {
            Target::All => command.arg(SIGNAL_ALL_FLAG),
            Target::Group(pgid) => command.arg(SIGNAL_GROUP_FLAG).arg(pgid.to_string()),
        };
        let child = command
            .arg((signal as i32).to_string())
            .env_clear()
            .current_dir("/")
            .uid(self.uid)
            .gid(self.gid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        // Reaped by the supervisor's wait4(-1) loop, never by Child::wait.
        i32::try_from(child.id()).map_err(std::io::Error::other)
    }
}

/// `kill(-1)` or `kill(-pgid)`; "no such process" is not an error.
fn send(target: Target, signal: Signal) -> Result<(), Errno> {
    let pid = match target {
        Target::All => Pid::from_raw(-1),
        Target::Group(pgid) if pgid > 1 => Pid::from_raw(-pgid),
        Target::Group(_) => return Err(Errno::EINVAL),
    };
    match kill(pid, signal) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(errno) => Err(errno),
    }
}

/// The helper mode: `code-runner-init --signal-all SIGNO` or
/// `code-runner-init --signal-group PGID SIGNO`, run as the job's uid.
pub(crate) fn helper_main(args: &[OsString]) -> i32 {
    let args: Vec<&str> = args.iter().filter_map(|arg| arg.to_str()).collect();
    let parsed = match args.as_slice() {
        [SIGNAL_ALL_FLAG, signo] => parse_signal(signo).map(|signal| (Target::All, signal)),
        [SIGNAL_GROUP_FLAG, pgid, signo] => pgid
            .parse::<i32>()
            .ok()
            .filter(|pgid| *pgid > 1)
            .zip(parse_signal(signo))
            .map(|(pgid, signal)| (Target::Group(pgid), signal)),
        _ => None,
    };
    let Some((target, signal)) = parsed else {
        eprintln!(
            "code-runner-init: usage: {SIGNAL_ALL_FLAG} SIGNO | {SIGNAL_GROUP_FLAG} PGID SIGNO"
        );
        return EXIT_USAGE;
    };
    if getuid().is_root() || nix::unistd::geteuid().is_root() {
        eprintln!("code-runner-init: refusing to signal as root");
        return EXIT_USAGE;
    }
    match send(target, signal) {
        Ok(()) => 0,
        Err(errno) => {
            eprintln!("code-runner-init: kill failed: {errno}");
            1
        }
    }
}

fn parse_signal(text: &str) -> Option<Signal> {
    text.parse::<i32>()
        .ok()
        .and_then(|signo| Signal::try_from(signo).ok())
}

struct SignalRequest {
    uid: u32,
    target: Target,
    signal: Signal,
    reply: mpsc::Sender<std::io::Result<()>>,
}

/// Handle to the signaller thread (the fallback of [`Killer::signal`]).
pub(crate) struct Signaller {
    requests: mpsc::Sender<SignalRequest>,
}

impl Signaller {
    /// Starts the thread. Done once, early: when it is needed, the pids
    /// cgroup may have no room left for a new thread.
    pub(crate) fn start() -> Result<Self, InitError> {
        let (requests, incoming) = mpsc::channel::<SignalRequest>();
        std::thread::Builder::new()
            .name("signaller".into())
            .spawn(move || {
                while let Ok(request) = incoming.recv() {
                    let outcome = signal_as(request.uid, request.target, request.signal);
                    let fatal = matches!(outcome, Err(SignalAsError::StuckAsUid(_)));
                    let _ = request.reply.send(outcome.map_err(SignalAsError::into_io));
                    if fatal {
                        // Could not get root back: serve nothing more.
                        return;
                    }
                }
            })
            .map_err(|source| InitError::Thread {
                thread: "signaller",
                source,
            })?;
        Ok(Self { requests })
    }

    /// Sends `signal` to `target` as `uid` from the signaller thread and
    /// waits for it to be done.
    pub(crate) fn signal(&self, uid: u32, target: Target, signal: Signal) -> std::io::Result<()> {
        if uid == 0 {
            return Err(std::io::Error::other("refusing to signal as root"));
        }
        let (reply, outcome) = mpsc::channel();
        self.requests
            .send(SignalRequest {
                uid,
                target,
                signal,
                reply,
            })
            .map_err(|_| std::io::Error::other("the signaller thread is gone"))?;
        outcome
            .recv()
            .map_err(|_| std::io::Error::other("the signaller thread is gone"))?
    }
}

#[derive(Debug)]
enum SignalAsError {
    /// Could not take the uid; nothing was sent.
    Switch(std::io::Error),
    /// The signal failed; the thread is root again.
    Kill(Errno),
    /// The thread could not return to uid 0.
    StuckAsUid(std::io::Error),
}

impl SignalAsError {
    fn into_io(self) -> std::io::Error {
        match self {
            SignalAsError::Switch(error) => {
                std::io::Error::other(format!("cannot switch to the job's uid: {error}"))
            }
            SignalAsError::Kill(errno) => std::io::Error::from(errno),
            SignalAsError::StuckAsUid(error) => {
                std::io::Error::other(format!("cannot switch back to root: {error}"))
            }
        }
    }
}

/// Runs on the signaller thread only.
fn signal_as(uid: u32, target: Target, signal: Signal) -> Result<(), SignalAsError> {
    // Real and effective uid become the job's (the kernel lets a sender
    // signal a process when its real or effective uid matches that process's
    // real or saved uid); the saved uid stays 0, which keeps the permitted
    // capabilities and lets the thread return to root below.
    set_thread_resuid(uid, uid, 0).map_err(SignalAsError::Switch)?;
    let sent = if getuid().as_raw() == uid && !nix::unistd::geteuid().is_root() {
        send(target, signal).map_err(SignalAsError::Kill)
    } else {
        Err(SignalAsError::Switch(std::io::Error::other(
            "the uid switch did not take effect",
        )))
    };
    set_thread_resuid(0, 0, 0).map_err(SignalAsError::StuckAsUid)?;
    sent
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// A uid no process on the host runs as, distinct from the integration
    /// tests' range.
    fn test_uid() -> u32 {
        4_200_000 + std::process::id() % 1000
    }

    #[test]
    fn helper_arguments_are_checked() {
        let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(helper_main(&args(&[SIGNAL_ALL_FLAG])), EXIT_USAGE);
        assert_eq!(helper_main(&args(&[SIGNAL_ALL_FLAG, "99"])), EXIT_USAGE);
        assert_eq!(
            helper_main(&args(&[SIGNAL_GROUP_FLAG, "1", "9"])),
            EXIT_USAGE
        );
    }

    #[test]
    fn signaller_kills_the_uid_and_returns_to_root() {
        if !getuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let uid = test_uid();
        let mut victim = Command::new("sleep")
            .arg("100")
            .uid(uid)
            .gid(uid)
            .spawn()
            .expect("spawn sleep as the test uid");
        let signaller = Signaller::start().expect("start the signaller");
        signaller
            .signal(uid, Target::All, Signal::SIGKILL)
            .expect("signal as the test uid");
        let status = victim.wait().expect("wait for sleep");
        assert_eq!(status.signal(), Some(nix::libc::SIGKILL));
        // A second request works: the thread became root again.
        signaller
            .signal(uid, Target::All, Signal::SIGKILL)
            .expect("second signal");
        assert!(signaller.signal(0, Target::All, Signal::SIGKILL).is_err());
    }
}
