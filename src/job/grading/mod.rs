//! Grading: a job with `tests` compiles once and runs its program once per
//! test, in the same sandbox, each run with its own stdin and limits, and
//! gets a verdict per test (docs/grading.md).
//!
//! - this file: the tests and the check as submitted, their validation, and
//!   the prepared form the engine runs ([`PreparedTests`]);
//! - [`compare`]: the built-in comparisons (`exact`, `trim`, `tokens`,
//!   `float`) and the first difference they report;
//! - [`verdict`]: a test's verdict from its run and its comparison (Judge0's
//!   status codes come from the same function), a test's result, and the
//!   job's summary.
//!
//! The expected output never goes into the program's sandbox: the worker
//! compares, or a custom checker in a sandbox of its own does.

pub mod compare;
pub mod verdict;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::limits::{LimitPolicy, Limits};
use super::validate::check_args;
use super::{Encoding, FileSpec, InvalidJob, JobSpec, PreparedJob};
use crate::languages::LanguageCatalog;
pub use compare::{Check, Difference};
pub use verdict::{CheckerUsage, Grading, Restarts, TestOutcome, TestResult, TimeLimit, Verdict};

/// Most tests in one job.
pub const MAX_TESTS: usize = 500;
/// The most points one test may carry.
pub const MAX_POINTS: f64 = 1_000_000.0;
/// What each stored test result may take at most (its previews, its
/// difference and message are cut to fit): the storage a graded job
/// reserves for its result is this per test.
pub const TEST_RESULT_BYTES: u64 = 2048;

/// One test as submitted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default)]
    pub stdin: String,
    #[serde(default)]
    pub stdin_encoding: Encoding,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_stdout: Option<String>,
    #[serde(default)]
    pub expected_stdout_encoding: Encoding,
    /// The test's stdin as a file the job's key stored, by its SHA-256
    /// (instead of `stdin`; see [`crate::job::refs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_ref: Option<String>,
    /// The expected stdout as a stored file (instead of `expected_stdout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_stdout_ref: Option<String>,
    /// The program's arguments for this test (instead of the job's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub points: Option<f64>,
    #[serde(default)]
    pub limits: TestLimitsRequest,
}

/// The limits a test may set: each at most the job's own run limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestLimitsRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Refused with a message: memory is the sandbox's, one for all tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

/// One test, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedTest {
    pub name: String,
    pub input: Vec<u8>,
    pub expected: Option<Vec<u8>>,
    /// The program's argv for this test.
    pub argv: Vec<String>,
    pub wall_ms: u64,
    pub cpu_ms: u64,
    pub output_bytes: u64,
    pub points: f64,
}

/// A graded job's tests and how their outputs are judged.
#[derive(Debug, Clone)]
pub struct PreparedTests {
    pub tests: Vec<PreparedTest>,
    pub check: PreparedCheck,
    pub stop_on_failure: bool,
}

/// How a test's output is judged.
#[derive(Debug, Clone)]
pub enum PreparedCheck {
    Builtin(Check),
    /// A checker program, prepared as a job of its own (its bundle's last
    /// stage is the command each check runs, with three paths appended).
    Program(Box<PreparedJob>),
}

impl PreparedTests {
    /// The sum of the tests' wall limits.
    pub fn wall_ms(&self) -> u64 {
        self.tests.iter().map(|t| t.wall_ms).sum()
    }

    /// The most points the job can score.
    pub fn max_score(&self) -> f64 {
        self.tests.iter().map(|t| t.points).sum()
    }

    /// The checker's wall budget: its compile stage, and each check at most
    /// its run limit.
    pub fn checker_wall_ms(&self) -> u64 {
        match &self.check {
            PreparedCheck::Builtin(_) => 0,
            PreparedCheck::Program(checker) => {
                let compile = checker.compile_limits.map_or(0, |c| c.wall_ms);
                compile + checker.limits.wall_ms * self.tests.len() as u64
            }
        }
    }
}

fn decode(text: &str, encoding: Encoding, field: &str) -> Result<Vec<u8>, InvalidJob> {
    match encoding {
        Encoding::Utf8 => Ok(text.as_bytes().to_vec()),
        Encoding::Base64 => STANDARD
            .decode(text)
            .map_err(|e| InvalidJob::new(field, format!("invalid base64: {e}"))),
    }
}

