//! Our result as Jobe's result object (`ResultObject.php`): `run_id`,
//! `outcome`, `cmpinfo`, `stdout`, `stderr`, with Jobe's outcome codes
//! decided by Jobe's rules.

use serde::Serialize;

use crate::job::{JobResult, StageResult, Status};
use crate::protocol::Reason;

/// Jobe's outcome codes (ideone's).
pub(super) mod outcome {
    pub const COMPILATION_ERROR: u8 = 11;
    pub const RUNTIME_ERROR: u8 = 12;
    pub const TIME_LIMIT: u8 = 13;
    pub const SUCCESS: u8 = 15;
    pub const MEMORY_LIMIT: u8 = 17;
    pub const ILLEGAL_SYSCALL: u8 = 19;
    pub const INTERNAL_ERROR: u8 = 20;
    pub const SERVER_OVERLOAD: u8 = 21;
}

/// Jobe's answer to `POST runs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct ResultObject {
    pub run_id: Option<String>,
    pub outcome: u8,
    pub cmpinfo: String,
    pub stdout: String,
    pub stderr: String,
}

impl ResultObject {
    /// An answer with only an outcome (overload) and what to say in stderr.
    pub fn bare(run_id: Option<String>, outcome: u8, stderr: String) -> Self {
        Self {
            run_id,
            outcome,
            cmpinfo: String::new(),
            stdout: String::new(),
            stderr,
        }
    }
}

