//! Typed messages carried by the frames, in both directions.

use serde::{Deserialize, Serialize};

use super::codec::{FrameError, RawFrame, encode_frame};

pub mod kind {
    pub const BUNDLE: u8 = 0x01;
    pub const STDIN: u8 = 0x02;
    pub const STDIN_CLOSE: u8 = 0x03;
    pub const SIGNAL: u8 = 0x04;
    pub const RUN: u8 = 0x05;
    pub const RUNS_END: u8 = 0x06;
    pub const PRESTART: u8 = 0x07;

    pub const READY: u8 = 0x81;
    pub const STAGE_START: u8 = 0x82;
    pub const STDOUT: u8 = 0x83;
    pub const STDERR: u8 = 0x84;
    pub const STAGE_END: u8 = 0x85;
    pub const FATAL: u8 = 0x86;
    pub const DONE: u8 = 0x87;
    pub const INPUT_WANTED: u8 = 0x88;
}

/// Everything the supervisor needs to run a job: the files to write into the
/// workspace and the stages to run, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bundle {
    /// Directory the files are written under (a tmpfs in the container).
    pub workspace: String,
    /// Unprivileged uid and gid the files are written as and the stages run as.
    pub uid: u32,
    pub gid: u32,
    pub files: Vec<BundleFile>,
    pub stages: Vec<StageSpec>,
    /// Runs to accept after the stages (a graded job's tests, a checker's
    /// checks): when set and every stage succeeded, the supervisor runs one
    /// stage per `run` frame until `runs_end`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<RunPlan>,
    /// Outbound network by allowlist: when set, the supervisor relays the
    /// sandbox's loopback port to the job's egress proxy before any stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressRelay>,
    /// After `done`, how long the supervisor stays (idle, every process of
    /// the job gone) until the host closes its stream, in ms; 0: it exits at
    /// once. The host then decides when the container's exit, and the
    /// teardown Docker does for it, happens: not beside the jobs running.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub linger_ms: u64,
    /// Before it lingers, the supervisor empties these directories (absent
    /// ones skipped) as the bundle's uid, so that a lingering container
    /// holds none of the job's files; when it cannot, it does not linger.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub linger_wipe: Vec<String>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// The sandbox's half of a job's egress (kind `bundle`): the sandbox has no
/// network, only loopback. Before the first stage the supervisor listens on
/// `127.0.0.1:listen_port` and relays every connection, byte for byte in
/// both directions, to a new connection to the Unix socket `socket` (the
/// job's egress proxy in the worker, mounted into this one sandbox). It
/// looks at none of the bytes: the proxy decides what may pass. At most
/// `max_concurrent` connections are relayed at once; further ones wait in
/// the listen backlog. The programs find the relay in `HTTP_PROXY` and
/// `HTTPS_PROXY`, which the host puts into the stages' environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRelay {
    pub listen_port: u16,
    pub socket: String,
    pub max_concurrent: u32,
}

/// How the supervisor runs the `run` frames that follow the stages.
///
/// The runs execute as a uid of their own, not the bundle's: everything the
/// bundle and its stages left (the files, the compiled program) belongs to
/// the bundle's uid and is read-only to them. Before the first run, the
/// supervisor takes away write access for others from what the stages left
/// (and makes every directory others may write in sticky). After each run
/// every process of the runs' uid is dead, and every entry a run added to a
/// directory it could write in is removed, so the next run sees exactly
/// what the first one saw. The runs cannot create System V IPC objects,
/// POSIX message queues or keys (a seccomp filter answers `EPERM`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunPlan {
    pub uid: u32,
    pub gid: u32,
    /// The writable mounts whose trees are kept as the first run found them
    /// (e.g. the workspace, `/tmp`, `/dev/shm`); absent paths are skipped.
    pub scratch: Vec<String>,
    /// Where a run's `files` are written (created fresh for each run as the
    /// runs' uid, inside one of `scratch`, so removed after it).
    pub files_dir: String,
}