fn check_test_limit(field: String, asked: Option<u64>, job: u64) -> Result<u64, InvalidJob> {
    match asked {
        None => Ok(job),
        Some(0) => Err(InvalidJob::new(field, "must be at least 1")),
        Some(value) if value > job => Err(InvalidJob::new(
            field,
            format!(
                "{value} is above the job's run limit of {job}; a test may only tighten the job's limits"
            ),
        )),
        Some(value) => Ok(value),
    }
}

/// Validates the job's `tests`, `check` and `stop_on_failure` against its
/// resolved run `limits`; `run_argv` is the program's command without the
/// job's own arguments (the catalog's, placeholders filled in).
pub(super) fn prepare_tests(
    spec: &JobSpec,
    limits: &Limits,
    run_argv: &[String],
    catalog: &LanguageCatalog,
    policy: &LimitPolicy,
) -> Result<Option<PreparedTests>, InvalidJob> {
    let Some(tests) = &spec.tests else {
        if spec.check.is_some() {
            return Err(InvalidJob::new("check", "a check needs tests"));
        }
        if spec.stop_on_failure.is_some() {
            return Err(InvalidJob::new(
                "stop_on_failure",
                "only a job with tests stops on a failure",
            ));
        }
        return Ok(None);
    };
    if spec.interactive {
        return Err(InvalidJob::new(
            "tests",
            "an interactive job cannot have tests (each test reads its own stdin to the end)",
        ));
    }
    if tests.is_empty() || tests.len() > MAX_TESTS {
        return Err(InvalidJob::new(
            "tests",
            format!("must hold 1-{MAX_TESTS} tests; it has {}", tests.len()),
        ));
    }
    if !spec.stdin.is_empty() {
        return Err(InvalidJob::new(
            "stdin",
            "a job with tests has no stdin of its own; give each test its stdin",
        ));
    }
    let mut prepared = Vec::with_capacity(tests.len());
    let mut total_bytes = 0usize;
    for (index, test) in tests.iter().enumerate() {
        let field = |name: &str| format!("tests[{index}].{name}");
        let name = match &test.name {
            Some(name) => {
                // The same rule as a job's `user`: 1-128 printable characters.
                super::check_user(name).map_err(|m| InvalidJob::new(field("name"), m))?;
                name.clone()
            }
            None => format!("{}", index + 1),
        };
        let input = decode(&test.stdin, test.stdin_encoding, &field("stdin"))?;
        let expected = test
            .expected_stdout
            .as_deref()
            .map(|text| {
                decode(
                    text,
                    test.expected_stdout_encoding,
                    &field("expected_stdout"),
                )
            })
            .transpose()?;
        total_bytes += input.len() + expected.as_ref().map_or(0, Vec::len);
        if total_bytes > policy.max_stdin_bytes {
            return Err(InvalidJob::new(
                "tests",
                format!(
                    "the tests' stdin and expected output come to more than the limit of {} bytes (at tests[{index}])",
                    policy.max_stdin_bytes
                ),
            ));
        }
        if test.limits.memory_mb.is_some() {
            return Err(InvalidJob::new(
                field("limits.memory_mb"),
                "memory is the sandbox's, the same for every test; set limits.memory_mb on the job",
            ));
        }
        let wall_ms =
            check_test_limit(field("limits.wall_ms"), test.limits.wall_ms, limits.wall_ms)?;
        let cpu_ms = check_test_limit(field("limits.cpu_ms"), test.limits.cpu_ms, limits.cpu_ms)?;
        let output_bytes = check_test_limit(
            field("limits.output_bytes"),
            test.limits.output_bytes,
            limits.output_bytes,
        )?;
        if let Some(expected) = &expected
            && expected.len() as u64 > output_bytes
        {
            return Err(InvalidJob::new(
                field("expected_stdout"),
                format!(
                    "{} bytes is more than the test may write ({output_bytes}, its output limit)",
                    expected.len()
                ),
            ));
        }
        let args = test.args.as_ref().unwrap_or(&spec.args);
        check_args(&field("args"), args)?;
        let points = test.points.unwrap_or(1.0);
        if !points.is_finite() || !(0.0..=MAX_POINTS).contains(&points) {
            return Err(InvalidJob::new(
                field("points"),
                format!("must be a number from 0 to {MAX_POINTS}"),
            ));
        }
        let mut argv = run_argv.to_vec();
        argv.extend(args.iter().cloned());
        prepared.push(PreparedTest {
            name,
            input,
            expected,
            argv,
            wall_ms,
            cpu_ms,
            output_bytes,
            points,
        });
    }
    let check = prepare_check(spec.check.as_ref(), catalog, policy)?;
    Ok(Some(PreparedTests {
        tests: prepared,
        check,
        stop_on_failure: spec.stop_on_failure.unwrap_or(false),
    }))
}

