//! Integration tests of `code-runner-init`, the in-sandbox supervisor, run
//! directly on the host (no container): the tests run as root, give each
//! job its own otherwise-unused uid (the supervisor kills every process of
//! that uid, so it must be one no host process runs as) and a tempdir
//! workspace, drive the binary with frames on stdin and parse its stdout.
//!
//! Every wait has a deadline; on failure the supervisor is killed by its pid
//! and whatever is left of the job's uid is killed by a `kill -9 -1` run as
//! that uid.

/// The egress relay from a loopback port to the job's proxy socket.
#[path = "init_supervisor/egress.rs"]
mod egress;
#[path = "init_supervisor/harness.rs"]
mod harness;
/// `input_wanted`: a process of the stage waits for stdin.
#[path = "init_supervisor/input.rs"]
mod input;
/// A watched stage reads big input as an unwatched one does (and what
/// watching costs it).
#[path = "init_supervisor/input_cost.rs"]
mod input_cost;
/// Limits and hostile programs.
#[path = "init_supervisor/limits.rs"]
mod limits;
/// Staying after `done` until the host closes its stream.
#[path = "init_supervisor/linger.rs"]
mod linger;
/// A stage's output files, sent before its end.
#[path = "init_supervisor/outputs.rs"]
mod outputs;
/// The runs after the stages (a graded job's tests).
#[path = "init_supervisor/runs.rs"]
mod runs;
/// Warm runtimes started before the bundle.
#[path = "init_supervisor/runtime.rs"]
mod runtime;
/// Warm runtimes fed their script through a FIFO.
#[path = "init_supervisor/runtime_fed.rs"]
mod runtime_fed;
/// The supervisor's own threads.
#[path = "init_supervisor/threads.rs"]
mod threads;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use code_runner_protocol::{HostMessage, Reason, SandboxMessage, SignalKind};

use harness::{PATH, SIGKILL, Sandbox, file};
use nix::sys::signal::Signal;

const T: Duration = Duration::from_secs(20);

#[test]
fn hello_world() {
    let mut sb = Sandbox::start();
    let stage = sb.stage("run", &["/bin/sh", "-c", "echo hi"]);
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    assert_eq!(outcome.stdout, b"hi\n");
    assert!(outcome.stderr.is_empty());
    assert_eq!(outcome.starts, ["run"]);
    let report = outcome.only_report();
    assert_eq!(report.stage, "run");
    assert_eq!(report.exit_code, Some(0));
    assert_eq!(report.signal, None);
    assert_eq!(report.reason, Reason::Exited);
    assert!(!report.output_truncated);
    assert!(report.memory_peak_bytes > 0);
    assert!(report.wall_ms < 5_000);
    assert_eq!(outcome.diagnostics, "");
    // ready, stage_start, stdout, stage_end, done: in that order.
    assert!(matches!(
        outcome.messages.as_slice(),
        [
            SandboxMessage::Ready(_),
            SandboxMessage::StageStart(_),
            SandboxMessage::Stdout(_),
            SandboxMessage::StageEnd(_),
            SandboxMessage::Done
        ]
    ));
}

#[test]
fn exit_code_is_reported_and_stderr_is_separate() {
    let mut sb = Sandbox::start();
    let stage = sb.stage("run", &["sh", "-c", "echo out; echo err >&2; exit 3"]);
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    assert_eq!(outcome.stdout, b"out\n");
    assert_eq!(outcome.stderr, b"err\n");
    let report = outcome.only_report();
    assert_eq!(report.exit_code, Some(3));
    assert_eq!(report.reason, Reason::Exited);
}