/// A warm runtime (kind `prestart`, only before the bundle): the language's
/// runtime started ahead of the job, waiting for it.
///
/// The supervisor starts `argv` as `uid`/`gid` with `env` in `cwd`, in a
/// session of its own, with pipes for its stdin, stdout and stderr and a
/// descriptor 200, the read end of a control pipe. The runtime is
/// expected to start up and then block reading descriptor 200 (a hook of the
/// runtime's own: see `runner-images/*/warm-runtime*`); it must not run any
/// of the job's code before that read returns.
///
/// The bundle's first stage runs on it when that stage's argv starts with
/// `stage_argv` and its env, cwd and ids are those here; the rest of its
/// argv (the job's args) is then written to descriptor 200, each argument
/// followed by a NUL byte, and the pipe closed. Before that the
/// supervisor sets the runtime's rlimits to the stage's. Otherwise the
/// runtime is killed before the first stage and the stages start as
/// always.
///
/// Some runtimes (php) open their main script before any hook can
/// run, and read it only after: for them `preopened` names that file (in
/// `cwd`). The supervisor creates it empty, as the runtime's ids, before
/// starting the runtime; the runtime fits only a bundle that carries that
/// file, whose content is then written into the same file (the one the
/// runtime holds open); an unused runtime's empty file is removed before
/// the bundle's files are written.
///
/// Others (ruby) read the first byte of their main script before any hook
/// can run, and the rest only after: for them `fed` names that file (in
/// `cwd`). The supervisor makes it a FIFO, as the runtime's ids, holds it
/// open and writes one byte into it, [`FED_LEAD`], before starting the
/// runtime; the runtime reads it (and puts it back), and its hook takes it
/// back out of the script's buffer before it waits. The runtime fits only
/// a bundle that carries that file with content the rule of
/// [`Prestart::feeds`] accepts. The FIFO is then replaced by the job's
/// regular file (the runtime has it open already), and the release also
/// writes that file's content into the FIFO and closes it. An unused
/// runtime's FIFO is removed before the bundle's files are written. The
/// supervisor uses a fed runtime only once it holds the FIFO open (seen in
/// `/proc`): one that opened its script after the job's file replaced the
/// FIFO would read that file instead, and a hookless one would run it
/// before its release.
///
/// A fed runtime may also be `hookless` (R): it opens its script at its
/// start and reads it only once started up, with no hook of its own in
/// between, so it waits for its program by itself, reading the FIFO. It
/// has no descriptor 200 and its FIFO no lead byte; it fits only a job
/// without args (the runtime took its command line at its start) and takes
/// any content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prestart {
    pub uid: u32,
    pub gid: u32,
    /// What is started (may hold the hook, e.g. node's `--require`).
    pub argv: Vec<String>,
    /// The stage's command this runtime stands for (without the job's args).
    pub stage_argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// The file (a name in `cwd`) the runtime opens at its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preopened: Option<String>,
    /// The file (a name in `cwd`) the runtime reads its program from
    /// through a FIFO the supervisor feeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fed: Option<String>,
    /// A fed runtime without a hook (see [`Prestart`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hookless: bool,
}

/// The byte a fed runtime's FIFO holds before its job (see [`Prestart`]):
/// one its hook takes out again. Not `#` (the runtime would read on,
/// looking for a `#!` line, before its hook could run); should the hook
/// not take it, the script does not parse, rather than run shifted.
pub const FED_LEAD: u8 = 0xEF;

impl Prestart {
    /// Whether a fed runtime (see [`Prestart`]) runs `content` exactly as a
    /// cold start of the file would. The one statement of the rule. Not
    /// when the content
    /// - starts with `#!`: a cold start reads the line's switches from it
    ///   (and `-x` when it does not name ruby), the fed one read
    ///   [`FED_LEAD`] first;
    /// - has a line that starts with `__END__`: `DATA` would be the FIFO
    ///   (no `rewind`, no `stat` of the file), and the parser stops
    ///   reading there.
    pub fn feeds(content: &[u8]) -> bool {
        !content.starts_with(b"#!")
            && !content
                .split(|&byte| byte == b'\n')
                .any(|line| line.starts_with(b"__END__"))
    }

