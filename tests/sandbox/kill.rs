//! Kills that cannot be dodged: a job that loops `kill(-1, SIGKILL)` (which
//! kills every other process of its uid the moment it exists) and fork bombs
//! against every kill the supervisor makes — the wall, CPU, idle and output
//! limits, the client's interrupt and kill, cancellation, and the cleanup of
//! leftover processes — under runc and, when `CODE_RUNNER_TEST_RUNSC=1`,
//! under runsc. Also: no process of the job ever holds a descriptor that
//! reaches the supervisor's output or log.

use crate::common;

use code_runner::sandbox::SandboxEngine as _;
use std::time::Duration;

use code_runner::job::limits::LimitsRequest;
use code_runner::job::{JobResult, JobSpec, Status};
use code_runner::protocol::{Reason, SignalKind};
use code_runner::sandbox::{JobInput, JobIo, SandboxEvent};
use common::{Harness, harness_per_runtime, job_with_limits, stdout};
use tokio::sync::mpsc;

/// Kills every other process of the job's uid, forever: nothing the
/// supervisor could start as that uid would live long enough to act.
const KILL_LOOP: &str = r#"
import os, signal, sys, time
def kill_all():
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
"#;

fn kill_loop_job(body: &str, limits: LimitsRequest) -> JobSpec {
    job_with_limits("python", "main.py", &format!("{KILL_LOOP}\n{body}"), limits)
}

/// What the test sends once the job printed its first line.
#[derive(Clone)]
enum Plan {
    Nothing,
    /// These inputs, once.
    Send(Vec<JobInput>),
    /// This input again and again until the job ends.
    Repeat(JobInput, Duration),
    /// Cancel the job.
    Cancel,
}

/// Runs `spec`; once its stdout has a first line, carries out `plan`.
async fn run_with(harness: &Harness, spec: &JobSpec, plan: Plan) -> JobResult {
    let job = harness.prepare(spec);
    let job_id = uuid::Uuid::new_v4().to_string();
    let (events_tx, mut events_rx) = mpsc::channel(64);
    let (input_tx, input_rx) = mpsc::channel(64);
    let io = JobIo {
        events: Some(events_tx),
        input: Some(input_rx),
        ..Default::default()
    };
    let cancel = io.cancel.clone();
    let drive = async move {
        let mut seen = Vec::new();
        let mut plan = Some(plan);
        let mut repeat: Option<(JobInput, Duration)> = None;
        loop {
            let event = match &repeat {
                Some((input, every)) => {
                    match tokio::time::timeout(*every, events_rx.recv()).await {
                        Ok(event) => event,
                        Err(_) => {
                            let _ = input_tx.send(input.clone()).await;
                            continue;
                        }
                    }
                }
                None => events_rx.recv().await,
            };
            let Some(event) = event else { break };
            if let SandboxEvent::Stdout(bytes) = &event {
                seen.extend_from_slice(bytes);
            }
            if seen.contains(&b'\n') {
                match plan.take() {
                    Some(Plan::Send(inputs)) => {
                        for input in inputs {
                            let _ = input_tx.send(input).await;
                        }
                    }
                    Some(Plan::Repeat(input, every)) => repeat = Some((input, every)),
                    Some(Plan::Cancel) => cancel.cancel(),
                    Some(Plan::Nothing) | None => {}
                }
            }
        }
    };
    let (result, ()) = tokio::join!(harness.engine.run(&job_id, &job, io), drive);
    result
}

fn limits(wall_ms: u64, cpu_ms: u64) -> LimitsRequest {
    LimitsRequest {
        wall_ms: Some(wall_ms),
        cpu_ms: Some(cpu_ms),
        ..Default::default()
    }
}

/// How the run stage must end.
struct End {
    status: Status,
    reason: Reason,
    signal: Option<&'static str>,
}

