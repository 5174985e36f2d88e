//! A job as Judge0 shows a submission (`app/serializers/submission_serializer.rb`
//! and the verdict of `app/jobs/isolate_job.rb`, Judge0 CE 1.13.1): status
//! ids and descriptions, `time`/`wall_time` in seconds (strings, as Rails
//! renders decimals), `memory` in KB, isolate's `message`, `fields`
//! selection and `base64_encoded` output (Ruby's `Base64.encode64`: lines
//! of 60 characters, each ending in a newline).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use super::languages::judge0_name;
use super::request::Judge0Record;
use crate::api::v1::jobs::rfc3339;
use crate::job::grading::verdict::run_failure;
use crate::job::grading::{Check, TimeLimit, Verdict as TestVerdict};
use crate::job::result::signal_number;
use crate::job::{JobResult, StageResult, Status};
use crate::languages::{Language, LanguageCatalog};
use crate::protocol::Reason;
use crate::store::JobRecord;

/// Judge0's statuses, id and description.
pub(super) const STATUSES: &[(u32, &str)] = &[
    (1, "In Queue"),
    (2, "Processing"),
    (3, "Accepted"),
    (4, "Wrong Answer"),
    (5, "Time Limit Exceeded"),
    (6, "Compilation Error"),
    (7, "Runtime Error (SIGSEGV)"),
    (8, "Runtime Error (SIGXFSZ)"),
    (9, "Runtime Error (SIGFPE)"),
    (10, "Runtime Error (SIGABRT)"),
    (11, "Runtime Error (NZEC)"),
    (12, "Runtime Error (Other)"),
    (13, "Internal Error"),
    (14, "Exec Format Error"),
];

/// Every attribute of a submission in Judge0 CE 1.13.1 (its `submissions`
/// columns, then `status` and `language`), in Judge0's order.
pub(super) const FIELDS: &[&str] = &[
    "source_code",
    "language_id",
    "stdin",
    "expected_output",
    "stdout",
    "status_id",
    "created_at",
    "finished_at",
    "time",
    "memory",
    "stderr",
    "token",
    "number_of_runs",
    "cpu_time_limit",
    "cpu_extra_time",
    "wall_time_limit",
    "memory_limit",
    "stack_limit",
    "max_processes_and_or_threads",
    "enable_per_process_and_thread_time_limit",
    "enable_per_process_and_thread_memory_limit",
    "max_file_size",
    "compile_output",
    "exit_code",
    "exit_signal",
    "message",
    "wall_time",
    "compiler_options",
    "command_line_arguments",
    "redirect_stderr_to_stdout",
    "callback_url",
    "additional_files",
    "enable_network",
    "status",
    "language",
];

/// The fields shown when none are asked for.
pub(super) const DEFAULT_FIELDS: &[&str] = &[
    "token",
    "time",
    "memory",
    "stdout",
    "stderr",
    "compile_output",
    "message",
    "status",
];

/// `?fields=`: the fields asked for (`*`: all), or the unknown ones.
pub(super) fn requested_fields(text: Option<&str>) -> Result<Vec<&'static str>, Vec<String>> {
    let asked: Vec<&str> = text
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .collect();
    let invalid: Vec<String> = asked
        .iter()
        .filter(|f| **f != "*" && !FIELDS.contains(f))
        .map(|f| f.to_string())
        .collect();
    if !invalid.is_empty() {
        return Err(invalid);
    }
    if asked.contains(&"*") {
        return Ok(FIELDS.to_vec());
    }
    let chosen: Vec<&'static str> = FIELDS
        .iter()
        .copied()
        .filter(|f| asked.contains(f))
        .collect();
    Ok(if chosen.is_empty() {
        DEFAULT_FIELDS.to_vec()
    } else {
        asked
            .iter()
            .filter_map(|a| FIELDS.iter().copied().find(|f| f == a))
            .collect()
    })
}

/// Ruby's `Base64.encode64`.
pub(super) fn encode64(bytes: &[u8]) -> String {
    let flat = STANDARD.encode(bytes);
    let mut out = String::with_capacity(flat.len() + flat.len() / 60 + 1);
    for chunk in flat.as_bytes().chunks(60) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out
}

/// The verdict of a finished job.
pub(super) struct Verdict {
    pub status: u32,
    pub message: Option<String>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    /// Compilation failed: no run figures are shown.
    pub compile_failed: bool,
}