    /// Whether the bundle's files (written into `workspace`) suit this
    /// runtime: a `preopened` or `fed` file must be among them, in the
    /// runtime's `cwd`, and a fed one's content must be one
    /// [`Prestart::feeds`] accepts (any content, for a `hookless` one).
    pub fn takes_files(&self, workspace: &str, files: &[BundleFile]) -> bool {
        let file = |name: &String| {
            let file = files.iter().find(|file| file.path == *name);
            file.filter(|_| workspace == self.cwd)
        };
        self.preopened
            .as_ref()
            .is_none_or(|name| file(name).is_some())
            && self.fed.as_ref().is_none_or(|name| {
                file(name).is_some_and(|file| self.hookless || Prestart::feeds(&file.content))
            })
    }

    /// The job's args when `stage` is the command this runtime stands for:
    /// its argv starts with `stage_argv`, with the same environment and
    /// working directory, and stdin from the job; a `hookless` runtime's
    /// only without args. The one statement of the rule: the supervisor
    /// decides by it (with the ids), the host predicts and reports by it.
    pub fn args_of<'a>(&self, stage: &'a StageSpec) -> Option<&'a [String]> {
        let fits = stage.stdin
            && stage.cwd == self.cwd
            && stage.env == self.env
            && stage.argv.starts_with(&self.stage_argv)
            && (!self.hookless || stage.argv.len() == self.stage_argv.len());
        fits.then(|| &stage.argv[self.stage_argv.len()..])
    }
}

/// One run (kind `run`): a stage, the bytes its stdin reads before EOF, and
/// files written for it into the plan's `files_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    pub stage: StageSpec,
    #[serde(with = "base64_bytes")]
    pub input: Vec<u8>,
    #[serde(default)]
    pub files: Vec<BundleFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleFile {
    /// Relative path below the workspace; validated by the worker and checked
    /// again by the supervisor (no absolute paths, no `..`).
    pub path: String,
    #[serde(with = "base64_bytes")]
    pub content: Vec<u8>,
    #[serde(default)]
    pub executable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSpec {
    /// `compile` or `run`.
    pub name: String,
    pub argv: Vec<String>,
    /// The whole environment of the stage (nothing is inherited).
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// Whether this stage reads the forwarded stdin; otherwise its stdin is
    /// empty (`/dev/null`).
    pub stdin: bool,
    /// Say [`SandboxMessage::InputWanted`] when a process of the stage waits
    /// for stdin with nothing buffered for it (interactive stages).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watch_input: bool,
    pub limits: StageLimits,
}

impl StageSpec {
    /// Whether the supervisor watches this stage's stdin for waits: asked
    /// (`watch_input`) and there is a stdin to wait on.
    pub fn watches_input(&self) -> bool {
        self.stdin && self.watch_input
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLimits {
    /// Wall-clock limit of the stage.
    pub wall_ms: u64,
    /// For interactive stages: longest time with neither input nor output.
    pub idle_ms: Option<u64>,
    /// CPU time of the stage (user + system, all its processes).
    pub cpu_ms: u64,
    /// stdout + stderr bytes the stage may write; more kills it.
    pub output_bytes: u64,
    /// Largest file the stage may write (RLIMIT_FSIZE).
    pub fsize_bytes: u64,
    /// Open files per process (RLIMIT_NOFILE).
    pub nofile: u64,
    /// Processes of the sandbox uid (RLIMIT_NPROC). Only set under gVisor,
    /// where the sandbox has a kernel of its own: under runc the count would
    /// include every sandbox on the host, and the pids cgroup does the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nproc: Option<u64>,
    /// The container's CPU quota in thousandths of a CPU. Only set under
    /// gVisor, whose kernel shows the supervisor every host CPU and not the
    /// quota; it caps the CPU time the supervisor believes (gVisor counts
    /// time spent waiting for the quota as CPU time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota_millis: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalKind {
    Interrupt,
    Kill,
}

/// Why a stage ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The program exited by itself (any exit code) or died of a signal it
    /// raised or got from inside the sandbox.
    Exited,
    WallTimeout,
    IdleTimeout,
    CpuTimeout,
    MemoryLimit,
    OutputLimit,
    /// Killed on request (a `kill` signal from the client, or cancellation).
    Killed,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Exited => "exited",
            Reason::WallTimeout => "wall_timeout",
            Reason::IdleTimeout => "idle_timeout",
            Reason::CpuTimeout => "cpu_timeout",
            Reason::MemoryLimit => "memory_limit",
            Reason::OutputLimit => "output_limit",
            Reason::Killed => "killed",
        }
    }

    pub fn is_timeout(self) -> bool {
        matches!(
            self,
            Reason::WallTimeout | Reason::IdleTimeout | Reason::CpuTimeout
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    pub protocol: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageStart {
    pub stage: String,
    /// The stage runs on the runtime started ahead (see [`Prestart`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm_runtime: bool,
}

/// What the supervisor measured about one stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageReport {
    pub stage: String,
    pub exit_code: Option<i32>,
    /// Signal number that ended the stage's main process, if any.
    pub signal: Option<i32>,
    pub reason: Reason,
    pub wall_ms: u64,
    pub cpu_ms: u64,
    pub memory_peak_bytes: u64,
    /// The stage wrote more than its output limit; what was sent is the start.
    pub output_truncated: bool,
    /// A process or thread start of the stage was refused at the pids
    /// limit (the pids cgroup's `max` count went up). `None` where no pids
    /// cgroup can be read: under gVisor, whose kernel enforces the limit
    /// (`nproc`) and counts no refusals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit_reached: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fatal {
    pub message: String,
}

/// A message from the worker to the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMessage {
    Bundle(Box<Bundle>),
    Stdin(Vec<u8>),
    StdinClose,
    Signal(SignalKind),
    Run(Box<RunSpec>),
    RunsEnd,
    Prestart(Box<Prestart>),
}

/// A message from the supervisor to the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxMessage {
    Ready(Ready),
    StageStart(StageStart),
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    StageEnd(StageReport),
    Fatal(Fatal),
    Done,
    /// A process of the stage is waiting for stdin and nothing is buffered
    /// for it (only for a stage with `watch_input`). Said once per wait,
    /// after the output written before the wait.
    InputWanted,
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing these plain structs cannot fail: no maps with non-string
    // keys, no custom serializers that error.
    serde_json::to_vec(value).unwrap_or_default()
}

