//! Piston's request (`/execute`'s body, `/connect`'s `init`) as a job,
//! checked the way Piston's `get_job` checks it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

use super::super::semver3;
use super::PISTON_NAMES;
use crate::api::ApiState;
use crate::job::limits::{CompileLimitsRequest, LimitPolicy, LimitsRequest};
use crate::job::{Encoding, FileSpec, JobSpec};
use crate::languages::{Language, LanguageCatalog};

/// Whether a version selector (`*`, `3`, `3.x`, `3.11.0`, `^3.10.0`,
/// `~3.11.0`, `>=3.8.0`) accepts a three-part version. Piston uses node's
/// semver; this covers the selectors its clients send.
fn version_matches(selector: &str, version: &str) -> bool {
    let number = |text: &str| -> Vec<u64> {
        text.split('.')
            .map(|p| p.parse::<u64>().unwrap_or(0))
            .chain(std::iter::repeat(0))
            .take(3)
            .collect()
    };
    let have = number(version);
    let selector = selector.trim();
    if let Some(rest) = selector.strip_prefix(">=") {
        return have >= number(rest.trim());
    }
    if let Some(rest) = selector.strip_prefix('^') {
        let want = number(rest);
        return have[0] == want[0] && have >= want;
    }
    if let Some(rest) = selector.strip_prefix('~') {
        let want = number(rest);
        return have[..2] == want[..2] && have >= want;
    }
    let selector = selector.trim_start_matches(['=', 'v']);
    if selector.is_empty() {
        return true;
    }
    selector.split('.').zip(&have).all(|(part, have)| {
        matches!(part, "*" | "x" | "X") || part.parse::<u64>().ok() == Some(*have)
    })
}

/// A request of `/execute` or `/connect`'s `init`, checked the way Piston's
/// `get_job` checks it, as a job. The first problem found is the answer, in
/// Piston's order: the runtime and the files, the limits, the files'
/// contents, the arguments, stdin.
pub(super) fn piston_job(
    body: &Map<String, Value>,
    catalog: &LanguageCatalog,
    state: &ApiState,
    interactive: bool,
) -> Result<(JobSpec, Language), String> {
    let (found, files) = runtime(body, catalog)?;
    let (limits, compile_limits) =
        piston_limits(body, &state.inner.policy, found.compile.is_some())?;
    let (spec_files, entry) = spec_files(files, &found)?;
    let args = match body.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(args)) => args
            .iter()
            .map(|a| match a {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        Some(_) => return Err("args must be an array".into()),
    };
    let mut stdin = match body.get("stdin") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("stdin must be a string".into()),
    };
    // Piston ends stdin with a newline when it has none.
    if !interactive && !stdin.ends_with('\n') {
        stdin.push('\n');
    }
    let mut metadata = Map::new();
    metadata.insert("via".into(), "piston".into());
    let spec = JobSpec {
        language: found.id.clone(),
        files: spec_files,
        entry,
        stdin,
        args,
        interactive,
        limits,
        compile_limits,
        metadata,
        ..Default::default()
    };
    Ok((spec, found))
}

/// The language and version asked for, as one of ours (by id or by
/// Piston's name, of a version the selector accepts), and the files, each
/// with a string `content` and at least one of them UTF-8.
fn runtime<'a>(
    body: &'a Map<String, Value>,
    catalog: &LanguageCatalog,
) -> Result<(Language, &'a Vec<Value>), String> {
    let language = body
        .get("language")
        .and_then(Value::as_str)
        .filter(|l| !l.is_empty())
        .ok_or("language is required as a string")?;
    let version = body
        .get("version")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        .ok_or("version is required as a string")?;
    let files = body
        .get("files")
        .and_then(Value::as_array)
        .ok_or("files is required as an array")?;
    for (index, file) in files.iter().enumerate() {
        if !file.get("content").is_some_and(Value::is_string) {
            return Err(format!("files[{index}].content is required as a string"));
        }
    }
    let found = catalog
        .find(language)
        .or_else(|| {
            PISTON_NAMES
                .iter()
                .find(|(_, name, _)| *name == language)
                .and_then(|(id, _, _)| catalog.find(id))
        })
        .filter(|l| version_matches(version, &semver3(&l.version)))
        .ok_or_else(|| format!("{language}-{version} runtime is unknown"))?
        .clone();
    if !files
        .iter()
        .any(|f| matches!(encoding_of(f), None | Some("utf8")))
    {
        return Err("files must include at least one utf8 encoded file".into());
    }
    Ok((found, files))
}