/// Judge0's verdict of our result: compile failure 6; time limit 5 (also a
/// CPU time above `cpu_time_limit` within the extra time); a signal by its
/// number (7–10, else 12); a non-zero exit 11; our own failure or a
/// cancellation 13; else 3,
/// or 4 when `expected_output` differs from stdout.
pub(super) fn verdict(result: &JobResult, record: &Judge0Record) -> Verdict {
    let mut verdict = Verdict {
        status: 13,
        message: None,
        exit_code: None,
        exit_signal: None,
        compile_failed: false,
    };
    if let Some(compile) = &result.compile
        && (compile.reason != Reason::Exited || compile.exit_code != Some(0))
    {
        verdict.status = 6;
        verdict.compile_failed = true;
        return verdict;
    }
    // Our own failures, and cancellation (which Judge0 does not have).
    let ours = matches!(result.status, Status::Error | Status::Cancelled);
    let Some(run) = result.run.as_ref().filter(|_| !ours) else {
        verdict.message = Some(match (&result.error, result.status) {
            (Some(error), _) => error.clone(),
            (None, Status::Cancelled) => "the job was cancelled".to_string(),
            (None, status) => format!("the job ended as {}", status.as_str()),
        });
        return verdict;
    };
    let signal = run.signal.as_deref().and_then(signal_number);
    verdict.exit_signal = signal;
    // Judge0 reports 0 when isolate gave no exit code (a kill).
    verdict.exit_code = Some(run.exit_code.unwrap_or(0));
    // The same verdict a graded job's test gets, in Judge0's numbers.
    let cpu_limit_ms = (record.cpu_time_limit * 1000.0) as u64;
    (verdict.status, verdict.message) = match run_failure(run, cpu_limit_ms) {
        Some(failure) => match failure.verdict {
            TestVerdict::TimeLimit => (
                5,
                Some(match failure.time_limit {
                    Some(TimeLimit::Wall) => "Time limit exceeded (wall clock)".into(),
                    _ => "Time limit exceeded".into(),
                }),
            ),
            TestVerdict::MemoryLimit => (12, Some("Memory limit exceeded".into())),
            TestVerdict::OutputLimit => (8, Some("Output limit exceeded".into())),
            _ => match (failure.exit_code, failure.signal) {
                (Some(code), _) if code != 0 => {
                    (11, Some(format!("Exited with error status {code}")))
                }
                (_, Some(number)) => (
                    match number {
                        11 => 7,
                        25 => 8,
                        8 => 9,
                        6 => 10,
                        _ => 12,
                    },
                    Some(format!("Caught fatal signal {number}")),
                ),
                _ => (13, Some(failure.message)),
            },
        },
        None => {
            let accepted = record.expected_output.as_deref().is_none_or(|expected| {
                Check::Trim
                    .compare(expected.as_bytes(), run.stdout.as_bytes())
                    .is_none()
            });
            (if accepted { 3 } else { 4 }, None)
        }
    };
    verdict
}

/// Seconds as Rails renders a decimal column: a string.
fn seconds(ms: u64) -> Value {
    Value::String(format!("{}", ms as f64 / 1000.0))
}

fn decimal(value: f64) -> Value {
    Value::String(format!("{value}"))
}

/// A text attribute: `None` when absent or empty; base64 when asked; an
/// error (the field's name) when it is not UTF-8 and base64 was not asked.
fn text_value(bytes: Option<&[u8]>, base64: bool) -> Result<Value, ()> {
    match bytes {
        None => Ok(Value::Null),
        Some([]) => Ok(Value::Null),
        Some(bytes) if base64 => Ok(Value::String(encode64(bytes))),
        Some(bytes) => std::str::from_utf8(bytes)
            .map(|t| Value::String(t.to_string()))
            .map_err(|_| ()),
    }
}

/// The submission of `job` with `fields`, or `Err(())` when a text field is
/// not UTF-8 and base64 was not asked (Judge0 then tells the client to ask).
pub(super) fn submission_view(
    job: &JobRecord,
    record: &Judge0Record,
    catalog: &LanguageCatalog,
    fields: &[&str],
    base64: bool,
) -> Result<Value, ()> {
    let shown = Shown::new(job, record, catalog);
    let mut view = Map::new();
    for field in fields {
        view.insert((*field).to_string(), shown.field(field, base64)?);
    }
    Ok(Value::Object(view))
}

