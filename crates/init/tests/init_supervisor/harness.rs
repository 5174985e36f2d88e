//! The harness of `tests/init_supervisor.rs`: starts the supervisor binary,
//! speaks frames to it, collects what it says, and cleans up after it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use code_runner_protocol::{
    Bundle, BundleFile, FrameDecoder, HostMessage, MAX_OUTPUT_CHUNK, MAX_SANDBOX_FRAME,
    PROTOCOL_VERSION, SandboxMessage, StageLimits, StageReport, StageSpec,
};

pub const BIN: &str = env!("CARGO_BIN_EXE_code-runner-init");
pub const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
pub const SIGKILL: i32 = 9;

/// A uid (and gid) used by no process on the host: 4_000_000 + 64 * pid +
/// a per-test counter; never 65534 or a system uid. No other test process
/// uses it while this one runs: 64 per process, by its whole pid (nextest runs each test in a process of its own, at
/// once with others; by `pid % 1000`, two of them could share uids, and
/// one's checks and cleanup would see the other's processes). Pids stay
/// under 2^22 (Linux's largest `pid_max`), so the uids stay under 2^28.
pub fn fresh_uid() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % 64;
    4_000_000 + 64 * std::process::id() + n
}

/// Pids of the processes whose real uid is `uid` (zombies excluded).
pub fn live_processes_of(uid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        let real_uid = field("Uid:").and_then(|v| v.split_whitespace().next()?.parse::<u32>().ok());
        let zombie = field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
        if real_uid == Some(uid) && !zombie {
            pids.push(pid);
        }
    }
    pids
}

pub fn limits() -> StageLimits {
    StageLimits {
        wall_ms: 10_000,
        idle_ms: None,
        cpu_ms: 10_000,
        output_bytes: 1 << 20,
        fsize_bytes: 1 << 20,
        nofile: 64,
        nproc: None,
        cpu_quota_millis: None,
        address_space_bytes: None,
    }
}

pub enum Event {
    Message(SandboxMessage),
    Eof,
    Error(String),
}

/// One supervisor process and its job.
pub struct Sandbox {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub events: mpsc::Receiver<Event>,
    /// The supervisor's stderr (diagnostics), once it is closed.
    pub diagnostics: mpsc::Receiver<String>,
    pub uid: u32,
    pub workspace: tempfile::TempDir,
    /// Everything received so far.
    pub seen: Vec<SandboxMessage>,
    /// See [`Sandbox::reading_gate`].
    reading: Arc<Mutex<()>>,
}

impl Sandbox {
    pub fn start() -> Self {
        Self::start_in(None)
    }

    /// Starts the supervisor; in the cgroup whose `cgroup.procs` is given,
    /// from its first instruction on, as in a container.
    pub fn start_in(cgroup_procs: Option<&Path>) -> Self {
        let workspace = tempfile::tempdir().unwrap();
        std::fs::set_permissions(workspace.path(), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
        let mut command = Command::new(BIN);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(procs) = cgroup_procs {
            let procs = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes()).unwrap();
            #[allow(unsafe_code)]
            // SAFETY: the closure runs in the forked child before exec and
            // makes only async-signal-safe system calls (open, write,
            // close) on memory prepared before the fork.
            unsafe {
                command.pre_exec(move || {
                    let fd = nix::libc::open(procs.as_ptr(), nix::libc::O_WRONLY);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // "0": the writing process itself.
                    let written = nix::libc::write(fd, b"0".as_ptr().cast(), 1);
                    nix::libc::close(fd);
                    if written == 1 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = command.spawn().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (diagnostics_tx, diagnostics) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            // Shown with the output of a failing test.
            eprint!("{text}");
            let _ = diagnostics_tx.send(text);
        });
        let mut stdout = child.stdout.take().unwrap();
        let (tx, events) = mpsc::channel();
        let reading = Arc::new(Mutex::new(()));
        let gate = Arc::clone(&reading);
        std::thread::spawn(move || {
            let mut decoder = FrameDecoder::new(MAX_SANDBOX_FRAME);
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                drop(
                    gate.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                );
                let read = match stdout.read(&mut buffer) {
                    Ok(0) => {
                        let _ = match decoder.finish() {
                            Ok(()) => tx.send(Event::Eof),
                            Err(e) => tx.send(Event::Error(e.to_string())),
                        };
                        return;
                    }
                    Ok(read) => read,
                    Err(e) => {
                        let _ = tx.send(Event::Error(e.to_string()));
                        return;
                    }
                };
                decoder.extend(&buffer[..read]);
                loop {
                    match decoder.next_frame() {
                        Ok(None) => break,
                        Ok(Some(frame)) => {
                            let event = match SandboxMessage::decode(frame) {
                                Ok(message) => Event::Message(message),
                                Err(e) => Event::Error(e.to_string()),
                            };
                            if tx.send(event).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Event::Error(e.to_string()));
                            return;
                        }
                    }
                }
            }
        });
        let stdin = child.stdin.take();
        let mut sandbox = Self {
            child,
            stdin,
            events,
            diagnostics,
            uid: fresh_uid(),
            workspace,
            seen: Vec::new(),
            reading,
        };
        let ready = sandbox.next(Duration::from_secs(5));
        assert!(
            matches!(ready, SandboxMessage::Ready(ref r) if r.protocol == PROTOCOL_VERSION),
            "first frame: {ready:?}"
        );
        sandbox
    }

