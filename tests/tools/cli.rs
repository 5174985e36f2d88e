//! The `code-runner` binary where it stops before any sandbox, as a user
//! runs it: a configuration it refuses (exit 64, one line naming the
//! setting), a flag it does not know, and the language list, which it
//! reads from its catalog.
//!
//! Every command here runs with `DOCKER_HOST` pointing nowhere, so none of
//! them can make a container (the CLI's tests on real sandboxes, which
//! check that none is left, are in the `daemon` binary: `daemon::cli`).

use crate::common;

use std::path::Path;
use std::process::Command;

use common::cli::run;
use common::daemon::{KEY_A, run_to_end};
use common::redis_server::free_port;
use common::source;

/// A Docker socket that does not exist.
const NO_DOCKER: &str = "unix:///nonexistent/docker.sock";

/// The `code-runner` binary with a clean environment
/// ([`common::code_runner`]) and no Docker to reach.
fn code_runner() -> Command {
    let mut command = common::code_runner();
    command.env("DOCKER_HOST", NO_DOCKER);
    command
}

fn sandbox_run(files: &[&Path], flags: &[&str]) -> Command {
    let mut command = code_runner();
    command.args(["sandbox", "run"]).args(files).args(flags);
    command
}

#[test]
fn languages_lists_python() {
    let mut command = code_runner();
    command.arg("languages");
    let ran = run(command);
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    assert_eq!(ran.stderr, "");
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "{:<12} {:<10} {:<24} {:<28} ALIASES",
            "ID", "VERSION", "NAME", "IMAGE"
        )
    );
    let python = format!(
        "{:<12} {:<10} {:<24} {:<28} {}",
        "python", "3.11", "Python", "code-runner/python:latest", "py, python3"
    );
    assert!(lines.contains(&python.as_str()), "{lines:#?}");
    let catalog = code_runner::languages::LanguageCatalog::embedded().unwrap();
    assert_eq!(
        lines.len(),
        1 + catalog.all().len(),
        "a header and every language of the catalog: {lines:#?}"
    );
}

#[test]
fn languages_json_parses() {
    let mut command = code_runner();
    command.args(["languages", "--json"]);
    let ran = run(command);
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    assert_eq!(ran.stderr, "");
    let languages: Vec<serde_json::Value> = serde_json::from_str(&ran.stdout)
        .unwrap_or_else(|e| panic!("stdout is not a JSON array ({e}): {:?}", ran.stdout));
    let ids: Vec<&str> = languages
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids[..7],
        ["python", "javascript", "c", "cpp", "bash", "ruby", "go"]
    );
    assert!(ids.len() >= 20, "{ids:?}");
    let python = &languages[0];
    assert_eq!(python["image"], "code-runner/python");
    assert_eq!(python["version"], "3.11");
    assert_eq!(
        python["run"],
        serde_json::json!(["python3", "-u", "{entry}"])
    );
    assert_eq!(python["compile"], serde_json::Value::Null);
}

#[test]
fn a_bad_configuration_value_exits_64_with_one_line_naming_it() {
    let mut command = code_runner();
    command
        .arg("languages")
        .env("CODE_RUNNER_MAX_LIMITS", "walls=5");
    let ran = run(command);
    assert_eq!(ran.code, Some(64), "{ran:#?}");
    assert_eq!(ran.stdout, "");
    assert_eq!(
        ran.stderr,
        "code-runner: invalid configuration: CODE_RUNNER_MAX_LIMITS: unknown limit \"walls\"; \
         known: wall_ms, idle_ms, cpu_ms, memory_mb, pids, output_bytes, disk_mb, files_bytes\n"
    );
}

#[test]
fn a_checker_cache_larger_than_the_limit_exits_64_naming_it() {
    let mut command = code_runner();
    command
        .arg("languages")
        .env("CODE_RUNNER_CHECKER_CACHE_MB", "16385");
    let ran = run(command);
    assert_eq!(ran.code, Some(64), "{ran:#?}");
    assert_eq!(
        ran.stderr,
        "code-runner: invalid configuration: CODE_RUNNER_CHECKER_CACHE_MB: 16385 is more than \
         16384 (MiB of the worker's memory)\n"
    );
}

#[test]
fn a_bad_on_off_value_exits_64_naming_the_setting_and_what_it_takes() {
    let mut command = code_runner();
    command
        .arg("worker")
        .env("CODE_RUNNER_WORKER_LISTEN", "127.0.0.1:0")
        .env("CODE_RUNNER_WARM_RUNTIMES", "maybe");
    let ran = run(command);
    assert_eq!(ran.code, Some(64), "{ran:#?}");
    assert_eq!(ran.stdout, "");
    assert_eq!(
        ran.stderr,
        "code-runner: invalid configuration: CODE_RUNNER_WARM_RUNTIMES: \"maybe\" is not on or \
         off (also true/false, yes/no, 1/0)\n"
    );
}

#[test]
fn an_unknown_flag_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let hello = source(dir.path(), "hello.py", "print('hello')\n");
    let ran = run(sandbox_run(&[&hello], &["--bogus"]));
    assert_eq!(ran.code, Some(64), "{ran:#?}");
    assert_eq!(ran.stdout, "");
    assert_eq!(
        ran.stderr.lines().next(),
        Some("error: unexpected argument '--bogus' found"),
        "{:?}",
        ran.stderr
    );
}

/// Environment variables for one run.
type Env<'a> = &'a [(&'a str, &'a str)];

#[test]
fn invalid_configuration_exits_64_with_one_line_naming_the_setting() {
    let keys = format!("a:{KEY_A}");
    let port = format!("127.0.0.1:{}", free_port());
    let cases: &[(&str, Env, &str)] = &[
        (
            "serve",
            &[
                ("CODE_RUNNER_WORKER_MAX_SANDBOXES", "0"),
                ("CODE_RUNNER_API_KEYS", &keys),
            ],
            "code-runner: invalid configuration: CODE_RUNNER_WORKER_MAX_SANDBOXES: must be between 1 and 1024",
        ),
        (
            "serve",
            &[],
            "code-runner: invalid configuration: CODE_RUNNER_API_KEYS: ",
        ),
        (
            "api",
            &[("CODE_RUNNER_API_KEYS", "no-colon-here")],
            "code-runner: invalid configuration: CODE_RUNNER_API_KEYS: ",
        ),
        (
            "worker",
            &[("CODE_RUNNER_REDIS_URL", "http://127.0.0.1:1")],
            "code-runner: invalid configuration: CODE_RUNNER_REDIS_URL: ",
        ),
        (
            "worker",
            &[("CODE_RUNNER_HEARTBEAT_TTL_MS", "100")],
            "code-runner: invalid configuration: CODE_RUNNER_HEARTBEAT_TTL_MS: ",
        ),
    ];
    for (role, env, expected) in cases {
        let mut env = env.to_vec();
        env.push(("CODE_RUNNER_LISTEN", &port));
        env.push(("CODE_RUNNER_WORKER_LISTEN", &port));
        env.push(("DOCKER_HOST", NO_DOCKER));
        let output = run_to_end(&[role], &env);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{role} {env:?}: {output:?}");
        assert_eq!(stderr.lines().count(), 1, "{role} {env:?}: {stderr:?}");
        assert!(stderr.starts_with(expected), "{role} {env:?}: {stderr:?}");
        assert!(output.stdout.is_empty(), "{output:?}");
    }
}
