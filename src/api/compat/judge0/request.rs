//! A Judge0 submission request (`app/models/submission.rb` of Judge0 CE
//! 1.13.1), checked the way Judge0 checks it, as an ordinary job. Refusals
//! are Judge0's validation errors: `{"<field>": ["<message>"]}` (422).

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::languages::language_for;
use crate::job::limits::{LimitPolicy, Limits, LimitsRequest};
use crate::job::{Encoding, FileSpec, JobSpec};
use crate::languages::{Language, LanguageCatalog};

/// Longest `command_line_arguments` (Judge0: 512).
const MAX_ARGUMENTS_CHARS: usize = 512;

/// Validation errors by field, as Judge0 answers them.
pub(super) type FieldErrors = BTreeMap<String, Vec<String>>;

/// What the Judge0 API keeps beside a job (`compat:<id>`): what it was
/// asked, so it can answer with it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Judge0Record {
    pub language_id: u32,
    pub expected_output: Option<String>,
    pub cpu_time_limit: f64,
    pub cpu_extra_time: f64,
    pub wall_time_limit: f64,
    pub memory_limit: u64,
    pub stack_limit: u64,
    pub max_processes_and_or_threads: u64,
    pub max_file_size: u64,
    pub command_line_arguments: Option<String>,
}

/// The decoded text of a field that may be base64 (`base64_encoded=true`):
/// whitespace is ignored, like Ruby's `Base64.decode64`.
fn text_field(
    body: &Map<String, Value>,
    name: &str,
    base64: bool,
    errors: &mut FieldErrors,
) -> Option<Vec<u8>> {
    let value = body.get(name)?;
    let text = match value {
        Value::Null => return None,
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    if !base64 {
        return Some(text.into_bytes());
    }
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    match STANDARD.decode(compact.as_bytes()) {
        Ok(bytes) => Some(bytes),
        Err(_) => {
            add(errors, name, "is not valid base64");
            None
        }
    }
}

fn add(errors: &mut FieldErrors, field: &str, message: impl Into<String>) {
    errors
        .entry(field.to_string())
        .or_default()
        .push(message.into());
}

/// A number field: `None` when absent or null; an error when not a number.
fn number(body: &Map<String, Value>, name: &str, errors: &mut FieldErrors) -> Option<f64> {
    match body.get(name) {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) if s.trim().parse::<f64>().is_ok() => s.trim().parse().ok(),
        Some(_) => {
            add(errors, name, "is not a number");
            None
        }
    }
}

/// Checks `value` is within `[min, max]` (Rails numericality messages).
fn within(
    errors: &mut FieldErrors,
    name: &str,
    value: f64,
    min: f64,
    min_exclusive: bool,
    max: f64,
) {
    if min_exclusive && value <= min {
        add(
            errors,
            name,
            format!("must be greater than {}", trim_float(min)),
        );
    } else if !min_exclusive && value < min {
        add(
            errors,
            name,
            format!("must be greater than or equal to {}", trim_float(min)),
        );
    } else if value > max {
        add(
            errors,
            name,
            format!("must be less than or equal to {}", trim_float(max)),
        );
    }
}

fn trim_float(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.1}")
    } else {
        value.to_string()
    }
}

fn flag(body: &Map<String, Value>, name: &str) -> bool {
    matches!(body.get(name), Some(Value::Bool(true)))
        || matches!(body.get(name), Some(Value::String(s)) if s == "true")
}

fn present(body: &Map<String, Value>, name: &str) -> bool {
    match body.get(name) {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.trim().is_empty(),
        Some(_) => true,
    }
}

/// `command_line_arguments` as Judge0 runs them: `$&;<>|` and backquotes
/// removed, then split like a shell splits words (quotes group, backslash
/// escapes).
pub(super) fn split_arguments(text: &str) -> Vec<String> {
    let cleaned: String = text.chars().filter(|c| !"$&;<>|`".contains(*c)).collect();
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = cleaned.trim().chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                    in_word = true;
                }
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

fn encode(bytes: Vec<u8>) -> (String, Encoding) {
    match String::from_utf8(bytes) {
        Ok(text) => (text, Encoding::Utf8),
        Err(error) => (STANDARD.encode(error.into_bytes()), Encoding::Base64),
    }
}

/// A submission as a job and the record kept beside it, or Judge0's
/// validation errors (every field's, as Judge0 answers them all at once).
pub(super) fn submission_job(
    body: &Map<String, Value>,
    base64: bool,
    catalog: &LanguageCatalog,
    policy: &LimitPolicy,
) -> Result<(JobSpec, Judge0Record), FieldErrors> {
    let mut errors = FieldErrors::new();
    let source = text_field(body, "source_code", base64, &mut errors);
    let stdin = text_field(body, "stdin", base64, &mut errors);
    let expected = text_field(body, "expected_output", base64, &mut errors);
    if source.as_ref().is_none_or(|s| s.is_empty()) && !errors.contains_key("source_code") {
        add(&mut errors, "source_code", "can't be blank");
    }
    let language_id = language_id(body, catalog, &mut errors);
    let asked = asked_limits(body, &policy.maximum, &mut errors);
    refuse_unsupported(body, &mut errors);
    let arguments = arguments(body, &mut errors);
    let (Some(language_id), Some(source), true) = (language_id, source, errors.is_empty()) else {
        return Err(errors);
    };
    let language = language_for(language_id, catalog).ok_or_else(FieldErrors::new)?;
    let (limits, record) = job_limits(&asked, language, policy);
    let record = Judge0Record {
        language_id,
        expected_output: expected.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        command_line_arguments: arguments.clone(),
        ..record
    };
    let spec = job_spec(language, source, stdin, arguments.as_deref(), limits);
    Ok((spec, record))
}

