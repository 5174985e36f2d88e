//! Hostile programs against every sandbox limit, each with the precise
//! outcome, on both start paths: in a container made for the job (`cold`)
//! and in a warm pool's sandbox started before the job came (`warm`), which
//! must hold the job to exactly the same limits.

use crate::common;
use crate::common::paths::on_every_start_path;
use crate::jobs::memory_bomb;

use std::time::{Duration, Instant};

use code_runner::job::Status;
use code_runner::job::limits::LimitsRequest;
use code_runner::protocol::Reason;
use common::{Harness, job, job_with_limits, stderr, stdout};

async fn fork_bomb_is_contained_by_the_pids_limit(harness: Harness) {
    let spec = job_with_limits(
        "bash",
        "main.sh",
        "bomb() { bomb | bomb & }; bomb; sleep 30",
        LimitsRequest {
            pids: Some(32),
            wall_ms: Some(3000),
            ..Default::default()
        },
    );
    // While the bomb goes off, the host still starts processes promptly.
    let host = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let started = Instant::now();
        let status = std::process::Command::new("true")
            .status()
            .expect("the host can still start a process");
        assert!(status.success());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "host unresponsive"
        );
    };
    let (result, ()) = tokio::join!(harness.run(&spec), host);
    assert_eq!(result.status, Status::TimedOut, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::WallTimeout);
    assert!(
        stderr(&result).contains("Resource temporarily unavailable"),
        "the bomb should have hit the pids limit: {:?}",
        stderr(&result)
    );
    // And the result says so, though the job ended by its wall limit.
    assert_eq!(run.pids_limit_reached, Some(true), "{result:#?}");
    harness.assert_clean().await;
}

async fn memory_bomb_hits_the_memory_limit(harness: Harness) {
    let spec = memory_bomb(64);
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Failed, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::MemoryLimit);
    assert_eq!(run.exit_code, None);
    assert_eq!(run.signal.as_deref(), Some("SIGKILL"));
    assert_eq!(run.pids_limit_reached, Some(false), "{result:#?}");
    harness.assert_clean().await;
}

