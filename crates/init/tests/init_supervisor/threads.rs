//! The supervisor's own threads: pipe threads are kept for the next stage,
//! and only the main thread takes the signals the supervisor handles.

use code_runner_protocol::{HostMessage, SandboxMessage};

use super::T;
use super::harness::Sandbox;

/// SIGINT (2), SIGTERM (15) and SIGCHLD (17) in a `SigBlk` mask.
const HANDLED: u64 = (1 << (2 - 1)) | (1 << (15 - 1)) | (1 << (17 - 1));

/// A thread of the supervisor: its id, name and blocked signals.
#[derive(Debug)]
pub(super) struct Task {
    tid: u32,
    pub name: String,
    blocked: u64,
}

/// The threads of process `pid`, by id.
pub(super) fn tasks_of(pid: u32) -> Vec<Task> {
    let mut tasks = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let tid: u32 = entry
            .unwrap()
            .file_name()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) else {
            continue; // ended meanwhile
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(str::trim)
                .unwrap()
                .to_string()
        };
        tasks.push(Task {
            tid,
            name: field("Name:"),
            blocked: u64::from_str_radix(&field("SigBlk:"), 16).unwrap(),
        });
    }
    tasks.sort_by_key(|task| task.tid);
    tasks
}

fn pipe_threads(tasks: &[Task]) -> Vec<u32> {
    tasks
        .iter()
        .filter(|task| task.name == "stage-pipe")
        .map(|task| task.tid)
        .collect()
}

#[test]
fn pipe_threads_outlive_their_stage_and_only_the_main_thread_takes_the_handled_signals() {
    let mut sb = Sandbox::start();
    let pid = sb.child.id();
    let stages = vec![
        sb.stage("one", &["/bin/sh", "-c", "echo one; sleep 1"]),
        sb.stage("two", &["/bin/sh", "-c", "echo two"]),
        sb.stage("three", &["/bin/sh", "-c", "echo three"]),
    ];
    let HostMessage::Bundle(mut bundle) = sb.bundle(vec![], stages) else {
        unreachable!()
    };
    bundle.linger_ms = 60_000;
    sb.send(HostMessage::Bundle(bundle));
    sb.wait_for_stdout("one", T);
    // The first stage's stdout and stderr threads, while it runs.
    let running = tasks_of(pid);
    let first = pipe_threads(&running);
    assert_eq!(first.len(), 2, "{running:?}");
    while !matches!(sb.next(T), SandboxMessage::Done) {}

    // Lingering after `done`: the first stage's threads are still there,
    // waiting, and no more of them than the supervisor keeps.
    let tasks = tasks_of(pid);
    let kept = pipe_threads(&tasks);
    for tid in &first {
        assert!(kept.contains(tid), "thread {tid} ended: {tasks:?}");
    }
    assert!(kept.len() <= 6, "{kept:?}");
    for task in &tasks {
        if task.tid == pid {
            assert_eq!(task.blocked & HANDLED, 0, "main thread: {task:?}");
        } else {
            assert_eq!(task.blocked & HANDLED, HANDLED, "helper thread: {task:?}");
        }
    }
    assert!(tasks.len() > 3, "{tasks:?}");

    sb.close_stdin();
    let outcome = sb.finish(T);
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(outcome.stdout, b"one\ntwo\nthree\n");
}
