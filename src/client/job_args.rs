//! The job flags shared by `code-runner run` (through the API) and
//! `code-runner sandbox run` (straight through the engine): files, language,
//! stdin, entry, args, env and limits, and the one function that turns them
//! into a [`JobSpec`].

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clap::Args;
use tokio::io::AsyncReadExt;

use crate::job::limits::{CompileLimitsRequest, LimitsRequest};
use crate::job::{Encoding, FileSpec, JobSpec};
use crate::languages::LanguageCatalog;

#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// Source files; the first is the entry unless --entry names another.
    /// A file keeps its path relative to the current directory in the
    /// sandbox's workspace (lib/util.py stays lib/util.py); a file outside
    /// the current directory goes to the top of the workspace by its name.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Language id or alias; guessed from the first file's extension if unset.
    #[arg(short, long)]
    pub language: Option<String>,
    /// Input for the program: the text itself, or `-` to read the terminal's stdin.
    #[arg(long)]
    pub stdin: Option<String>,
    /// The entry file, as it is named in the workspace (its path relative to
    /// the current directory, like the files).
    #[arg(long)]
    pub entry: Option<String>,
    /// An argument for the program (repeatable).
    #[arg(long = "arg", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// An environment variable NAME=VALUE for the program (repeatable).
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// Wall-clock limit of the run stage, in milliseconds.
    #[arg(long)]
    pub wall_ms: Option<u64>,
    /// Interactive jobs: longest time with no input and no output, in milliseconds.
    #[arg(long)]
    pub idle_ms: Option<u64>,
    /// CPU time limit of the run stage, in milliseconds.
    #[arg(long)]
    pub cpu_ms: Option<u64>,
    /// Memory limit of the sandbox, in MiB.
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Most processes and threads in the sandbox.
    #[arg(long)]
    pub pids: Option<u64>,
    /// Most stdout + stderr bytes of a stage.
    #[arg(long)]
    pub output_bytes: Option<u64>,
    /// Size of /workspace and /tmp, in MiB.
    #[arg(long)]
    pub disk_mb: Option<u64>,
    /// Most bytes of submitted files.
    #[arg(long)]
    pub files_bytes: Option<u64>,
    /// Wall-clock limit of the compile stage, in milliseconds.
    #[arg(long)]
    pub compile_wall_ms: Option<u64>,
    /// CPU time limit of the compile stage, in milliseconds.
    #[arg(long)]
    pub compile_cpu_ms: Option<u64>,
    /// Most stdout + stderr bytes of the compile stage.
    #[arg(long)]
    pub compile_output_bytes: Option<u64>,
}

/// The name a file given on the command line gets in the sandbox's
/// workspace: its path relative to `cwd` when it is inside `cwd` (`lib/util.py`
/// stays `lib/util.py`, `./a/../b.py` is `b.py`), else its file name alone (an
/// absolute path elsewhere, or `../x.py`). Paths are taken as written, without
/// following symlinks.
pub fn workspace_name(path: &Path, cwd: &Path) -> Result<String, String> {
    let absolute = normalize(&cwd.join(path));
    let relative = match absolute.strip_prefix(normalize(cwd)) {
        Ok(inside) if !inside.as_os_str().is_empty() => inside.to_path_buf(),
        _ => PathBuf::from(
            absolute
                .file_name()
                .ok_or_else(|| format!("{} has no usable file name", path.display()))?,
        ),
    };
    let parts: Option<Vec<&str>> = relative
        .components()
        .map(|c| c.as_os_str().to_str())
        .collect();
    parts
        .map(|parts| parts.join("/"))
        .ok_or_else(|| format!("{} is not a UTF-8 path", path.display()))
}

/// `path` with `.` and `..` resolved lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Text as UTF-8 when it is, base64 otherwise.
fn encode(bytes: Vec<u8>) -> (String, Encoding) {
    match String::from_utf8(bytes) {
        Ok(text) => (text, Encoding::Utf8),
        Err(error) => (STANDARD.encode(error.into_bytes()), Encoding::Base64),
    }
}

