//! The runs after the stages (a graded job's tests): each as the plan's
//! uid, each with its own stdin, and each finding the scratch trees as the
//! first one did.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use code_runner_protocol::{BundleFile, HostMessage, Reason, RunSpec, SandboxMessage, StageSpec};

use super::harness::{Outcome, Sandbox, file, live_processes_of};

const T: Duration = Duration::from_secs(20);

/// A scratch directory like the sandbox's `/tmp`: sticky, open to all.
fn scratch_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

fn run(
    sb: &Sandbox,
    index: usize,
    script: &str,
    input: &[u8],
    files: Vec<BundleFile>,
) -> HostMessage {
    let mut stage: StageSpec = sb.stage(&format!("test:{index}"), &["/bin/sh", "-c", script]);
    stage.stdin = true;
    HostMessage::Run(Box::new(RunSpec {
        stage,
        input: input.to_vec(),
        files,
    }))
}

/// Stdout per stage, in the order the stages ran.
fn stdout_by_stage(outcome: &Outcome) -> BTreeMap<String, String> {
    let mut by_stage = BTreeMap::new();
    let mut current = String::new();
    for message in &outcome.messages {
        match message {
            SandboxMessage::StageStart(start) => current = start.stage.clone(),
            SandboxMessage::Stdout(data) => by_stage
                .entry(current.clone())
                .or_insert_with(String::new)
                .push_str(&String::from_utf8_lossy(data)),
            _ => {}
        }
    }
    by_stage
}

#[test]
fn each_run_has_the_plans_uid_and_its_own_stdin_and_files() {
    let mut sb = Sandbox::start();
    let tmp = scratch_dir();
    let files_dir = tmp.path().join("run");
    let script = format!(
        "id -u; cat; cat {}/input 2>/dev/null || echo no-file",
        files_dir.display()
    );
    let bundle = sb.bundle_with_runs(
        vec![file("a.txt", b"original\n", false)],
        vec![],
        vec![
            sb.workspace().display().to_string(),
            tmp.path().display().to_string(),
        ],
        &files_dir.display().to_string(),
    );
    sb.send(bundle);
    sb.send(run(
        &sb,
        0,
        &script,
        b"first\n",
        vec![file("input", b"given\n", false)],
    ));
    sb.send(run(&sb, 1, &script, b"second\n", vec![]));
    sb.send(HostMessage::RunsEnd);
    let outcome = sb.finish(T);
    assert!(outcome.done, "{outcome:?}");
    assert_eq!(outcome.starts, ["test:0", "test:1"]);
    let out = stdout_by_stage(&outcome);
    let uid = sb.runs_uid();
    assert_eq!(out["test:0"], format!("{uid}\nfirst\ngiven\n"));
    assert_eq!(
        out["test:1"],
        format!("{uid}\nsecond\nno-file\n"),
        "the files of run 0 are gone"
    );
    assert!(
        outcome
            .reports
            .iter()
            .all(|r| r.reason == Reason::Exited && r.exit_code == Some(0))
    );
}

#[test]
fn a_run_cannot_change_what_the_stages_left_nor_leave_anything_for_the_next() {
    let mut sb = Sandbox::start();
    let tmp = scratch_dir();
    let ws = sb.workspace().display().to_string();
    let t = tmp.path().display().to_string();
    // The compile stage (the bundle's uid) leaves a file others could write
    // and a directory others could write in; the runs may change neither.
    let compile = sb.stage(
        "compile",
        &["/bin/sh", "-c", &format!("echo built > {ws}/out && chmod 666 {ws}/out && mkdir {t}/cache && chmod 777 {t}/cache && echo c > {t}/cache/keep && chmod 666 {t}/cache/keep")],
    );
    let bundle = sb.bundle_with_runs(
        vec![file("a.txt", b"original\n", false)],
        vec![compile],
        vec![ws.clone(), t.clone()],
        &format!("{t}/run"),
    );
    sb.send(bundle);
    let spoil = format!(
        "echo hacked > {ws}/a.txt; echo hacked > {ws}/out; echo hacked > {t}/cache/keep; rm -f {t}/cache/keep {ws}/out; \
         echo x > {ws}/left; mkdir -p {ws}/d/e; echo y > {ws}/d/e/f; chmod 000 {ws}/d; echo z > {t}/cache/new; ln -s /etc {t}/link; \
         (sleep 30 &); echo spoiled"
    );
    let look = format!(
        "cat {ws}/a.txt {ws}/out {t}/cache/keep; ls -A {ws}; echo --; ls -A {t}; echo --; ls -A {t}/cache"
    );
    sb.send(run(&sb, 0, &spoil, b"", vec![]));
    sb.send(run(&sb, 1, &look, b"", vec![]));
    sb.send(HostMessage::RunsEnd);
    let outcome = sb.finish(T);
    assert!(outcome.done, "{outcome:?}");
    let out = stdout_by_stage(&outcome);
    assert_eq!(out["test:0"].trim_end(), "spoiled");
    assert_eq!(
        out["test:1"], "original\nbuilt\nc\na.txt\nout\n--\ncache\n--\nkeep\n",
        "the second run saw what the first one left"
    );
    assert!(
        live_processes_of(sb.runs_uid()).is_empty(),
        "a process of run 0 outlived it"
    );
}

#[test]
fn a_run_cannot_create_ipc_objects() {
    let mut sb = Sandbox::start();
    let tmp = scratch_dir();
    let t = tmp.path().display().to_string();
    let bundle = sb.bundle_with_runs(vec![], vec![], vec![t.clone()], &format!("{t}/run"));
    sb.send(bundle);
    sb.send(run(
        &sb,
        0,
        "ipcmk -M 4096 2>&1; ipcmk -Q 2>&1; ipcmk -S 1 2>&1; echo end",
        b"",
        vec![],
    ));
    sb.send(HostMessage::RunsEnd);
    let outcome = sb.finish(T);
    let out = &stdout_by_stage(&outcome)["test:0"];
    assert_eq!(out.matches("Operation not permitted").count(), 3, "{out}");
    assert!(out.ends_with("end\n"), "{out}");
}

#[test]
fn runs_sent_before_a_failing_compile_never_run() {
    let mut sb = Sandbox::start();
    let tmp = scratch_dir();
    let t = tmp.path().display().to_string();
    let compile = sb.stage("compile", &["/bin/sh", "-c", "exit 1"]);
    let bundle = sb.bundle_with_runs(vec![], vec![compile], vec![t.clone()], &format!("{t}/run"));
    sb.send(bundle);
    sb.send(run(&sb, 0, "echo ran", b"", vec![]));
    let outcome = sb.finish(T);
    assert!(outcome.done);
    assert_eq!(outcome.starts, ["compile"]);
    assert_eq!(outcome.reports[0].exit_code, Some(1));
}

#[test]
fn a_run_of_a_bundle_without_a_plan_is_fatal() {
    let mut sb = Sandbox::start();
    let stage = sb.stage("run", &["/bin/sh", "-c", "sleep 1"]);
    sb.send(sb.bundle(vec![], vec![stage]));
    sb.send(run(&sb, 0, "echo ran", b"", vec![]));
    let outcome = sb.finish(T);
    assert_eq!(
        outcome.fatal.as_deref(),
        Some("unexpected run frame from the host after the bundle")
    );
}
