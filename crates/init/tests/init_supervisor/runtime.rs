//! Warm runtimes (`prestart`): the runtime started before the bundle runs
//! the first stage when it fits, with the stage's args and rlimits; one
//! that does not fit, or died while waiting, is killed and the stage
//! starts cold.
//!
//! The "runtime" here is bash, which reads its control descriptor (200)
//! and prints what it got; the stage it stands for is a command that does
//! not exist, so a stage that prints anything ran on the runtime.

use std::time::Duration;

use code_runner_protocol::{BundleFile, HostMessage, Prestart, Reason, SandboxMessage, StageSpec};

use super::harness::{Sandbox, file, live_processes_of};

pub(super) const T: Duration = Duration::from_secs(20);

/// Prints the args it was given, its open-files limit and its file-size
/// limit (bash counts 1024-byte blocks), then exits 0.
const RUNTIME: &str = "args=$(tr '\\0' '|' <&200); exec 200<&-; echo \"runtime got: $args\"; ulimit -n; ulimit -f; test -e /proc/self/fd/200 && echo control-open || echo control-closed";

pub(super) fn prestart(sb: &Sandbox, stage: &StageSpec) -> HostMessage {
    HostMessage::Prestart(Box::new(Prestart {
        uid: sb.uid,
        gid: sb.uid,
        argv: vec!["/bin/bash".into(), "-c".into(), RUNTIME.into()],
        stage_argv: vec!["not-a-command-anywhere".into()],
        env: stage.env.clone(),
        cwd: stage.cwd.clone(),
        preopened: None,
        fed: None,
        hookless: false,
    }))
}

/// Like php: opens `main.rb` at its start (before the job came),
/// waits for its args, then prints what it reads from that descriptor.
const PREOPENING: &str =
    "exec 3<main.rb; args=$(tr '\\0' '|' <&200); exec 200<&-; echo \"runtime got: $args\"; cat <&3";

fn preopening(sb: &Sandbox, stage: &StageSpec) -> HostMessage {
    let HostMessage::Prestart(mut prestart) = prestart(sb, stage) else {
        unreachable!()
    };
    prestart.argv = vec!["/bin/bash".into(), "-c".into(), PREOPENING.into()];
    prestart.preopened = Some("main.rb".into());
    HostMessage::Prestart(prestart)
}