    pub fn workspace(&self) -> &Path {
        self.workspace.path()
    }

    pub fn stage(&self, name: &str, argv: &[&str]) -> StageSpec {
        StageSpec {
            name: name.into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            env: vec![("PATH".into(), PATH.into())],
            cwd: self.workspace().to_string_lossy().into_owned(),
            stdin: false,
            watch_input: false,
            limits: limits(),
            outputs: None,
        }
    }

    pub fn bundle(&self, files: Vec<BundleFile>, stages: Vec<StageSpec>) -> HostMessage {
        self.bundle_of(files, stages, None)
    }

    fn bundle_of(
        &self,
        files: Vec<BundleFile>,
        stages: Vec<StageSpec>,
        runs: Option<code_runner_protocol::RunPlan>,
    ) -> HostMessage {
        HostMessage::Bundle(Box::new(Bundle {
            workspace: self.workspace().to_string_lossy().into_owned(),
            uid: self.uid,
            gid: self.uid,
            files,
            stages,
            runs,
            egress: None,
            linger_ms: 0,
            linger_wipe: Vec::new(),
        }))
    }

    /// The uid the runs of a run plan use in these tests: another one no
    /// host process runs as.
    pub fn runs_uid(&self) -> u32 {
        self.uid + 1_000_000_000
    }

    /// A bundle whose stages are followed by runs as [`Self::runs_uid`],
    /// `scratch` kept as the first run finds it, run files in `files_dir`.
    pub fn bundle_with_runs(
        &self,
        files: Vec<BundleFile>,
        stages: Vec<StageSpec>,
        scratch: Vec<String>,
        files_dir: &str,
    ) -> HostMessage {
        let plan = code_runner_protocol::RunPlan {
            uid: self.runs_uid(),
            gid: self.runs_uid(),
            scratch,
            files_dir: files_dir.to_string(),
        };
        self.bundle_of(files, stages, Some(plan))
    }

    pub fn send(&mut self, message: HostMessage) {
        self.send_raw(&message.encode());
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Sends `signal` to the supervisor (our own child, by its pid).
    pub fn signal_supervisor(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// What the reader of the supervisor's stdout takes before each read:
    /// while a test holds it locked, the host reads nothing more (after the
    /// read under way), as a loaded worker reads late.
    pub fn reading_gate(&self) -> Arc<Mutex<()>> {
        Arc::clone(&self.reading)
    }

    /// The next frame; panics after `timeout` or at the end of the stream.
    pub fn next(&mut self, timeout: Duration) -> SandboxMessage {
        match self.events.recv_timeout(timeout) {
            Ok(Event::Message(message)) => {
                self.seen.push(message.clone());
                message
            }
            Ok(Event::Eof) => panic!("stream ended; frames so far: {:?}", self.seen),
            Ok(Event::Error(e)) => panic!("bad frame from the supervisor: {e}"),
            Err(_) => panic!(
                "no frame within {timeout:?}; frames so far: {:?}",
                self.seen
            ),
        }
    }

    /// Reads frames until stdout of the stage contains `needle`.
    pub fn wait_for_stdout(&mut self, needle: &str, timeout: Duration) -> Vec<u8> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if let SandboxMessage::Stdout(data) = self.next(left) {
                out.extend(data);
                if String::from_utf8_lossy(&out).contains(needle) {
                    return out;
                }
            }
        }
    }

