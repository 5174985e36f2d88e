//! A Judge0 submission request (`app/models/submission.rb` of Judge0 CE
//! 1.13.1), checked the way Judge0 checks it, as an ordinary job. Refusals
//! are Judge0's validation errors: `{"<field>": ["<message>"]}` (422).

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::languages::language_for;
use crate::job::limits::{LimitPolicy, LimitsRequest};
use crate::job::{Encoding, FileSpec, JobSpec};
use crate::languages::LanguageCatalog;

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
/// validation errors.
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
    let language_id = match body.get("language_id") {
        None | Some(Value::Null) => {
            add(&mut errors, "language_id", "can't be blank");
            None
        }
        Some(value) => {
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
                        &mut errors,
                        "language_id",
                        format!("language with id {shown} doesn't exist"),
                    );
                    None
                }
            }
        }
    };

    // Limits, in Judge0's units (seconds, KB), within this server's maximum.
    let max = policy.maximum;
    let seconds = |ms: u64| ms as f64 / 1000.0;
    let runs = number(body, "number_of_runs", &mut errors);
    if let Some(runs) = runs {
        within(&mut errors, "number_of_runs", runs, 0.0, true, 1.0);
    }
    let cpu = number(body, "cpu_time_limit", &mut errors);
    let extra = number(body, "cpu_extra_time", &mut errors);
    if let Some(cpu) = cpu {
        within(
            &mut errors,
            "cpu_time_limit",
            cpu,
            0.0,
            false,
            seconds(max.cpu_ms),
        );
    }
    if let Some(extra) = extra {
        within(&mut errors, "cpu_extra_time", extra, 0.0, false, 5.0);
    }
    let wall = number(body, "wall_time_limit", &mut errors);
    if let Some(wall) = wall {
        within(
            &mut errors,
            "wall_time_limit",
            wall,
            1.0,
            false,
            seconds(max.wall_ms),
        );
    }
    let memory = number(body, "memory_limit", &mut errors);
    if let Some(memory) = memory {
        within(
            &mut errors,
            "memory_limit",
            memory,
            2048.0,
            false,
            (max.memory_mb * 1024) as f64,
        );
    }
    let stack = number(body, "stack_limit", &mut errors);
    if let Some(stack) = stack {
        within(
            &mut errors,
            "stack_limit",
            stack,
            0.0,
            false,
            (max.memory_mb * 1024) as f64,
        );
    }
    let pids = number(body, "max_processes_and_or_threads", &mut errors);
    if let Some(pids) = pids {
        within(
            &mut errors,
            "max_processes_and_or_threads",
            pids,
            0.0,
            true,
            max.pids as f64,
        );
    }
    let file_size = number(body, "max_file_size", &mut errors);
    if let Some(size) = file_size {
        within(
            &mut errors,
            "max_file_size",
            size,
            0.0,
            false,
            (max.disk_mb * 1024) as f64,
        );
    }
    for (field, message) in [
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
    ] {
        if flag(body, field) {
            add(&mut errors, field, message);
        }
    }
    for (field, message) in [
        (
            "compiler_options",
            "setting compiler options is not allowed",
        ),
        ("callback_url", "setting callback is not allowed"),
        (
            "additional_files",
            "setting additional files is not allowed",
        ),
    ] {
        if present(body, field) {
            add(&mut errors, field, message);
        }
    }
    let arguments = match body.get("command_line_arguments") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => {
            if text.chars().count() > MAX_ARGUMENTS_CHARS {
                add(
                    &mut errors,
                    "command_line_arguments",
                    format!("is too long (maximum is {MAX_ARGUMENTS_CHARS} characters)"),
                );
            }
            Some(text.clone())
        }
        Some(_) => {
            add(&mut errors, "command_line_arguments", "is not a string");
            None
        }
    };
    let (Some(language_id), Some(source), true) = (language_id, source, errors.is_empty()) else {
        return Err(errors);
    };
    let language = language_for(language_id, catalog).ok_or_else(FieldErrors::new)?;

    // Judge0's CPU extra time is a grace before the kill; the verdict still
    // compares with cpu_time_limit (see the view).
    let defaults = language.limits.with_defaults(policy.defaults);
    let cpu_limit = cpu.unwrap_or(seconds(defaults.cpu_ms));
    let extra = extra.unwrap_or(0.0);
    let ms = |s: f64| (s * 1000.0).ceil() as u64;
    let cpu_with_extra = ms(cpu_limit + extra).min(max.cpu_ms).max(1);
    let limits = LimitsRequest {
        cpu_ms: Some(cpu_with_extra),
        wall_ms: wall.map(ms),
        memory_mb: memory.map(|kb| (kb as u64).div_ceil(1024)),
        pids: pids.map(|p| p as u64),
        disk_mb: file_size.map(|kb| (kb as u64).div_ceil(1024).max(1)),
        ..Default::default()
    };
    let resolved = limits.with_defaults(defaults);
    let record = Judge0Record {
        language_id,
        expected_output: expected.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        cpu_time_limit: cpu_limit,
        cpu_extra_time: extra,
        wall_time_limit: seconds(resolved.wall_ms),
        memory_limit: resolved.memory_mb * 1024,
        stack_limit: stack.map_or(0, |s| s as u64),
        max_processes_and_or_threads: resolved.pids,
        max_file_size: resolved.disk_mb * 1024,
        command_line_arguments: arguments.clone(),
    };
    let (content, encoding) = encode(source);
    let (stdin, stdin_encoding) = encode(stdin.unwrap_or_default());
    let mut metadata = Map::new();
    metadata.insert("via".into(), "judge0".into());
    let spec = JobSpec {
        language: language.id.clone(),
        files: vec![FileSpec {
            name: language.source_file.clone(),
            content,
            encoding,
        }],
        stdin,
        stdin_encoding,
        args: arguments
            .as_deref()
            .map(split_arguments)
            .unwrap_or_default(),
        limits,
        metadata,
        ..Default::default()
    };
    Ok((spec, record))
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
