//! The job as a client submits it, its validation, and the prepared form the
//! sandbox runs (the request's shape: docs/api.md). Validation happens before any container exists;
//! every refusal names the field at fault.
//!
//! The spec's types and [`prepare`] are here; the checks of the submitted
//! files, entry, stdin, arguments and environment are in [`validate`], and
//! the stages built from the catalog's commands in [`stages`].
//!
//! [`prepare`] resolves the language, checks every file name (relative, no
//! `..`, no duplicates, no file that is also a directory), decodes base64,
//! checks sizes and counts, resolves each limit against the language's
//! default, the server's default and the server's maximum ([`limits`]),
//! and builds the [`PreparedJob`]: its `Bundle` (the compile stage if the
//! language has one, then the run stage, or for a graded job the run plan
//! of [`grading`]), its wall budget and its egress. Every refusal is an
//! [`InvalidJob`] naming the field. A job reaches Docker only as a
//! [`PreparedJob`], so bad input never creates a container.
//!
//! Beside it: [`lifecycle`] (the statuses and the one table of moves),
//! [`deadline`] (the time budget, computed once), [`events`] (a job's
//! event stream), [`result`], and [`carry`] (prepared jobs handed from a
//! `serve` process's API to its worker).

pub mod carry;
pub mod deadline;
pub mod events;
pub mod grading;
pub mod lifecycle;
pub mod limits;
pub mod outputs;
pub mod refs;
pub mod result;
mod stages;
mod validate;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::languages::{Language, LanguageCatalog};
use crate::protocol::{Bundle, EgressRelay, RunPlan, StageSpec};
use grading::{PreparedTests, TestSpec};
use limits::{CompileLimits, CompileLimitsRequest, LimitPolicy, Limits, LimitsRequest};
pub use result::{Encoding, JobResult, Output, StageResult, StartKind, Status, Timings};
use stages::{build_stages, source_files};
pub use stages::{runs_on, warm_runtime};
pub use validate::check_file_name;
use validate::{check_args, check_env, choose_entry, decode_files, decode_stdin};

/// Where the job's files live inside the sandbox.
pub const WORKSPACE: &str = "/workspace";
/// The unprivileged uid and gid user code runs as (`nobody`/`nogroup`).
pub const SANDBOX_UID: u32 = 65534;
pub const SANDBOX_GID: u32 = 65534;

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
    /// Arguments added to the end of the language's compile command (a
    /// compiled language's flags: `["-std=c89"]`, `["-lcrypt"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compile_args: Vec<String>,
    /// Arguments given to the language's runtime before the entry file in
    /// the run command (`python3 -u <these> main.py`); for a compiled
    /// program, its first arguments. A job with them never runs on a
    /// pre-started runtime.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interpreter_args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub interactive: bool,
    #[serde(default)]
    pub limits: LimitsRequest,
    /// An address-space limit (RLIMIT_AS) on each process of the run, in
    /// MiB ([`VIRTUAL_MEMORY_MB`]), as Jobe's and older judges' memory
    /// limits are: an allocation past it fails (`malloc` returns NULL)
    /// where the memory limit, of real memory, stops the program. Unset:
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_memory_mb: Option<u64>,
    #[serde(default)]
    pub compile_limits: CompileLimitsRequest,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Most times the job may be started (1–[`MAX_ATTEMPTS_LIMIT`]): a batch
    /// job whose worker is lost while it runs runs again until then. Unset:
    /// the server's `CODE_RUNNER_MAX_ATTEMPTS`. An interactive job runs once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Who the job is for: an opaque id the platform chooses (1–128
    /// printable characters). Fair turns, per-user limits, quotas and the
    /// usage ledger go by it; unset: the key's anonymous user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Grading: the program runs once per test, each with its stdin and
    /// limits, and gets a verdict per test (1–500 tests; see `grading`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tests: Option<Vec<TestSpec>>,
    /// How a test's output is judged: a built-in mode's name, `{"mode": …}`
    /// with its options, or a checker program. Default `trim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<serde_json::Value>,
    /// Skip the remaining tests after the first one not accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_on_failure: Option<bool>,
    /// Outbound network: the hosts the job may reach through its egress
    /// proxy, within its key's allowlist (docs/egress.md). Unset or an
    /// empty `allow`: no network, as every job without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkRequest>,
    /// Files to send back: paths or globs relative to the working
    /// directory, matched once the run stage (each test's run) ended
    /// (at most 32; see `outputs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
}