/// What a submission shows of a job, read once for all its fields.
struct Shown<'a> {
    job: &'a JobRecord,
    record: &'a Judge0Record,
    source: Option<Vec<u8>>,
    stdin: Option<Vec<u8>>,
    /// The job's result, once it is terminal.
    result: Option<&'a JobResult>,
    verdict: Option<Verdict>,
    /// The run stage, unless compilation failed.
    run: Option<&'a StageResult>,
    compile_output: Option<Vec<u8>>,
    status_id: u32,
    description: &'static str,
    language: Option<&'a Language>,
}

impl<'a> Shown<'a> {
    fn new(job: &'a JobRecord, record: &'a Judge0Record, catalog: &'a LanguageCatalog) -> Self {
        let spec: Option<crate::job::JobSpec> = job
            .spec
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok());
        let decode = |text: &str, encoding: crate::job::Encoding| match encoding {
            crate::job::Encoding::Utf8 => text.as_bytes().to_vec(),
            crate::job::Encoding::Base64 => STANDARD.decode(text).unwrap_or_default(),
        };
        let source = spec
            .as_ref()
            .and_then(|s| s.files.first())
            .map(|f| decode(&f.content, f.encoding));
        let stdin = spec.as_ref().map(|s| decode(&s.stdin, s.stdin_encoding));
        let result = job.result.as_ref().filter(|_| job.status.is_terminal());
        // A job cancelled while running keeps its killed run stage; Judge0
        // has no cancellation, so it is shown as our own end (13).
        let cancelled = result
            .filter(|_| job.status == Status::Cancelled)
            .map(|r| JobResult {
                status: Status::Cancelled,
                ..r.clone()
            });
        let verdict = cancelled.as_ref().or(result).map(|r| verdict(r, record));
        let run = result
            .and_then(|r| r.run.as_ref())
            .filter(|_| verdict.as_ref().is_some_and(|v| !v.compile_failed));
        let compile_output = result.and_then(|r| r.compile.as_ref()).map(|c| {
            if matches!(c.reason, Reason::WallTimeout | Reason::CpuTimeout) {
                b"Compilation time limit exceeded.".to_vec()
            } else {
                [c.stdout.as_bytes(), c.stderr.as_bytes()].concat()
            }
        });
        let status_id = verdict
            .as_ref()
            .map_or(if job.status == Status::Running { 2 } else { 1 }, |v| {
                v.status
            });
        let description = STATUSES
            .iter()
            .find(|(id, _)| *id == status_id)
            .map_or("", |(_, d)| d);
        Self {
            job,
            record,
            source,
            stdin,
            result,
            verdict,
            run,
            compile_output,
            status_id,
            description,
            language: catalog.find(&job.language),
        }
    }

    /// The value of one field (`null` for a name Judge0 does not have).
    fn field(&self, name: &str, base64: bool) -> Result<Value, ()> {
        let (job, record, run) = (self.job, self.record, self.run);
        let verdict = self.verdict.as_ref();
        Ok(match name {
            "token" => json!(job.id),
            "source_code" => text_value(self.source.as_deref(), base64)?,
            "stdin" => text_value(self.stdin.as_deref(), base64)?,
            "expected_output" => {
                text_value(record.expected_output.as_deref().map(str::as_bytes), base64)?
            }
            "stdout" => text_value(run.map(|r| r.stdout.as_bytes()), base64)?,
            "stderr" => text_value(run.map(|r| r.stderr.as_bytes()), base64)?,
            "compile_output" => text_value(self.compile_output.as_deref(), base64)?,
            "message" => match verdict.and_then(|v| v.message.as_ref()) {
                Some(text) if base64 => json!(encode64(text.as_bytes())),
                other => json!(other),
            },
            "language_id" => json!(record.language_id),
            "status_id" => json!(self.status_id),
            "status" => json!({"id": self.status_id, "description": self.description}),
            "language" => json!({
                "id": record.language_id,
                "name": self.language.map(judge0_name),
            }),
            "created_at" => json!(rfc3339(job.created_ms)),
            "finished_at" => json!(
                job.finished_ms
                    .filter(|_| self.result.is_some())
                    .map(rfc3339)
            ),
            "time" => run.map_or(Value::Null, |r| seconds(r.cpu_ms)),
            "wall_time" => run.map_or(Value::Null, |r| seconds(r.wall_ms)),
            "memory" => run.map_or(Value::Null, |r| json!(r.memory_peak_bytes / 1024)),
            "exit_code" => json!(verdict.and_then(|v| v.exit_code)),
            "exit_signal" => json!(verdict.and_then(|v| v.exit_signal)),
            "number_of_runs" => json!(1),
            "cpu_time_limit" => decimal(record.cpu_time_limit),
            "cpu_extra_time" => decimal(record.cpu_extra_time),
            "wall_time_limit" => decimal(record.wall_time_limit),
            "memory_limit" => json!(record.memory_limit),
            "stack_limit" => json!(record.stack_limit),
            "max_processes_and_or_threads" => json!(record.max_processes_and_or_threads),
            "max_file_size" => json!(record.max_file_size),
            "command_line_arguments" => json!(record.command_line_arguments),
            "enable_per_process_and_thread_time_limit"
            | "enable_per_process_and_thread_memory_limit"
            | "redirect_stderr_to_stdout"
            | "enable_network" => json!(false),
            _ => Value::Null,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Output, StageResult};

    fn run(
        reason: Reason,
        exit_code: Option<i32>,
        signal: Option<&str>,
        stdout: &str,
    ) -> JobResult {
        JobResult {
            status: Status::Failed,
            language: "c".into(),
            version: "12".into(),
            compile: None,
            run: Some(StageResult {
                stdout: Output(stdout.as_bytes().to_vec()),
                stderr: Output(Vec::new()),
                truncated: false,
                exit_code,
                signal: signal.map(String::from),
                reason,
                wall_ms: 20,
                cpu_ms: 10,
                memory_peak_bytes: 4096,
                pids_limit_reached: None,
            }),
            error: None,
            reason: None,
            start: None,
            timings: Default::default(),
            grading: None,
            egress: None,
            outputs: Vec::new(),
        }
    }

    fn record(expected: Option<&str>) -> Judge0Record {
        Judge0Record {
            cpu_time_limit: 5.0,
            expected_output: expected.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn verdicts_follow_judge0() {
        let status =
            |result: &JobResult, expected: Option<&str>| verdict(result, &record(expected)).status;
        assert_eq!(status(&run(Reason::Exited, Some(0), None, "4 \n"), None), 3);
        assert_eq!(
            status(&run(Reason::Exited, Some(0), None, "4 \n\n"), Some("4")),
            3
        );
        assert_eq!(
            status(&run(Reason::Exited, Some(0), None, "5\n"), Some("4")),
            4
        );
        assert_eq!(
            status(&run(Reason::CpuTimeout, None, Some("SIGKILL"), ""), None),
            5
        );
        assert_eq!(
            status(&run(Reason::WallTimeout, None, Some("SIGKILL"), ""), None),
            5
        );
        assert_eq!(
            status(&run(Reason::Exited, None, Some("SIGSEGV"), ""), None),
            7
        );
        assert_eq!(
            status(&run(Reason::OutputLimit, None, Some("SIGKILL"), ""), None),
            8
        );
        assert_eq!(
            status(&run(Reason::Exited, None, Some("SIGFPE"), ""), None),
            9
        );
        assert_eq!(
            status(&run(Reason::Exited, None, Some("SIGABRT"), ""), None),
            10
        );
        assert_eq!(status(&run(Reason::Exited, Some(1), None, ""), None), 11);
        assert_eq!(
            status(&run(Reason::MemoryLimit, None, Some("SIGKILL"), ""), None),
            12
        );
        let segv = verdict(
            &run(Reason::Exited, None, Some("SIGSEGV"), ""),
            &record(None),
        );
        assert_eq!((segv.exit_code, segv.exit_signal), (Some(0), Some(11)));
        assert_eq!(segv.message.as_deref(), Some("Caught fatal signal 11"));
        let mut failed = run(Reason::Exited, Some(0), None, "");
        failed.status = Status::Error;
        failed.error = Some("worker lost".into());
        let internal = verdict(&failed, &record(None));
        assert_eq!(
            (internal.status, internal.message.as_deref()),
            (13, Some("worker lost"))
        );
    }

    #[test]
    fn fields_and_base64_are_judge0s() {
        assert_eq!(requested_fields(None).unwrap(), DEFAULT_FIELDS);
        assert_eq!(
            requested_fields(Some("stdout,status")).unwrap(),
            ["stdout", "status"]
        );
        assert_eq!(requested_fields(Some("*")).unwrap().len(), FIELDS.len());
        assert_eq!(
            requested_fields(Some("stdout,nope,x")).unwrap_err(),
            ["nope", "x"]
        );
        assert_eq!(encode64(b"hello, Judge0\n"), "aGVsbG8sIEp1ZGdlMAo=\n");
        let long = encode64(&[b'a'; 50]);
        assert_eq!(long.lines().next().unwrap().len(), 60);
        assert!(long.ends_with('\n'));
    }
}
