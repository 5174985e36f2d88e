//! The outcome of a job: its status and one result per stage (the result's
//! shape, as clients read it: docs/api.md, "The result").
//!
//! Output is UTF-8 text when it is valid UTF-8, else base64 with an
//! `*_encoding: "base64"` flag. A result the platform gives a job before
//! any stage reported (cancelled while queued, refused, lost, past its
//! deadline) comes from one constructor, [`JobResult::without_stages`].

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::protocol::Reason;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Queued,
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::TimedOut => "timed_out",
            Status::Cancelled => "cancelled",
            Status::Error => "error",
        }
    }

    /// Whether the job has ended: one of [`TERMINAL`](crate::job::lifecycle::TERMINAL),
    /// the set the job's transition table and its Lua scripts use too.
    pub fn is_terminal(self) -> bool {
        crate::job::lifecycle::TERMINAL.contains(&self)
    }
}

/// Output bytes with the JSON encoding that keeps them intact: UTF-8 text when
/// they are valid UTF-8, base64 otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output(pub Vec<u8>);

impl Output {
    pub fn encoded(&self) -> (String, Encoding) {
        match std::str::from_utf8(&self.0) {
            Ok(text) => (text.to_string(), Encoding::Utf8),
            Err(_) => (STANDARD.encode(&self.0), Encoding::Base64),
        }
    }

    pub fn decode(text: &str, encoding: Encoding) -> Result<Self, base64::DecodeError> {
        match encoding {
            Encoding::Utf8 => Ok(Output(text.as_bytes().to_vec())),
            Encoding::Base64 => STANDARD.decode(text).map(Output),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

/// The result of one stage (compile or run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "StageResultJson", try_from = "StageResultJson")]
pub struct StageResult {
    pub stdout: Output,
    pub stderr: Output,
    /// More was written than the output limit allowed; what is here is the start.
    pub truncated: bool,
    pub exit_code: Option<i32>,
    /// Name of the signal that ended the stage (`SIGKILL`), if one did.
    pub signal: Option<String>,
    pub reason: Reason,
    pub wall_ms: u64,
    pub cpu_ms: u64,
    pub memory_peak_bytes: u64,
    /// A process or thread start of the stage was refused at its `pids`
    /// limit: a fork bomb shows here, whatever reason it ended by. `None`
    /// when not known: under gVisor (its kernel counts no refusals), and in
    /// results stored before this was measured.
    pub pids_limit_reached: Option<bool>,
}

#[derive(Serialize, Deserialize)]
struct StageResultJson {
    stdout: String,
    #[serde(default)]
    stdout_encoding: Encoding,
    stderr: String,
    #[serde(default)]
    stderr_encoding: Encoding,
    truncated: bool,
    exit_code: Option<i32>,
    signal: Option<String>,
    reason: Reason,
    wall_ms: u64,
    cpu_ms: u64,
    memory_peak_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pids_limit_reached: Option<bool>,
}

impl From<StageResult> for StageResultJson {
    fn from(result: StageResult) -> Self {
        let (stdout, stdout_encoding) = result.stdout.encoded();
        let (stderr, stderr_encoding) = result.stderr.encoded();
        Self {
            stdout,
            stdout_encoding,
            stderr,
            stderr_encoding,
            truncated: result.truncated,
            exit_code: result.exit_code,
            signal: result.signal,
            reason: result.reason,
            wall_ms: result.wall_ms,
            cpu_ms: result.cpu_ms,
            memory_peak_bytes: result.memory_peak_bytes,
            pids_limit_reached: result.pids_limit_reached,
        }
    }
}

impl TryFrom<StageResultJson> for StageResult {
    type Error = String;
    fn try_from(json: StageResultJson) -> Result<Self, String> {
        Ok(Self {
            stdout: Output::decode(&json.stdout, json.stdout_encoding)
                .map_err(|e| format!("stdout: {e}"))?,
            stderr: Output::decode(&json.stderr, json.stderr_encoding)
                .map_err(|e| format!("stderr: {e}"))?,
            truncated: json.truncated,
            exit_code: json.exit_code,
            signal: json.signal,
            reason: json.reason,
            wall_ms: json.wall_ms,
            cpu_ms: json.cpu_ms,
            memory_peak_bytes: json.memory_peak_bytes,
            pids_limit_reached: json.pids_limit_reached,
        })
    }
}

/// How long each phase of a job took, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// Create + attach + start of the container, until the supervisor is ready.
    pub container_start_ms: u64,
    pub compile_ms: Option<u64>,
    pub run_ms: Option<u64>,
    /// Everything, including removing the container.
    pub total_ms: u64,
}

/// The outcome of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    pub status: Status,
    pub language: String,
    pub version: String,
    /// The compile stage, for compiled languages (absent when it never ran).
    pub compile: Option<StageResult>,
    /// The run stage (absent when compilation failed or the platform failed first).
    pub run: Option<StageResult>,
    /// For status `error`: what went wrong on the platform's side.
    pub error: Option<String>,
    /// For status `error`, when the platform knows it: why, for machines
    /// (`worker_lost`, `deadline_exceeded`). Absent from the JSON otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ErrorReason>,
    /// Whether the job's sandbox was started before it came (`warm`) or for
    /// it (`cold`); absent when no sandbox was tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartKind>,
    pub timings: Timings,
    /// A graded job's tests and their summary: `tests`, `passed`, `total`,
    /// `score`, `max_score` and `verdict`, beside the fields above.
    #[serde(flatten)]
    pub grading: Option<super::grading::Grading>,
    /// A job with network: its connections through the egress proxy
    /// (`connections`, of which `refused`) and the bytes relayed
    /// (`bytes_up` to the hosts, `bytes_down` from them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::EgressTotals>,
    /// The files the job asked back (`outputs`), from its run stage: each
    /// inline, stored (`ref`) or why not (see `job::outputs`). A graded
    /// job's are on each test.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<super::outputs::OutputEntry>,
}

/// How a job got its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartKind {
    /// A sandbox started before the job came (a warm pool member).
    Warm,
    /// A warm sandbox whose language runtime was started and initialised
    /// before the job came, and ran it (docs/warm-runtimes.md).
    WarmRuntime,
    /// A sandbox created and started for the job.
    Cold,
}

