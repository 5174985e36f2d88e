//! Signalling the job's processes without `CAP_KILL`, in a way the job
//! cannot dodge.
//!
//! The supervisor runs as uid 0 but holds only `CAP_SETUID`/`CAP_SETGID`, so
//! the kernel refuses its signals to the job's processes (another uid). Every
//! signal is sent by **the signaller**: a thread of the supervisor, started
//! at start-up (when it is needed, a fork bomb may have filled the pids
//! cgroup), that per request switches *its own* credentials (Linux and gVisor
//! keep credentials per thread; see [`super::creds`]), sends the signal and
//! switches back to root. The main thread, whose credentials govern signals
//! aimed at the process, stays root throughout.
//!
//! Which credentials the thread takes decides who can reach it meanwhile.
//! The kernel lets A signal B when A's real or effective uid equals B's real
//! or saved uid:
//!
//! - **As PID 1** (in a sandbox, always): real 0, effective *job uid*, saved
//!   0. The thread can signal the job (effective = the job's real uid), but
//!   no job process can signal the thread (its real and saved uids are 0),
//!   trace it or open its `/proc/1/task/<tid>/…` (ptrace access needs every
//!   uid of the target to match). The kill is `kill(-1)`: from PID 1 of the
//!   container's pid namespace it reaches every other process in it, which
//!   are all the job's. Linux delivers it to all of them under one lock, so
//!   not even a fork bomb can race it (gVisor may leave stragglers, which the
//!   next round gets).
//! - **Not PID 1** (the supervisor's own tests on a host): real and
//!   effective *job uid*, saved 0, as a real uid of 0 would let `kill(-1)`
//!   reach every root process of the machine. `kill(-1)` then reaches the
//!   processes of the job's uid only.
//!
//! There is no helper process: an earlier design started one as the job's
//! uid, which a job looping `kill(-1, SIGKILL)` killed before it acted, and
//! whose inherited stderr the job could open through `/proc`.
//!
//! `kill(-1)` is never sent with an effective uid of 0.

use std::sync::mpsc;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, geteuid, getpid, getuid};

use super::creds::set_thread_resuid;
use super::{InitError, spawn_thread};

/// Which of the job's processes to signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Every process of the job (`kill(-1)`).
    All,
    /// One process group (`kill(-pgid)`); the stage's main process leads its own.
    Group(i32),
}

/// The credentials the signaller takes to send a signal; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Identity {
    /// PID 1 of a pid namespace: real 0, effective the job's uid, saved 0.
    Init,
    /// Anywhere else: real and effective the job's uid, saved 0.
    Process,
}

impl Identity {
    /// The identity for the running process.
    pub(crate) fn current() -> Self {
        if getpid() == Pid::from_raw(1) {
            Identity::Init
        } else {
            Identity::Process
        }
    }

    /// `(real, effective, saved)` uids to take for signalling as `uid`.
    pub(crate) fn uids(self, uid: u32) -> (u32, u32, u32) {
        match self {
            Identity::Init => (0, uid, 0),
            Identity::Process => (uid, uid, 0),
        }
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

struct SignalRequest {
    uid: u32,
    target: Target,
    signal: Signal,
    reply: mpsc::Sender<std::io::Result<()>>,
}

/// Signals the processes of one uid from the signaller thread.
pub(crate) struct Killer {
    uid: u32,
    signaller: Signaller,
}

impl Killer {
    pub(crate) fn new(uid: u32, signaller: Signaller) -> Self {
        Self { uid, signaller }
    }

    /// From now on, signal the processes of `uid` (the runs after the
    /// stages have a uid of their own).
    pub(crate) fn set_uid(&mut self, uid: u32) {
        self.uid = uid;
    }

    /// Sends `signal` to `target` and returns once it is sent; `false` when
    /// it could not be (written to the supervisor's log). Kills are sent
    /// again on a timer until the stage is gone.
    pub(crate) fn signal(&self, target: Target, signal: Signal) -> bool {
        match self.signaller.signal(self.uid, target, signal) {
            Ok(()) => true,
            Err(error) => {
                eprintln!("code-runner-init: cannot send {signal} to {target:?}: {error}");
                false
            }
        }
    }
}

/// Handle to the signaller thread.
pub(crate) struct Signaller {
    requests: mpsc::Sender<SignalRequest>,
}

impl Signaller {
    /// Starts the thread with the identity for this process. Done once,
    /// early: when it is needed, the pids cgroup may have no room left for a
    /// new thread.
    pub(crate) fn start() -> Result<Self, InitError> {
        Self::start_as(Identity::current())
    }

    fn start_as(identity: Identity) -> Result<Self, InitError> {
        let (requests, incoming) = mpsc::channel::<SignalRequest>();
        spawn_thread("signaller", move || {
            while let Ok(request) = incoming.recv() {
                let outcome = signal_as(identity, request.uid, request.target, request.signal);
                let fatal = matches!(outcome, Err(SignalAsError::StuckAsUid(_)));
                let _ = request.reply.send(outcome.map_err(SignalAsError::into_io));
                if fatal {
                    // Could not get root back: serve nothing more.
                    return;
                }
            }
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
fn signal_as(
    identity: Identity,
    uid: u32,
    target: Target,
    signal: Signal,
) -> Result<(), SignalAsError> {
    let (real, effective, saved) = identity.uids(uid);
    // The saved uid stays 0: it keeps the permitted capabilities and lets
    // the thread return to root below.
    set_thread_resuid(real, effective, saved).map_err(SignalAsError::Switch)?;
    let sent = if getuid().as_raw() == real && geteuid().as_raw() == effective && effective != 0 {
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
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::Command;

    /// A uid no process on the host runs as, distinct from the integration
    /// tests' range.
    fn test_uid() -> u32 {
        4_200_000 + std::process::id() % 1000
    }

    #[test]
    fn init_identity_cannot_be_signalled_by_the_job() {
        // The kernel's rule: A may signal B when A's real or effective uid is
        // B's real or saved uid.
        let may_signal = |a: (u32, u32, u32), b: (u32, u32, u32)| {
            [a.0, a.1].iter().any(|id| *id == b.0 || *id == b.2)
        };
        let uid = 65_534;
        let job = (uid, uid, uid);
        let init = Identity::Init.uids(uid);
        assert!(may_signal(init, job));
        assert!(!may_signal(job, init));
        assert_eq!(Identity::Process.uids(uid), (uid, uid, 0));
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
        // Not PID 1 here: the `Process` identity (the `Init` one would let
        // kill(-1) reach every root process of the host).
        assert_eq!(Identity::current(), Identity::Process);
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

    #[test]
    fn init_identity_signals_one_group_and_returns_to_root() {
        if !getuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        // Only a process group is signalled here: the Init identity's
        // kill(-1) is for PID 1 of a container.
        let uid = test_uid() + 1;
        let mut victim = Command::new("sleep")
            .arg("100")
            .uid(uid)
            .gid(uid)
            .process_group(0)
            .spawn()
            .expect("spawn sleep as the test uid");
        let pgid = i32::try_from(victim.id()).expect("pid");
        let signaller = Signaller::start_as(Identity::Init).expect("start the signaller");
        signaller
            .signal(uid, Target::Group(pgid), Signal::SIGKILL)
            .expect("signal the group");
        let status = victim.wait().expect("wait for sleep");
        assert_eq!(status.signal(), Some(nix::libc::SIGKILL));
        assert!(getuid().is_root() && geteuid().is_root());
    }
}