    /// Reads every remaining frame and waits for the supervisor to exit.
    pub fn finish(&mut self, timeout: Duration) -> Outcome {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Message(message)) => self.seen.push(message),
                Ok(Event::Eof) => break,
                Ok(Event::Error(e)) => panic!("bad frame from the supervisor: {e}"),
                Err(_) => panic!(
                    "supervisor still talking after {timeout:?}: {:?}",
                    self.seen
                ),
            }
        }
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "supervisor did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let diagnostics = self.diagnostics.recv_timeout(left).unwrap_or_default();
        Outcome::new(self.seen.clone(), status.code(), diagnostics)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Only ever the processes this test started: the supervisor by its
        // pid, the job's by its own uid.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for uid in [self.uid, self.runs_uid()] {
            if !live_processes_of(uid).is_empty() {
                // kill(-1) from that uid: every process of the uid but itself.
                let _ = Command::new("/bin/sh")
                    .args(["-c", "kill -9 -1"])
                    .uid(uid)
                    .gid(uid)
                    .status();
            }
        }
    }
}

/// Everything the supervisor said, sorted out.
#[derive(Debug)]
pub struct Outcome {
    pub messages: Vec<SandboxMessage>,
    pub exit_code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub starts: Vec<String>,
    pub reports: Vec<StageReport>,
    pub fatal: Option<String>,
    pub done: bool,
    /// What the supervisor wrote on stderr.
    pub diagnostics: String,
}

impl Outcome {
    fn new(messages: Vec<SandboxMessage>, exit_code: Option<i32>, diagnostics: String) -> Self {
        let mut outcome = Outcome {
            messages: messages.clone(),
            exit_code,
            stdout: Vec::new(),
            stderr: Vec::new(),
            starts: Vec::new(),
            reports: Vec::new(),
            fatal: None,
            done: false,
            diagnostics,
        };
        for message in messages {
            assert!(!outcome.done, "frame after done: {message:?}");
            match message {
                SandboxMessage::Ready(_) => {}
                SandboxMessage::StageStart(start) => outcome.starts.push(start.stage),
                SandboxMessage::Stdout(data) => {
                    assert!(data.len() <= MAX_OUTPUT_CHUNK && !data.is_empty());
                    outcome.stdout.extend(data);
                }
                SandboxMessage::Stderr(data) => {
                    assert!(data.len() <= MAX_OUTPUT_CHUNK && !data.is_empty());
                    outcome.stderr.extend(data);
                }
                SandboxMessage::StageEnd(report) => outcome.reports.push(report),
                SandboxMessage::Fatal(fatal) => outcome.fatal = Some(fatal.message),
                SandboxMessage::Done => outcome.done = true,
                SandboxMessage::InputWanted
                | SandboxMessage::OutputFile(_)
                | SandboxMessage::OutputData(_)
                | SandboxMessage::OutputError(_) => {}
            }
        }
        outcome
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The run ended normally with exactly one stage report.
    pub fn only_report(&self) -> &StageReport {
        assert!(self.done, "no done frame: {self:?}");
        assert_eq!(self.exit_code, Some(0), "{self:?}");
        assert_eq!(self.reports.len(), 1, "{self:?}");
        &self.reports[0]
    }
}

pub fn file(path: &str, content: &[u8], executable: bool) -> BundleFile {
    BundleFile {
        path: path.into(),
        content: content.to_vec(),
        executable,
    }
}

/// The v1 cgroup directory of `controller` that the test process is in.
pub fn own_cgroup(controller: &str) -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })?;
    let dir = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(path.trim_start_matches('/'));
    dir.is_dir().then_some(dir)
}

/// A child of the test's own v1 cgroup with some limits, removed on drop.
pub struct TestCgroup(pub PathBuf);

impl TestCgroup {
    pub fn create(controller: &str, limits: &[(&str, u64)]) -> Option<Self> {
        let parent = own_cgroup(controller)?;
        let dir = parent.join(format!("code-runner-init-test-{}", fresh_uid()));
        std::fs::create_dir(&dir).ok()?;
        let cgroup = TestCgroup(dir);
        for (file, value) in limits {
            let path = cgroup.0.join(file);
            if path.exists() {
                std::fs::write(path, value.to_string()).ok()?;
            }
        }
        Some(cgroup)
    }

    /// Starts a supervisor inside this cgroup (before it reads the bundle).
    pub fn start_sandbox(&self) -> Sandbox {
        Sandbox::start_in(Some(&self.0.join("cgroup.procs")))
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove the test cgroup {}", self.0.display());
    }
}