fn parse_json<T: for<'de> Deserialize<'de>>(kind: u8, payload: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(payload).map_err(|error| FrameError::BadPayload {
        kind,
        message: error.to_string(),
    })
}

fn expect_empty(kind: u8, payload: &[u8]) -> Result<(), FrameError> {
    if payload.is_empty() {
        Ok(())
    } else {
        Err(FrameError::BadPayload {
            kind,
            message: format!("expected no payload, got {} bytes", payload.len()),
        })
    }
}

impl HostMessage {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            HostMessage::Bundle(bundle) => encode_frame(kind::BUNDLE, &json(bundle)),
            HostMessage::Stdin(data) => encode_frame(kind::STDIN, data),
            HostMessage::StdinClose => encode_frame(kind::STDIN_CLOSE, &[]),
            HostMessage::Signal(signal) => encode_frame(
                kind::SIGNAL,
                &[match signal {
                    SignalKind::Interrupt => 1,
                    SignalKind::Kill => 2,
                }],
            ),
            HostMessage::Run(run) => encode_frame(kind::RUN, &json(run)),
            HostMessage::RunsEnd => encode_frame(kind::RUNS_END, &[]),
            HostMessage::Prestart(prestart) => encode_frame(kind::PRESTART, &json(prestart)),
        }
    }

    pub fn decode(frame: RawFrame) -> Result<Self, FrameError> {
        let RawFrame { kind, payload } = frame;
        match kind {
            kind::BUNDLE => Ok(HostMessage::Bundle(Box::new(parse_json(kind, &payload)?))),
            kind::STDIN => Ok(HostMessage::Stdin(payload)),
            kind::STDIN_CLOSE => expect_empty(kind, &payload).map(|()| HostMessage::StdinClose),
            kind::RUN => Ok(HostMessage::Run(Box::new(parse_json(kind, &payload)?))),
            kind::RUNS_END => expect_empty(kind, &payload).map(|()| HostMessage::RunsEnd),
            kind::PRESTART => Ok(HostMessage::Prestart(Box::new(parse_json(kind, &payload)?))),
            kind::SIGNAL => match payload.as_slice() {
                [1] => Ok(HostMessage::Signal(SignalKind::Interrupt)),
                [2] => Ok(HostMessage::Signal(SignalKind::Kill)),
                _ => Err(FrameError::BadPayload {
                    kind,
                    message: "signal must be one byte, 1 or 2".to_string(),
                }),
            },
            other => Err(FrameError::UnknownKind(other)),
        }
    }
}

