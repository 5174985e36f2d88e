//! Compiled checkers kept between jobs: for the next job of the same key
//! only, compiled once for jobs that arrive together, not kept when they do
//! not compile, compiled again for another build of the image, and every
//! time with the cache off.

use crate::common;

use code_runner::job::grading::Verdict;
use code_runner::job::{JobResult, JobSpec};
use code_runner::sandbox::SandboxEngine as _;
use common::{Harness, harness_per_runtime};
use serde_json::{Value, json};

use super::{PYTHON, graded, verdicts};

/// A C++ checker: accepts when the program's number is the answer's.
const CPP_CHECKER: &str = r#"
#include <cstdio>
#include <fstream>
int main(int argc, char** argv) {
    std::ifstream out(argv[2]), ans(argv[3]);
    long long got, want;
    if (!(out >> got)) { std::puts("no number"); return 1; }
    ans >> want;
    if (got == want) { std::puts("ok"); return 0; }
    std::printf("expected %lld, got %lld\n", want, got);
    return 1;
}
"#;

fn cpp_checker(source: &str) -> Value {
    json!({"mode": "program", "language": "cpp", "files": [{"name": "check.cpp", "content": source}]})
}

/// A python sum judged by `checker`: test 1 right, test 2 wrong.
fn judged_by(checker: &str) -> JobSpec {
    graded(
        "python",
        "main.py",
        PYTHON,
        json!({"check": cpp_checker(checker), "tests": [
            {"stdin": "1 2", "expected_stdout": "3"},
            {"stdin": "3 4", "expected_stdout": "8"},
        ]}),
    )
}

/// Runs `spec` as a job of API key `tenant` on the harness's engine.
async fn run_as(harness: &Harness, tenant: &str, spec: &JobSpec) -> JobResult {
    let mut job = harness.prepare(spec);
    job.tenant = Some(tenant.to_string());
    let id = uuid::Uuid::new_v4().to_string();
    harness.engine.run(&id, &job, Default::default()).await
}

