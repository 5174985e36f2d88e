//! Bad input is refused before any container exists: `prepare()` names the
//! field at fault, and the engine only takes a `PreparedJob`, so an invalid
//! job cannot reach Docker. The CLI refuses the same jobs with exit 64.

use crate::common;
use crate::jobs::base64;

use std::collections::BTreeMap;

use code_runner::job::limits::{CompileLimitsRequest, LimitsRequest};
use code_runner::job::{Encoding, FileSpec, InvalidJob, JobSpec, prepare};
use common::{CliHarness, Harness, job, python};

/// The server maximum of every run-stage limit (the built-in policy).
const MAXIMUM: &[(&str, u64)] = &[
    ("wall_ms", 300_000),
    ("idle_ms", 600_000),
    ("cpu_ms", 300_000),
    ("memory_mb", 2048),
    ("pids", 512),
    ("output_bytes", 16 << 20),
    ("disk_mb", 1024),
    ("files_bytes", 16 << 20),
];

/// The server maximum of every compile-stage limit.
const COMPILE_MAXIMUM: &[(&str, u64)] = &[
    ("wall_ms", 120_000),
    ("cpu_ms", 120_000),
    ("output_bytes", 4 << 20),
];

fn refuse(harness: &Harness, spec: &JobSpec) -> InvalidJob {
    match prepare(spec, &harness.catalog, &harness.policy) {
        Ok(job) => panic!("the job was accepted: {:#?}", job.bundle.stages),
        Err(error) => error,
    }
}

fn assert_refused(harness: &Harness, spec: &JobSpec, field: &str, message: &str) {
    let error = refuse(harness, spec);
    assert_eq!(
        (error.field.as_str(), error.message.as_str()),
        (field, message),
        "{spec:#?}"
    );
}

fn file(name: &str, content: &str) -> FileSpec {
    FileSpec {
        name: name.to_string(),
        content: content.to_string(),
        encoding: Encoding::Utf8,
        reference: None,
    }
}

fn with_files(files: Vec<FileSpec>) -> JobSpec {
    JobSpec {
        language: "python".into(),
        files,
        ..Default::default()
    }
}