impl SandboxMessage {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            SandboxMessage::Ready(ready) => encode_frame(kind::READY, &json(ready)),
            SandboxMessage::StageStart(start) => encode_frame(kind::STAGE_START, &json(start)),
            SandboxMessage::Stdout(data) => encode_frame(kind::STDOUT, data),
            SandboxMessage::Stderr(data) => encode_frame(kind::STDERR, data),
            SandboxMessage::StageEnd(report) => encode_frame(kind::STAGE_END, &json(report)),
            SandboxMessage::Fatal(fatal) => encode_frame(kind::FATAL, &json(fatal)),
            SandboxMessage::Done => encode_frame(kind::DONE, &[]),
            SandboxMessage::InputWanted => encode_frame(kind::INPUT_WANTED, &[]),
        }
    }

    pub fn decode(frame: RawFrame) -> Result<Self, FrameError> {
        let RawFrame { kind, payload } = frame;
        match kind {
            kind::READY => Ok(SandboxMessage::Ready(parse_json(kind, &payload)?)),
            kind::STAGE_START => Ok(SandboxMessage::StageStart(parse_json(kind, &payload)?)),
            kind::STDOUT => Ok(SandboxMessage::Stdout(payload)),
            kind::STDERR => Ok(SandboxMessage::Stderr(payload)),
            kind::STAGE_END => Ok(SandboxMessage::StageEnd(parse_json(kind, &payload)?)),
            kind::FATAL => Ok(SandboxMessage::Fatal(parse_json(kind, &payload)?)),
            kind::DONE => expect_empty(kind, &payload).map(|()| SandboxMessage::Done),
            kind::INPUT_WANTED => {
                expect_empty(kind, &payload).map(|()| SandboxMessage::InputWanted)
            }
            other => Err(FrameError::UnknownKind(other)),
        }
    }
}