/// `language_id`: the Judge0 id (a number, or a string of one) of a
/// language this server has.
fn language_id(
    body: &Map<String, Value>,
    catalog: &LanguageCatalog,
    errors: &mut FieldErrors,
) -> Option<u32> {
    let value = match body.get("language_id") {
        None | Some(Value::Null) => {
            add(errors, "language_id", "can't be blank");
            return None;
        }
        Some(value) => value,
    };
    let id = value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()));
    match id.and_then(|id| u32::try_from(id).ok()) {
        Some(id) if language_for(id, catalog).is_some() => Some(id),
        _ => {
            let shown = value
                .as_str()
                .map_or_else(|| value.to_string(), String::from);
            add(
                errors,
                "language_id",
                format!("language with id {shown} doesn't exist"),
            );
            None
        }
    }
}

/// The limits a submission asks for, in Judge0's units (seconds, KB).
#[derive(Debug, Clone, Copy, Default)]
struct AskedLimits {
    cpu: Option<f64>,
    extra: Option<f64>,
    wall: Option<f64>,
    memory: Option<f64>,
    stack: Option<f64>,
    pids: Option<f64>,
    file_size: Option<f64>,
}

/// The limit fields, each a number within Judge0's bounds and this
/// server's `max` (`number_of_runs` is checked and has no other use: a job
/// runs once).
fn asked_limits(body: &Map<String, Value>, max: &Limits, errors: &mut FieldErrors) -> AskedLimits {
    let seconds = |ms: u64| ms as f64 / 1000.0;
    let max_kb = |mb: u64| (mb * 1024) as f64;
    let mut field = |name: &str, min: f64, min_exclusive: bool, max: f64| {
        let value = number(body, name, errors);
        if let Some(value) = value {
            within(errors, name, value, min, min_exclusive, max);
        }
        value
    };
    field("number_of_runs", 0.0, true, 1.0);
    AskedLimits {
        cpu: field("cpu_time_limit", 0.0, false, seconds(max.cpu_ms)),
        extra: field("cpu_extra_time", 0.0, false, 5.0),
        wall: field("wall_time_limit", 1.0, false, seconds(max.wall_ms)),
        memory: field("memory_limit", 2048.0, false, max_kb(max.memory_mb)),
        stack: field("stack_limit", 0.0, false, max_kb(max.memory_mb)),
        pids: field("max_processes_and_or_threads", 0.0, true, max.pids as f64),
        file_size: field("max_file_size", 0.0, false, max_kb(max.disk_mb)),
    }
}

/// Judge0's options this server does not offer, refused in Judge0's words
/// when a submission turns them on or sets them.
fn refuse_unsupported(body: &Map<String, Value>, errors: &mut FieldErrors) {
    const ENABLED: [(&str, &str); 4] = [
        (
            "enable_per_process_and_thread_time_limit",
            "this option cannot be enabled",
        ),
        (
            "enable_per_process_and_thread_memory_limit",
            "this option cannot be enabled",
        ),
        ("enable_network", "enabling network is not allowed"),
        (
            "redirect_stderr_to_stdout",
            "redirecting stderr to stdout is not supported",
        ),
    ];
    const SET: [(&str, &str); 3] = [
        (
            "compiler_options",
            "setting compiler options is not allowed",
        ),
        ("callback_url", "setting callback is not allowed"),
        (
            "additional_files",
            "setting additional files is not allowed",
        ),
    ];
    for (field, message) in ENABLED {
        if flag(body, field) {
            add(errors, field, message);
        }
    }
    for (field, message) in SET {
        if present(body, field) {
            add(errors, field, message);
        }
    }
}

/// `command_line_arguments`: a string of at most [`MAX_ARGUMENTS_CHARS`].
fn arguments(body: &Map<String, Value>, errors: &mut FieldErrors) -> Option<String> {
    match body.get("command_line_arguments") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => {
            if text.chars().count() > MAX_ARGUMENTS_CHARS {
                add(
                    errors,
                    "command_line_arguments",
                    format!("is too long (maximum is {MAX_ARGUMENTS_CHARS} characters)"),
                );
            }
            Some(text.clone())
        }
        Some(_) => {
            add(errors, "command_line_arguments", "is not a string");
            None
        }
    }
}