/// Waits until `main.rb` is in the workspace; its metadata.
pub(super) fn made_entry(sb: &Sandbox) -> std::fs::Metadata {
    let until = std::time::Instant::now() + T;
    while listing(sb).is_empty() {
        assert!(std::time::Instant::now() < until, "no entry made");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::symlink_metadata(sb.workspace().join("main.rb")).unwrap()
}

/// The workspace's entries, sorted.
pub(super) fn listing(sb: &Sandbox) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(sb.workspace())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The stage the runtime stands for, with `args`.
pub(super) fn fitting_stage(sb: &Sandbox, args: &[&str]) -> StageSpec {
    let mut argv = vec!["not-a-command-anywhere"];
    argv.extend_from_slice(args);
    let mut stage = sb.stage("run", &argv);
    stage.stdin = true;
    stage
}

pub(super) fn said_warm_runtime(messages: &[SandboxMessage]) -> Vec<bool> {
    messages
        .iter()
        .filter_map(|m| match m {
            SandboxMessage::StageStart(start) => Some(start.warm_runtime),
            _ => None,
        })
        .collect()
}

/// Prestarts the runtime for `stage`, sends the bundle, and checks that
/// the stage ran on the runtime and exited 0; returns its stdout.
fn run_on_the_runtime(sb: &mut Sandbox, stage: StageSpec) -> String {
    sb.send(prestart(sb, &stage));
    released(sb, vec![], stage)
}

/// Sends the bundle of `files` and `stage` to the runtime prestarted, and
/// checks that the stage ran on it and exited 0; returns its stdout.
pub(super) fn released(sb: &mut Sandbox, files: Vec<BundleFile>, stage: StageSpec) -> String {
    let bundle = sb.bundle(files, vec![stage]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(
        (report.reason, report.exit_code),
        (Reason::Exited, Some(0)),
        "{report:?}: {}",
        outcome.diagnostics
    );
    assert_eq!(said_warm_runtime(&outcome.messages), [true]);
    outcome.stdout_text()
}

#[test]
fn a_fitting_stage_runs_on_the_runtime_with_its_args_and_limits() {
    let mut sb = Sandbox::start();
    let mut stage = fitting_stage(&sb, &["a", "b c", ""]);
    stage.limits.nofile = 77;
    stage.limits.fsize_bytes = 512 * 1024;
    // The args, NUL-separated; the stage's rlimits, not the supervisor's;
    // and the control descriptor closed.
    assert_eq!(
        run_on_the_runtime(&mut sb, stage),
        "runtime got: a|b c||\n77\n512\ncontrol-closed\n"
    );
}

#[test]
fn args_larger_than_the_control_pipe_holds_all_reach_the_runtime() {
    let mut sb = Sandbox::start();
    // 200 KiB of args: more than a pipe takes without a reader (64 KiB),
    // so the release writes what fits and a thread the rest.
    let long: Vec<String> = (0..50).map(|i| format!("{i:04}").repeat(1024)).collect();
    let args: Vec<&str> = long.iter().map(String::as_str).collect();
    let stage = fitting_stage(&sb, &args);
    let stdout = run_on_the_runtime(&mut sb, stage);
    let expected = format!(
        "runtime got: {}|\n64\n1024\ncontrol-closed\n",
        long.join("|")
    );
    assert!(
        stdout == expected,
        "stdout {} bytes, expected {}: {:?}",
        stdout.len(),
        expected.len(),
        stdout.get(..80)
    );
}

#[test]
fn a_stage_with_another_environment_starts_cold_and_the_runtime_is_killed() {
    let mut sb = Sandbox::start();
    let fitting = fitting_stage(&sb, &[]);
    sb.send(prestart(&sb, &fitting));
    let mut stage = sb.stage("run", &["/bin/sh", "-c", "echo cold start"]);
    stage.stdin = true;
    stage.env.push(("EXTRA".into(), "1".into()));
    let bundle = sb.bundle(vec![], vec![stage]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(outcome.only_report().exit_code, Some(0), "{outcome:?}");
    assert_eq!(said_warm_runtime(&outcome.messages), [false]);
    assert_eq!(outcome.stdout_text(), "cold start\n");
    assert!(live_processes_of(sb.uid).is_empty());
}

#[test]
fn the_same_command_with_another_environment_does_not_fit() {
    let mut sb = Sandbox::start();
    let fitting = fitting_stage(&sb, &["x"]);
    sb.send(prestart(&sb, &fitting));
    let mut stage = fitting;
    stage.env.push(("PYTHONHASHSEED".into(), "0".into()));
    let bundle = sb.bundle(vec![], vec![stage]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(said_warm_runtime(&outcome.messages), [false]);
    // Started cold: the command does not exist.
    assert_eq!(outcome.only_report().exit_code, Some(127), "{outcome:?}");
    assert_eq!(outcome.stdout_text(), "");
}

#[test]
fn a_runtime_that_died_while_waiting_is_not_used() {
    let mut sb = Sandbox::start();
    let fitting = fitting_stage(&sb, &[]);
    let HostMessage::Prestart(mut dying) = prestart(&sb, &fitting) else {
        unreachable!()
    };
    dying.argv = vec!["/bin/sh".into(), "-c".into(), "echo early; exit 3".into()];
    sb.send(HostMessage::Prestart(dying));
    std::thread::sleep(Duration::from_millis(300));
    let mut stage = fitting;
    stage.argv = vec!["/bin/sh".into(), "-c".into(), "echo fresh".into()];
    let bundle = sb.bundle(vec![], vec![stage]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(said_warm_runtime(&outcome.messages), [false]);
    assert_eq!(outcome.only_report().exit_code, Some(0), "{outcome:?}");
    // Nothing the dead runtime wrote reaches the job.
    assert_eq!(outcome.stdout_text(), "fresh\n");
}

#[test]
fn a_runtime_that_opened_its_entry_file_reads_the_jobs_content_from_it() {
    let mut sb = Sandbox::start();
    let stage = fitting_stage(&sb, &["x"]);
    sb.send(preopening(&sb, &stage));
    // The empty file is there before the job, as the runtime's uid.
    let until = std::time::Instant::now() + T;
    while listing(&sb).is_empty() {
        assert!(std::time::Instant::now() < until, "no placeholder");
        std::thread::sleep(Duration::from_millis(10));
    }
    let made = std::fs::metadata(sb.workspace().join("main.rb")).unwrap();
    assert_eq!(made.len(), 0);
    let bundle = sb.bundle(
        vec![
            file("main.rb", b"puts :job\n", true),
            file("lib.rb", b"", false),
        ],
        vec![stage],
    );
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(said_warm_runtime(&outcome.messages), [true]);
    assert_eq!(outcome.only_report().exit_code, Some(0), "{outcome:?}");
    assert_eq!(outcome.stdout_text(), "runtime got: x|\nputs :job\n");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let written = std::fs::metadata(sb.workspace().join("main.rb")).unwrap();
    assert_eq!(written.ino(), made.ino(), "the same file, written in place");
    assert_eq!(written.uid(), sb.uid);
    assert_eq!(written.permissions().mode() & 0o777, 0o755);
    assert_eq!(listing(&sb), ["lib.rb", "main.rb"]);
}

#[test]
fn a_bundle_without_the_entry_file_starts_cold_and_the_empty_file_is_gone() {
    let mut sb = Sandbox::start();
    let stage = fitting_stage(&sb, &[]);
    sb.send(preopening(&sb, &stage));
    let mut cold = stage;
    cold.argv = vec!["/bin/sh".into(), "-c".into(), "ls; cat other.rb".into()];
    let bundle = sb.bundle(vec![file("other.rb", b"other\n", false)], vec![cold]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(said_warm_runtime(&outcome.messages), [false]);
    assert_eq!(outcome.only_report().exit_code, Some(0), "{outcome:?}");
    assert_eq!(outcome.stdout_text(), "other.rb\nother\n");
    assert!(live_processes_of(sb.uid).is_empty());
}

#[test]
fn a_stage_that_does_not_fit_gets_its_entry_file_fresh() {
    let mut sb = Sandbox::start();
    let fitting = fitting_stage(&sb, &[]);
    sb.send(preopening(&sb, &fitting));
    let mut stage = sb.stage("run", &["/bin/sh", "-c", "cat main.rb"]);
    stage.stdin = true;
    let bundle = sb.bundle(vec![file("main.rb", b"fresh\n", false)], vec![stage]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(said_warm_runtime(&outcome.messages), [false]);
    assert_eq!(outcome.only_report().exit_code, Some(0), "{outcome:?}");
    assert_eq!(outcome.stdout_text(), "fresh\n");
    assert_eq!(listing(&sb), ["main.rb"]);
}

#[test]
fn a_preopened_name_that_is_a_path_gives_no_runtime() {
    let mut sb = Sandbox::start();
    let stage = fitting_stage(&sb, &[]);
    let HostMessage::Prestart(mut prestart) = preopening(&sb, &stage) else {
        unreachable!()
    };
    prestart.preopened = Some("../main.rb".into());
    sb.send(HostMessage::Prestart(prestart));
    let mut cold = stage;
    cold.argv = vec!["/bin/sh".into(), "-c".into(), "echo cold".into()];
    let bundle = sb.bundle(vec![], vec![cold]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    assert_eq!(said_warm_runtime(&outcome.messages), [false]);
    assert_eq!(outcome.stdout_text(), "cold\n");
    assert!(
        outcome
            .diagnostics
            .contains("no warm runtime: cannot make its entry file"),
        "{outcome:?}"
    );
    assert!(listing(&sb).is_empty());
}