/// Serde helper: `Vec<u8>` as a standard base64 string in JSON.
pub mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FrameDecoder;
    use proptest::prelude::*;

    fn limits() -> StageLimits {
        StageLimits {
            wall_ms: 1000,
            idle_ms: None,
            cpu_ms: 1000,
            output_bytes: 1024,
            fsize_bytes: 1024,
            nofile: 64,
            nproc: None,
            cpu_quota_millis: None,
        }
    }

    fn roundtrip_host(message: HostMessage) -> HostMessage {
        let mut decoder = FrameDecoder::new(crate::MAX_HOST_FRAME);
        decoder.extend(&message.encode());
        HostMessage::decode(decoder.next_frame().unwrap().unwrap()).unwrap()
    }

    #[test]
    fn stage_limits_stay_compatible_both_ways() {
        // Without the optional fields the JSON is the first version's, and
        // the first version's JSON decodes with them unset.
        let json = serde_json::to_value(limits()).unwrap();
        assert!(json.get("nproc").is_none() && json.get("cpu_quota_millis").is_none());
        let decoded: StageLimits = serde_json::from_value(json).unwrap();
        assert_eq!(decoded, limits());
        // A field a newer worker adds is ignored by this supervisor.
        let mut newer = serde_json::to_value(StageLimits {
            cpu_quota_millis: Some(1500),
            ..limits()
        })
        .unwrap();
        newer["a_later_field"] = serde_json::json!(7);
        let decoded: StageLimits = serde_json::from_value(newer).unwrap();
        assert_eq!(decoded.cpu_quota_millis, Some(1500));
    }

    #[test]
    fn host_messages_roundtrip() {
        let bundle = HostMessage::Bundle(Box::new(Bundle {
            workspace: "/workspace".into(),
            uid: 65534,
            gid: 65534,
            files: vec![BundleFile {
                path: "main.py".into(),
                content: vec![0, 159, 146, 150],
                executable: false,
            }],
            stages: vec![StageSpec {
                name: "run".into(),
                argv: vec!["python3".into(), "main.py".into()],
                env: vec![("PATH".into(), "/usr/bin".into())],
                cwd: "/workspace".into(),
                stdin: true,
                watch_input: true,
                limits: limits(),
            }],
            runs: Some(RunPlan {
                uid: 4_000_001,
                gid: 4_000_001,
                scratch: vec!["/tmp".into()],
                files_dir: "/tmp/run".into(),
            }),
            egress: Some(EgressRelay {
                listen_port: 3128,
                socket: "/run/code-runner/egress/proxy.sock".into(),
                max_concurrent: 16,
            }),
            linger_ms: 30_000,
            linger_wipe: vec!["/workspace".into(), "/tmp".into()],
        }));
        let run = HostMessage::Run(Box::new(RunSpec {
            stage: StageSpec {
                name: "test:0".into(),
                argv: vec!["./main".into()],
                env: vec![],
                cwd: "/workspace".into(),
                stdin: true,
                watch_input: false,
                limits: limits(),
            },
            input: vec![1, 2, 255],
            files: vec![],
        }));
        let prestart = HostMessage::Prestart(Box::new(Prestart {
            uid: 65534,
            gid: 65534,
            argv: vec![
                "node".into(),
                "--require".into(),
                "/hook.js".into(),
                "main.js".into(),
            ],
            stage_argv: vec!["node".into(), "main.js".into()],
            env: vec![("HOME".into(), "/tmp".into())],
            cwd: "/workspace".into(),
            preopened: Some("main.php".into()),
            fed: Some("main.rb".into()),
            hookless: true,
        }));
        for message in [
            bundle,
            run,
            prestart,
            HostMessage::RunsEnd,
            HostMessage::Stdin(vec![0, 1, 2, 255]),
            HostMessage::StdinClose,
            HostMessage::Signal(SignalKind::Interrupt),
            HostMessage::Signal(SignalKind::Kill),
        ] {
            assert_eq!(roundtrip_host(message.clone()), message);
        }
    }

    #[test]
    fn bad_payloads_are_errors() {
        let frame = RawFrame {
            kind: kind::STAGE_END,
            payload: b"{not json".to_vec(),
        };
        assert!(matches!(
            SandboxMessage::decode(frame),
            Err(FrameError::BadPayload { kind: 0x85, .. })
        ));
        let frame = RawFrame {
            kind: kind::SIGNAL,
            payload: vec![7],
        };
        assert!(HostMessage::decode(frame).is_err());
        let frame = RawFrame {
            kind: 0x42,
            payload: vec![],
        };
        assert_eq!(
            SandboxMessage::decode(frame),
            Err(FrameError::UnknownKind(0x42))
        );
    }

    #[test]
    fn a_stage_report_without_the_pids_count_reads_as_unknown() {
        // As a supervisor built before the field sends it.
        let old = br#"{"stage":"run","exit_code":0,"signal":null,"reason":"exited","wall_ms":5,"cpu_ms":4,"memory_peak_bytes":1024,"output_truncated":false}"#;
        let report: StageReport = serde_json::from_slice(old).unwrap();
        assert_eq!(report.pids_limit_reached, None);
        let counted = StageReport {
            pids_limit_reached: Some(true),
            ..report
        };
        let json = serde_json::to_value(&counted).unwrap();
        assert_eq!(json["pids_limit_reached"], true);
    }

    proptest! {
        #[test]
        fn sandbox_decode_never_panics(kind in any::<u8>(), payload in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = SandboxMessage::decode(RawFrame { kind, payload: payload.clone() });
            let _ = HostMessage::decode(RawFrame { kind, payload });
        }

        #[test]
        fn stage_reports_roundtrip(exit_code in proptest::option::of(any::<i32>()), signal in proptest::option::of(1i32..64),
                                   wall_ms in any::<u64>(), cpu_ms in any::<u64>(), peak in any::<u64>(), truncated in any::<bool>(),
                                   pids_limit_reached in proptest::option::of(any::<bool>())) {
            let report = SandboxMessage::StageEnd(StageReport {
                stage: "run".into(), exit_code, signal, reason: Reason::CpuTimeout,
                wall_ms, cpu_ms, memory_peak_bytes: peak, output_truncated: truncated, pids_limit_reached,
            });
            let mut decoder = FrameDecoder::new(crate::MAX_SANDBOX_FRAME);
            decoder.extend(&report.encode());
            prop_assert_eq!(SandboxMessage::decode(decoder.next_frame().unwrap().unwrap()).unwrap(), report);
        }
    }

    fn fed_prestart() -> Prestart {
        Prestart {
            uid: 1000,
            gid: 1000,
            argv: vec!["ruby".into(), "main.rb".into()],
            stage_argv: vec!["ruby".into(), "main.rb".into()],
            env: vec![],
            cwd: "/workspace".into(),
            preopened: None,
            fed: Some("main.rb".into()),
            hookless: false,
        }
    }

    /// A run stage of `argv` in /workspace, with stdin and no env.
    fn stage(argv: &[&str]) -> StageSpec {
        StageSpec {
            name: "run".into(),
            argv: argv.iter().map(|arg| arg.to_string()).collect(),
            env: vec![],
            cwd: "/workspace".into(),
            stdin: true,
            watch_input: false,
            limits: limits(),
        }
    }

    fn file(path: &str, content: &[u8]) -> BundleFile {
        BundleFile {
            path: path.into(),
            content: content.to_vec(),
            executable: false,
        }
    }

    #[test]
    fn a_fed_runtime_takes_only_content_its_parser_reads_as_a_cold_start_does() {
        for fine in [
            &b""[..],
            b"puts 1\n",
            b"# comment\nputs 1\n",
            b"# encoding: ascii-8bit\n",
            b"x = 1 # __END__\n",
            b" __END__\n",
            b"puts 1\n#!not first\n",
            b"\xEF\xBB\xBFputs 1\n",
        ] {
            assert!(Prestart::feeds(fine), "{:?}", String::from_utf8_lossy(fine));
        }
        for refused in [
            &b"#!/usr/bin/env ruby -w\nputs 1\n"[..],
            b"#!",
            b"puts DATA.read\n__END__\ndata\n",
            b"__END__",
            b"p 1\n__END__x\n",
        ] {
            assert!(
                !Prestart::feeds(refused),
                "{:?}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn a_fed_runtime_takes_its_file_with_fitting_content() {
        let prestart = fed_prestart();
        let ws = "/workspace";
        assert!(prestart.takes_files(ws, &[file("lib.rb", b"x"), file("main.rb", b"p 1")]));
        assert!(!prestart.takes_files(ws, &[file("lib.rb", b"x")]));
        assert!(!prestart.takes_files("/elsewhere", &[file("main.rb", b"p 1")]));
        assert!(!prestart.takes_files(ws, &[file("main.rb", b"#!ruby\np 1")]));
        let with_args = stage(&["ruby", "main.rb", "a"]);
        assert_eq!(prestart.args_of(&with_args), Some(&with_args.argv[2..]));
        assert_eq!(prestart.args_of(&stage(&["ruby", "other.rb"])), None);
        let plain = Prestart {
            fed: None,
            ..prestart
        };
        assert!(plain.takes_files(ws, &[]));
    }

    #[test]
    fn a_hookless_runtime_takes_any_content_and_no_args() {
        let prestart = Prestart {
            argv: vec!["Rscript".into(), "--vanilla".into(), "main.r".into()],
            stage_argv: vec!["Rscript".into(), "--vanilla".into(), "main.r".into()],
            fed: Some("main.r".into()),
            hookless: true,
            ..fed_prestart()
        };
        let ws = "/workspace";
        for content in [&b"#!/usr/bin/Rscript\nprint(1)\n"[..], b"", b"x\n__END__\n"] {
            assert!(prestart.takes_files(ws, &[file("main.r", content)]));
        }
        assert!(!prestart.takes_files(ws, &[file("other.r", b"print(1)")]));
        let bare = stage(&["Rscript", "--vanilla", "main.r"]);
        assert_eq!(prestart.args_of(&bare), Some(&[][..]));
        assert_eq!(
            prestart.args_of(&stage(&["Rscript", "--vanilla", "main.r", "a"])),
            None
        );
        assert_eq!(
            prestart.args_of(&stage(&["Rscript", "--vanilla", "main.r", ""])),
            None
        );
    }
}