/// A job's `network`: `{"allow": ["pypi.org", "*.pythonhosted.org:443"]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    pub allow: Vec<String>,
}

impl JobSpec {
    /// The entries of `network.allow`, when there are any.
    pub fn network_allow(&self) -> Option<&[String]> {
        self.network
            .as_ref()
            .map(|n| n.allow.as_slice())
            .filter(|allow| !allow.is_empty())
    }
}

/// The port of the egress relay on a sandbox's loopback.
pub const EGRESS_PORT: u16 = 3128;
/// Where a job's egress socket is inside its sandbox (a directory the
/// worker mounts, holding `proxy.sock`).
pub const EGRESS_MOUNT: &str = "/run/code-runner-egress";
/// The socket's file name in [`EGRESS_MOUNT`].
pub const EGRESS_SOCKET: &str = "proxy.sock";
/// Most connections the relay in the sandbox carries at once (the proxy's
/// own cap on concurrent connections is the one that counts).
const EGRESS_RELAY_CONCURRENT: u32 = 16;
/// Egress events a job's storage reserve makes room for (the worker's
/// default connection cap), and the most one takes (an event with a
/// 253-character host and every field).
pub const EGRESS_RESERVED_EVENTS: u64 = 256;
pub const EGRESS_EVENT_BYTES: u64 = 512;
/// The variables that point a job's programs at the relay (both spellings:
/// curl and Python read the lowercase ones, others the uppercase).
pub const PROXY_VARIABLES: [&str; 4] = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"];

/// What [`PROXY_VARIABLES`] say: the relay's address.
pub fn egress_proxy_url() -> String {
    format!("http://127.0.0.1:{EGRESS_PORT}")
}

/// Where the sandbox's writable mounts are: what the runs of a graded job
/// may add to, and what is put back as it was between two tests.
pub const SCRATCH_MOUNTS: [&str; 4] = [WORKSPACE, "/tmp", "/dev/shm", "/dev/mqueue"];

/// [`SCRATCH_MOUNTS`] as a bundle carries them (a run plan's `scratch`, a
/// lingering supervisor's `linger_wipe`).
pub fn scratch_mounts() -> Vec<String> {
    SCRATCH_MOUNTS.iter().map(|m| m.to_string()).collect()
}

/// Where a checker's input, output and answer files are written for each check.
pub const RUN_FILES_DIR: &str = "/tmp/.code-runner-check";

/// The longest [`JobSpec::user`], in characters.
pub const MAX_USER_CHARS: usize = 128;

/// Checks a job's `user`: 1–[`MAX_USER_CHARS`] printable characters (no
/// control characters, no whitespace but the plain space, not only spaces).
pub fn check_user(user: &str) -> Result<(), String> {
    let chars = user.chars().count();
    if chars == 0 || chars > MAX_USER_CHARS {
        return Err(format!(
            "must be 1-{MAX_USER_CHARS} printable characters; it has {chars}"
        ));
    }
    if let Some(bad) = user
        .chars()
        .find(|c| c.is_control() || (c.is_whitespace() && *c != ' '))
    {
        return Err(format!(
            "must be printable characters; it contains {:?}",
            bad
        ));
    }
    if user.trim().is_empty() {
        return Err("must not be only spaces".into());
    }
    Ok(())
}

/// The range of [`JobSpec::virtual_memory_mb`].
pub const VIRTUAL_MEMORY_MB: std::ops::RangeInclusive<u64> = 16..=1 << 20;