/// Runs `spec` under every runtime, carrying out `plan` each time, and
/// checks that the job ends as `end`, with no error, well before the
/// worker's own deadline (wall + grace) would have removed the container.
/// Returns the results for further checks.
async fn check(test: &str, spec: &JobSpec, plan: Plan, end: End) -> Vec<(&'static str, JobResult)> {
    let mut results = Vec::new();
    for (runtime, harness) in harness_per_runtime(test).await {
        let result = run_with(&harness, spec, plan.clone()).await;
        assert_eq!(result.status, end.status, "{runtime}: {result:#?}");
        assert_eq!(result.error, None, "{runtime}: {result:#?}");
        let run = result.run.as_ref().expect("a run stage");
        assert_eq!(run.reason, end.reason, "{runtime}: {result:#?}");
        assert_eq!(run.signal.as_deref(), end.signal, "{runtime}: {result:#?}");
        // Ended promptly, as the sandbox measured the run stage (without the
        // runtime's start-up and the container's removal): well within the
        // 20 s wall limit of the jobs that another kill must stop.
        assert!(
            run.wall_ms < 10_000,
            "{runtime}: the run stage took {} ms",
            run.wall_ms
        );
        harness.assert_clean().await;
        results.push((runtime, result));
    }
    results
}

/// Prints `ready`, then kills everything else of its uid, forever.
const LOOP: &str = "print('ready', flush=True)\nwhile True:\n    kill_all()\n";

fn killed(status: Status, reason: Reason) -> End {
    End {
        status,
        reason,
        signal: Some("SIGKILL"),
    }
}

#[tokio::test]
async fn kill_loop_is_stopped_by_the_wall_limit() {
    let spec = kill_loop_job(LOOP, limits(1500, 60_000));
    let end = killed(Status::TimedOut, Reason::WallTimeout);
    check(
        "kill_loop_is_stopped_by_the_wall_limit",
        &spec,
        Plan::Nothing,
        end,
    )
    .await;
}

#[tokio::test]
async fn kill_loop_is_stopped_by_the_cpu_limit() {
    // SIGKILL from the supervisor; RLIMIT_CPU's backstop (2 s) would have
    // been SIGXCPU.
    let spec = kill_loop_job(LOOP, limits(20_000, 1000));
    let end = killed(Status::TimedOut, Reason::CpuTimeout);
    check(
        "kill_loop_is_stopped_by_the_cpu_limit",
        &spec,
        Plan::Nothing,
        end,
    )
    .await;
}

#[tokio::test]
async fn kill_loop_is_stopped_by_the_idle_limit() {
    let mut spec = kill_loop_job(
        "print('ready', flush=True)\nwhile True:\n    kill_all()\n    time.sleep(0.005)\n",
        LimitsRequest {
            idle_ms: Some(1000),
            wall_ms: Some(20_000),
            ..Default::default()
        },
    );
    spec.interactive = true;
    let end = killed(Status::TimedOut, Reason::IdleTimeout);
    for (runtime, result) in check(
        "kill_loop_is_stopped_by_the_idle_limit",
        &spec,
        Plan::Nothing,
        end,
    )
    .await
    {
        assert_eq!(stdout(&result), "ready\n", "{runtime}");
    }
}

#[tokio::test]
async fn kill_loop_is_stopped_by_the_output_limit() {
    let spec = kill_loop_job(
        "print('ready', flush=True)\nwhile True:\n    kill_all()\n    sys.stdout.write('x' * 100)\n    sys.stdout.flush()\n",
        LimitsRequest {
            output_bytes: Some(10_000),
            wall_ms: Some(20_000),
            ..Default::default()
        },
    );
    let end = killed(Status::Failed, Reason::OutputLimit);
    for (runtime, result) in check(
        "kill_loop_is_stopped_by_the_output_limit",
        &spec,
        Plan::Nothing,
        end,
    )
    .await
    {
        let run = result.run.as_ref().expect("a run stage");
        assert!(run.truncated, "{runtime}");
        assert_eq!(run.stdout.as_bytes().len(), 10_000, "{runtime}");
    }
}

#[tokio::test]
async fn kill_loop_is_stopped_by_the_clients_kill() {
    let mut spec = kill_loop_job(LOOP, limits(20_000, 60_000));
    spec.interactive = true;
    let plan = Plan::Send(vec![JobInput::Signal(SignalKind::Kill)]);
    let end = killed(Status::Failed, Reason::Killed);
    check("kill_loop_is_stopped_by_the_clients_kill", &spec, plan, end).await;
}

#[tokio::test]
async fn kill_loop_gets_the_clients_interrupt() {
    // Python's default SIGINT handler raises KeyboardInterrupt; uncaught,
    // the interpreter ends itself with SIGINT.
    let mut spec = kill_loop_job(LOOP, limits(20_000, 60_000));
    spec.interactive = true;
    let plan = Plan::Send(vec![JobInput::Signal(SignalKind::Interrupt)]);
    let end = End {
        status: Status::Failed,
        reason: Reason::Exited,
        signal: Some("SIGINT"),
    };
    check("kill_loop_gets_the_clients_interrupt", &spec, plan, end).await;
}