#[test]
fn stage_runs_with_exact_env_uid_no_groups_and_rlimits() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage(
        "run",
        &[
            "sh",
            "-c",
            "env; grep -E '^(Uid|Gid|Groups):' /proc/self/status; \
             grep -E '^Max (cpu time|file size|open files|core file size) ' /proc/self/limits; \
             test \"$(pwd)\" = \"$WS\" && echo cwd-ok; ps -o sid= -o pgid= -p $$",
        ],
    );
    let ws = sb.workspace().to_string_lossy().into_owned();
    stage.env.push(("WS".into(), ws));
    stage.env.push(("FOO".into(), "bar baz".into()));
    stage.limits.cpu_ms = 1500;
    stage.limits.fsize_bytes = 12345;
    stage.limits.nofile = 77;
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    assert_eq!(outcome.only_report().exit_code, Some(0), "{outcome:?}");
    let text = outcome.stdout_text();
    let lines: Vec<&str> = text.lines().collect();
    let mut env: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("PATH=") || l.starts_with("FOO=") || l.starts_with("WS="))
        .collect();
    env.sort();
    assert_eq!(env.len(), 3, "{text}");
    assert_eq!(env[0], "FOO=bar baz");
    assert_eq!(env[1], format!("PATH={PATH}"));
    // Nothing inherited: sh itself adds only PWD (and dash nothing else).
    for line in &lines {
        if line.contains('=') && !line.starts_with("Max") {
            let key = line.split('=').next().unwrap();
            assert!(
                ["PATH", "FOO", "WS", "PWD", "OLDPWD"].contains(&key),
                "unexpected variable {line:?}"
            );
        }
    }
    let uid = sb.uid;
    assert!(
        text.contains(&format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("Gid:\t{uid}\t{uid}\t{uid}\t{uid}\n")),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.trim_end() == "Groups:"),
        "supplementary groups not cleared: {text}"
    );
    let limit = |name: &str| -> Vec<String> {
        let line = lines
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing: {text}"));
        line[name.len()..]
            .split_whitespace()
            .take(2)
            .map(str::to_string)
            .collect()
    };
    assert_eq!(limit("Max cpu time"), ["3", "4"]);
    assert_eq!(limit("Max file size"), ["12345", "12345"]);
    assert_eq!(limit("Max open files"), ["77", "77"]);
    assert_eq!(limit("Max core file size"), ["0", "0"]);
    assert!(text.contains("cwd-ok"), "{text}");
}

#[test]
fn stdin_is_forwarded_byte_exact() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["cat"]);
    stage.stdin = true;
    stage.limits.output_bytes = 4 << 20;
    sb.send(sb.bundle(vec![], vec![stage]));
    let mut input = Vec::new();
    for round in 0..1200u32 {
        let chunk: Vec<u8> = (0..=255u8).map(|b| b ^ (round as u8)).collect();
        input.extend_from_slice(&chunk);
    }
    input.extend_from_slice(b"\0\r\n\xff no newline at the end");
    for piece in input.chunks(100_000) {
        sb.send(HostMessage::Stdin(piece.to_vec()));
    }
    sb.send(HostMessage::StdinClose);
    let outcome = sb.finish(T);
    assert_eq!(outcome.only_report().exit_code, Some(0));
    assert_eq!(outcome.stdout.len(), input.len());
    assert!(outcome.stdout == input, "output differs from input");
}

#[test]
fn stdin_sent_before_its_stage_starts_is_delivered_in_order() {
    let mut sb = Sandbox::start();
    let compile = sb.stage("compile", &["sh", "-c", "sleep 0.3; echo compiled"]);
    let mut run = sb.stage("run", &["cat"]);
    run.stdin = true;
    sb.send(sb.bundle(vec![], vec![compile, run]));
    sb.send(HostMessage::Stdin(b"first ".to_vec()));
    sb.send(HostMessage::Stdin(b"second\n".to_vec()));
    sb.send(HostMessage::StdinClose);
    let outcome = sb.finish(T);
    assert!(outcome.done && outcome.exit_code == Some(0), "{outcome:?}");
    assert_eq!(outcome.starts, ["compile", "run"]);
    assert_eq!(outcome.stdout_text(), "compiled\nfirst second\n");
    assert!(outcome.reports.iter().all(|r| r.exit_code == Some(0)));
}

#[test]
fn stdin_close_gives_eof() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["sh", "-c", "cat; echo after-eof"]);
    stage.stdin = true;
    sb.send(sb.bundle(vec![], vec![stage]));
    sb.send(HostMessage::Stdin(b"abc\n".to_vec()));
    sb.wait_for_stdout("abc\n", T);
    sb.send(HostMessage::StdinClose);
    let outcome = sb.finish(T);
    assert_eq!(outcome.stdout_text(), "abc\nafter-eof\n");
    assert_eq!(outcome.only_report().exit_code, Some(0));
}

#[test]
fn prompt_without_newline_arrives_before_any_input() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage(
        "run",
        &["sh", "-c", "printf 'name? '; read name; echo \"hi $name\""],
    );
    stage.stdin = true;
    sb.send(sb.bundle(vec![], vec![stage]));
    let prompt = sb.wait_for_stdout("name? ", Duration::from_secs(5));
    assert_eq!(prompt, b"name? ");
    sb.send(HostMessage::Stdin(b"bob\n".to_vec()));
    let outcome = sb.finish(T);
    assert_eq!(outcome.stdout_text(), "name? hi bob\n");
    assert_eq!(outcome.only_report().exit_code, Some(0));
}