/// A source file as the job carries it: its base name and its content.
pub(crate) fn read_source(path: &Path) -> Result<FileSpec, String> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{} has no usable file name", path.display()))?
        .to_string();
    read_source_named(path, name)
}

/// The file at `path` as a job file named `name` in the workspace.
fn read_source_named(path: &Path, name: String) -> Result<FileSpec, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let (content, encoding) = encode(bytes);
    Ok(FileSpec {
        name,
        content,
        encoding,
        reference: None,
    })
}

/// The language asked for, or the one the entry file's extension selects.
pub(crate) fn language_for(
    catalog: &LanguageCatalog,
    language: Option<&str>,
    first_file: &str,
) -> Result<String, String> {
    match language {
        Some(language) => Ok(language.to_string()),
        None => catalog
            .for_file_name(first_file)
            .map(|l| l.id.clone())
            .ok_or_else(|| format!("cannot tell the language of {first_file}; pass --language")),
    }
}

impl JobArgs {
    /// Reads the files (and stdin for `--stdin -`) and builds the job. The
    /// catalog is only used to guess the language from the first file's
    /// extension when `--language` is not given. Errors are one line for the
    /// user.
    pub async fn job_spec(
        &self,
        catalog: &LanguageCatalog,
        interactive: bool,
    ) -> Result<JobSpec, String> {
        let cwd = std::env::current_dir()
            .map_err(|e| format!("cannot read the current directory: {e}"))?;
        let files = self
            .files
            .iter()
            .map(|path| read_source_named(path, workspace_name(path, &cwd)?))
            .collect::<Result<Vec<_>, _>>()?;
        let first = files.first().ok_or("at least one file is required")?;
        let language = language_for(catalog, self.language.as_deref(), &first.name)?;
        let stdin = match self.stdin.as_deref() {
            None => Vec::new(),
            Some("-") => {
                let mut data = Vec::new();
                tokio::io::stdin()
                    .read_to_end(&mut data)
                    .await
                    .map_err(|e| format!("cannot read stdin: {e}"))?;
                data
            }
            Some(text) => text.as_bytes().to_vec(),
        };
        let (stdin, stdin_encoding) = encode(stdin);
        let mut env = BTreeMap::new();
        for item in &self.env {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| format!("--env {item:?} is not NAME=VALUE"))?;
            env.insert(name.to_string(), value.to_string());
        }
        Ok(JobSpec {
            language,
            files,
            entry: self
                .entry
                .as_deref()
                .map(|entry| workspace_name(Path::new(entry), &cwd))
                .transpose()?,
            stdin,
            stdin_encoding,
            args: self.args.clone(),
            env,
            interactive,
            limits: LimitsRequest {
                wall_ms: self.wall_ms,
                idle_ms: self.idle_ms,
                cpu_ms: self.cpu_ms,
                memory_mb: self.memory_mb,
                pids: self.pids,
                output_bytes: self.output_bytes,
                disk_mb: self.disk_mb,
                files_bytes: self.files_bytes,
            },
            compile_limits: CompileLimitsRequest {
                wall_ms: self.compile_wall_ms,
                cpu_ms: self.compile_cpu_ms,
                output_bytes: self.compile_output_bytes,
            },
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_keep_their_directories() {
        let cwd = Path::new("/home/ada/project");
        let name = |p: &str| workspace_name(Path::new(p), cwd).unwrap();
        assert_eq!(name("main.py"), "main.py");
        assert_eq!(name("lib/util.py"), "lib/util.py");
        assert_eq!(name("./lib/./util.py"), "lib/util.py");
        assert_eq!(name("lib/../main.py"), "main.py");
        assert_eq!(name("/home/ada/project/include/x.h"), "include/x.h");
        // Outside the current directory: the file name alone.
        assert_eq!(name("../shared/util.py"), "util.py");
        assert_eq!(name("/etc/hosts"), "hosts");
        assert!(workspace_name(Path::new("/"), cwd).is_err());
    }
}
