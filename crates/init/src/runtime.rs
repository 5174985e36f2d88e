//! A warm runtime: the language's runtime started before the job came
//! (see [`Prestart`]), blocked reading its control pipe, and released into
//! the job's first stage when the bundle arrives.
//!
//! It is an ordinary process of the job's uid, in a session of its own, with
//! the same pipes a stage gets, so once released the stage's event loop
//! watches it exactly as it watches a process it spawned. What differs:
//! - it was started with the supervisor's rlimits (no core dumps); the
//!   stage's are set on it by `prlimit(2)` before the release, right after
//!   the bundle's files, from the
//!   thread that has the job's ids (`job_thread`; the kernel lets a process
//!   change another's limits only with the same real ids, and only lower a
//!   hard limit), so the stage ends up with exactly a spawned stage's limits;
//! - its descriptor 200 is the control pipe: the job's args, each followed by
//!   a NUL byte, then EOF. The release writes them without blocking and
//!   closes it (a thread writes what the pipe does not take at once). The
//!   runtime's hook closes it before the program starts.
//!
//! A fed runtime (ruby, `Prestart::fed`) opens its script at its start: a
//! FIFO the supervisor made and holds open (`files::create_fed_entry`).
//! Its release also writes the job's file into the FIFO, in the same way,
//! and closes it; the runtime's parser, which its hook let go on, reads it
//! up to the end.
//!
//! A hookless fed runtime (R, `Prestart::hookless`) has no control pipe and
//! its FIFO no lead byte: it waits for its program by reading the FIFO, and
//! its release is the script alone.
//!
//! A fed runtime of either kind runs a job only once it holds the FIFO open
//! ([`WarmRuntime::await_fifo_opened`]): a hookless one that would open its
//! script only after the job's file replaced the FIFO would run that file
//! at once, before its release, and a hooked one would read the file by its
//! name, leaving what the release writes into the FIFO unread. The
//! supervisor looks for that open while the sandbox waits for its job
//! ([`WarmRuntime::watching_fifo`]), so that a job normally finds it seen;
//! once seen, it closes its own read end of the FIFO, so that a runtime
//! that ends with its script unread fails the release's writes rather than
//! leaving them waiting until the sandbox goes.
//!
//! A runtime that did not fit the bundle, or died while waiting, is killed
//! and reaped before the first stage, which then starts as always.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::Signal;

use super::InitError;
use super::files::{
    FedEntry, Placeholder, ThenWork, create_fed_entry, create_placeholder, remove_placeholder,
};
use super::job_thread::take_ids;
use super::kill::{Killer, Target};
use super::reap::reap_one;
use super::spawn::{Launch, SpawnError, SpawnedStage, StageRlimits, spawn};
use code_runner_protocol::{BundleFile, FED_LEAD, FIFO_OPEN_TIMEOUT, Prestart, StageSpec};

/// How long a killed runtime may take to be reaped.
const KILL_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a fed runtime's open of its FIFO is looked at while it may
/// still come ([`FIFO_OPEN_TIMEOUT`]; before the job, and by it).
pub(crate) const FIFO_OPEN_POLL: Duration = Duration::from_millis(2);

/// A started runtime waiting for its job.
pub(crate) struct WarmRuntime {
    prestart: Prestart,
    /// The empty entry file it holds open (`Prestart::preopened`), or the
    /// FIFO it reads it from (`Prestart::fed`).
    placeholder: Option<Placeholder>,
    process: SpawnedStage,
    /// The write end of the control pipe (none for a hookless runtime).
    control: Option<OwnedFd>,
    /// A fed runtime's FIFO (its write end), and what the release writes
    /// into it (the job's file, kept by [`Self::takes_files`]).
    fifo: Option<(OwnedFd, Vec<u8>)>,
    /// The supervisor's read end of a fed runtime's FIFO
    /// ([`FedEntry::reader`]), while the runtime is not yet seen holding
    /// the FIFO (its `placeholder`) open: closed once it is.
    fifo_reader: Option<OwnedFd>,
    /// Until when the runtime may take to open its FIFO
    /// ([`FIFO_OPEN_TIMEOUT`] after its start).
    fifo_deadline: Instant,
    /// Whether writing to `control` (and the FIFO) never blocks.
    nonblocking: bool,
    /// Set once [`WarmRuntime::check_alive`] saw it end.
    ended: bool,
    /// Its stage's rlimits go with the bundle's files
    /// ([`WarmRuntime::limits_work`]).
    limits_set: bool,
}