#[test]
fn interrupt_reaches_the_stage_as_sigint() {
    let mut sb = Sandbox::start();
    let stage = sb.stage(
        "run",
        &[
            "sh",
            "-c",
            "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.05; done",
        ],
    );
    sb.send(sb.bundle(vec![], vec![stage]));
    sb.wait_for_stdout("ready\n", Duration::from_secs(5));
    sb.send(HostMessage::Signal(SignalKind::Interrupt));
    let outcome = sb.finish(T);
    assert_eq!(outcome.stdout_text(), "ready\ngot-int\n");
    let report = outcome.only_report();
    assert_eq!(report.exit_code, Some(5));
    assert_eq!(report.reason, Reason::Exited);
}

#[test]
fn kill_frame_kills_the_stage() {
    let mut sb = Sandbox::start();
    let stage = sb.stage("run", &["sh", "-c", "echo started; sleep 100"]);
    sb.send(sb.bundle(vec![], vec![stage]));
    sb.wait_for_stdout("started\n", Duration::from_secs(5));
    sb.send(HostMessage::Signal(SignalKind::Kill));
    let outcome = sb.finish(Duration::from_secs(5));
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::Killed);
    assert_eq!(report.signal, Some(SIGKILL));
}

#[test]
fn sigterm_to_the_supervisor_kills_the_stage_and_ends_the_run() {
    let mut sb = Sandbox::start();
    let run = sb.stage("run", &["sh", "-c", "echo started; sleep 100"]);
    let after = sb.stage("after", &["echo", "must not run"]);
    sb.send(sb.bundle(vec![], vec![run, after]));
    sb.wait_for_stdout("started\n", Duration::from_secs(5));
    sb.signal_supervisor(Signal::SIGTERM);
    let outcome = sb.finish(Duration::from_secs(5));
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::Killed);
    assert_eq!(report.signal, Some(SIGKILL));
    assert_eq!(outcome.starts, ["run"]);
}

#[test]
fn failing_compile_stage_stops_the_run_stage() {
    let mut sb = Sandbox::start();
    let compile = sb.stage(
        "compile",
        &["sh", "-c", "echo 'main.c:1: error' >&2; exit 1"],
    );
    let run = sb.stage("run", &["echo", "ran"]);
    sb.send(sb.bundle(vec![], vec![compile, run]));
    let outcome = sb.finish(T);
    assert_eq!(outcome.starts, ["compile"]);
    assert_eq!(outcome.stderr, b"main.c:1: error\n");
    assert!(outcome.stdout.is_empty());
    let report = outcome.only_report();
    assert_eq!(report.stage, "compile");
    assert_eq!(report.exit_code, Some(1));
}

#[test]
fn command_not_found_is_exit_127_with_the_error_on_stderr() {
    let mut sb = Sandbox::start();
    let stage = sb.stage("run", &["definitely-not-a-command-xyz"]);
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.exit_code, Some(127));
    assert_eq!(report.reason, Reason::Exited);
    let stderr = String::from_utf8_lossy(&outcome.stderr);
    assert!(
        stderr.contains("definitely-not-a-command-xyz") && stderr.contains("No such file"),
        "{stderr}"
    );
}

#[test]
fn files_are_written_as_the_job_uid_with_their_modes() {
    let mut sb = Sandbox::start();
    let files = vec![
        file(
            "main.sh",
            b"#!/bin/sh\necho from-script \"$(cat data/deep/input.txt)\"\n",
            true,
        ),
        file("data/deep/input.txt", b"payload", false),
        file("data/other.bin", &[0, 1, 2, 255], false),
    ];
    let stage = sb.stage("run", &["./main.sh"]);
    sb.send(sb.bundle(files, vec![stage]));
    let outcome = sb.finish(T);
    assert_eq!(outcome.stdout_text(), "from-script payload\n");
    assert_eq!(outcome.only_report().exit_code, Some(0));
    let ws = sb.workspace().to_path_buf();
    for (path, mode) in [
        ("main.sh", 0o100755),
        ("data", 0o040755),
        ("data/deep", 0o040755),
        ("data/deep/input.txt", 0o100644),
        ("data/other.bin", 0o100644),
    ] {
        let meta = std::fs::symlink_metadata(ws.join(path)).unwrap();
        assert_eq!(meta.uid(), sb.uid, "{path}");
        assert_eq!(meta.gid(), sb.uid, "{path}");
        assert_eq!(meta.mode(), mode, "{path}: {:o}", meta.mode());
    }
    assert_eq!(
        std::fs::read(ws.join("data/other.bin")).unwrap(),
        [0, 1, 2, 255]
    );
}

