//! Limits and hostile programs: output, wall, CPU, idle, memory, a stage
//! that never reads stdin or closes it early, an escaping grandchild, a fork bomb.

use std::path::Path;
use std::time::{Duration, Instant};

use code_runner_protocol::{HostMessage, Reason, SignalKind, StageReport};

use super::T;
use super::harness::{SIGKILL, Sandbox, TestCgroup, live_processes_of};

#[test]
fn stage_that_never_reads_stdin_does_not_stall_the_supervisor() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["sleep", "100"]);
    stage.stdin = true;
    stage.limits.wall_ms = 800;
    sb.send(sb.bundle(vec![], vec![stage]));
    let started = Instant::now();
    // Far more than a pipe holds; the supervisor queues it.
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..16 {
        sb.send(HostMessage::Stdin(chunk.clone()));
    }
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::WallTimeout, "{report:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn stage_that_closes_its_stdin_early_loses_the_rest_and_does_not_stall() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage(
        "run",
        &["sh", "-c", "head -c 3; exec 0<&-; sleep 0.3; echo done"],
    );
    stage.stdin = true;
    sb.send(sb.bundle(vec![], vec![stage]));
    let started = Instant::now();
    // Far more than a pipe holds: most of it is still queued when the stage
    // closes its stdin, and is dropped then.
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..16 {
        sb.send(HostMessage::Stdin(chunk.clone()));
    }
    sb.send(HostMessage::StdinClose);
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::Exited, "{report:?}");
    assert_eq!(report.exit_code, Some(0));
    assert_eq!(outcome.stdout, b"xxxdone\n");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// What a stage wrote just before it ended is all sent, however late the
/// host reads it: the drain's bound is for pipes held open, not for a host
/// that is slow to take frames (a loaded worker).
#[test]
fn output_left_at_the_stages_end_reaches_a_host_that_reads_late() {
    let mut sb = Sandbox::start();
    // 70 000 bytes fill the supervisor's stdout pipe; then 150 writes 10 ms
    // apart, a frame each, fill its queue of frames, and the last of them
    // wait in the stage's own pipe when the stage ends.
    let stage = sb.stage(
        "run",
        &[
            "sh",
            "-c",
            "head -c 70000 /dev/zero | tr '\\0' y; i=0; while [ $i -lt 150 ]; do printf x; sleep 0.01; i=$((i+1)); done",
        ],
    );
    let gate = sb.reading_gate();
    let paused = gate.lock().unwrap();
    sb.send(sb.bundle(vec![], vec![stage]));
    // The stage ends within about 2 s; the host reads nothing until 5 s.
    std::thread::sleep(Duration::from_secs(5));
    drop(paused);
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::Exited, "{report:?}");
    assert_eq!(report.exit_code, Some(0));
    assert!(!report.output_truncated, "{report:?}");
    let mut expected = vec![b'y'; 70_000];
    expected.extend([b'x'; 150]);
    assert_eq!(outcome.stdout.len(), expected.len());
    assert!(outcome.stdout == expected);
}

/// A stage's output still held open after every process of the stage is
/// gone (here by the test, opening the pipe through `/proc` as a process
/// that escaped the kill would hold it) is cut after the drain's bound, and
/// the report says so: nothing is dropped silently.
#[test]
fn output_held_open_past_the_stages_end_is_cut_and_said() {
    let mut sb = Sandbox::start();
    let stage = sb.stage("run", &["sh", "-c", "echo before; sleep 1"]);
    sb.send(sb.bundle(vec![], vec![stage]));
    sb.wait_for_stdout("before", T);
    let pid = live_processes_of(sb.uid)[0];
    let holder = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/fd/1"))
        .unwrap();
    let outcome = sb.finish(T);
    drop(holder);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::Exited, "{report:?}");
    assert_eq!(report.exit_code, Some(0));
    assert!(report.output_truncated, "{report:?}");
    assert_eq!(outcome.stdout_text(), "before\n");
    assert!(
        outcome
            .diagnostics
            .contains("the stage's output was still open 3000 ms after it ended"),
        "{:?}",
        outcome.diagnostics
    );
}

#[test]
fn output_limit_keeps_exactly_the_first_bytes() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["sh", "-c", "yes | head -c 3000000"]);
    stage.limits.output_bytes = 100_000;
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::OutputLimit);
    assert!(report.output_truncated);
    assert_eq!(outcome.stdout.len(), 100_000);
    assert!(outcome.stdout == b"y\n".repeat(50_000));
}