async fn filling_the_workspace_and_tmp_gets_enospc_and_the_job_still_reports(harness: Harness) {
    let source = r#"
import errno, os
for directory in ("/workspace", "/tmp"):
    written = 0
    try:
        for i in range(1000):
            with open(f"{directory}/fill{i}", "wb") as f:
                f.write(b"x" * (1 << 20))
            written += 1
        print(directory, "no limit")
    except OSError as e:
        print(directory, errno.errorcode[e.errno], written < 16)
"#;
    let spec = job_with_limits(
        "python",
        "main.py",
        source,
        LimitsRequest {
            disk_mb: Some(8),
            ..Default::default()
        },
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(
        stdout(&result),
        "/workspace ENOSPC True\n/tmp ENOSPC True\n"
    );
    harness.assert_clean().await;
}

async fn output_flood_is_cut_at_the_limit_keeping_the_first_bytes(harness: Harness) {
    let spec = job_with_limits(
        "python",
        "main.py",
        "import sys\ni = 0\nwhile True:\n    sys.stdout.write(f'{i:08d}\\n')\n    i += 1\n",
        LimitsRequest {
            output_bytes: Some(100_000),
            ..Default::default()
        },
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Failed, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::OutputLimit);
    assert!(run.truncated);
    let expected: String = (0..20_000).map(|i| format!("{i:08}\n")).collect();
    assert_eq!(stdout(&result), expected[..100_000]);
    harness.assert_clean().await;
}

async fn busy_loop_hits_the_cpu_limit(harness: Harness) {
    let spec = job_with_limits(
        "python",
        "main.py",
        "while True:\n    pass\n",
        LimitsRequest {
            cpu_ms: Some(1000),
            wall_ms: Some(20_000),
            ..Default::default()
        },
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::TimedOut, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::CpuTimeout);
    assert!(run.cpu_ms >= 1000, "cpu_ms = {}", run.cpu_ms);
    assert!(run.wall_ms < 10_000, "wall_ms = {}", run.wall_ms);
    harness.assert_clean().await;
}

async fn busy_loop_hits_the_wall_limit_when_that_is_lower(harness: Harness) {
    let spec = job_with_limits(
        "c",
        "main.c",
        "int main(void){ volatile unsigned long n = 0; for(;;) n++; }",
        LimitsRequest {
            cpu_ms: Some(20_000),
            wall_ms: Some(1000),
            ..Default::default()
        },
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::TimedOut, "{result:#?}");
    assert_eq!(result.run.as_ref().unwrap().reason, Reason::WallTimeout);
    harness.assert_clean().await;
}

async fn sleep_forever_hits_the_wall_limit(harness: Harness) {
    let spec = job_with_limits(
        "bash",
        "main.sh",
        "echo before; sleep 1000; echo after",
        LimitsRequest {
            wall_ms: Some(1000),
            ..Default::default()
        },
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::TimedOut, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::WallTimeout);
    assert_eq!(stdout(&result), "before\n");
    // The program ran for the wall limit and was stopped there, far short of
    // its 1000 s sleep: measured by the sandbox, so without the container's
    // start and removal.
    assert!(
        (1000..10_000).contains(&run.wall_ms),
        "wall_ms = {}",
        run.wall_ms
    );
    harness.assert_clean().await;
}

async fn a_file_larger_than_the_fsize_limit_cannot_be_written(harness: Harness) {
    // The file size limit is the workspace size (disk_mb). A write past it
    // kills a program that keeps SIGXFSZ's default (dd) and fails with EFBIG
    // in one that ignores the signal (Python). Both write sparse files, so the
    // tmpfs never fills up first.
    let source = r#"
import errno, subprocess
r = subprocess.run(["dd", "if=/dev/zero", "of=/tmp/big", "bs=1", "count=1", f"seek={8 << 20}"],
                   stderr=subprocess.DEVNULL)
print("dd", r.returncode)
try:
    with open("/tmp/big2", "wb") as f:
        f.seek(8 << 20)
        f.write(b"x")
except OSError as e:
    print(errno.errorcode[e.errno])
"#;
    let spec = job_with_limits(
        "python",
        "main.py",
        source,
        LimitsRequest {
            disk_mb: Some(8),
            ..Default::default()
        },
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    // -25: killed by SIGXFSZ.
    assert_eq!(stdout(&result), "dd -25\nEFBIG\n");
    harness.assert_clean().await;
}

async fn zombies_and_orphans_do_not_keep_a_finished_job_alive(harness: Harness) {
    // The program exits at once, leaving a daemonised child behind.
    let spec = job_with_limits(
        "bash",
        "main.sh",
        "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo done",
        LimitsRequest {
            wall_ms: Some(30_000),
            ..Default::default()
        },
    );
    let started = Instant::now();
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(stdout(&result), "done\n");
    // Held by the orphan, the job would last at least its 30 s wall limit
    // (counted once the sandbox is up); this bound leaves the container's
    // start and removal the rest.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the orphan held the job: {:?}",
        started.elapsed()
    );
    harness.assert_clean().await;
}

async fn nonzero_exit_and_signals_are_reported(harness: Harness) {
    let result = harness.run(&job("bash", "main.sh", "exit 7")).await;
    assert_eq!(result.status, Status::Failed);
    assert_eq!(result.run.as_ref().unwrap().exit_code, Some(7));
    let result = harness.run(&job("bash", "main.sh", "kill -SEGV $$")).await;
    assert_eq!(result.status, Status::Failed, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::Exited);
    assert_eq!(run.signal.as_deref(), Some("SIGSEGV"));
    assert_eq!(run.exit_code, None);
    harness.assert_clean().await;
}

async fn an_interactive_job_with_no_input_and_no_output_hits_the_idle_limit(harness: Harness) {
    let mut spec = job_with_limits(
        "python",
        "main.py",
        "print('ready', flush=True)\nname = input()\nprint('never', name)\n",
        LimitsRequest {
            idle_ms: Some(1000),
            wall_ms: Some(20_000),
            ..Default::default()
        },
    );
    spec.interactive = true;
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::TimedOut, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::IdleTimeout);
    assert_eq!(stdout(&result), "ready\n");
    // Ended by the 1 s idle limit, long before the 20 s wall limit: measured
    // by the sandbox, so without the container's start and removal.
    assert!(
        (1000..10_000).contains(&run.wall_ms),
        "the idle limit did not end it: wall_ms = {}",
        run.wall_ms
    );
    harness.assert_clean().await;
}