impl WarmRuntime {
    /// Starts the runtime `prestart` names.
    pub(crate) fn start(prestart: Prestart) -> Result<Self, String> {
        if prestart.uid == 0 || prestart.gid == 0 {
            return Err("a warm runtime must run as a non-root uid and gid".into());
        }
        if prestart.stage_argv.is_empty() {
            return Err("a warm runtime must name the stage command it stands for".into());
        }
        if prestart.hookless && prestart.fed.is_none() {
            return Err("only a fed warm runtime can be hookless".into());
        }
        // A hookless runtime reads its script from the first byte.
        let lead = (!prestart.hookless).then_some(FED_LEAD);
        let (placeholder, fifo, fifo_reader) = match (&prestart.preopened, &prestart.fed) {
            (Some(_), Some(_)) => {
                return Err("a warm runtime cannot both preopen and be fed its entry file".into());
            }
            (Some(name), None) => (
                Some(
                    create_placeholder(&prestart.cwd, prestart.uid, prestart.gid, name)
                        .map_err(|error| format!("cannot make its entry file: {error}"))?,
                ),
                None,
                None,
            ),
            (None, Some(name)) => {
                let FedEntry {
                    placeholder,
                    reader,
                    writer,
                } = create_fed_entry(&prestart.cwd, prestart.uid, prestart.gid, name, lead)
                    .map_err(|error| format!("cannot make its entry fifo: {error}"))?;
                (Some(placeholder), Some(writer), Some(reader))
            }
            (None, None) => (None, None, None),
        };
        let control = if prestart.hookless {
            None
        } else {
            Some(
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                    .map_err(|errno| format!("cannot create the control pipe: {errno}"))?,
            )
        };
        let launched = spawn(&Launch {
            argv: &prestart.argv,
            env: &prestart.env,
            cwd: &prestart.cwd,
            uid: prestart.uid,
            gid: prestart.gid,
            stdin: true,
            // Always traced: whether its job is interactive is not known
            // yet, and a traced process cannot be untraced (its filter
            // would fail the traced calls). Its stdin is watched only if
            // the stage asks (see `stage`).
            watch: true,
            rlimits: None,
            filter: None,
            control: control.as_ref().map(|(read, _)| read.as_raw_fd()),
        });
        // The child has its copy; ours would keep the pipe open forever.
        let control = control.map(|(_, write)| write);
        // Ours writes without blocking, so that the args go in from the
        // release itself when the pipe takes them all (see `release`).
        let nonblocking = control
            .as_ref()
            .is_none_or(|write| set_nonblocking(write, true).is_ok())
            && fifo
                .as_ref()
                .is_none_or(|fifo| set_nonblocking(fifo, true).is_ok());
        let process = match launched {
            Ok(process) => process,
            Err(SpawnError::Start(error) | SpawnError::Pipes(error)) => {
                if let Some(placeholder) = placeholder {
                    let _ =
                        remove_placeholder(&prestart.cwd, prestart.uid, prestart.gid, placeholder);
                }
                return Err(format!("cannot start {:?}: {error}", prestart.argv));
            }
        };
        // The job thread takes the runtime's ids now, off the job's path: a
        // job the runtime fits runs as them, so the bundle's files and the
        // release's limits find it switched already (a php runtime's
        // placeholder had it switched before). When it cannot, that work
        // runs on threads of its own, as always.
        take_ids(prestart.uid, prestart.gid);
        Ok(Self {
            prestart,
            placeholder,
            process,
            control,
            fifo: fifo.map(|fifo| (fifo, Vec::new())),
            fifo_reader,
            fifo_deadline: Instant::now() + FIFO_OPEN_TIMEOUT,
            nonblocking,
            ended: false,
            limits_set: false,
        })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.process.pid
    }

    /// The empty entry file it holds open, for the job's file of that name
    /// to be written into: from then on the file is the job's, and
    /// [`Self::discard`] leaves it.
    pub(crate) fn take_placeholder(&mut self) -> Option<Placeholder> {
        self.placeholder.take()
    }