#[test]
fn output_at_exactly_the_limit_is_not_truncated() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["sh", "-c", "printf 12345; printf 67890 >&2"]);
    stage.limits.output_bytes = 10;
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::Exited);
    assert!(!report.output_truncated);
    assert_eq!(outcome.stdout, b"12345");
    assert_eq!(outcome.stderr, b"67890");
}

#[test]
fn wall_timeout_kills_and_the_supervisor_exits_promptly() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["sleep", "100"]);
    stage.limits.wall_ms = 300;
    sb.send(sb.bundle(vec![], vec![stage]));
    let started = Instant::now();
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::WallTimeout);
    assert_eq!(report.signal, Some(SIGKILL));
    assert_eq!(report.exit_code, None);
    assert!(
        report.wall_ms >= 300 && report.wall_ms < 1_500,
        "{report:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// The report of `sh -c script` with a CPU limit of 500 ms (and 10 s of
/// wall), which must end it.
fn killed_at_the_cpu_limit(script: &str) -> StageReport {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["sh", "-c", script]);
    stage.limits.cpu_ms = 500;
    stage.limits.wall_ms = 10_000;
    sb.send(sb.bundle(vec![], vec![stage]));
    let report = sb.finish(T).only_report().clone();
    assert_eq!(report.reason, Reason::CpuTimeout, "{report:?}");
    report
}

#[test]
fn cpu_timeout_on_a_busy_loop() {
    let report = killed_at_the_cpu_limit("while :; do :; done");
    assert_eq!(report.signal, Some(SIGKILL));
    assert!(report.cpu_ms >= 500, "{report:?}");
    assert!(report.wall_ms < 5_000, "{report:?}");
}

#[test]
fn cpu_limit_after_an_idle_spell_is_kept_as_closely_as_from_the_start() {
    // While the job sleeps its CPU time is read seldom (the limit is out of
    // reach); once it spins, the reads must come in time all the same. Read
    // once a second regardless, the loop would run past 1 s of CPU.
    let report = killed_at_the_cpu_limit("sleep 1.9; while :; do :; done");
    assert!(
        (500..800).contains(&report.cpu_ms),
        "killed at {} ms of CPU for a 500 ms limit: {report:?}",
        report.cpu_ms
    );
    assert!(report.wall_ms >= 2_400, "{report:?}");
}

#[test]
fn cpu_of_child_processes_counts() {
    let mut sb = Sandbox::start();
    // The CPU is burnt in a grandchild; the main process only waits.
    let mut stage = sb.stage("run", &["sh", "-c", "sh -c 'while :; do :; done' & wait"]);
    stage.limits.cpu_ms = 400;
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::CpuTimeout, "{report:?}");
    assert!(report.cpu_ms >= 400, "{report:?}");
}

#[test]
fn idle_timeout_without_input_or_output() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["sh", "-c", "echo waiting; read line; echo never"]);
    stage.stdin = true;
    stage.limits.idle_ms = Some(400);
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::IdleTimeout, "{report:?}");
    assert_eq!(outcome.stdout_text(), "waiting\n");
    assert!(
        report.wall_ms >= 400 && report.wall_ms < 2_000,
        "{report:?}"
    );
}

#[test]
fn backgrounded_grandchild_does_not_survive_or_hang_the_supervisor() {
    let mut sb = Sandbox::start();
    // The grandchild leaves the session and keeps stdout open.
    let run = sb.stage("run", &["sh", "-c", "setsid sleep 1000 & echo started"]);
    let check = sb.stage(
        "check",
        &[
            "sh",
            "-c",
            "ps -u \"$(id -u)\" -o comm= | grep -c sleep || true",
        ],
    );
    sb.send(sb.bundle(vec![], vec![run, check]));
    let started = Instant::now();
    let outcome = sb.finish(Duration::from_secs(10));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(outcome.done && outcome.exit_code == Some(0), "{outcome:?}");
    assert_eq!(outcome.reports.len(), 2);
    assert_eq!(outcome.reports[0].exit_code, Some(0));
    assert_eq!(outcome.reports[0].reason, Reason::Exited);
    // The next stage saw no sleep of the first one.
    assert_eq!(outcome.stdout_text(), "started\n0\n");
    assert_eq!(live_processes_of(sb.uid), Vec::<u32>::new());
}