/// Piston's limits (`{compile,run}_{timeout,cpu_time,memory_limit}`, in ms
/// and bytes), each checked against this server's maximum, as the job's.
/// A language without a compile stage ignores the compile limits, as
/// Piston does; one container holds both stages, so it gets the larger
/// memory limit.
fn piston_limits(
    body: &Map<String, Value>,
    policy: &LimitPolicy,
    compiled: bool,
) -> Result<(LimitsRequest, CompileLimitsRequest), String> {
    let mut limits = LimitsRequest::default();
    let mut compile_limits = CompileLimitsRequest::default();
    let mut memory_bytes: Option<u64> = None;
    for stage in ["compile", "run"] {
        for constraint in ["timeout", "cpu_time", "memory_limit"] {
            let maximum = match (stage, constraint) {
                ("compile", "timeout") => policy.compile_maximum.wall_ms,
                ("compile", "cpu_time") => policy.compile_maximum.cpu_ms,
                ("run", "timeout") => policy.maximum.wall_ms,
                ("run", "cpu_time") => policy.maximum.cpu_ms,
                _ => policy.maximum.memory_mb * 1024 * 1024,
            };
            let name = format!("{stage}_{constraint}");
            let Some(value) = limit_value(body, &name, maximum)? else {
                continue;
            };
            match (stage, constraint) {
                ("compile", "timeout") if compiled => compile_limits.wall_ms = Some(value),
                ("compile", "cpu_time") if compiled => compile_limits.cpu_ms = Some(value),
                ("run", "timeout") => limits.wall_ms = Some(value),
                ("run", "cpu_time") => limits.cpu_ms = Some(value),
                (_, "memory_limit") => {
                    memory_bytes = Some(memory_bytes.map_or(value, |m| m.max(value)));
                }
                _ => {}
            }
        }
    }
    limits.memory_mb = memory_bytes.map(|bytes| bytes.div_ceil(1024 * 1024).max(1));
    Ok((limits, compile_limits))
}

/// The limit `name` of the request, within `maximum`; `None` when it is
/// not given (absent, null, or Piston's 0 "not given" and -1 "no limit":
/// ours is then the default).
fn limit_value(body: &Map<String, Value>, name: &str, maximum: u64) -> Result<Option<u64>, String> {
    let Some(value) = body.get(name).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(number) = value.as_f64() else {
        return Err(format!("If specified, {name} must be a number"));
    };
    if number == 0.0 || number == -1.0 {
        return Ok(None);
    }
    if number > maximum as f64 {
        return Err(format!(
            "{name} cannot exceed the configured limit of {maximum}"
        ));
    }
    if number < 0.0 {
        return Err(format!("{name} must be non-negative"));
    }
    Ok(Some(number.ceil() as u64))
}

/// The job's files (hex contents as base64; a nameless first file named
/// for the language, others `file<n>.code`) and its entry: Piston runs the
/// first UTF-8 file.
fn spec_files(
    files: &[Value],
    language: &Language,
) -> Result<(Vec<FileSpec>, Option<String>), String> {
    let mut spec_files = Vec::with_capacity(files.len());
    for (index, file) in files.iter().enumerate() {
        let content = file.get("content").and_then(Value::as_str).unwrap_or("");
        let (content, encoding) = match encoding_of(file) {
            Some("base64") => (content.to_string(), Encoding::Base64),
            Some("hex") => {
                let bytes = hex::decode(content)
                    .map_err(|e| format!("files[{index}].content is not valid hex: {e}"))?;
                (STANDARD.encode(bytes), Encoding::Base64)
            }
            _ => (content.to_string(), Encoding::Utf8),
        };
        let name = match file.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => name.to_string(),
            _ if index == 0 => default_entry_name(language, &content),
            _ => format!("file{index}.code"),
        };
        spec_files.push(FileSpec {
            name,
            content,
            encoding,
            reference: None,
        });
    }
    let entry = files
        .iter()
        .position(|f| matches!(encoding_of(f), None | Some("utf8")))
        .map(|i| spec_files[i].name.clone());
    Ok((spec_files, entry))
}

/// A Piston file's `encoding` (absent: utf8).
fn encoding_of(file: &Value) -> Option<&str> {
    file.get("encoding").and_then(Value::as_str)
}

/// The name of a nameless first file: the language's entry file name; for
/// Java, the public class's file (Piston runs Java with the single-file
/// launcher, which takes any class name).
fn default_entry_name(language: &Language, content: &str) -> String {
    if language.id == "java" {
        let mut words = content.split_whitespace().peekable();
        while let Some(word) = words.next() {
            if word == "public"
                && words.peek() == Some(&"class")
                && let Some(name) = words.nth(1)
            {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                    .collect();
                if !name.is_empty() {
                    return format!("{name}.java");
                }
            }
        }
    }
    language.source_file.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_selectors_match_like_piston() {
        assert!(version_matches("*", "3.11.0"));
        assert!(version_matches("3", "3.11.0"));
        assert!(version_matches("3.x", "3.11.0"));
        assert!(version_matches("3.11", "3.11.0"));
        assert!(version_matches("3.11.0", "3.11.0"));
        assert!(!version_matches("3.10.0", "3.11.0"));
        assert!(!version_matches("2", "3.11.0"));
        assert!(version_matches("^3.8.0", "3.11.0"));
        assert!(!version_matches("^4.0.0", "3.11.0"));
        assert!(version_matches("~3.11.0", "3.11.0"));
        assert!(!version_matches("~3.10.0", "3.11.0"));
        assert!(version_matches(">=3.0.0", "3.11.0"));
    }

    #[test]
    fn a_nameless_java_file_is_named_after_its_public_class() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let java = catalog.find("java").unwrap();
        assert_eq!(
            default_entry_name(java, "import x;\npublic class Hello {\n}"),
            "Hello.java"
        );
        assert_eq!(default_entry_name(java, "class Hidden {}"), "Main.java");
        let python = catalog.find("python").unwrap();
        assert_eq!(default_entry_name(python, "public class X"), "main.py");
    }
}
