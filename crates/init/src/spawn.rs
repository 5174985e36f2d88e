//! Starting one stage: the command, its credentials, rlimits and pipes.

use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{SigSet, SigmaskHow, sigprocmask};

use super::pipes::{InputPipe, OutputPipe, SharedPipe};
use super::runs_filter::RunFilter;
use super::watch::{self, StageFilter};
use code_runner_protocol::{StageLimits, StageSpec};

/// The rlimits of a stage, computed before the fork so that the child only
/// has to make system calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StageRlimits {
    /// RLIMIT_CPU in seconds: a backstop above the precise, polled limit.
    pub cpu: (u64, u64),
    pub fsize: (u64, u64),
    pub nofile: (u64, u64),
    pub nproc: Option<(u64, u64)>,
    pub address_space: Option<(u64, u64)>,
}

impl StageRlimits {
    /// `ceil(cpu_ms / 1000) + 1` seconds soft and one more hard; FSIZE and
    /// NOFILE as given. Every value is clamped to the supervisor's own hard
    /// limit: the child has already dropped its privileges when it sets them
    /// and could not raise a hard limit.
    pub(crate) fn for_limits(limits: &StageLimits) -> Self {
        let cpu_soft = limits.cpu_ms.div_ceil(1000).saturating_add(1);
        let own = own_hard_limits();
        Self {
            cpu: clamp(own.cpu, cpu_soft, cpu_soft.saturating_add(1)),
            fsize: clamp(own.fsize, limits.fsize_bytes, limits.fsize_bytes),
            nofile: clamp(own.nofile, limits.nofile, limits.nofile),
            nproc: limits.nproc.map(|nproc| clamp(own.nproc, nproc, nproc)),
            address_space: limits
                .address_space_bytes
                .map(|bytes| clamp(own.address_space, bytes, bytes)),
        }
    }

    /// Runs in the forked child: only async-signal-safe system calls.
    fn apply(&self) -> std::io::Result<()> {
        nix::unistd::setsid()?;
        setrlimit(Resource::RLIMIT_CPU, self.cpu.0, self.cpu.1)?;
        setrlimit(Resource::RLIMIT_FSIZE, self.fsize.0, self.fsize.1)?;
        setrlimit(Resource::RLIMIT_NOFILE, self.nofile.0, self.nofile.1)?;
        setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
        if let Some((soft, hard)) = self.nproc {
            setrlimit(Resource::RLIMIT_NPROC, soft, hard)?;
        }
        if let Some((soft, hard)) = self.address_space {
            setrlimit(Resource::RLIMIT_AS, soft, hard)?;
        }
        Ok(())
    }
}