async fn the_wall_limit_still_caps_an_interactive_job(harness: Harness) {
    // Output every 200 ms keeps the job from ever being idle.
    let mut spec = job_with_limits(
        "python",
        "main.py",
        "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.2)\n",
        LimitsRequest {
            idle_ms: Some(1000),
            wall_ms: Some(2000),
            ..Default::default()
        },
    );
    spec.interactive = true;
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::TimedOut, "{result:#?}");
    assert_eq!(result.run.as_ref().unwrap().reason, Reason::WallTimeout);
    assert!(stdout(&result).starts_with("tick\ntick\n"));
    harness.assert_clean().await;
}

/// A job's `virtual_memory_mb` (RLIMIT_AS): an allocation past it fails
/// and the program goes on; without it the same allocation succeeds, its
/// pages untouched, within the memory limit.
pub(crate) async fn an_allocation_past_the_address_space_limit_fails(harness: Harness) {
    let source = r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    char *big = malloc(512u << 20);
    char *small = malloc(16u << 20);
    if (small) memset(small, 1, 16u << 20);
    printf("%s %s\n", big ? "big" : "NULL", small ? "small" : "NULL");
    return 0;
}
"#;
    let mut spec = job("c", "main.c", source);
    spec.virtual_memory_mb = Some(128);
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(stdout(&result), "NULL small\n");
    spec.virtual_memory_mb = None;
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(stdout(&result), "big small\n");
    harness.assert_clean().await;
}

// Each test above, once per start path.
on_every_start_path!(
    an_allocation_past_the_address_space_limit_fails,
    fork_bomb_is_contained_by_the_pids_limit,
    memory_bomb_hits_the_memory_limit,
    filling_the_workspace_and_tmp_gets_enospc_and_the_job_still_reports,
    output_flood_is_cut_at_the_limit_keeping_the_first_bytes,
    busy_loop_hits_the_cpu_limit,
    busy_loop_hits_the_wall_limit_when_that_is_lower,
    sleep_forever_hits_the_wall_limit,
    a_file_larger_than_the_fsize_limit_cannot_be_written,
    zombies_and_orphans_do_not_keep_a_finished_job_alive,
    nonzero_exit_and_signals_are_reported,
    an_interactive_job_with_no_input_and_no_output_hits_the_idle_limit,
    the_wall_limit_still_caps_an_interactive_job,
);

/// The deadline the store keeps for a job (set when it started) bounds the
/// sandbox even when the job's own wall limit is longer: the worker, the
/// reaper and a waiting client all go by that one figure.
#[tokio::test]
async fn the_stored_deadline_ends_a_job_before_its_wall_limit() {
    let harness = Harness::new().await;
    let spec = job_with_limits(
        "python",
        "main.py",
        "import time\nprint('up', flush=True)\ntime.sleep(30)\n",
        LimitsRequest {
            wall_ms: Some(25_000),
            ..Default::default()
        },
    );
    let io = code_runner::sandbox::JobIo {
        deadline_ms: Some(common::unix_ms() + 4_000),
        ..Default::default()
    };
    let began = Instant::now();
    let result = harness.run_io(&spec, io).await;
    let took = began.elapsed();
    assert_eq!(result.status, Status::TimedOut, "{result:#?}");
    let run = result.run.as_ref().expect("a run stage");
    assert_eq!(run.reason, Reason::WallTimeout, "{result:#?}");
    assert_eq!(stdout(&result), "up\n");
    assert!(
        took < Duration::from_secs(15),
        "the job lasted {took:?}: its stored deadline was 4 s away"
    );
    harness.assert_clean().await;
}
