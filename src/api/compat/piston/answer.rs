//! Our result as Piston's answer: each stage with isolate's status
//! letters and messages, the output interleaved as it was written, and
//! Piston's 500 for a job the platform failed.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use serde_json::{Value, json};

use super::super::semver3;
use super::{SIGNALS, piston_error, piston_name};
use crate::api::ApiState;
use crate::job::events::{JobEvent, StageState};
use crate::job::{Encoding, JobResult, StageResult, Status};
use crate::languages::Language;
use crate::protocol::Reason;

/// A stage as Piston reports it.
#[derive(Debug, Serialize)]
struct PistonStage {
    stdout: String,
    stderr: String,
    output: String,
    code: Option<i32>,
    signal: Option<String>,
    message: Option<String>,
    status: Option<&'static str>,
    cpu_time: u64,
    wall_time: u64,
    memory: u64,
}

pub(super) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Our stage result as Piston's: isolate's status letters (`RE` non-zero
/// exit, `SG` signal, `TO` time limit, `OL`/`EL` output limit) and messages.
fn piston_stage(stage: &StageResult, output: Option<String>) -> PistonStage {
    let stdout = text(stage.stdout.as_bytes());
    let stderr = text(stage.stderr.as_bytes());
    let output = output.unwrap_or_else(|| format!("{stdout}{stderr}"));
    let killed = || Some("SIGKILL".to_string());
    let (code, signal, status, message) = match stage.reason {
        Reason::Exited => match (stage.exit_code, &stage.signal) {
            (Some(0), _) => (Some(0), None, None, None),
            (Some(code), _) => (
                Some(code),
                None,
                Some("RE"),
                Some(format!("Exited with error status {code}")),
            ),
            (None, signal) => {
                let number = signal
                    .as_deref()
                    .and_then(|s| SIGNALS.iter().position(|n| *n == s))
                    .map_or(0, |i| i + 1);
                (
                    None,
                    signal.clone(),
                    Some("SG"),
                    Some(format!("Caught fatal signal {number}")),
                )
            }
        },
        Reason::WallTimeout | Reason::IdleTimeout => (
            None,
            killed(),
            Some("TO"),
            Some("Time limit exceeded (wall clock)".into()),
        ),
        Reason::CpuTimeout => (
            None,
            killed(),
            Some("TO"),
            Some("Time limit exceeded".into()),
        ),
        Reason::MemoryLimit => (
            None,
            killed(),
            Some("SG"),
            Some("Memory limit exceeded".into()),
        ),
        Reason::OutputLimit => {
            if stdout.len() >= stderr.len() {
                (
                    None,
                    killed(),
                    Some("OL"),
                    Some("stdout length exceeded".into()),
                )
            } else {
                (
                    None,
                    killed(),
                    Some("EL"),
                    Some("stderr length exceeded".into()),
                )
            }
        }
        Reason::Killed => (
            None,
            killed(),
            Some("SG"),
            Some("Caught fatal signal 9".into()),
        ),
    };
    PistonStage {
        stdout,
        stderr,
        output,
        code,
        signal,
        message,
        status,
        cpu_time: stage.cpu_ms,
        wall_time: stage.wall_ms,
        memory: stage.memory_peak_bytes,
    }
}

/// Stdout and stderr of each stage interleaved as they were written, from
/// the job's events stream; `None` where it cannot be read.
async fn interleaved_output(state: &ApiState, id: &str) -> Option<(String, String)> {
    let store = &state.inner.store;
    let (mut compile, mut run) = (String::new(), String::new());
    let mut stage = "";
    let mut after = 0;
    loop {
        let events = store.events().since(id, after, 1000).await.ok()?;
        let Some(last) = events.last() else { break };
        after = last.seq;
        for stored in &events {
            match stored.event().ok()? {
                JobEvent::Stage {
                    stage: name,
                    state: StageState::Start,
                    ..
                } => stage = if name == "compile" { "compile" } else { "run" },
                JobEvent::Stdout { data, encoding } | JobEvent::Stderr { data, encoding } => {
                    let bytes = match encoding {
                        Encoding::Utf8 => data.into_bytes(),
                        Encoding::Base64 => STANDARD.decode(data).ok()?,
                    };
                    let into = if stage == "compile" {
                        &mut compile
                    } else {
                        &mut run
                    };
                    into.push_str(&text(&bytes));
                }
                _ => {}
            }
        }
    }
    Some((compile, run))
}

pub(super) async fn piston_answer(
    state: &ApiState,
    id: &str,
    language: &Language,
    result: &JobResult,
) -> Response {
    let Some(first) = result.compile.as_ref().or(result.run.as_ref()) else {
        return platform_failed(result);
    };
    if result.status == Status::Error {
        return platform_failed(result);
    }
    let (compile_output, run_output) = match interleaved_output(state, id).await {
        Some((compile, run)) => (Some(compile), Some(run)),
        None => (None, None),
    };
    let compile = result
        .compile
        .as_ref()
        .map(|stage| piston_stage(stage, compile_output.clone()));
    // Piston: when the run stage never started, `run` is the compile stage.
    let run = match &result.run {
        Some(stage) => piston_stage(stage, run_output),
        None => piston_stage(first, compile_output),
    };
    let (name, _) = piston_name(language);
    let mut answer = json!({
        "language": name,
        "version": semver3(&language.version),
        "run": run,
    });
    if let Some(compile) = compile {
        answer["compile"] = serde_json::to_value(compile).unwrap_or(Value::Null);
    }
    Json(answer).into_response()
}

/// The platform failed the job: Piston answers 500 then.
fn platform_failed(result: &JobResult) -> Response {
    let message = result
        .error
        .clone()
        .unwrap_or_else(|| format!("the job ended as {}", result.status.as_str()));
    piston_error(StatusCode::INTERNAL_SERVER_ERROR, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(reason: Reason, exit_code: Option<i32>, signal: Option<&str>) -> StageResult {
        StageResult {
            stdout: crate::job::Output(b"out".to_vec()),
            stderr: crate::job::Output(b"e".to_vec()),
            truncated: false,
            exit_code,
            signal: signal.map(String::from),
            reason,
            wall_ms: 5,
            cpu_ms: 3,
            memory_peak_bytes: 1024,
            pids_limit_reached: None,
        }
    }

    #[test]
    fn stages_map_to_isolate_statuses() {
        let ok = piston_stage(&stage(Reason::Exited, Some(0), None), None);
        assert_eq!(
            (ok.code, ok.status, ok.output.as_str()),
            (Some(0), None, "oute")
        );
        let re = piston_stage(&stage(Reason::Exited, Some(3), None), None);
        assert_eq!(re.status, Some("RE"));
        assert_eq!(re.message.as_deref(), Some("Exited with error status 3"));
        let sg = piston_stage(&stage(Reason::Exited, None, Some("SIGSEGV")), None);
        assert_eq!(
            (sg.code, sg.signal.as_deref(), sg.status),
            (None, Some("SIGSEGV"), Some("SG"))
        );
        assert_eq!(sg.message.as_deref(), Some("Caught fatal signal 11"));
        let to = piston_stage(&stage(Reason::WallTimeout, None, Some("SIGKILL")), None);
        assert_eq!(
            (to.status, to.signal.as_deref()),
            (Some("TO"), Some("SIGKILL"))
        );
        let ol = piston_stage(&stage(Reason::OutputLimit, None, None), None);
        assert_eq!(ol.status, Some("OL"));
        assert_eq!((ol.cpu_time, ol.wall_time, ol.memory), (3, 5, 1024));
    }
}
