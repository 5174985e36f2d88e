//! The checks of a job's files, entry, stdin, arguments and environment; each refusal names its field.

use std::collections::{BTreeMap, HashSet};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::limits::{LimitPolicy, Limits};
use super::{Encoding, InvalidJob, JobSpec};
use crate::languages::Language;
use crate::protocol::BundleFile;

const MAX_NAME_BYTES: usize = 255;
const MAX_PATH_DEPTH: usize = 16;
const MAX_ARGS: usize = 64;
const MAX_ARG_BYTES: usize = 4096;
const MAX_ENV: usize = 64;

/// Checks a file name: relative, no `..` or `.` parts, no empty parts, no
/// control characters (a newline, a tab or an escape in a name would forge
/// lines of a listing or a terminal's output), sane length.
pub fn check_file_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("file name is empty".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!("file name is longer than {MAX_NAME_BYTES} bytes"));
    }
    if name.starts_with('/') {
        return Err(format!("{name:?} is absolute; file names must be relative"));
    }
    if name.contains('\0') || name.contains('\\') {
        return Err(format!("{name:?} contains a NUL or backslash"));
    }
    if let Some(bad) = name.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{name:?} contains the control character {bad:?}; file names must be printable"
        ));
    }
    let parts: Vec<&str> = name.split('/').collect();
    if parts.len() > MAX_PATH_DEPTH {
        return Err(format!("{name:?} is nested deeper than {MAX_PATH_DEPTH}"));
    }
    for part in parts {
        match part {
            ".." => return Err(format!("{name:?} contains \"..\"")),
            "." | "" => return Err(format!("{name:?} has an empty or \".\" part")),
            _ => {}
        }
    }
    Ok(())
}

pub(super) fn decode_files(
    spec: &JobSpec,
    policy: &LimitPolicy,
    limits: &Limits,
) -> Result<Vec<BundleFile>, InvalidJob> {
    if spec.files.is_empty() {
        return Err(InvalidJob::new("files", "at least one file is required"));
    }
    if spec.files.len() > policy.max_files {
        return Err(InvalidJob::new(
            "files",
            format!(
                "{} files is more than the limit of {}",
                spec.files.len(),
                policy.max_files
            ),
        ));
    }
    // A file named by reference is empty here: the API counts its stored
    // size, the worker gives it its bytes before it prepares the job.
    super::refs::references(spec)?;
    let mut names = HashSet::new();
    let mut total: u64 = 0;
    let mut files = Vec::with_capacity(spec.files.len());
    for (index, file) in spec.files.iter().enumerate() {
        let field = format!("files[{index}].name");
        check_file_name(&file.name).map_err(|m| InvalidJob::new(&field, m))?;
        if !names.insert(file.name.as_str()) {
            return Err(InvalidJob::new(
                field,
                format!("duplicate file name {:?}", file.name),
            ));
        }
        let content = match file.encoding {
            _ if file.reference.is_some() => Vec::new(),
            Encoding::Utf8 => file.content.as_bytes().to_vec(),
            Encoding::Base64 => STANDARD.decode(&file.content).map_err(|e| {
                InvalidJob::new(
                    format!("files[{index}].content"),
                    format!("invalid base64: {}", base64_error(&e)),
                )
            })?,
        };
        total += content.len() as u64;
        if total > limits.files_bytes {
            return Err(InvalidJob::new(
                "files",
                format!(
                    "files total more than {} bytes (limits.files_bytes)",
                    limits.files_bytes
                ),
            ));
        }
        files.push(BundleFile {
            path: file.name.clone(),
            content,
            executable: false,
        });
    }
    // A file and a directory of the same name cannot both exist.
    for name in &names {
        let mut prefix = String::new();
        for part in name.split('/').take(name.split('/').count() - 1) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if names.contains(prefix.as_str()) {
                return Err(InvalidJob::new(
                    "files",
                    format!("{prefix:?} is both a file and the directory of {name:?}"),
                ));
            }
        }
    }
    Ok(files)
}

pub(super) fn choose_entry(
    spec: &JobSpec,
    language: &Language,
    files: &[BundleFile],
) -> Result<String, InvalidJob> {
    match &spec.entry {
        Some(entry) => {
            if files.iter().any(|f| &f.path == entry) {
                Ok(entry.clone())
            } else {
                Err(InvalidJob::new(
                    "entry",
                    format!("{entry:?} is not one of the files"),
                ))
            }
        }
        None => Ok(files
            .iter()
            .find(|f| f.path == language.source_file)
            .unwrap_or(&files[0])
            .path
            .clone()),
    }
}

/// The base64 crate's message in this project's style (lowercase, no period).
fn base64_error(error: &base64::DecodeError) -> String {
    let text = error.to_string();
    let mut chars = text.trim_end_matches('.').chars();
    chars
        .next()
        .map(|first| first.to_lowercase().chain(chars).collect())
        .unwrap_or_default()
}

