//! Hostile jobs under gVisor (`runsc`) with the default limits: fork bombs
//! and thread bombs end with a verdict, never as a platform error, and the
//! CPU time reported follows the container's CPU quota.
//!
//! Runs only when `CODE_RUNNER_TEST_RUNSC=1`. Each bomb runs
//! `CODE_RUNNER_GVISOR_BOMB_RUNS` times (default 3; 50 for the full proof).

use crate::common;

use code_runner::job::limits::LimitsRequest;
use code_runner::job::{JobSpec, Status};
use code_runner::protocol::Reason;
use common::{Harness, job_with_limits, runsc_harness};

/// The tests of this file run one at a time: the bombs of one would take the
/// CPUs that another's spinning job is measured against.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn runs() -> usize {
    std::env::var("CODE_RUNNER_GVISOR_BOMB_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// The default limits but a shorter wall limit: a bomb never ends by
/// itself, and what is under test is the process and memory limits.
fn bomb(language: &str, file: &str, source: &str) -> JobSpec {
    job_with_limits(
        language,
        file,
        source,
        LimitsRequest {
            wall_ms: Some(3000),
            ..Default::default()
        },
    )
}

/// Runs `spec` `runs()` times; each must end with a verdict: the wall limit
/// (the bomb is held at its process limit until then) or the memory limit
/// (64 forked interpreters can fill 256 MB first).
async fn assert_verdicts(harness: &Harness, name: &str, spec: &JobSpec) {
    let runs = runs();
    let mut seen = Vec::new();
    for attempt in 1..=runs {
        let result = harness.run(spec).await;
        let run = result.run.as_ref();
        let verdict = (result.status, run.map(|r| r.reason), result.error.clone());
        let ok = matches!(
            verdict,
            (Status::TimedOut, Some(Reason::WallTimeout), None)
                | (Status::Failed, Some(Reason::MemoryLimit), None)
        );
        assert!(
            ok,
            "{name}: run {attempt} of {runs} ended without a verdict: {result:#?}"
        );
        seen.push(run.map(|r| r.reason.as_str()).unwrap_or("-"));
    }
    println!("{name}: {runs} of {runs} runs ended with a verdict: {seen:?}");
}

#[tokio::test]
async fn fork_bombs_end_with_a_verdict_under_gvisor() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(harness) = runsc_harness("fork_bombs_end_with_a_verdict_under_gvisor").await else {
        return;
    };
    let shell = bomb(
        "bash",
        "main.sh",
        "bomb() { bomb | bomb & }; bomb; sleep 30",
    );
    assert_verdicts(&harness, "bash fork bomb", &shell).await;
    harness.assert_clean().await;
}

#[tokio::test]
async fn a_fork_bomb_that_fills_the_memory_ends_with_a_verdict_under_gvisor() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // 64 forking interpreters fill 256 MB: the host's OOM killer then kills
    // the whole gVisor sandbox. Docker's `OOMKilled` says so, except when
    // it loses the OOM event (a few runs in a hundred): the engine then
    // takes the bare exit 137 of a gVisor sandbox it did not kill as the
    // memory limit (`ended_out_of_memory`).
    let Some(harness) =
        runsc_harness("a_fork_bomb_that_fills_the_memory_ends_with_a_verdict_under_gvisor").await
    else {
        return;
    };
    // Every process keeps forking: the harshest on gVisor's host threads.
    let python = bomb(
        "python",
        "main.py",
        "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.001)\n",
    );
    assert_verdicts(&harness, "python fork bomb", &python).await;
    harness.assert_clean().await;
}

#[tokio::test]
async fn thread_bombs_end_with_a_verdict_under_gvisor() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(harness) = runsc_harness("thread_bombs_end_with_a_verdict_under_gvisor").await else {
        return;
    };
    let python = bomb(
        "python",
        "main.py",
        "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(100,)).start()\n",
    );
    assert_verdicts(&harness, "python thread bomb", &python).await;
    let c = bomb(
        "c",
        "main.c",
        "#include <pthread.h>\n#include <unistd.h>\nstatic void *idle(void *arg) { (void)arg; pause(); return 0; }\nint main(void) { pthread_t t; for (;;) pthread_create(&t, 0, idle, 0); }\n",
    );
    assert_verdicts(&harness, "c thread bomb", &c).await;
    harness.assert_clean().await;
}

#[tokio::test]
async fn cpu_time_follows_the_containers_quota_under_gvisor() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(harness) = runsc_harness("cpu_time_follows_the_containers_quota_under_gvisor").await
    else {
        return;
    };
    assert_eq!(harness.engine.config().cpus, 1.0);
    // Two processes spin for the whole wall limit in a one-CPU container on
    // a host with more CPUs. gVisor counts the time a task waits for the
    // quota as CPU time, so unless capped at the quota the job would show
    // up to twice its wall time.
    let spec = job_with_limits(
        "python",
        "main.py",
        "import os\nos.fork()\nwhile True:\n    pass\n",
        LimitsRequest {
            wall_ms: Some(2000),
            cpu_ms: Some(60_000),
            ..Default::default()
        },
    );
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::TimedOut, "{result:#?}");
    let run = result.run.as_ref().expect("a run stage");
    assert_eq!(run.reason, Reason::WallTimeout);
    assert!(
        run.cpu_ms <= run.wall_ms * 5 / 4,
        "cpu_ms {} above what one CPU gives in {} ms",
        run.cpu_ms,
        run.wall_ms
    );
    assert!(
        run.cpu_ms >= run.wall_ms / 2,
        "cpu_ms {} is not the spinning it should be ({} ms)",
        run.cpu_ms,
        run.wall_ms
    );
    harness.assert_clean().await;
}

/// gVisor's kernel holds a job to its address-space limit too.
#[tokio::test]
async fn an_allocation_past_the_address_space_limit_fails_under_gvisor() {
    let Some(harness) =
        runsc_harness("an_allocation_past_the_address_space_limit_fails_under_gvisor").await
    else {
        return;
    };
    crate::limits::an_allocation_past_the_address_space_limit_fails(harness).await;
}