#[tokio::test]
async fn an_unknown_language_is_refused() {
    let harness = Harness::new().await;
    assert_refused(
        &harness,
        &job("cobol", "main.cob", "DISPLAY 'HI'."),
        "language",
        &format!(
            "unknown language \"cobol\"; known: {}",
            harness.catalog.ids().join(", ")
        ),
    );
    let mut spec = python("print(1)");
    spec.version = Some("2.7".into());
    assert_refused(
        &harness,
        &spec,
        "version",
        "python \"2.7\" is not available; this server has 3.11",
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn file_names_outside_the_workspace_are_refused() {
    let harness = Harness::new().await;
    for (name, message) in [
        (
            "/etc/passwd",
            "\"/etc/passwd\" is absolute; file names must be relative",
        ),
        ("../escape.py", "\"../escape.py\" contains \"..\""),
        (
            "pkg/../../etc/cron.d/x",
            "\"pkg/../../etc/cron.d/x\" contains \"..\"",
        ),
        ("pkg/..", "\"pkg/..\" contains \"..\""),
        ("./main.py", "\"./main.py\" has an empty or \".\" part"),
        ("a//b.py", "\"a//b.py\" has an empty or \".\" part"),
        ("dir/", "\"dir/\" has an empty or \".\" part"),
        ("", "file name is empty"),
        ("a\\b.py", "\"a\\\\b.py\" contains a NUL or backslash"),
        ("a\0b.py", "\"a\\0b.py\" contains a NUL or backslash"),
    ] {
        // The bad name is the second file: the field says which one.
        let spec = with_files(vec![file("main.py", "print(1)"), file(name, "x")]);
        assert_refused(&harness, &spec, "files[1].name", message);
    }
    let deep = vec!["d"; 17].join("/");
    assert_refused(
        &harness,
        &with_files(vec![file(&deep, "")]),
        "files[0].name",
        &format!("{deep:?} is nested deeper than 16"),
    );
    let long = "x".repeat(256);
    assert_refused(
        &harness,
        &with_files(vec![file(&long, "")]),
        "files[0].name",
        "file name is longer than 255 bytes",
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn duplicate_and_conflicting_names_are_refused() {
    let harness = Harness::new().await;
    assert_refused(
        &harness,
        &with_files(vec![
            file("main.py", ""),
            file("lib.py", ""),
            file("main.py", ""),
        ]),
        "files[2].name",
        "duplicate file name \"main.py\"",
    );
    assert_refused(
        &harness,
        &with_files(vec![file("pkg", ""), file("pkg/mod.py", "")]),
        "files",
        "\"pkg\" is both a file and the directory of \"pkg/mod.py\"",
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn too_many_files_or_bytes_are_refused() {
    let harness = Harness::new().await;
    let sixty_five: Vec<FileSpec> = (0..65).map(|i| file(&format!("f{i}.py"), "")).collect();
    assert_refused(
        &harness,
        &with_files(sixty_five.clone()),
        "files",
        "65 files is more than the limit of 64",
    );
    // 64 is fine.
    prepare(
        &with_files(sixty_five[..64].to_vec()),
        &harness.catalog,
        &harness.policy,
    )
    .expect("64 files are allowed");
    assert_refused(
        &harness,
        &with_files(vec![]),
        "files",
        "at least one file is required",
    );

    // Two files that fit alone but not together.
    let mut spec = with_files(vec![
        file("main.py", &"#".repeat(600)),
        file("b.py", &"#".repeat(401)),
    ]);
    spec.limits.files_bytes = Some(1000);
    assert_refused(
        &harness,
        &spec,
        "files",
        "files total more than 1000 bytes (limits.files_bytes)",
    );
    spec.files[1].content.pop();
    prepare(&spec, &harness.catalog, &harness.policy).expect("exactly 1000 bytes are allowed");

    // The default files_bytes (1 MiB); the decoded size counts, not base64's.
    let mut spec = with_files(vec![file("main.py", &"#".repeat((1 << 20) + 1))]);
    assert_refused(
        &harness,
        &spec,
        "files",
        "files total more than 1048576 bytes (limits.files_bytes)",
    );
    spec.files[0] = FileSpec {
        name: "data.bin".into(),
        content: base64(&vec![0u8; 1 << 20]),
        encoding: Encoding::Base64,
        reference: None,
    };
    prepare(&spec, &harness.catalog, &harness.policy)
        .expect("1 MiB decoded is allowed, though its base64 is longer");
    harness.assert_clean().await;
}

/// Sets one run-stage limit by name.
fn limits(name: &str, value: u64) -> LimitsRequest {
    let mut request = LimitsRequest::default();
    request.set(name, value).unwrap();
    request
}

fn compile_limits(name: &str, value: u64) -> CompileLimitsRequest {
    let mut request = CompileLimitsRequest::default();
    request.set(name, value).unwrap();
    request
}

#[tokio::test]
async fn a_limit_above_the_server_maximum_is_refused_never_clamped() {
    let harness = Harness::new().await;
    let names: Vec<&str> = MAXIMUM.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, LimitsRequest::FIELDS, "every limit is tested");
    for (name, maximum) in MAXIMUM {
        let mut spec = python("print(1)");
        spec.limits = limits(name, maximum + 1);
        assert_refused(
            &harness,
            &spec,
            &format!("limits.{name}"),
            &format!("{} is above the server maximum of {maximum}", maximum + 1),
        );
        // The maximum itself is allowed, and kept as asked.
        spec.limits = limits(name, *maximum);
        let job = prepare(&spec, &harness.catalog, &harness.policy)
            .unwrap_or_else(|e| panic!("{name} = {maximum} is allowed: {e}"));
        let resolved = serde_json::to_value(job.limits).unwrap();
        assert_eq!(resolved[name], *maximum, "{name}");
    }

    let names: Vec<&str> = COMPILE_MAXIMUM.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, CompileLimitsRequest::FIELDS, "every limit is tested");
    for (name, maximum) in COMPILE_MAXIMUM {
        let mut spec = job("c", "main.c", "int main(void){return 0;}");
        spec.compile_limits = compile_limits(name, maximum + 1);
        assert_refused(
            &harness,
            &spec,
            &format!("compile_limits.{name}"),
            &format!("{} is above the server maximum of {maximum}", maximum + 1),
        );
    }
    harness.assert_clean().await;
}

#[tokio::test]
async fn zero_limits_are_refused() {
    let harness = Harness::new().await;
    for name in LimitsRequest::FIELDS {
        let mut spec = python("print(1)");
        spec.limits = limits(name, 0);
        assert_refused(
            &harness,
            &spec,
            &format!("limits.{name}"),
            "must be at least 1",
        );
    }
    for name in CompileLimitsRequest::FIELDS {
        let mut spec = job("c", "main.c", "int main(void){return 0;}");
        spec.compile_limits = compile_limits(name, 0);
        assert_refused(
            &harness,
            &spec,
            &format!("compile_limits.{name}"),
            "must be at least 1",
        );
    }
    harness.assert_clean().await;
}

#[tokio::test]
async fn invalid_base64_is_refused_in_a_file_and_in_stdin() {
    let harness = Harness::new().await;
    let mut spec = with_files(vec![file("main.py", "print(1)"), file("data.bin", "!!!!")]);
    spec.files[1].encoding = Encoding::Base64;
    assert_refused(
        &harness,
        &spec,
        "files[1].content",
        "invalid base64: invalid symbol 33, offset 0",
    );

    let mut spec = python("print(1)");
    spec.stdin = "aGVsbG8=x".into();
    spec.stdin_encoding = Encoding::Base64;
    assert_refused(
        &harness,
        &spec,
        "stdin",
        "invalid base64: invalid symbol 61, offset 7",
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn an_entry_that_is_not_one_of_the_files_is_refused() {
    let harness = Harness::new().await;
    let mut spec = with_files(vec![file("main.py", "print(1)"), file("lib.py", "")]);
    spec.entry = Some("other.py".into());
    assert_refused(
        &harness,
        &spec,
        "entry",
        "\"other.py\" is not one of the files",
    );
    // A directory of the files is not a file either.
    let mut spec = with_files(vec![file("pkg/main.py", "print(1)")]);
    spec.entry = Some("pkg".into());
    assert_refused(&harness, &spec, "entry", "\"pkg\" is not one of the files");
    harness.assert_clean().await;
}

#[tokio::test]
async fn compile_limits_for_an_interpreted_language_are_refused() {
    let harness = Harness::new().await;
    let mut spec = python("print(1)");
    spec.compile_limits = compile_limits("wall_ms", 5000);
    assert_refused(
        &harness,
        &spec,
        "compile_limits",
        "python has no compile stage",
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn bad_environment_variables_are_refused() {
    let harness = Harness::new().await;
    for name in ["1BAD", "A-B", "A=B", "", "É"] {
        let mut spec = python("print(1)");
        spec.env = BTreeMap::from([(name.to_string(), "x".to_string())]);
        assert_refused(
            &harness,
            &spec,
            &format!("env.{name}"),
            "a variable name is letters, digits and _, not starting with a digit",
        );
    }
    let mut spec = python("print(1)");
    spec.env = BTreeMap::from([("OK".to_string(), "a\0b".to_string())]);
    assert_refused(
        &harness,
        &spec,
        "env.OK",
        "value must be at most 4096 bytes with no NUL",
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn the_cli_refuses_invalid_jobs_with_exit_64_before_any_container() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let hello = dir.path().join("hello.py");
    std::fs::write(&hello, "print('hello')\n").unwrap();
    let unknown = format!(
        "code-runner: invalid job: language: unknown language \"cobol\"; known: {}\n",
        code_runner::languages::LanguageCatalog::embedded()
            .unwrap()
            .ids()
            .join(", ")
    );
    for (flags, message) in [
        (&["--language", "cobol"][..], unknown.as_str()),
        (
            &["--memory-mb", "4096"][..],
            "code-runner: invalid job: limits.memory_mb: 4096 is above the server maximum of 2048\n",
        ),
        (
            &["--wall-ms", "0"][..],
            "code-runner: invalid job: limits.wall_ms: must be at least 1\n",
        ),
    ] {
        let output = harness
            .command()
            .args(["sandbox", "run"])
            .arg(&hello)
            .args(flags)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(64), "{flags:?}: {output:#?}");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "", "{flags:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stderr),
            message,
            "{flags:?}"
        );
    }
    harness.assert_clean().await;
}
