//! Warm runtimes (`prestart`): the runtime started before the bundle runs
//! the first stage when it fits, with the stage's args and rlimits; one
//! that does not fit, or died while waiting, is killed and the stage
//! starts cold.
//!
//! The "runtime" here is bash, which reads its control descriptor (200)
//! and prints what it got; the stage it stands for is a command that does
//! not exist, so a stage that prints anything ran on the runtime.

use std::time::Duration;

use code_runner_protocol::{HostMessage, Prestart, Reason, SandboxMessage, StageSpec};

use super::harness::{Sandbox, live_processes_of};

const T: Duration = Duration::from_secs(20);

/// Prints the args it was given, its open-files limit and its file-size
/// limit (bash counts 1024-byte blocks), then exits 0.
const RUNTIME: &str = "args=$(tr '\\0' '|' <&200); exec 200<&-; echo \"runtime got: $args\"; ulimit -n; ulimit -f; test -e /proc/self/fd/200 && echo control-open || echo control-closed";

fn prestart(sb: &Sandbox, stage: &StageSpec) -> HostMessage {
    HostMessage::Prestart(Box::new(Prestart {
        uid: sb.uid,
        gid: sb.uid,
        argv: vec!["/bin/bash".into(), "-c".into(), RUNTIME.into()],
        stage_argv: vec!["not-a-command-anywhere".into()],
        env: stage.env.clone(),
        cwd: stage.cwd.clone(),
    }))
}

/// The stage the runtime stands for, with `args`.
fn fitting_stage(sb: &Sandbox, args: &[&str]) -> StageSpec {
    let mut argv = vec!["not-a-command-anywhere"];
    argv.extend_from_slice(args);
    let mut stage = sb.stage("run", &argv);
    stage.stdin = true;
    stage
}

fn said_warm_runtime(messages: &[SandboxMessage]) -> Vec<bool> {
    messages
        .iter()
        .filter_map(|m| match m {
            SandboxMessage::StageStart(start) => Some(start.warm_runtime),
            _ => None,
        })
        .collect()
}

#[test]
fn a_fitting_stage_runs_on_the_runtime_with_its_args_and_limits() {
    let mut sb = Sandbox::start();
    let mut stage = fitting_stage(&sb, &["a", "b c", ""]);
    stage.limits.nofile = 77;
    stage.limits.fsize_bytes = 512 * 1024;
    sb.send(prestart(&sb, &stage));
    let bundle = sb.bundle(vec![], vec![stage]);
    sb.send(bundle);
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(
        (report.reason, report.exit_code),
        (Reason::Exited, Some(0)),
        "{outcome:?}"
    );
    assert_eq!(said_warm_runtime(&outcome.messages), [true]);
    // The args, NUL-separated; the stage's rlimits, not the supervisor's;
    // and the control descriptor closed.
    assert_eq!(
        outcome.stdout_text(),
        "runtime got: a|b c||\n77\n512\ncontrol-closed\n"
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