impl StartKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StartKind::Warm => "warm",
            StartKind::WarmRuntime => "warm_runtime",
            StartKind::Cold => "cold",
        }
    }
}

/// Why the platform settled a job as `error`, when a machine should be able
/// to tell (the `error` message is for people).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorReason {
    /// The worker running (or holding) the job stopped heartbeating; the
    /// reaper settled the job.
    WorkerLost,
    /// The job's worker is alive but the job outlived its deadline; the
    /// reaper settled it.
    DeadlineExceeded,
}

impl ErrorReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::WorkerLost => "worker_lost",
            ErrorReason::DeadlineExceeded => "deadline_exceeded",
        }
    }
}

impl JobResult {
    /// The result of a job the platform ended before any stage reported:
    /// cancelled before it started, refused by its worker, a sandbox that
    /// never ran it, a lost worker, a passed deadline. No error, no reason,
    /// no sandbox tried and no time spent until the `with_*` calls say so.
    pub fn without_stages(
        status: Status,
        language: impl Into<String>,
        version: impl Into<String>,
    ) -> JobResult {
        JobResult {
            status,
            language: language.into(),
            version: version.into(),
            compile: None,
            run: None,
            error: None,
            reason: None,
            start: None,
            timings: Timings::default(),
            grading: None,
            egress: None,
            outputs: Vec::new(),
        }
    }

    /// The same result with what went wrong on the platform's side.
    pub fn with_error(self, error: impl Into<String>) -> JobResult {
        JobResult {
            error: Some(error.into()),
            ..self
        }
    }

