//! The job as a client submits it, its validation, and the prepared form the
//! sandbox runs (DESIGN §3). Validation happens before any container exists;
//! every refusal names the field at fault.

pub mod carry;
pub mod events;
pub mod lifecycle;
pub mod limits;
pub mod result;

use std::collections::{BTreeMap, HashSet};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::languages::{Language, LanguageCatalog};
use crate::protocol::{Bundle, BundleFile, StageLimits, StageSpec};
use limits::{CompileLimits, CompileLimitsRequest, LimitPolicy, Limits, LimitsRequest};
pub use result::{Encoding, JobResult, Output, StageResult, StartKind, Status, Timings};

/// Where the job's files live inside the sandbox.
pub const WORKSPACE: &str = "/workspace";
/// The unprivileged uid and gid user code runs as (`nobody`/`nogroup`).
pub const SANDBOX_UID: u32 = 65534;
pub const SANDBOX_GID: u32 = 65534;

const MAX_NAME_BYTES: usize = 255;
const MAX_PATH_DEPTH: usize = 16;
const MAX_ARGS: usize = 64;
const MAX_ARG_BYTES: usize = 4096;
const MAX_ENV: usize = 64;
const MAX_METADATA_BYTES: usize = 4096;

/// A job as submitted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub language: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub files: Vec<FileSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    #[serde(default)]
    pub stdin: String,
    #[serde(default)]
    pub stdin_encoding: Encoding,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub interactive: bool,
    #[serde(default)]
    pub limits: LimitsRequest,
    #[serde(default)]
    pub compile_limits: CompileLimitsRequest,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Most times the job may be started (1–[`MAX_ATTEMPTS_LIMIT`]): a batch
    /// job whose worker is lost while it runs runs again until then. Unset:
    /// the server's `CODE_RUNNER_MAX_ATTEMPTS`. An interactive job runs once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
}

/// The most `max_attempts` a job or the server may ask for.
pub const MAX_ATTEMPTS_LIMIT: u32 = 10;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    pub name: String,
    pub content: String,
    #[serde(default)]
    pub encoding: Encoding,
}

/// A refused job: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidJob {
    pub field: String,
    pub message: String,
}

impl InvalidJob {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A validated job, ready for a sandbox.
#[derive(Debug, Clone)]
pub struct PreparedJob {
    pub language: Language,
    pub limits: Limits,
    pub compile_limits: Option<CompileLimits>,
    pub interactive: bool,
    /// Stdin given with the submission (delivered, then closed, unless interactive).
    pub stdin: Vec<u8>,
    /// What the job asked for (`None`: the server's default).
    pub max_attempts: Option<u32>,
    pub bundle: Bundle,
}

impl PreparedJob {
    /// Most times the job may be started, `default` unless it asked: an
    /// interactive job runs once.
    pub fn max_attempts(&self, default: u32) -> u32 {
        if self.interactive {
            1
        } else {
            self.max_attempts.unwrap_or(default)
        }
    }

    /// The output a job may leave at most: every stage's output limit.
    pub fn output_limit_bytes(&self) -> u64 {
        self.limits.output_bytes + self.compile_limits.map_or(0, |c| c.output_bytes)
    }