    /// Whether the bundle's files (written into `workspace`) suit it
    /// ([`Prestart::takes_files`]): a runtime with a placeholder runs
    /// nothing else. A fed runtime keeps what its release will write.
    pub(crate) fn takes_files(&mut self, workspace: &str, files: &[BundleFile]) -> bool {
        if !self.prestart.takes_files(workspace, files) {
            return false;
        }
        if let (Some((_, feed)), Some(name)) = (self.fifo.as_mut(), self.prestart.fed.as_ref())
            && let Some(file) = files.iter().find(|file| file.path == *name)
        {
            feed.clone_from(&file.content);
        }
        true
    }

    /// The job's args when `spec`, run as `uid`/`gid`, is the command this
    /// runtime stands for: same command before the args, same environment,
    /// working directory and ids, stdin from the job. `None`: start it cold.
    pub(crate) fn args_for(&self, spec: &StageSpec, uid: u32, gid: u32) -> Option<Vec<String>> {
        let prestart = &self.prestart;
        if self.ended || uid != prestart.uid || gid != prestart.gid {
            return None;
        }
        prestart.args_of(spec).map(<[String]>::to_vec)
    }

    /// Whether the sandbox, waiting for its bundle, is to look again in
    /// [`FIFO_OPEN_POLL`] whether the runtime opened its FIFO
    /// ([`Self::look_for_fifo_idle`]): a fed runtime, alive, not seen
    /// holding it yet, within [`FIFO_OPEN_TIMEOUT`] of its start.
    pub(crate) fn watching_fifo(&self) -> bool {
        self.fifo_reader.is_some() && !self.ended && Instant::now() < self.fifo_deadline
    }

    /// Looks once whether the runtime opened its FIFO, before its job. One
    /// that cannot be looked at is not watched further (the job looks once
    /// more, and starts afresh if it cannot either).
    pub(crate) fn look_for_fifo_idle(&mut self) {
        if self.look_for_fifo().is_none() {
            self.fifo_deadline = Instant::now();
        }
    }

    /// Whether the runtime holds its FIFO open (true for one seen before,
    /// and for any runtime not fed); `None` (said on stderr) when that
    /// cannot be told. Looked at in `/proc/<pid>/fd` from the job thread,
    /// as the runtime's ids; once it does, the supervisor's own read end is
    /// closed.
    fn look_for_fifo(&mut self) -> Option<bool> {
        let (Some(_), Some(placeholder)) = (&self.fifo_reader, &self.placeholder) else {
            return Some(true);
        };
        let (pid, uid, gid) = (self.process.pid, self.prestart.uid, self.prestart.gid);
        match placeholder.held_by(pid, uid, gid) {
            Ok(false) => Some(false),
            Ok(true) => {
                self.fifo_reader = None;
                Some(true)
            }
            Err(error) => {
                eprintln!(
                    "code-runner-init: cannot tell whether the warm runtime opened its script: {error}"
                );
                None
            }
        }
    }

    /// Whether a fed runtime holds its FIFO open, waiting while it may
    /// still be starting (until [`FIFO_OPEN_TIMEOUT`] after its start; true
    /// at once for one seen before and for any other runtime).
    pub(crate) async fn await_fifo_opened(&mut self) -> bool {
        loop {
            match self.look_for_fifo() {
                Some(true) => return true,
                Some(false) => {}
                None => return false,
            }
            if Instant::now() >= self.fifo_deadline || !self.check_alive() {
                return false;
            }
            tokio::time::sleep(FIFO_OPEN_POLL).await;
        }
    }

    /// Notes whether the runtime ended while waiting: reaps whatever child
    /// ended (before the first stage the runtime is the only child).
    pub(crate) fn check_alive(&mut self) -> bool {
        while let Some(reaped) = reap_one() {
            if reaped.pid == self.process.pid {
                self.ended = true;
            }
        }
        !self.ended
    }