    /// The same result with why, for machines.
    pub fn with_reason(self, reason: ErrorReason) -> JobResult {
        JobResult {
            reason: Some(reason),
            ..self
        }
    }

    /// Status from the stage results: a stage that timed out makes the job
    /// `timed_out`; any other unsuccessful stage makes it `failed`.
    pub fn status_from_stages(compile: Option<&StageResult>, run: Option<&StageResult>) -> Status {
        for stage in [compile, run].into_iter().flatten() {
            if stage.reason.is_timeout() {
                return Status::TimedOut;
            }
            if stage.reason != Reason::Exited || stage.exit_code != Some(0) {
                return Status::Failed;
            }
        }
        if run.is_some() {
            Status::Succeeded
        } else {
            Status::Error
        }
    }

    /// The stage that decided the outcome: the run stage if it ran, else compile.
    pub fn deciding_stage(&self) -> Option<&StageResult> {
        self.run.as_ref().or(self.compile.as_ref())
    }

    /// The result without its output, and the output apart: compile
    /// stdout, compile stderr, run stdout, run stderr (empty where a stage
    /// did not run). The job store keeps the output as raw bytes next to
    /// the rest of the result, so nothing is escaped or encoded twice.
    pub fn split_output(&self) -> (JobResult, [Vec<u8>; 4]) {
        let mut bare = self.clone();
        let mut outputs: [Vec<u8>; 4] = Default::default();
        for (index, stage) in [&mut bare.compile, &mut bare.run].into_iter().enumerate() {
            if let Some(stage) = stage.as_mut() {
                outputs[index * 2] = std::mem::take(&mut stage.stdout.0);
                outputs[index * 2 + 1] = std::mem::take(&mut stage.stderr.0);
            }
        }
        (bare, outputs)
    }

    /// The inverse of [`Self::split_output`]: puts the output back into the
    /// stages that ran (output of a stage that did not run is dropped).
    pub fn with_output(mut self, outputs: [Vec<u8>; 4]) -> JobResult {
        let [compile_out, compile_err, run_out, run_err] = outputs;
        if let Some(stage) = self.compile.as_mut() {
            stage.stdout = Output(compile_out);
            stage.stderr = Output(compile_err);
        }
        if let Some(stage) = self.run.as_mut() {
            stage.stdout = Output(run_out);
            stage.stderr = Output(run_err);
        }
        self
    }
}

/// Number of a signal name (`SIGSEGV` → 11), the inverse of [`signal_name`].
pub fn signal_number(name: &str) -> Option<i32> {
    name.parse::<nix::sys::signal::Signal>()
        .ok()
        .map(|s| s as i32)
}

/// Name of a signal number (`9` → `SIGKILL`), or `SIG<n>` for unknown ones.
pub fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("SIG{signal}"))
}