#[test]
fn a_kill_loop_left_by_one_stage_does_not_reach_the_next() {
    if !Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: needs python3");
        return;
    }
    let mut sb = Sandbox::start();
    // The first stage leaves a daemonised process that, once the stage's
    // main process has exited, kills every other process of its uid forever.
    let looper = "import os, signal, time\nparent = os.getpid()\nif os.fork() == 0:\n    os.setsid()\n    while os.getppid() == parent:\n        time.sleep(0.01)\n    while True:\n        try:\n            os.kill(-1, signal.SIGKILL)\n        except OSError:\n            pass\nprint('compiled', flush=True)\n";
    let compile = sb.stage("compile", &["python3", "-c", looper]);
    // The next stage lives for a while: a survivor would kill it.
    let run = sb.stage("run", &["sh", "-c", "sleep 0.5; echo ran"]);
    sb.send(sb.bundle(vec![], vec![compile, run]));
    let outcome = sb.finish(Duration::from_secs(10));
    assert!(outcome.done && outcome.exit_code == Some(0), "{outcome:?}");
    assert_eq!(outcome.reports.len(), 2, "{outcome:?}");
    for report in &outcome.reports {
        assert_eq!(report.reason, Reason::Exited, "{report:?}");
        assert_eq!(report.exit_code, Some(0), "{report:?}");
    }
    assert_eq!(outcome.stdout_text(), "compiled\nran\n");
    assert_eq!(outcome.diagnostics, "");
    assert_eq!(live_processes_of(sb.uid), Vec::<u32>::new());
}

#[test]
fn a_kill_loop_cannot_dodge_the_wall_limit_or_an_interrupt() {
    if !Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: needs python3");
        return;
    }
    let looper = "import os, signal\nprint('ready', flush=True)\nwhile True:\n    try:\n        os.kill(-1, signal.SIGKILL)\n    except OSError:\n        pass\n";
    let mut sb = Sandbox::start();
    let mut stage = sb.stage("run", &["python3", "-c", looper]);
    stage.limits.wall_ms = 1_000;
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(Duration::from_secs(10));
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::WallTimeout, "{report:?}");
    assert_eq!(report.signal, Some(SIGKILL));
    assert_eq!(live_processes_of(sb.uid), Vec::<u32>::new());

    let mut sb = Sandbox::start();
    let stage = sb.stage("run", &["python3", "-c", looper]);
    sb.send(sb.bundle(vec![], vec![stage]));
    sb.wait_for_stdout("ready", Duration::from_secs(10));
    sb.send(HostMessage::Signal(SignalKind::Interrupt));
    let outcome = sb.finish(Duration::from_secs(10));
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::Exited, "{report:?}");
    assert_eq!(report.signal, Some(nix::libc::SIGINT), "{report:?}");
    assert_eq!(outcome.diagnostics, "");
}

#[test]
fn oom_kill_is_reported_as_memory_limit() {
    let limit = 64u64 << 20;
    let Some(cgroup) = TestCgroup::create(
        "memory",
        &[
            ("memory.limit_in_bytes", limit),
            ("memory.memsw.limit_in_bytes", limit),
        ],
    ) else {
        eprintln!("skipped: cannot create a memory cgroup (cgroup v1) here");
        return;
    };
    let mut sb = cgroup.start_sandbox();
    // `tail` keeps the whole newline-free input in memory.
    let mut stage = sb.stage("run", &["tail", "/dev/zero"]);
    stage.limits.wall_ms = 15_000;
    stage.limits.cpu_ms = 15_000;
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::MemoryLimit, "{report:?}");
    assert_eq!(report.signal, Some(SIGKILL));
    assert!(report.memory_peak_bytes > 32 << 20, "{report:?}");
    drop(sb);
    drop(cgroup);
}

#[test]
fn fork_bomb_filling_the_pids_cgroup_is_still_killed() {
    if !Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: needs python3");
        return;
    }
    let Some(cgroup) = TestCgroup::create("pids", &[("pids.max", 40)]) else {
        eprintln!("skipped: cannot create a pids cgroup (cgroup v1) here");
        return;
    };
    let mut sb = cgroup.start_sandbox();
    // Forks until the cgroup is full and keeps trying: the supervisor can
    // start no process now, and needs none to kill the job.
    let bomb = "import os, time\nwhile True:\n    try:\n        os.fork() or time.sleep(100)\n    except OSError:\n        pass\n";
    let mut stage = sb.stage("run", &["python3", "-c", bomb]);
    stage.limits.wall_ms = 1_000;
    stage.limits.cpu_ms = 20_000;
    sb.send(sb.bundle(vec![], vec![stage]));
    let started = Instant::now();
    let outcome = sb.finish(T);
    let report = outcome.only_report();
    assert_eq!(report.reason, Reason::WallTimeout, "{report:?}");
    assert_eq!(report.signal, Some(SIGKILL));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(outcome.diagnostics, "");
    assert_eq!(live_processes_of(sb.uid), Vec::<u32>::new());
    drop(sb);
    drop(cgroup);
}