/// The modes `check` may name, for messages.
const MODES: &str = "exact, trim, tokens, float, program";

fn number(object: &serde_json::Map<String, Value>, key: &str) -> Result<Option<f64>, InvalidJob> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(value) if value.is_finite() && value >= 0.0 => Ok(Some(value)),
            _ => Err(InvalidJob::new(
                format!("check.{key}"),
                "must be a number of at least 0",
            )),
        },
        Some(_) => Err(InvalidJob::new(
            format!("check.{key}"),
            "must be a number of at least 0",
        )),
    }
}

/// `check`: a mode's name, `{"mode": …}` with its options, or
/// `{"mode": "program", "language": …, "files": […]}`.
fn prepare_check(
    check: Option<&Value>,
    catalog: &LanguageCatalog,
    policy: &LimitPolicy,
) -> Result<PreparedCheck, InvalidJob> {
    let unknown = |mode: &str| {
        InvalidJob::new(
            "check.mode",
            format!("unknown check mode {mode:?}; known: {MODES}"),
        )
    };
    let object = match check {
        None => return Ok(PreparedCheck::Builtin(Check::Trim)),
        Some(Value::String(mode)) => {
            return match mode.as_str() {
                "exact" => Ok(PreparedCheck::Builtin(Check::Exact)),
                "trim" => Ok(PreparedCheck::Builtin(Check::Trim)),
                "tokens" => Ok(PreparedCheck::Builtin(Check::Tokens)),
                "float" => Ok(PreparedCheck::Builtin(Check::float(None, None))),
                "program" => Err(InvalidJob::new(
                    "check",
                    "a checker program is {\"mode\": \"program\", \"language\": …, \"files\": […]}",
                )),
                other => Err(unknown(other)),
            };
        }
        Some(Value::Object(object)) => object,
        Some(_) => {
            return Err(InvalidJob::new(
                "check",
                format!("must be a mode's name ({MODES}) or an object with \"mode\""),
            ));
        }
    };
    let mode = match object.get("mode") {
        Some(Value::String(mode)) => mode.as_str(),
        _ => {
            return Err(InvalidJob::new(
                "check.mode",
                format!("is required: one of {MODES}"),
            ));
        }
    };
    let allowed: &[&str] = match mode {
        "exact" | "trim" | "tokens" => &["mode"],
        "float" => &["mode", "abs", "rel"],
        "program" => &["mode", "language", "version", "files", "entry"],
        other => return Err(unknown(other)),
    };
    if let Some(extra) = object.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(InvalidJob::new(
            format!("check.{extra}"),
            format!(
                "is not an option of check mode {mode:?} (it takes {})",
                allowed[1..].join(", ")
            ),
        ));
    }
    Ok(match mode {
        "exact" => PreparedCheck::Builtin(Check::Exact),
        "trim" => PreparedCheck::Builtin(Check::Trim),
        "tokens" => PreparedCheck::Builtin(Check::Tokens),
        "float" => {
            PreparedCheck::Builtin(Check::float(number(object, "abs")?, number(object, "rel")?))
        }
        _ => PreparedCheck::Program(Box::new(prepare_checker(object, catalog, policy)?)),
    })
}

/// The checker program, prepared like a job of its own language with that
/// language's default limits (every field's name is prefixed `check.`).
fn prepare_checker(
    object: &serde_json::Map<String, Value>,
    catalog: &LanguageCatalog,
    policy: &LimitPolicy,
) -> Result<PreparedJob, InvalidJob> {
    let text = |key: &str| -> Result<Option<String>, InvalidJob> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(InvalidJob::new(format!("check.{key}"), "must be a string")),
        }
    };
    let language = text("language")?
        .ok_or_else(|| InvalidJob::new("check.language", "a checker program needs its language"))?;
    let files: Vec<FileSpec> = match object.get("files") {
        Some(files) => serde_json::from_value(files.clone())
            .map_err(|e| InvalidJob::new("check.files", format!("must be a list of files: {e}")))?,
        None => {
            return Err(InvalidJob::new(
                "check.files",
                "a checker program needs its files",
            ));
        }
    };
    let checker = JobSpec {
        language,
        version: text("version")?,
        files,
        entry: text("entry")?,
        ..JobSpec::default()
    };
    super::prepare(&checker, catalog, policy)
        .map_err(|e| InvalidJob::new(format!("check.{}", e.field), e.message))
}

#[cfg(test)]
mod tests;