    /// The longest the job may take once its container is up: every stage's
    /// wall limit added together.
    pub fn stages_wall_ms(&self) -> u64 {
        self.bundle.stages.iter().map(|s| s.limits.wall_ms).sum()
    }
}

/// The limits of a job of `language` that asks for none: the language's
/// own defaults, then the server's, each capped at the server's maximum (a
/// language's wish yields to the operator's choice). A warm pool's sandboxes
/// are built for these.
pub fn default_limits(language: &Language, policy: &LimitPolicy) -> Limits {
    language
        .limits
        .with_defaults(policy.defaults)
        .capped_at(policy.maximum)
}

/// Validates `spec` against the catalog and the server's policy.
pub fn prepare(
    spec: &JobSpec,
    catalog: &LanguageCatalog,
    policy: &LimitPolicy,
) -> Result<PreparedJob, InvalidJob> {
    let language = catalog.find(&spec.language).ok_or_else(|| {
        InvalidJob::new(
            "language",
            format!(
                "unknown language {:?}; known: {}",
                spec.language,
                catalog.ids().join(", ")
            ),
        )
    })?;
    if let Some(version) = &spec.version
        && version != &language.version
    {
        return Err(InvalidJob::new(
            "version",
            format!(
                "{} {version:?} is not available; this server has {}",
                language.id, language.version
            ),
        ));
    }

    let limits = spec
        .limits
        .resolve("limits", default_limits(language, policy), policy.maximum)?;
    let compile_limits = match language.compile {
        Some(_) => Some(
            spec.compile_limits.resolve(
                "compile_limits",
                language
                    .compile_limits
                    .with_defaults(policy.compile_defaults)
                    .capped_at(policy.compile_maximum),
                policy.compile_maximum,
            )?,
        ),
        None => {
            if spec.compile_limits != CompileLimitsRequest::default() {
                return Err(InvalidJob::new(
                    "compile_limits",
                    format!("{} has no compile stage", language.id),
                ));
            }
            None
        }
    };

    let files = decode_files(spec, policy, &limits)?;
    let entry = choose_entry(spec, language, &files)?;
    let stdin = decode_stdin(spec, policy)?;
    check_args(&spec.args)?;
    check_env(&spec.env)?;
    let metadata_bytes = serde_json::to_vec(&spec.metadata).map_or(0, |v| v.len());
    if metadata_bytes > MAX_METADATA_BYTES {
        return Err(InvalidJob::new(
            "metadata",
            format!("{metadata_bytes} bytes is above the limit of {MAX_METADATA_BYTES}"),
        ));
    }

    if let Some(attempts) = spec.max_attempts {
        if !(1..=MAX_ATTEMPTS_LIMIT).contains(&attempts) {
            return Err(InvalidJob::new(
                "max_attempts",
                format!("{attempts} is not between 1 and {MAX_ATTEMPTS_LIMIT}"),
            ));
        }
        if spec.interactive && attempts > 1 {
            return Err(InvalidJob::new(
                "max_attempts",
                "an interactive job runs at most once (its input cannot be replayed)",
            ));
        }
    }

    let sources = source_files(language, &entry, &files);
    let stages = build_stages(
        spec,
        language,
        &entry,
        &sources,
        &limits,
        compile_limits.as_ref(),
    );
    Ok(PreparedJob {
        language: language.clone(),
        limits,
        compile_limits,
        interactive: spec.interactive,
        stdin,
        max_attempts: spec.max_attempts,
        bundle: Bundle {
            workspace: WORKSPACE.to_string(),
            uid: SANDBOX_UID,
            gid: SANDBOX_GID,
            files,
            stages,
        },
    })
}

/// Checks a file name: relative, no `..` or `.` parts, no empty parts, sane length.
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

fn decode_files(
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

fn choose_entry(
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

fn decode_stdin(spec: &JobSpec, policy: &LimitPolicy) -> Result<Vec<u8>, InvalidJob> {
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

fn check_args(args: &[String]) -> Result<(), InvalidJob> {
    if args.len() > MAX_ARGS {
        return Err(InvalidJob::new(
            "args",
            format!("{} arguments is more than {MAX_ARGS}", args.len()),
        ));
    }
    for (index, arg) in args.iter().enumerate() {
        if arg.len() > MAX_ARG_BYTES || arg.contains('\0') {
            return Err(InvalidJob::new(
                format!("args[{index}]"),
                format!("must be at most {MAX_ARG_BYTES} bytes with no NUL"),
            ));
        }
    }
    Ok(())
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), InvalidJob> {
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

/// The catalog's argv with its placeholders filled in (see
/// `runner-images/languages.toml`): `{entry}`, `{entry_stem}`,
/// `{entry_base}` (the entry's path without its extension),
/// `{entry_class}` (that path as a dotted class name, for the JVM), and
/// `{sources}`, an argument of its own that becomes every submitted file
/// with one of the language's extensions, the entry first.
fn expand(argv: &[String], entry: &str, sources: &[String]) -> Vec<String> {
    let file_name = entry.rsplit('/').next().unwrap_or(entry);
    let stem = file_name
        .rsplit_once('.')
        .map_or(file_name, |(stem, _)| stem);
    let base = &entry[..entry.len() - (file_name.len() - stem.len())];
    let class = base.replace('/', ".");
    let mut expanded = Vec::with_capacity(argv.len() + sources.len());
    for arg in argv {
        if arg == "{sources}" {
            expanded.extend(sources.iter().cloned());
            continue;
        }
        expanded.push(
            arg.replace("{entry}", entry)
                .replace("{entry_stem}", stem)
                .replace("{entry_base}", base)
                .replace("{entry_class}", &class),
        );
    }
    expanded
}

/// The files `{sources}` stands for: the entry, then every other file whose
/// extension is one of the language's, in the order given.
fn source_files(language: &Language, entry: &str, files: &[BundleFile]) -> Vec<String> {
    let is_source = |path: &str| {
        std::path::Path::new(path)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| language.extensions.contains(&e.to_lowercase()))
    };
    std::iter::once(entry.to_string())
        .chain(
            files
                .iter()
                .map(|f| f.path.clone())
                .filter(|p| p != entry && is_source(p)),
        )
        .collect()
}

fn build_stages(
    spec: &JobSpec,
    language: &Language,
    entry: &str,
    sources: &[String],
    limits: &Limits,
    compile_limits: Option<&CompileLimits>,
) -> Vec<StageSpec> {
    let mut env: BTreeMap<String, String> = BTreeMap::from([
        (
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        ),
        ("HOME".to_string(), "/tmp".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("TMPDIR".to_string(), "/tmp".to_string()),
    ]);
    env.extend(language.env.clone());
    env.extend(spec.env.clone());
    let env: Vec<(String, String)> = env.into_iter().collect();
    let fsize_bytes = limits.disk_mb * 1024 * 1024;
    let nofile = 256;

    let mut stages = Vec::new();
    if let (Some(compile), Some(compile_limits)) = (&language.compile, compile_limits) {
        stages.push(StageSpec {
            name: "compile".into(),
            argv: expand(compile, entry, sources),
            env: env.clone(),
            cwd: WORKSPACE.into(),
            stdin: false,
            limits: StageLimits {
                wall_ms: compile_limits.wall_ms,
                idle_ms: None,
                cpu_ms: compile_limits.cpu_ms,
                output_bytes: compile_limits.output_bytes,
                fsize_bytes,
                nofile,
                nproc: None,
                cpu_quota_millis: None,
            },
        });
    }
    let mut run = expand(&language.run, entry, sources);
    run.extend(spec.args.iter().cloned());
    stages.push(StageSpec {
        name: "run".into(),
        argv: run,
        env,
        cwd: WORKSPACE.into(),
        stdin: true,
        limits: StageLimits {
            wall_ms: limits.wall_ms,
            idle_ms: spec.interactive.then_some(limits.idle_ms),
            cpu_ms: limits.cpu_ms,
            output_bytes: limits.output_bytes,
            fsize_bytes,
            nofile,
            nproc: None,
            cpu_quota_millis: None,
        },
    });
    stages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(language: &str, files: &[(&str, &str)]) -> JobSpec {
        JobSpec {
            language: language.into(),
            files: files
                .iter()
                .map(|(name, content)| FileSpec {
                    name: name.to_string(),
                    content: content.to_string(),
                    encoding: Encoding::Utf8,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn refuse(spec: &JobSpec) -> InvalidJob {
        prepare(
            spec,
            &LanguageCatalog::embedded().unwrap(),
            &LimitPolicy::default(),
        )
        .unwrap_err()
    }

    #[test]
    fn a_c_job_has_compile_then_run() {
        let job = prepare(
            &spec("c", &[("main.c", "int main(){}")]),
            &LanguageCatalog::embedded().unwrap(),
            &LimitPolicy::default(),
        )
        .unwrap();
        let names: Vec<&str> = job.bundle.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["compile", "run"]);
        assert!(job.bundle.stages[0].argv.contains(&"main.c".to_string()));
        assert!(!job.bundle.stages[0].stdin);
        assert_eq!(job.bundle.stages[1].argv, ["./main"]);
    }

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
    }

    #[test]
    fn unknown_language_lists_the_known_ones() {
        let error = refuse(&spec("cobol", &[("a", "")]));
        assert_eq!(error.field, "language");
        assert!(
            error
                .message
                .starts_with("unknown language \"cobol\"; known: python")
        );
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
    fn compile_limits_for_an_interpreted_language_are_refused() {
        let mut s = spec("python", &[("a.py", "")]);
        s.compile_limits.wall_ms = Some(5);
        assert_eq!(refuse(&s).field, "compile_limits");
    }

    #[test]
    fn language_defaults_yield_to_the_server_maximum() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let mut policy = LimitPolicy::default();
        let go = prepare(&spec("go", &[("main.go", "")]), &catalog, &policy).unwrap();
        assert_eq!(go.limits.memory_mb, 512);
        policy.maximum.memory_mb = 256;
        let go = prepare(&spec("go", &[("main.go", "")]), &catalog, &policy).unwrap();
        assert_eq!(go.limits.memory_mb, 256);
        let mut asking = spec("go", &[("main.go", "")]);
        asking.limits.memory_mb = Some(300);
        assert_eq!(
            prepare(&asking, &catalog, &policy).unwrap_err().message,
            "300 is above the server maximum of 256"
        );
    }

    #[test]
    fn placeholders_name_the_entry_and_every_source() {
        let sources = vec![
            "com/acme/Main.java".to_string(),
            "com/acme/Util.java".to_string(),
        ];
        let argv: Vec<String> = [
            "javac",
            "{sources}",
            "-d",
            ".",
            "{entry_class}",
            "{entry_base}.js",
            "{entry_stem}",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            expand(&argv, "com/acme/Main.java", &sources),
            [
                "javac",
                "com/acme/Main.java",
                "com/acme/Util.java",
                "-d",
                ".",
                "com.acme.Main",
                "com/acme/Main.js",
                "Main"
            ]
        );
        assert_eq!(expand(&argv[4..5], "Main", &[]), ["Main"]);
    }

    #[test]
    fn sources_are_the_entry_then_the_other_files_of_the_language() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let job = prepare(
            &spec(
                "c",
                &[
                    ("util.c", ""),
                    ("include/util.h", ""),
                    ("main.c", ""),
                    ("notes.txt", ""),
                ],
            ),
            &catalog,
            &LimitPolicy::default(),
        )
        .unwrap();
        let compile = &job.bundle.stages[0].argv;
        let main = compile.iter().position(|a| a == "main.c").unwrap();
        assert_eq!(compile[main + 1], "util.c");
        assert!(!compile.contains(&"include/util.h".to_string()));
        assert!(!compile.contains(&"notes.txt".to_string()));
    }

    #[test]
    fn env_names_are_checked() {
        let mut s = spec("python", &[("a.py", "")]);
        s.env.insert("1BAD".into(), "x".into());
        assert_eq!(refuse(&s).field, "env.1BAD");
    }
}