/// The verdicts and messages of a [`judged_by`] job, and its checker's
/// figures.
fn judged(result: &JobResult, what: &str) -> code_runner::job::grading::CheckerUsage {
    assert_eq!(
        verdicts(result),
        [(Verdict::Accepted, None), (Verdict::WrongAnswer, None)],
        "{what}: {result:#?}"
    );
    let grading = result.grading.as_ref().unwrap();
    let messages: Vec<_> = grading
        .tests
        .iter()
        .map(|t| t.outcome.message.as_deref())
        .collect();
    assert_eq!(
        messages,
        [Some("ok"), Some("expected 8, got 7")],
        "{what}: {result:#?}"
    );
    let usage = grading
        .checker
        .unwrap_or_else(|| panic!("no checker usage {what}"));
    assert_eq!(usage.checks, 2, "{what}: {result:#?}");
    usage
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compiled_checker_is_kept_for_the_next_job_of_the_same_key_only() {
    for (runtime, harness) in
        harness_per_runtime("a_compiled_checker_is_kept_for_the_next_job_of_the_same_key_only")
            .await
    {
        let cache = &harness.engine.config().checker_cache;
        let first = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
        let compiled = judged(&first, &format!("{runtime}: first"));
        assert!(!compiled.compile_cached, "{runtime}: {first:#?}");
        let (entries, bytes) = cache.usage();
        assert_eq!(entries, 1, "{runtime}");
        // The binary and its source (a C++ binary is kilobytes at least).
        assert!(bytes > 4096, "{runtime}: {bytes} bytes kept");

        // The same key and checker: no compile, the same judgements.
        let second = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
        let cached = judged(&second, &format!("{runtime}: second"));
        assert!(cached.compile_cached, "{runtime}: {second:#?}");
        // Its figures are the two checks' alone, the compile's CPU is not in
        // them (g++ spends hundreds of ms on <fstream>).
        assert!(
            cached.cpu_ms < compiled.cpu_ms,
            "{runtime}: cached {cached:?} against compiled {compiled:?}"
        );
        let json = serde_json::to_value(&second).unwrap();
        assert_eq!(json["checker"]["compile_cached"], true, "{runtime}");

        // Another key compiles its own, and so does another checker.
        let other_key = run_as(&harness, "key-b", &judged_by(CPP_CHECKER)).await;
        assert!(!judged(&other_key, &format!("{runtime}: key-b")).compile_cached);
        let changed = format!("// another checker\n{CPP_CHECKER}");
        let other_source = run_as(&harness, "key-a", &judged_by(&changed)).await;
        assert!(!judged(&other_source, &format!("{runtime}: changed")).compile_cached);
        assert_eq!(cache.usage().0, 3, "{runtime}");
        harness.assert_clean().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_arriving_together_compile_their_checker_once() {
    for (runtime, harness) in
        harness_per_runtime("jobs_arriving_together_compile_their_checker_once").await
    {
        let spec = judged_by(CPP_CHECKER);
        let (a, b, c) = tokio::join!(
            run_as(&harness, "key-a", &spec),
            run_as(&harness, "key-a", &spec),
            run_as(&harness, "key-a", &spec),
        );
        let cached: Vec<bool> = [&a, &b, &c]
            .iter()
            .map(|result| judged(result, runtime).compile_cached)
            .collect();
        assert_eq!(
            cached.iter().filter(|cached| !**cached).count(),
            1,
            "{runtime}: one compile, two waited for it: {cached:?}"
        );
        harness.assert_clean().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_that_does_not_compile_is_not_kept() {
    let harness = Harness::new().await;
    let broken = "int main() { return undefined_name; }\n";
    for attempt in ["first", "second"] {
        let result = run_as(&harness, "key-a", &judged_by(broken)).await;
        let grading = result.grading.as_ref().unwrap();
        assert_eq!(
            grading.tests[0].outcome.verdict,
            Verdict::CheckerError,
            "{attempt}: {result:#?}"
        );
        let error = result.error.as_deref().unwrap_or_default();
        assert!(
            error.contains("the checker did not compile (exited)")
                && error.contains("undefined_name"),
            "{attempt}: {error}"
        );
        // Its compile ran (and reported) both times.
        let usage = grading.checker.unwrap();
        assert!(
            !usage.compile_cached && usage.cpu_ms > 0,
            "{attempt}: {usage:?}"
        );
    }
    assert_eq!(harness.engine.config().checker_cache.usage(), (0, 0));
    harness.assert_clean().await;
}

/// A tag of the C++ image made for one test, removed when it ends (also
/// when it fails), with every image built under it.
struct TestTag(String);

impl TestTag {
    fn new() -> Self {
        let tag = format!("code-runner/cpp:checker-cache-{}", uuid::Uuid::new_v4());
        docker_cli(&["tag", "code-runner/cpp:latest", &tag], None);
        Self(tag)
    }

    /// Points the tag at a new image: the C++ image with one label more.
    fn rebuild(&self) {
        let dockerfile = format!("FROM code-runner/cpp:latest\nLABEL rebuilt={}\n", self.0);
        docker_cli(&["build", "--quiet", "-t", &self.0, "-"], Some(&dockerfile));
    }

    fn id(&self) -> String {
        docker_cli(&["image", "inspect", "--format", "{{.Id}}", &self.0], None)
    }
}

impl Drop for TestTag {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rmi", &self.0])
            .output();
    }
}

/// Runs the docker CLI (with `stdin`), panicking unless it succeeds; its
/// stdout, trimmed.
fn docker_cli(args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the docker CLI runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "docker {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_compiled_with_another_build_of_the_image_compiles_again() {
    let tag = TestTag::new();
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("languages.toml");
    let languages = code_runner::languages::EMBEDDED_CATALOG.replace(
        "image = \"code-runner/cpp\"\n",
        &format!("image = \"{}\"\n", tag.0),
    );
    assert_ne!(languages, code_runner::languages::EMBEDDED_CATALOG);
    std::fs::write(&catalog, languages).unwrap();
    let mut settings = common::default_settings(None);
    settings.languages_file = Some(catalog);
    let harness = Harness::with_settings(settings).await;

    let first = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
    assert!(!judged(&first, "first").compile_cached);
    let again = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
    assert!(judged(&again, "again").compile_cached);

    // The same tag, another image: the kept checker is not taken.
    let before = tag.id();
    tag.rebuild();
    assert_ne!(tag.id(), before);
    let rebuilt = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
    assert!(!judged(&rebuilt, "rebuilt").compile_cached);
    let after = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
    assert!(judged(&after, "after").compile_cached);
    assert_eq!(harness.engine.config().checker_cache.usage().0, 2);
    harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cache_off_every_job_compiles_its_checker() {
    let mut settings = common::default_settings(None);
    settings.checker_cache_mb = 0;
    let harness = Harness::with_settings(settings).await;
    for attempt in ["first", "second"] {
        let result = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
        let usage = judged(&result, attempt);
        assert!(!usage.compile_cached, "{attempt}: {usage:?}");
    }
    assert_eq!(harness.engine.config().checker_cache.usage(), (0, 0));
    harness.assert_clean().await;
}