#[test]
fn malformed_first_frame_is_fatal() {
    let mut sb = Sandbox::start();
    sb.send_raw(&[0, 0, 0, 0]);
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(70));
    let fatal = outcome.fatal.expect("a fatal frame");
    assert!(fatal.contains("malformed frame"), "{fatal}");
    assert!(!outcome.done);
}

#[test]
fn a_first_frame_other_than_the_bundle_is_fatal() {
    let mut sb = Sandbox::start();
    sb.send(HostMessage::Stdin(b"early".to_vec()));
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(70));
    let fatal = outcome.fatal.expect("a fatal frame");
    assert!(
        fatal.contains("expected a bundle") && fatal.contains("stdin"),
        "{fatal}"
    );
}

#[test]
fn eof_before_the_bundle_is_fatal() {
    let mut sb = Sandbox::start();
    sb.close_stdin();
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(70));
    assert!(
        outcome
            .fatal
            .expect("a fatal frame")
            .contains("before sending the bundle")
    );
}

#[test]
fn bundle_path_escaping_the_workspace_is_fatal() {
    let mut sb = Sandbox::start();
    let escape_target = sb.workspace().parent().unwrap().join("x");
    let stage = sb.stage("run", &["echo", "ran"]);
    sb.send(sb.bundle(vec![file("../x", b"escaped", false)], vec![stage]));
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(70));
    let fatal = outcome.fatal.expect("a fatal frame");
    assert!(
        fatal.contains("\"../x\"") && fatal.contains(".."),
        "{fatal}"
    );
    assert!(outcome.starts.is_empty());
    assert!(std::fs::read(&escape_target).map_or(true, |c| c != b"escaped"));
}

/// Runs a bundle whose only file is `path`, in a workspace where `prepare`
/// planted a symlink to a directory outside; the run must be fatal and
/// nothing may appear outside.
fn assert_symlink_not_followed(path: &str, prepare: impl FnOnce(&Path, &Path)) {
    let mut sb = Sandbox::start();
    let outside = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    prepare(sb.workspace(), outside.path());
    let stage = sb.stage("run", &["echo", "ran"]);
    sb.send(sb.bundle(vec![file(path, b"through the link", false)], vec![stage]));
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(70), "{outcome:?}");
    let fatal = outcome.fatal.expect("a fatal frame");
    assert!(fatal.contains(path), "{fatal}");
    assert!(outcome.starts.is_empty());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn symlinked_directory_in_the_workspace_is_never_followed() {
    assert_symlink_not_followed("link/x", |workspace, outside| {
        std::os::unix::fs::symlink(outside, workspace.join("link")).unwrap();
    });
}

#[test]
fn symlinked_file_in_the_workspace_is_never_followed() {
    assert_symlink_not_followed("file-link", |workspace, outside| {
        std::os::unix::fs::symlink(outside.join("target"), workspace.join("file-link")).unwrap();
    });
}

#[test]
fn root_uid_in_the_bundle_is_refused() {
    let mut sb = Sandbox::start();
    let stage = sb.stage("run", &["id"]);
    let HostMessage::Bundle(mut bundle) = sb.bundle(vec![], vec![stage]) else {
        unreachable!()
    };
    bundle.uid = 0;
    sb.send(HostMessage::Bundle(bundle));
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(70));
    assert!(outcome.fatal.expect("a fatal frame").contains("non-root"));
}

#[test]
fn sigterm_before_the_bundle_is_fatal() {
    let mut sb = Sandbox::start();
    sb.signal_supervisor(Signal::SIGTERM);
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(70));
    assert!(
        outcome
            .fatal
            .expect("a fatal frame")
            .contains("terminated by a signal")
    );
}

#[test]
fn missing_cwd_is_exit_127() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["echo", "hi"]);
    stage.cwd = sb
        .workspace()
        .join("missing")
        .to_string_lossy()
        .into_owned();
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    assert_eq!(outcome.only_report().exit_code, Some(127));
    assert!(String::from_utf8_lossy(&outcome.stderr).contains("missing"));
}