    /// Kills the runtime's session, waits until it is reaped, and removes
    /// its placeholder if it still holds one (no job's file went into it).
    pub(crate) async fn discard(self, killer: &mut Killer, job_uid: u32) {
        if !self.ended {
            killer.set_uid(self.prestart.uid);
            killer.signal(Target::Group(self.process.pid), Signal::SIGKILL);
            killer.set_uid(job_uid);
            let deadline = Instant::now() + KILL_TIMEOUT;
            let mut gone = false;
            while !gone && Instant::now() < deadline {
                while let Some(reaped) = reap_one() {
                    gone |= reaped.pid == self.process.pid;
                }
                if !gone {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            if !gone {
                eprintln!(
                    "code-runner-init: the unused warm runtime (pid {}) was not reaped in {} s",
                    self.process.pid,
                    KILL_TIMEOUT.as_secs()
                );
            }
        }
        if let Some(placeholder) = self.placeholder {
            let prestart = &self.prestart;
            if let Err(error) =
                remove_placeholder(&prestart.cwd, prestart.uid, prestart.gid, placeholder)
            {
                // The job's own file of that name then fails to be written,
                // saying so.
                eprintln!("code-runner-init: cannot remove the warm runtime's entry file: {error}");
            }
        }
    }

    /// The work that gives the runtime `spec`'s rlimits (the stage it runs,
    /// the bundle's first), to be run as the runtime's ids with the
    /// bundle's files: one trip to the job thread (see
    /// [`files::write_bundle_files`]). The only way the limits are set:
    /// when that work fails the job ends before any release, and
    /// [`Self::release`] refuses a runtime whose limits work was never
    /// handed out. Setting them before the stage's start changes nothing
    /// for the runtime, which waits on its control pipe meanwhile: its CPU
    /// limit counts its CPU since its start either way.
    ///
    /// [`files::write_bundle_files`]: super::files::write_bundle_files
    pub(crate) fn limits_work(&mut self, spec: &StageSpec) -> ThenWork {
        let rlimits = StageRlimits::for_limits(&spec.limits);
        let pid = self.process.pid;
        self.limits_set = true;
        Box::new(move || {
            rlimits
                .apply_to(pid)
                .map_err(|source| InitError::RuntimeLimits { pid, source })
        })
    }

    /// Gives the runtime the job's args, and a fed runtime its script (its
    /// stage's rlimits were set with the files, [`Self::limits_work`]):
    /// from here on it is the stage's main process.
    pub(crate) fn release(self, args: Vec<String>) -> Result<SpawnedStage, std::io::Error> {
        if !self.limits_set {
            return Err(std::io::Error::other(
                "the warm runtime's limits were not set before its release",
            ));
        }
        let mut message = Vec::new();
        for arg in args {
            message.extend_from_slice(arg.as_bytes());
            message.push(0);
        }
        // `keep_if_fits` saw a fed runtime holding its FIFO, and closed the
        // supervisor's read end then: what the runtime does not read fails
        // the writes once it ends.
        drop(self.fifo_reader);
        if let Some((fifo, feed)) = self.fifo {
            hand_over(fifo, feed, self.nonblocking, "script")?;
        }
        match self.control {
            Some(control) => hand_over(control, message, self.nonblocking, "args")?,
            // `Prestart::args_of` gives a hookless runtime only jobs without.
            None if message.is_empty() => {}
            None => {
                return Err(std::io::Error::other(
                    "a hookless warm runtime cannot take args",
                ));
            }
        }
        Ok(self.process)
    }
}

/// Writes `message` to `fd` and closes it: at once when `fd` does not block
/// and takes it all, else (the rest) from a thread of its own, as the
/// runtime reads it. A runtime that died meanwhile is not an error here: its
/// end shows in the stage's report.
fn hand_over(
    fd: OwnedFd,
    mut message: Vec<u8>,
    nonblocking: bool,
    what: &'static str,
) -> Result<(), std::io::Error> {
    let mut file = std::fs::File::from(fd);
    let mut written = 0;
    while nonblocking && written < message.len() {
        match file.write(&message[written..]) {
            Ok(n) => written += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(error) => {
                eprintln!("code-runner-init: cannot hand the {what} to the warm runtime: {error}");
                return Ok(());
            }
        }
    }
    if written == message.len() {
        // Closing it is what releases the runtime.
        return Ok(());
    }
    if nonblocking {
        set_nonblocking(&file, false).map_err(std::io::Error::from)?;
    }
    let rest = message.split_off(written);
    super::spawn_named("runtime-args", move || {
        let mut file = file;
        if let Err(error) = file.write_all(&rest) {
            eprintln!("code-runner-init: cannot hand the {what} to the warm runtime: {error}");
        }
    })?;
    Ok(())
}

/// Sets or clears `O_NONBLOCK` on `fd`'s open file description.
fn set_nonblocking(fd: &impl AsFd, on: bool) -> nix::Result<()> {
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    let flags = if on {
        flags | OFlag::O_NONBLOCK
    } else {
        flags - OFlag::O_NONBLOCK
    };
    fcntl(fd, FcntlArg::F_SETFL(flags)).map(drop)
}