/// Text as Jobe returns it: UTF-8 as it is; anything else with every
/// control character but newline, tab and return, and every byte above
/// `~`, written `\xNN` (Jobe's `ResultObject::clean`).
pub(super) fn clean(bytes: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return text.to_string();
    }
    let mut out = String::with_capacity(bytes.len() + 16);
    for &b in bytes {
        if (b < b' ' && !matches!(b, b'\n' | b'\r' | b'\t')) || b > b'~' {
            out.push_str(&format!("\\x{b:02x}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

/// Whether a compile stage ended in what Jobe counts as a compile error:
/// it failed, or (gcc, g++, javac: Jobe runs the program only when the
/// compiler wrote nothing to stderr) it wrote to stderr.
fn compile_failed(stage: &StageResult, strict: bool) -> bool {
    !(stage.reason == Reason::Exited && stage.exit_code == Some(0))
        || (strict && !stage.stderr.as_bytes().is_empty())
}

/// What a compiler said: its stderr, with its stdout before it (fpc
/// writes its errors to stdout).
fn compiler_output(stage: &StageResult) -> String {
    let mut bytes = stage.stdout.as_bytes().to_vec();
    bytes.extend_from_slice(stage.stderr.as_bytes());
    clean(&bytes)
}

/// A Python program that did not start because its source does not parse
/// (what Jobe finds with `py_compile` before running): nothing on stdout,
/// and a stderr that is no traceback but a syntax error's report.
fn python_syntax_error(run: &StageResult) -> bool {
    let stderr = String::from_utf8_lossy(run.stderr.as_bytes());
    run.stdout.as_bytes().is_empty()
        && run.exit_code == Some(1)
        && stderr.starts_with("  File ")
        && stderr.lines().last().is_some_and(|line| {
            ["SyntaxError:", "IndentationError:", "TabError:"]
                .iter()
                .any(|kind| line.starts_with(kind))
        })
}

/// A PHP program that did not start because its source does not parse
/// (what Jobe finds with `php -l`).
fn php_parse_error(run: &StageResult) -> Option<String> {
    let said = [run.stderr.as_bytes(), run.stdout.as_bytes()]
        .into_iter()
        .map(String::from_utf8_lossy)
        .find(|text| text.contains("Parse error: "))?;
    (run.exit_code == Some(255)).then(|| said.trim_start().to_string())
}

/// Jobe's answer for a job that ended: compile errors (11) as Jobe finds
/// them, then the run by Jobe's rule — a runtime error (12) when stderr is
/// not empty or the program died of a signal, success (15) otherwise —
/// refined by how it ended: a time limit (13, stderr emptied, as Jobe
/// does; so is an output flood, which Jobe ends by its time limit), the
/// memory limit (17), a system call the sandbox forbids (19). A job the
/// platform failed, or one cancelled, is an internal error (20).
pub(super) fn jobe_result(id: &str, jobe_id: &str, result: &JobResult) -> ResultObject {
    let run_id = Some(id.to_string());
    let internal =
        |message: String| ResultObject::bare(run_id.clone(), outcome::INTERNAL_ERROR, message);
    if matches!(result.status, Status::Error | Status::Cancelled) {
        return internal(
            result
                .error
                .clone()
                .unwrap_or_else(|| format!("the job was {}", result.status.as_str())),
        );
    }
    let strict = matches!(jobe_id, "c" | "cpp" | "java");
    if let Some(compile) = &result.compile
        && compile_failed(compile, strict)
    {
        return ResultObject {
            cmpinfo: compiler_output(compile),
            ..ResultObject::bare(run_id, outcome::COMPILATION_ERROR, String::new())
        };
    }
    let Some(run) = &result.run else {
        return internal("the program did not run".into());
    };
    if jobe_id == "python3" && python_syntax_error(run) {
        return ResultObject {
            cmpinfo: clean(run.stderr.as_bytes()),
            ..ResultObject::bare(run_id, outcome::COMPILATION_ERROR, String::new())
        };
    }
    if jobe_id == "php"
        && let Some(said) = php_parse_error(run)
    {
        return ResultObject {
            cmpinfo: said,
            ..ResultObject::bare(run_id, outcome::COMPILATION_ERROR, String::new())
        };
    }
    let mut stderr = clean(run.stderr.as_bytes());
    let outcome = match run.reason {
        Reason::CpuTimeout | Reason::WallTimeout | Reason::IdleTimeout | Reason::OutputLimit => {
            stderr.clear();
            outcome::TIME_LIMIT
        }
        Reason::MemoryLimit => outcome::MEMORY_LIMIT,
        Reason::Killed => {
            return internal("the program was killed on request".into());
        }
        Reason::Exited if run.signal.as_deref() == Some("SIGSYS") => outcome::ILLEGAL_SYSCALL,
        Reason::Exited if run.signal.is_some() || !stderr.is_empty() => outcome::RUNTIME_ERROR,
        Reason::Exited => outcome::SUCCESS,
    };
    ResultObject {
        run_id,
        outcome,
        cmpinfo: String::new(),
        stdout: clean(run.stdout.as_bytes()),
        stderr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::result::Output;

    fn stage(stdout: &[u8], stderr: &[u8], reason: Reason, code: Option<i32>) -> StageResult {
        StageResult {
            stdout: Output(stdout.to_vec()),
            stderr: Output(stderr.to_vec()),
            truncated: false,
            exit_code: code,
            signal: None,
            reason,
            wall_ms: 1,
            cpu_ms: 1,
            memory_peak_bytes: 0,
            pids_limit_reached: None,
        }
    }

    fn result(compile: Option<StageResult>, run: Option<StageResult>) -> JobResult {
        JobResult {
            status: Status::Succeeded,
            language: "c".into(),
            version: "12".into(),
            compile,
            run,
            error: None,
            reason: None,
            start: None,
            timings: Default::default(),
            grading: None,
            egress: None,
            outputs: Vec::new(),
        }
    }

    fn outcome_of(jobe_id: &str, compile: Option<StageResult>, run: StageResult) -> ResultObject {
        jobe_result("job-1", jobe_id, &result(compile, Some(run)))
    }

    #[test]
    fn non_utf8_output_is_escaped_as_jobe_does() {
        assert_eq!(clean("Un rôle\n".as_bytes()), "Un rôle\n");
        assert_eq!(
            clean(b"Hello world\n\x01\x06\xc0\xc9\n"),
            "Hello world\n\\x01\\x06\\xc0\\xc9\n"
        );
    }

    #[test]
    fn each_ending_has_jobes_outcome() {
        let ok = || stage(b"", b"", Reason::Exited, Some(0));
        let hello = stage(b"hi\n", b"", Reason::Exited, Some(0));
        let answer = outcome_of("c", Some(ok()), hello);
        assert_eq!(
            answer,
            ResultObject {
                run_id: Some("job-1".into()),
                outcome: 15,
                cmpinfo: String::new(),
                stdout: "hi\n".into(),
                stderr: String::new()
            }
        );
        // Jobe's rule: a non-zero exit with nothing on stderr is a success.
        let quiet_exit = stage(b"", b"", Reason::Exited, Some(3));
        assert_eq!(outcome_of("c", Some(ok()), quiet_exit).outcome, 15);
        let stderr = stage(b"", b"oops\n", Reason::Exited, Some(0));
        let answer = outcome_of("c", Some(ok()), stderr);
        assert_eq!((answer.outcome, answer.stderr.as_str()), (12, "oops\n"));
        let mut segv = stage(b"", b"", Reason::Exited, None);
        segv.signal = Some("SIGSEGV".into());
        assert_eq!(outcome_of("c", Some(ok()), segv).outcome, 12);
        let mut sys = stage(b"", b"", Reason::Exited, None);
        sys.signal = Some("SIGSYS".into());
        assert_eq!(outcome_of("c", Some(ok()), sys).outcome, 19);
        for reason in [Reason::CpuTimeout, Reason::WallTimeout, Reason::OutputLimit] {
            let answer = outcome_of("c", Some(ok()), stage(b"x", b"late", reason, None));
            assert_eq!(
                (answer.outcome, answer.stderr.as_str()),
                (13, ""),
                "{reason:?}"
            );
            assert_eq!(answer.stdout, "x");
        }
        let memory = stage(b"", b"", Reason::MemoryLimit, None);
        assert_eq!(outcome_of("c", Some(ok()), memory).outcome, 17);
        let killed = stage(b"", b"", Reason::Killed, None);
        assert_eq!(outcome_of("c", Some(ok()), killed).outcome, 20);
    }

    #[test]
    fn compile_errors_are_found_as_jobe_finds_them() {
        let run = || stage(b"", b"", Reason::Exited, Some(0));
        let failed = stage(
            b"",
            b"prog.c:3: error: expected ';'\n",
            Reason::Exited,
            Some(1),
        );
        let answer = outcome_of("c", Some(failed), run());
        assert_eq!(answer.outcome, 11);
        assert_eq!(answer.cmpinfo, "prog.c:3: error: expected ';'\n");
        // gcc's warnings alone stop a Jobe C run; fpc's do not.
        let warned = stage(b"", b"warning: unused\n", Reason::Exited, Some(0));
        assert_eq!(outcome_of("c", Some(warned.clone()), run()).outcome, 11);
        assert_eq!(outcome_of("pascal", Some(warned), run()).outcome, 15);
        let fpc = stage(b"main.pas(3) Error: x\n", b"", Reason::Exited, Some(1));
        assert_eq!(
            outcome_of("pascal", Some(fpc), run()).cmpinfo,
            "main.pas(3) Error: x\n"
        );

        let syntax = b"  File \"test.py\", line 1\n    print(\n         ^\nSyntaxError: '(' was never closed\n";
        let answer = outcome_of("python3", None, stage(b"", syntax, Reason::Exited, Some(1)));
        assert_eq!(answer.outcome, 11);
        assert_eq!(answer.cmpinfo.as_bytes(), syntax);
        let traceback =
            b"Traceback (most recent call last):\n  File \"test.py\", line 1\nSyntaxError: x\n";
        let answer = outcome_of(
            "python3",
            None,
            stage(b"", traceback, Reason::Exited, Some(1)),
        );
        assert_eq!(answer.outcome, 12);

        let php = stage(b"", b"PHP Parse error:  syntax error, unexpected end of file in /workspace/prog.php on line 3\n", Reason::Exited, Some(255));
        assert_eq!(outcome_of("php", None, php).outcome, 11);
    }

    #[test]
    fn a_job_the_platform_failed_is_an_internal_error() {
        let mut failed = result(None, None);
        failed.status = Status::Error;
        failed.error = Some("the worker was lost".into());
        let answer = jobe_result("job-2", "c", &failed);
        assert_eq!(answer.outcome, 20);
        assert_eq!(answer.stderr, "the worker was lost");
    }
}