/// The job's limits for what was asked, and Judge0's record of them (its
/// other fields left to the caller). Judge0's CPU extra time is a grace
/// before the kill, so the job's CPU limit is both; the verdict still
/// compares with `cpu_time_limit` (see the view).
fn job_limits(
    asked: &AskedLimits,
    language: &Language,
    policy: &LimitPolicy,
) -> (LimitsRequest, Judge0Record) {
    let seconds = |ms: u64| ms as f64 / 1000.0;
    let ms = |s: f64| (s * 1000.0).ceil() as u64;
    let defaults = language.limits.with_defaults(policy.defaults);
    let cpu_limit = asked.cpu.unwrap_or(seconds(defaults.cpu_ms));
    let extra = asked.extra.unwrap_or(0.0);
    let cpu_with_extra = ms(cpu_limit + extra).min(policy.maximum.cpu_ms).max(1);
    let limits = LimitsRequest {
        cpu_ms: Some(cpu_with_extra),
        wall_ms: asked.wall.map(ms),
        memory_mb: asked.memory.map(|kb| (kb as u64).div_ceil(1024)),
        pids: asked.pids.map(|p| p as u64),
        disk_mb: asked.file_size.map(|kb| (kb as u64).div_ceil(1024).max(1)),
        ..Default::default()
    };
    let resolved = limits.with_defaults(defaults);
    let record = Judge0Record {
        cpu_time_limit: cpu_limit,
        cpu_extra_time: extra,
        wall_time_limit: seconds(resolved.wall_ms),
        memory_limit: resolved.memory_mb * 1024,
        stack_limit: asked.stack.map_or(0, |s| s as u64),
        max_processes_and_or_threads: resolved.pids,
        max_file_size: resolved.disk_mb * 1024,
        ..Judge0Record::default()
    };
    (limits, record)
}

/// The job: the source as the language's one file, stdin, the arguments
/// split as Judge0's shell splits them, and `via: judge0` in its metadata.
fn job_spec(
    language: &Language,
    source: Vec<u8>,
    stdin: Option<Vec<u8>>,
    arguments: Option<&str>,
    limits: LimitsRequest,
) -> JobSpec {
    let (content, encoding) = encode(source);
    let (stdin, stdin_encoding) = encode(stdin.unwrap_or_default());
    let mut metadata = Map::new();
    metadata.insert("via".into(), "judge0".into());
    JobSpec {
        language: language.id.clone(),
        files: vec![FileSpec {
            name: language.source_file.clone(),
            content,
            encoding,
            reference: None,
        }],
        stdin,
        stdin_encoding,
        args: arguments.map(split_arguments).unwrap_or_default(),
        limits,
        metadata,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(body: Value) -> Result<(JobSpec, Judge0Record), FieldErrors> {
        submission_job(
            body.as_object().unwrap(),
            false,
            &LanguageCatalog::embedded().unwrap(),
            &LimitPolicy::default(),
        )
    }

    #[test]
    fn arguments_split_like_judge0s_shell() {
        assert_eq!(
            split_arguments("a  'b c' \"d\\\"e\" f\\ g"),
            ["a", "b c", "d\"e", "f g"]
        );
        assert_eq!(
            split_arguments("x; rm -rf / | y"),
            ["x", "rm", "-rf", "/", "y"]
        );
        assert!(split_arguments("  ").is_empty());
    }

    #[test]
    fn a_submission_becomes_a_job() {
        let (spec, record) = job(json!({
            "source_code": "print(input())", "language_id": 71, "stdin": "x",
            "cpu_time_limit": 2, "cpu_extra_time": 0.5, "memory_limit": 100000,
            "command_line_arguments": "1 '2 3'", "expected_output": "x\n"
        }))
        .unwrap();
        assert_eq!(spec.language, "python");
        assert_eq!(spec.files[0].name, "main.py");
        assert_eq!(spec.args, ["1", "2 3"]);
        assert_eq!(spec.limits.cpu_ms, Some(2500));
        assert_eq!(spec.limits.memory_mb, Some(98));
        assert_eq!(
            (record.cpu_time_limit, record.memory_limit),
            (2.0, 98 * 1024)
        );
        assert_eq!(record.expected_output.as_deref(), Some("x\n"));
    }

    #[test]
    fn refusals_are_judge0s_field_errors() {
        let errors = job(json!({"language_id": 9999, "cpu_time_limit": 1000,
            "callback_url": "http://x", "enable_network": true, "number_of_runs": 3}))
        .unwrap_err();
        assert_eq!(errors["source_code"], ["can't be blank"]);
        assert_eq!(
            errors["language_id"],
            ["language with id 9999 doesn't exist"]
        );
        assert_eq!(
            errors["cpu_time_limit"],
            ["must be less than or equal to 300.0"]
        );
        assert_eq!(errors["callback_url"], ["setting callback is not allowed"]);
        assert_eq!(
            errors["enable_network"],
            ["enabling network is not allowed"]
        );
        assert_eq!(
            errors["number_of_runs"],
            ["must be less than or equal to 1.0"]
        );
    }
}