pub(super) fn decode_stdin(spec: &JobSpec, policy: &LimitPolicy) -> Result<Vec<u8>, InvalidJob> {
    let stdin = match spec.stdin_encoding {
        Encoding::Utf8 => spec.stdin.as_bytes().to_vec(),
        Encoding::Base64 => STANDARD.decode(&spec.stdin).map_err(|e| {
            InvalidJob::new("stdin", format!("invalid base64: {}", base64_error(&e)))
        })?,
    };
    if stdin.len() > policy.max_stdin_bytes {
        return Err(InvalidJob::new(
            "stdin",
            format!(
                "{} bytes is more than the limit of {}",
                stdin.len(),
                policy.max_stdin_bytes
            ),
        ));
    }
    Ok(stdin)
}

/// Checks the arguments of `field` (`args`, `compile_args`,
/// `interpreter_args`): at most [`MAX_ARGS`], each at most
/// [`MAX_ARG_BYTES`] with no NUL.
pub(super) fn check_args(field: &str, args: &[String]) -> Result<(), InvalidJob> {
    if args.len() > MAX_ARGS {
        return Err(InvalidJob::new(
            field,
            format!("{} arguments is more than {MAX_ARGS}", args.len()),
        ));
    }
    for (index, arg) in args.iter().enumerate() {
        if arg.len() > MAX_ARG_BYTES || arg.contains('\0') {
            return Err(InvalidJob::new(
                format!("{field}[{index}]"),
                format!("must be at most {MAX_ARG_BYTES} bytes with no NUL"),
            ));
        }
    }
    Ok(())
}

pub(super) fn check_env(env: &BTreeMap<String, String>) -> Result<(), InvalidJob> {
    if env.len() > MAX_ENV {
        return Err(InvalidJob::new(
            "env",
            format!("{} variables is more than {MAX_ENV}", env.len()),
        ));
    }
    for (name, value) in env {
        let valid_name = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(InvalidJob::new(
                format!("env.{name}"),
                "a variable name is letters, digits and _, not starting with a digit",
            ));
        }
        if value.len() > MAX_ARG_BYTES || value.contains('\0') {
            return Err(InvalidJob::new(
                format!("env.{name}"),
                format!("value must be at most {MAX_ARG_BYTES} bytes with no NUL"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::prepare;
    use crate::job::tests::{refuse, spec};
    use crate::languages::LanguageCatalog;

    #[test]
    fn bad_names_are_refused_with_the_field() {
        assert_eq!(
            refuse(&spec("python", &[("/etc/x", "")])).field,
            "files[0].name"
        );
        let error = refuse(&spec("python", &[("a.py", ""), ("../x", "")]));
        assert_eq!(error.field, "files[1].name");
        assert_eq!(error.message, "\"../x\" contains \"..\"");
        let error = refuse(&spec("python", &[("a.py", ""), ("a.py", "")]));
        assert_eq!(error.message, "duplicate file name \"a.py\"");
        assert_eq!(
            refuse(&spec("python", &[("a", ""), ("a/b.py", "")])).field,
            "files"
        );
        assert_eq!(
            refuse(&spec("python", &[("a//b", "")])).field,
            "files[0].name"
        );
        // Control characters, C0 and C1 and DEL, anywhere in the name.
        for (name, shown) in [
            ("a\nb.py", "'\\n'"),
            ("tab\t.py", "'\\t'"),
            ("\u{1b}[31mred.py", "'\\u{1b}'"),
            ("del\u{7f}.py", "'\\u{7f}'"),
            ("dir/c1\u{85}.py", "'\\u{85}'"),
        ] {
            let error = refuse(&spec("python", &[("main.py", ""), (name, "")]));
            assert_eq!(error.field, "files[1].name", "{name:?}");
            assert_eq!(
                error.message,
                format!(
                    "{name:?} contains the control character {shown}; file names must be printable"
                )
            );
        }
        // Printable characters beyond ASCII stay allowed.
        check_file_name("données/résumé é.py").unwrap();
    }

    #[test]
    fn entry_defaults_to_the_source_file_then_the_first_file() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let policy = LimitPolicy::default();
        let job = prepare(
            &spec("python", &[("lib.py", ""), ("main.py", "")]),
            &catalog,
            &policy,
        )
        .unwrap();
        assert_eq!(job.bundle.stages[0].argv, ["python3", "-u", "main.py"]);
        let job = prepare(&spec("python", &[("x/prog.py", "")]), &catalog, &policy).unwrap();
        assert_eq!(job.bundle.stages[0].argv, ["python3", "-u", "x/prog.py"]);
        let mut s = spec("python", &[("a.py", "")]);
        s.entry = Some("b.py".into());
        assert_eq!(refuse(&s).field, "entry");
    }

    #[test]
    fn invalid_base64_names_the_file() {
        let mut s = spec("python", &[("a.py", "!!!")]);
        s.files[0].encoding = Encoding::Base64;
        let error = refuse(&s);
        assert_eq!(error.field, "files[0].content");
        assert!(error.message.starts_with("invalid base64"));
    }

    #[test]
    fn env_names_are_checked() {
        let mut s = spec("python", &[("a.py", "")]);
        s.env.insert("1BAD".into(), "x".into());
        assert_eq!(refuse(&s).field, "env.1BAD");
    }
}