/// The most `max_attempts` a job or the server may ask for.
pub const MAX_ATTEMPTS_LIMIT: u32 = 10;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    pub name: String,
    /// The file's bytes, in `encoding`; empty for a file named by `ref`.
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub encoding: Encoding,
    /// A file the job's key stored (`PUT /v1/files/{sha256}`), named by its
    /// SHA-256 instead of its content: the worker reads its bytes when the
    /// job starts ([`refs`]).
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
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
    /// The bundle: its files, the compile stage (if any) and, without
    /// tests, the run stage; with tests, a run plan instead of the run stage.
    pub bundle: Bundle,
    /// A graded job's tests; each runs the program as `run_stage` with the
    /// test's argv, stdin and limits.
    pub tests: Option<PreparedTests>,
    /// The stage every test runs (its argv and limits are the test's).
    pub run_stage: Option<StageSpec>,
    /// The hosts the job may reach (its `network.allow`); `None`: no
    /// network. Checked against the key's allowlist when it is submitted.
    pub egress: Option<crate::egress::Allowlist>,
    /// The API key the job came with (the worker sets it from the store;
    /// `None` for a job the engine runs alone): a compiled checker is kept
    /// for the next graded job of the same key only (see
    /// `sandbox::checker_cache`).
    pub tenant: Option<String>,
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
    /// A graded job keeps a bounded result per test instead of its output.
    pub fn output_limit_bytes(&self) -> u64 {
        let compile = self.compile_limits.map_or(0, |c| c.output_bytes);
        match &self.tests {
            Some(tests) => compile + tests.tests.len() as u64 * grading::TEST_RESULT_BYTES,
            None => self.limits.output_bytes + compile,
        }
    }

    /// What the job's record may hold beyond its spec: its output limit
    /// ([`Self::output_limit_bytes`]) and, for a job with network, room for
    /// [`EGRESS_RESERVED_EVENTS`] egress events (more are stored too, and
    /// counted at their size when the job ends).
    pub fn record_limit_bytes(&self) -> u64 {
        let egress = match self.egress {
            Some(_) => EGRESS_RESERVED_EVENTS * EGRESS_EVENT_BYTES,
            None => 0,
        };
        self.output_limit_bytes() + egress
    }

    /// The longest the job may take once its container is up: every stage's
    /// wall limit added together (for a graded job, every test's, and its
    /// checker's).
    pub fn stages_wall_ms(&self) -> u64 {
        let stages: u64 = self.bundle.stages.iter().map(|s| s.limits.wall_ms).sum();
        match &self.tests {
            Some(tests) => stages + tests.wall_ms() + tests.checker_wall_ms(),
            None => stages,
        }
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
    check_args("args", &spec.args)?;
    check_args("compile_args", &spec.compile_args)?;
    check_args("interpreter_args", &spec.interpreter_args)?;
    if language.compile.is_none() && !spec.compile_args.is_empty() {
        return Err(InvalidJob::new(
            "compile_args",
            format!("{} has no compile stage", language.id),
        ));
    }
    check_env(&spec.env)?;
    if let Some(mb) = spec.virtual_memory_mb
        && !VIRTUAL_MEMORY_MB.contains(&mb)
    {
        return Err(InvalidJob::new(
            "virtual_memory_mb",
            format!(
                "{mb} is not between {} and {}",
                VIRTUAL_MEMORY_MB.start(),
                VIRTUAL_MEMORY_MB.end()
            ),
        ));
    }
    let metadata_bytes = serde_json::to_vec(&spec.metadata).map_or(0, |v| v.len());
    if metadata_bytes > MAX_METADATA_BYTES {
        return Err(InvalidJob::new(
            "metadata",
            format!("{metadata_bytes} bytes is above the limit of {MAX_METADATA_BYTES}"),
        ));
    }

    if let Some(user) = &spec.user {
        check_user(user).map_err(|message| InvalidJob::new("user", message))?;
    }
    let egress = spec
        .network_allow()
        .map(crate::egress::Allowlist::parse)
        .transpose()
        .map_err(|error| InvalidJob::new(error.field(), error.problem()))?;
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

    outputs::check(&spec.outputs)?;

    let sources = source_files(language, &entry, &files);
    let mut stages = build_stages(
        spec,
        language,
        &entry,
        &sources,
        &limits,
        compile_limits.as_ref(),
    );
    if let Some(run) = stages.last_mut() {
        // The run stage, or what each test runs, sends the files back.
        run.outputs = outputs::request(&spec.outputs);
    }
    let run = stages.last().expect("every job has a run stage");
    let run_argv = &run.argv[..run.argv.len() - spec.args.len()];
    let tests = grading::prepare_tests(spec, &limits, run_argv, catalog, policy)?;
    // A graded job's run stage is what each test runs, through a run plan.
    let (run_stage, runs) = match &tests {
        Some(_) => (
            stages.pop(),
            Some(RunPlan {
                // The engine gives the runs a uid of their own.
                uid: SANDBOX_UID,
                gid: SANDBOX_GID,
                scratch: scratch_mounts(),
                files_dir: RUN_FILES_DIR.to_string(),
            }),
        ),
        None => (None, None),
    };
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
            runs,
            egress: egress.as_ref().map(|_| EgressRelay {
                listen_port: EGRESS_PORT,
                socket: format!("{EGRESS_MOUNT}/{EGRESS_SOCKET}"),
                max_concurrent: EGRESS_RELAY_CONCURRENT,
            }),
            // Set by the engine that runs it (`SandboxConfig::linger`).
            linger_ms: 0,
            linger_wipe: Vec::new(),
        },
        tests,
        run_stage,
        egress,
        tenant: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn spec(language: &str, files: &[(&str, &str)]) -> JobSpec {
        JobSpec {
            language: language.into(),
            files: files
                .iter()
                .map(|(name, content)| FileSpec {
                    name: name.to_string(),
                    content: content.to_string(),
                    encoding: Encoding::Utf8,
                    reference: None,
                })
                .collect(),
            ..Default::default()
        }
    }

    pub(super) fn refuse(spec: &JobSpec) -> InvalidJob {
        prepare(
            spec,
            &LanguageCatalog::embedded().unwrap(),
            &LimitPolicy::default(),
        )
        .unwrap_err()
    }

    #[test]
    fn a_job_with_network_gets_the_relay_its_variables_and_record_room() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let policy = LimitPolicy::default();
        let mut s = spec("python", &[("a.py", "")]);
        s.env
            .insert("HTTP_PROXY".into(), "http://elsewhere:1".into());
        let plain = prepare(&s, &catalog, &policy).unwrap();
        assert_eq!((&plain.egress, &plain.bundle.egress), (&None, &None));
        s.network = Some(NetworkRequest { allow: vec![] });
        assert_eq!(prepare(&s, &catalog, &policy).unwrap().egress, None);

        s.network = Some(NetworkRequest {
            allow: vec!["PyPI.org".into(), "*.pythonhosted.org:443".into()],
        });
        let job = prepare(&s, &catalog, &policy).unwrap();
        assert_eq!(
            job.egress.as_ref().unwrap().entries(),
            ["pypi.org", "*.pythonhosted.org:443"]
        );
        assert_eq!(
            job.bundle.egress,
            Some(EgressRelay {
                listen_port: 3128,
                socket: "/run/code-runner-egress/proxy.sock".into(),
                max_concurrent: 16,
            })
        );
        let run = job.bundle.stages.last().unwrap();
        for name in PROXY_VARIABLES {
            let value = run
                .env
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str());
            assert_eq!(value, Some("http://127.0.0.1:3128"), "{name}");
        }
        assert_eq!(
            job.record_limit_bytes(),
            plain.record_limit_bytes() + 256 * 512
        );

        s.network = Some(NetworkRequest {
            allow: vec!["pypi.org".into(), "10.0.0.1".into()],
        });
        let error = refuse(&s);
        assert_eq!(
            (error.field.as_str(), error.message.as_str()),
            (
                "network.allow[1]",
                "\"10.0.0.1\" is an IP address; name a host"
            )
        );
        s.network = Some(NetworkRequest {
            allow: (0..65).map(|i| format!("h{i}.org")).collect(),
        });
        let error = refuse(&s);
        assert_eq!(
            (error.field.as_str(), error.message.as_str()),
            ("network.allow", "65 entries; at most 64")
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
}