#[cfg(test)]
impl StageResult {
    /// A stage that exited 0 having written `stdout` (1 ms of wall and
    /// CPU time), for tests.
    pub(crate) fn exited_with(stdout: &[u8]) -> Self {
        StageResult {
            stdout: Output(stdout.to_vec()),
            stderr: Output(Vec::new()),
            truncated: false,
            exit_code: Some(0),
            signal: None,
            reason: Reason::Exited,
            wall_ms: 1,
            cpu_ms: 1,
            memory_peak_bytes: 0,
            pids_limit_reached: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(reason: Reason, exit_code: Option<i32>) -> StageResult {
        StageResult {
            stdout: Output(b"ok\n".to_vec()),
            stderr: Output(vec![0xff, 0xfe]),
            truncated: false,
            exit_code,
            signal: None,
            reason,
            wall_ms: 1,
            cpu_ms: 1,
            memory_peak_bytes: 1,
            pids_limit_reached: None,
        }
    }

    #[test]
    fn non_utf8_output_roundtrips_as_base64() {
        let result = stage(Reason::Exited, Some(0));
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(json["stdout"], "ok\n");
        assert_eq!(json["stdout_encoding"], "utf8");
        assert_eq!(json["stderr"], "//4=");
        assert_eq!(json["stderr_encoding"], "base64");
        let back: StageResult = serde_json::from_value(json).unwrap();
        assert_eq!(back, result);
    }

    #[test]
    fn pids_limit_reached_is_written_only_where_it_is_known() {
        let unknown = stage(Reason::WallTimeout, None);
        let json = serde_json::to_value(&unknown).unwrap();
        assert!(json.get("pids_limit_reached").is_none(), "{json}");
        for known in [true, false] {
            let result = StageResult {
                pids_limit_reached: Some(known),
                ..unknown.clone()
            };
            let json = serde_json::to_value(&result).unwrap();
            assert_eq!(json["pids_limit_reached"], known);
            let back: StageResult = serde_json::from_value(json).unwrap();
            assert_eq!(back, result);
        }
    }

    #[test]
    fn status_follows_the_stages() {
        let ok = stage(Reason::Exited, Some(0));
        let bad = stage(Reason::Exited, Some(1));
        let slow = stage(Reason::CpuTimeout, None);
        let oom = stage(Reason::MemoryLimit, None);
        assert_eq!(
            JobResult::status_from_stages(None, Some(&ok)),
            Status::Succeeded
        );
        assert_eq!(
            JobResult::status_from_stages(Some(&ok), Some(&bad)),
            Status::Failed
        );
        assert_eq!(
            JobResult::status_from_stages(Some(&bad), None),
            Status::Failed
        );
        assert_eq!(
            JobResult::status_from_stages(None, Some(&slow)),
            Status::TimedOut
        );
        assert_eq!(
            JobResult::status_from_stages(None, Some(&oom)),
            Status::Failed
        );
        assert_eq!(JobResult::status_from_stages(None, None), Status::Error);
        assert_eq!(signal_name(9), "SIGKILL");
    }

    #[test]
    fn output_splits_off_and_goes_back() {
        let mut run = stage(Reason::Exited, Some(0));
        run.stdout = Output(b"\x01\x02 text".to_vec());
        run.stderr = Output(vec![0xff]);
        let result = JobResult {
            status: Status::Succeeded,
            language: "python".into(),
            version: "3".into(),
            compile: None,
            run: Some(run),
            error: None,
            reason: None,
            start: None,
            timings: Timings::default(),
            grading: None,
            egress: None,
            outputs: Vec::new(),
        };
        let (bare, outputs) = result.split_output();
        assert_eq!(bare.run.as_ref().unwrap().stdout, Output::default());
        assert_eq!(outputs[2], b"\x01\x02 text");
        assert_eq!(outputs[3], [0xff]);
        assert!(outputs[0].is_empty() && outputs[1].is_empty());
        assert_eq!(bare.with_output(outputs), result);
    }

    #[test]
    fn a_result_without_stages_has_the_json_it_always_had() {
        let lost = JobResult::without_stages(Status::Error, "python", "3.12")
            .with_error("worker w1 was lost")
            .with_reason(ErrorReason::WorkerLost);
        assert_eq!(
            serde_json::to_string(&lost).unwrap(),
            concat!(
                r#"{"status":"error","language":"python","version":"3.12","compile":null,"#,
                r#""run":null,"error":"worker w1 was lost","reason":"worker_lost","#,
                r#""timings":{"container_start_ms":0,"compile_ms":null,"run_ms":null,"total_ms":0}}"#
            )
        );
        let cancelled = JobResult::without_stages(Status::Cancelled, "python", "3.12");
        assert_eq!(
            serde_json::to_string(&cancelled).unwrap(),
            concat!(
                r#"{"status":"cancelled","language":"python","version":"3.12","compile":null,"#,
                r#""run":null,"error":null,"#,
                r#""timings":{"container_start_ms":0,"compile_ms":null,"run_ms":null,"total_ms":0}}"#
            )
        );
    }
}