#[tokio::test]
async fn kill_loop_is_stopped_by_cancellation() {
    let spec = kill_loop_job(LOOP, limits(20_000, 60_000));
    let end = killed(Status::Cancelled, Reason::Killed);
    check(
        "kill_loop_is_stopped_by_cancellation",
        &spec,
        Plan::Cancel,
        end,
    )
    .await;
}

#[tokio::test]
async fn a_leftover_kill_loop_is_cleaned_up() {
    // The program leaves a daemonised grandchild behind that starts killing
    // everything of its uid once the program has exited. The supervisor must
    // still clean it up; if it cannot, it ends the job as an error rather
    // than report it finished.
    let spec = kill_loop_job(
        r#"
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(0.3)
        while True:
            kill_all()
    os._exit(0)
os.wait()
print("parent done", flush=True)
"#,
        limits(20_000, 60_000),
    );
    let end = End {
        status: Status::Succeeded,
        reason: Reason::Exited,
        signal: None,
    };
    for (runtime, result) in check(
        "a_leftover_kill_loop_is_cleaned_up",
        &spec,
        Plan::Nothing,
        end,
    )
    .await
    {
        assert_eq!(stdout(&result), "parent done\n", "{runtime}");
    }
}

#[tokio::test]
async fn fork_bomb_is_stopped_by_the_clients_kill() {
    let mut spec = job_with_limits(
        "bash",
        "main.sh",
        "echo ready; bomb() { bomb | bomb & }; bomb; sleep 30",
        LimitsRequest {
            pids: Some(32),
            wall_ms: Some(20_000),
            ..Default::default()
        },
    );
    spec.interactive = true;
    let plan = Plan::Send(vec![JobInput::Signal(SignalKind::Kill)]);
    let end = killed(Status::Failed, Reason::Killed);
    check("fork_bomb_is_stopped_by_the_clients_kill", &spec, plan, end).await;
}

#[tokio::test]
async fn no_job_process_can_reach_the_supervisors_descriptors() {
    // The job ignores SIGINT and, for 2 s while the test sends it an
    // interrupt every 20 ms (each one a signal the supervisor must send
    // as the job's uid), looks at every process it can see and tries to
    // open every descriptor of theirs, threads included, for reading and
    // for writing. gVisor lets any uid list /proc/1/fd and re-open the
    // supervisor's descriptors of plain files (/proc, /proc/<pid>/stat,
    // which anyone may open by path); what must never open is anything
    // else: a pipe, a socket, the container's stdio.
    let mut spec = job_with_limits(
        "python",
        "main.py",
        r#"
import os, signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
me = str(os.getpid())
print("ready", flush=True)
others, opened = set(), set()
end = time.time() + 2.0
while time.time() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        others.add(pid)
        dirs = [f"/proc/{pid}/fd"]
        try:
            dirs += [f"/proc/{pid}/task/{tid}/fd" for tid in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            pass
        for d in dirs:
            try:
                fds = os.listdir(d)
            except OSError:
                continue
            for fd in fds:
                for flags in (os.O_RDONLY, os.O_WRONLY):
                    try:
                        os.close(os.open(f"{d}/{fd}", flags | os.O_NONBLOCK))
                        target = os.readlink(f"{d}/{fd}")
                    except OSError:
                        continue
                    # A file the job may open by its path anyway is no way in.
                    try:
                        os.close(os.open(target, flags | os.O_NONBLOCK))
                    except OSError:
                        opened.add(f"{d}/{fd} -> {target}")
print("other processes", sorted(others))
print("opened descriptors", sorted(opened))
"#,
        limits(20_000, 60_000),
    );
    spec.interactive = true;
    let plan = Plan::Repeat(
        JobInput::Signal(SignalKind::Interrupt),
        Duration::from_millis(20),
    );
    let end = End {
        status: Status::Succeeded,
        reason: Reason::Exited,
        signal: None,
    };
    let test = "no_job_process_can_reach_the_supervisors_descriptors";
    for (runtime, result) in check(test, &spec, plan, end).await {
        // Only the supervisor, none of whose descriptors (its frames, its
        // log, the stage's pipes) a job process can open.
        assert_eq!(
            stdout(&result),
            "ready\nother processes ['1']\nopened descriptors []\n",
            "{runtime}"
        );
    }
}