impl StageRlimits {
    /// Sets these limits on another process (a warm runtime), soft and
    /// hard, with `prlimit(2)`. The caller must have that process's real
    /// ids; only lowering a hard limit is allowed then, which is all this
    /// does to a process started with the supervisor's own limits.
    #[allow(unsafe_code)]
    pub(crate) fn apply_to(&self, pid: i32) -> std::io::Result<()> {
        use nix::libc;
        let mut limits = vec![
            (libc::RLIMIT_CPU, self.cpu),
            (libc::RLIMIT_FSIZE, self.fsize),
            (libc::RLIMIT_NOFILE, self.nofile),
            (libc::RLIMIT_CORE, (0, 0)),
        ];
        if let Some(nproc) = self.nproc {
            limits.push((libc::RLIMIT_NPROC, nproc));
        }
        if let Some(address_space) = self.address_space {
            limits.push((libc::RLIMIT_AS, address_space));
        }
        for (resource, (soft, hard)) in limits {
            let new = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: prlimit reads the one struct `new` points to (a live
            // local) and writes nothing, the old-limit pointer being null.
            let result = unsafe { libc::prlimit(pid, resource, &new, std::ptr::null_mut()) };
            if result != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

fn clamp(own_hard: u64, soft: u64, hard: u64) -> (u64, u64) {
    let hard = hard.min(own_hard);
    (soft.min(hard), hard)
}

/// The supervisor's own hard limits of the resources a stage's limits are
/// clamped in.
#[derive(Debug, Clone, Copy)]
struct OwnHardLimits {
    cpu: u64,
    fsize: u64,
    nofile: u64,
    nproc: u64,
    address_space: u64,
}

/// Read once: nothing in the supervisor changes its own limits (only a
/// stage's child sets its own, after the fork). Under gVisor each
/// `getrlimit` is a system call of about 0.1 ms here, so the supervisor
/// reads them before the bundle ([`read_own_limits`]).
fn own_hard_limits() -> OwnHardLimits {
    static HARD: std::sync::OnceLock<OwnHardLimits> = std::sync::OnceLock::new();
    *HARD.get_or_init(|| {
        let hard = |resource| getrlimit(resource).map_or(u64::MAX, |(_, hard)| hard);
        OwnHardLimits {
            cpu: hard(Resource::RLIMIT_CPU),
            fsize: hard(Resource::RLIMIT_FSIZE),
            nofile: hard(Resource::RLIMIT_NOFILE),
            nproc: hard(Resource::RLIMIT_NPROC),
            address_space: hard(Resource::RLIMIT_AS),
        }
    })
}

/// Reads the supervisor's own hard limits now (see [`own_hard_limits`]).
pub(crate) fn read_own_limits() {
    own_hard_limits();
}

/// A started stage: its pid (it leads its own session and process group)
/// and the supervisor's ends of its pipes (see [`super::pipes`]).
pub(crate) struct SpawnedStage {
    pub pid: i32,
    pub stdin: Option<InputPipe>,
    pub stdout: OutputPipe,
    pub stderr: OutputPipe,
}

#[derive(Debug)]
pub(crate) enum SpawnError {
    /// The stage did not start (command not found, bad cwd, ...).
    Start(std::io::Error),
    /// The threads serving the pipes could not be started (before the
    /// fork), or the stage started without its pipes and must be killed.
    Pipes(std::io::Error),
}

/// Starts `spec` as `uid`/`gid`: its own session, the rlimits, exactly the
/// stage's environment (whose `PATH` is used to find `argv[0]`), stdin from
/// a pipe or `/dev/null`, stdout and stderr to pipes, each pipe served by a
/// thread of [`super::pipes`].
pub(crate) fn spawn_stage(
    spec: &StageSpec,
    uid: u32,
    gid: u32,
    filter: Option<&RunFilter>,
) -> Result<SpawnedStage, SpawnError> {
    spawn(&Launch {
        argv: &spec.argv,
        env: &spec.env,
        cwd: &spec.cwd,
        uid,
        gid,
        stdin: spec.stdin,
        watch: spec.watches_input(),
        rlimits: Some(StageRlimits::for_limits(&spec.limits)),
        filter,
        control: None,
    })
}

/// What to start, for [`spawn`].
pub(crate) struct Launch<'a> {
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    pub cwd: &'a str,
    pub uid: u32,
    pub gid: u32,
    /// stdin from a pipe (else `/dev/null`).
    pub stdin: bool,
    /// Traced, to notice waits for stdin (see [`super::watch`]); only with
    /// `stdin`.
    pub watch: bool,
    /// `None`: the supervisor's own rlimits stay (a warm runtime's are set
    /// when its job comes), except that no core is dumped.
    pub rlimits: Option<StageRlimits>,
    pub filter: Option<&'a RunFilter>,
    /// Becomes descriptor [`CONTROL_FD`] of the child (a warm runtime's control pipe).
    pub control: Option<RawFd>,
}

/// The descriptor a warm runtime reads its job's args from: high, so that
/// the runtime's own start-up opens the same descriptor numbers as a cold
/// start does (3 and up), and below any `RLIMIT_NOFILE` a sandbox starts
/// with.
pub(crate) const CONTROL_FD: RawFd = 200;

/// Starts a process: its own session, credentials, rlimits, pipes.
#[allow(unsafe_code)]
pub(crate) fn spawn(launch: &Launch<'_>) -> Result<SpawnedStage, SpawnError> {
    let Some((program, args)) = launch.argv.split_first() else {
        return Err(SpawnError::Start(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the stage has an empty argv",
        )));
    };
    let rlimits = launch.rlimits;
    let control = launch.control;
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(launch.env.iter().map(|(key, value)| (key, value)))
        .current_dir(launch.cwd)
        // std applies gid, then (being root) clears the supplementary
        // groups with setgroups(0), then uid, all in the child before exec.
        .gid(launch.gid)
        .uid(launch.uid)
        .stdin(if launch.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child between fork and exec,
    // where only async-signal-safe functions may be called. It calls
    // sigprocmask(2), setsid(2), setrlimit(2), dup2(2) and fcntl(2) through nix's thin
    // wrappers — direct system calls that neither allocate nor take locks —
    // with plain integers computed before the fork, and builds its error
    // (if any) from an errno without allocating. std's own pre-exec steps
    // (dup2, setgid, setgroups, setuid, chdir) have run by then.
    // The stage filter, and the run filter of a graded job's tests, are
    // built here too, and only installed by prctl(2) calls in the child
    // (after ptrace(PTRACE_TRACEME) when the stage is watched).
    let filter = launch.filter.cloned();
    let traced = launch.watch;
    let stage_filter = StageFilter::get(traced);
    unsafe {
        command.pre_exec(move || {
            // A fork keeps the mask of the thread that forked, and the
            // supervisor's helper threads block the signals it handles
            // (see `spawn_named`): the stage starts with none blocked.
            sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
            match &rlimits {
                Some(rlimits) => rlimits.apply()?,
                None => {
                    nix::unistd::setsid()?;
                    setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
                }
            }
            if let Some(fd) = control {
                inherit_as_control(fd)?;
            }
            stage_filter.apply_in_child(traced)?;
            match &filter {
                Some(filter) => filter.install(),
                None => Ok(()),
            }
        });
    }
    // The pipes' threads first (see `HandOff`): once the child runs, a fork
    // bomb may leave no room for them.
    let stdin_pipe = launch
        .stdin
        .then(InputPipe::start::<SharedPipe>)
        .transpose()
        .map_err(SpawnError::Pipes)?;
    let (mut stdout_pipe, stdout_hand_off) = OutputPipe::start().map_err(SpawnError::Pipes)?;
    let (mut stderr_pipe, stderr_hand_off) = OutputPipe::start().map_err(SpawnError::Pipes)?;
    // Every pipe std creates is close-on-exec in the supervisor, so the
    // child inherits only its own three descriptors (and a control pipe).
    let mut child = command.spawn().map_err(SpawnError::Start)?;
    let pid = i32::try_from(child.id()).map_err(|e| SpawnError::Pipes(std::io::Error::other(e)))?;
    if traced {
        watch::adopt(pid);
    }
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    // The Child is dropped without waiting: the supervisor's wait4(-1) loop
    // reaps the stage (see `reap`).
    drop(child);
    let missing = || SpawnError::Pipes(std::io::Error::other("a stage pipe is missing"));
    // A traced stage's output is counted, to tell when what it wrote before
    // it waits for stdin has all been read (see `stage`).
    stdout_pipe
        .hand_over(stdout_hand_off, stdout.ok_or_else(missing)?, traced)
        .map_err(SpawnError::Pipes)?;
    stderr_pipe
        .hand_over(stderr_hand_off, stderr.ok_or_else(missing)?, traced)
        .map_err(SpawnError::Pipes)?;
    let stdin = match (stdin_pipe, stdin) {
        (Some((mut pipe, hand_off)), Some(stdin)) => {
            hand_off.give(pipe.share(OwnedFd::from(stdin)));
            Some(pipe)
        }
        (None, None) => None,
        _ => return Err(missing()),
    };
    Ok(SpawnedStage {
        pid,
        stdin,
        stdout: stdout_pipe,
        stderr: stderr_pipe,
    })
}

/// In the forked child: `fd` becomes [`CONTROL_FD`], inherited across exec.
#[allow(unsafe_code)]
fn inherit_as_control(fd: RawFd) -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: dup2 and fcntl(F_SETFD) only change the descriptor table;
    // both are async-signal-safe. dup2 onto the same descriptor would keep
    // close-on-exec, so that case clears the flag instead.
    let result = unsafe {
        if fd == CONTROL_FD {
            libc::fcntl(fd, libc::F_SETFD, 0)
        } else {
            libc::dup2(fd, CONTROL_FD)
        }
    };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::pipes::Output;
    use super::*;

    /// A stage started from a thread that blocks the handled signals (a
    /// helper) blocks none: the mask is not inherited.
    #[test]
    fn a_stage_started_from_a_helper_thread_blocks_no_signal() {
        let spawned = super::super::spawn_named("test-helper", || {
            let argv = ["grep", "^SigBlk", "/proc/self/status"].map(String::from);
            let env = [("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
            let stage = spawn(&Launch {
                argv: &argv,
                env: &env,
                cwd: "/",
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
                stdin: false,
                watch: false,
                rlimits: None,
                filter: None,
                control: None,
            })
            .expect("the stage starts");
            // The helper itself blocks them.
            let own = SigSet::thread_get_mask().expect("mask");
            assert!(own.contains(nix::sys::signal::Signal::SIGCHLD));
            stage
        })
        .expect("spawn")
        .join()
        .expect("join");
        let mut stdout = spawned.stdout;
        let output = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(async move {
                let mut all = Vec::new();
                loop {
                    match stdout.recv().await {
                        Output::Data(data) => all.extend(data),
                        Output::Eof => break all,
                        Output::Failed(error) => panic!("{error}"),
                    }
                }
            });
        let status =
            nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(spawned.pid), None).expect("reaped");
        assert_eq!(
            String::from_utf8_lossy(&output),
            "SigBlk:\t0000000000000000\n"
        );
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(spawned.pid), 0)
        );
    }

    #[test]
    fn cpu_rlimit_is_a_backstop_above_the_limit() {
        let limits = StageLimits {
            wall_ms: 1000,
            idle_ms: None,
            cpu_ms: 1500,
            output_bytes: 1,
            fsize_bytes: 4096,
            nofile: 64,
            nproc: None,
            cpu_quota_millis: None,
            address_space_bytes: None,
        };
        let rlimits = StageRlimits::for_limits(&limits);
        assert_eq!(rlimits.cpu, (3, 4));
        let exact = StageRlimits::for_limits(&StageLimits {
            cpu_ms: 2000,
            ..limits
        });
        assert_eq!(exact.cpu, (3, 4));
        let huge = StageRlimits::for_limits(&StageLimits {
            cpu_ms: u64::MAX,
            ..limits
        });
        assert!(huge.cpu.0 <= huge.cpu.1);
    }
}
