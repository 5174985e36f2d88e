//! The `code-runner` binary as a user runs it, on real sandboxes: exit
//! codes, what reaches stdout and stderr, streaming, `doctor`. Its
//! refusals, which need no Docker, are in the `tools` binary (`tools::cli`).

use crate::common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cli::{ChildGuard, finish, run};
use common::{CliHarness, runsc_enabled, source};

fn sandbox_run(harness: &CliHarness, files: &[&Path], flags: &[&str]) -> Command {
    let mut command = harness.command();
    command.args(["sandbox", "run"]).args(files).args(flags);
    command
}

#[tokio::test]
async fn hello_prints_exactly_the_programs_stdout_and_exits_0() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let hello = source(dir.path(), "hello.py", "print('hello')\n");
    let ran = run(sandbox_run(&harness, &[&hello], &[]));
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    assert_eq!(ran.stdout, "hello\n");
    assert_eq!(ran.stderr, "");
    harness.assert_clean().await;
}

#[tokio::test]
async fn the_programs_exit_code_is_the_commands() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let program = source(
        dir.path(),
        "three.py",
        "import sys\nprint('bye')\nsys.exit(3)\n",
    );
    let ran = run(sandbox_run(&harness, &[&program], &[]));
    assert_eq!(ran.code, Some(3), "{ran:#?}");
    assert_eq!(ran.stdout, "bye\n");
    assert_eq!(ran.stderr, "");

    let program = source(dir.path(), "three.sh", "echo to stderr >&2; exit 3\n");
    let ran = run(sandbox_run(&harness, &[&program], &[]));
    assert_eq!(ran.code, Some(3), "{ran:#?}");
    assert_eq!(ran.stdout, "");
    assert_eq!(ran.stderr, "to stderr\n");
    harness.assert_clean().await;
}

#[tokio::test]
async fn json_prints_the_result() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let hello = source(dir.path(), "hello.py", "print('hello')\n");
    let ran = run(sandbox_run(&harness, &[&hello], &["--json"]));
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    assert_eq!(ran.stderr, "");
    let result: serde_json::Value = serde_json::from_str(&ran.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", ran.stdout));
    assert_eq!(result["status"], "succeeded");
    assert_eq!(result["language"], "python");
    assert_eq!(result["run"]["stdout"], "hello\n");
    assert_eq!(result["run"]["stderr"], "");
    assert_eq!(result["run"]["exit_code"], 0);
    assert_eq!(result["run"]["reason"], "exited");
    assert_eq!(result["compile"], serde_json::Value::Null);
    assert_eq!(result["error"], serde_json::Value::Null);
    harness.assert_clean().await;
}

#[tokio::test]
async fn a_wall_timeout_exits_124_with_one_line() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let program = source(dir.path(), "sleep.sh", "sleep 100\n");
    let started = Instant::now();
    let ran = run(sandbox_run(&harness, &[&program], &["--wall-ms", "500"]));
    assert_eq!(ran.code, Some(124), "{ran:#?}");
    assert_eq!(ran.stdout, "");
    assert_eq!(
        ran.stderr,
        "code-runner: program exceeded its wall time limit\n"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn a_compile_error_exits_with_the_compilers_code_and_shows_its_diagnostics() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let program = source(dir.path(), "main.c", "int main(void) { return nope; }\n");
    let ran = run(sandbox_run(&harness, &[&program], &[]));
    assert_eq!(ran.code, Some(1), "{ran:#?}");
    assert_eq!(ran.stdout, "");
    // The stages run with LANG=C.UTF-8, so gcc quotes with ‘ and ’.
    assert!(
        ran.stderr
            .contains("main.c:1:25: error: ‘nope’ undeclared (first use in this function)"),
        "{:?}",
        ran.stderr
    );
    assert!(
        ran.stderr
            .ends_with("\ncode-runner: compilation failed (exit code 1)\n"),
        "{:?}",
        ran.stderr
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn stdin_dash_passes_the_commands_own_stdin() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let program = source(
        dir.path(),
        "echo.py",
        "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())\n",
    );
    let input = "line one\nünïcode line two, no newline at the end";
    let mut command = sandbox_run(&harness, &[&program], &["--stdin", "-"]);
    let mut guard = ChildGuard(Some(
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let mut stdin = guard.child().stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let ran = finish(guard);
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    assert_eq!(ran.stdout, input);
    assert_eq!(ran.stderr, "");
    harness.assert_clean().await;
}

#[tokio::test]
async fn output_is_streamed_while_the_program_runs() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let program = source(
        dir.path(),
        "stream.py",
        "import sys, time\nprint('first')\nsys.stdout.flush()\ntime.sleep(3)\nprint('second')\n",
    );
    let mut command = sandbox_run(&harness, &[&program], &[]);
    let mut guard = ChildGuard(Some(
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    // Read the pipe on a thread of its own, so waiting has a deadline.
    let mut stdout = guard.child().stdout.take().unwrap();
    let (chunks, received) = std::sync::mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        loop {
            match stdout.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if chunks.send(buffer[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while !seen.ends_with(b"first\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = received
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no `first` before the deadline ({e}); have {seen:?}"));
        seen.extend_from_slice(&chunk);
    }
    // `first` is here while the program still sleeps: it was streamed.
    assert!(
        guard.child().try_wait().unwrap().is_none(),
        "the command had already ended"
    );
    assert_eq!(String::from_utf8_lossy(&seen), "first\n");
    let ran = finish(guard);
    reader.join().unwrap();
    seen.extend(received.try_iter().flatten());
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    assert_eq!(ran.stderr, "");
    assert_eq!(String::from_utf8_lossy(&seen), "first\nsecond\n");
    harness.assert_clean().await;
}

#[tokio::test]
async fn doctor_passes_on_this_machine() {
    let harness = CliHarness::new().await;
    let mut command = harness.command();
    command.arg("doctor");
    let ran = run(command);
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert!(
        lines.contains(&"ok: image code-runner/python:latest is present and current"),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("problem:")),
        "{lines:#?}"
    );
    harness.assert_clean().await;
}

#[tokio::test]
async fn sandbox_runtime_runsc_runs_hello_under_gvisor() {
    if !runsc_enabled() {
        println!("runsc tests are skipped (CODE_RUNNER_TEST_RUNSC is not 1)");
        return;
    }
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let hello = source(
        dir.path(),
        "hello.py",
        "import os\nprint('hello')\nprint(os.uname().release)\n",
    );
    let mut command = sandbox_run(&harness, &[&hello], &[]);
    command.env("SANDBOX_RUNTIME", "runsc");
    let ran = run(command);
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    assert_eq!(ran.stderr, "");
    let lines: Vec<&str> = ran.stdout.lines().collect();
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0], "hello");
    // gVisor answers uname with its own kernel's release, not the host's.
    assert_ne!(
        lines[1],
        host_release.trim(),
        "the program saw the host kernel: not gVisor"
    );
    harness.assert_clean().await;
}
