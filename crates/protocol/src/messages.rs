//! The frames' typed messages: [`HostMessage`] (host → sandbox) and
//! [`SandboxMessage`] (sandbox → host), their [`kind`] bytes, how each is
//! encoded and decoded, and the small payloads only the sandbox sends
//! ([`Ready`], [`StageStart`], [`StageReport`], [`Fatal`]). The bundle's
//! types are in [`crate::bundle`], the warm runtime's in [`crate::prestart`].

use serde::{Deserialize, Serialize};

use super::codec::{FrameError, RawFrame, encode_frame};
use crate::{Bundle, Prestart, RunSpec};

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
    pub const OUTPUT_FILE: u8 = 0x89;
    pub const OUTPUT_DATA: u8 = 0x8A;
    pub const OUTPUT_ERROR: u8 = 0x8B;
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

/// A file of a stage's outputs (kind `output_file`): `size` bytes of it
/// follow in `output_data` frames, nothing else between them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Its path relative to the stage's `cwd`.
    pub name: String,
    pub size: u64,
}

/// What a stage's outputs could not send (kind `output_error`): for
/// `pattern`, or for the file `name` it matched. `error` is a short code
/// (`not_found`, `not_regular_file`, `too_large`, `cap_reached`,
/// `unreadable`), `message` says it to a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputError {
    pub pattern: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub error: String,
    pub message: String,
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
    /// A file of the stage's outputs; its bytes follow (see [`OutputFile`]).
    OutputFile(OutputFile),
    /// Bytes of the output file being sent.
    OutputData(Vec<u8>),
    /// A pattern or file of the stage's outputs that is not sent.
    OutputError(OutputError),
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
            SandboxMessage::OutputFile(file) => encode_frame(kind::OUTPUT_FILE, &json(file)),
            SandboxMessage::OutputData(data) => encode_frame(kind::OUTPUT_DATA, data),
            SandboxMessage::OutputError(error) => encode_frame(kind::OUTPUT_ERROR, &json(error)),
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
            kind::OUTPUT_FILE => Ok(SandboxMessage::OutputFile(parse_json(kind, &payload)?)),
            kind::OUTPUT_DATA => Ok(SandboxMessage::OutputData(payload)),
            kind::OUTPUT_ERROR => Ok(SandboxMessage::OutputError(parse_json(kind, &payload)?)),
            other => Err(FrameError::UnknownKind(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::tests::limits;
    use crate::{BundleFile, EgressRelay, FrameDecoder, RunPlan, StageSpec};
    use proptest::prelude::*;

    fn roundtrip_host(message: HostMessage) -> HostMessage {
        let mut decoder = FrameDecoder::new(crate::MAX_HOST_FRAME);
        decoder.extend(&message.encode());
        HostMessage::decode(decoder.next_frame().unwrap().unwrap()).unwrap()
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
                outputs: None,
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
                outputs: Some(crate::OutputRequest {
                    patterns: vec!["out/*.png".into(), "result.csv".into()],
                    max_files: 100,
                    max_bytes: 64 << 20,
                }),
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
    fn output_frames_roundtrip() {
        for message in [
            SandboxMessage::OutputFile(OutputFile {
                name: "out/a.png".into(),
                size: 3,
            }),
            SandboxMessage::OutputData(vec![0, 255, 7]),
            SandboxMessage::OutputError(OutputError {
                pattern: "out/*".into(),
                name: Some("out/link".into()),
                error: "not_regular_file".into(),
                message: "a symbolic link".into(),
            }),
        ] {
            let mut decoder = FrameDecoder::new(crate::MAX_SANDBOX_FRAME);
            decoder.extend(&message.encode());
            let frame = decoder.next_frame().unwrap().unwrap();
            assert_eq!(SandboxMessage::decode(frame).unwrap(), message);
        }
    }

    #[test]
    fn a_stage_without_outputs_is_the_json_it_was() {
        // A worker that asks for none sends what a supervisor built before
        // outputs reads, and an older worker's stage reads as asking none.
        let json = serde_json::json!({"name": "run", "argv": ["./main"], "env": [],
            "cwd": "/workspace", "stdin": true, "limits": limits()});
        let stage: StageSpec = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(stage.outputs, None);
        assert_eq!(serde_json::to_value(&stage).unwrap(), json);
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
}
