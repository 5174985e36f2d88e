//! Checker programs: partial scores and a crashing checker, a checker's
//! CPU and wall time in the result, a checker still compiling when the job
//! ends, and a kill or a cancel while tests or a checker run.

use crate::common;

use std::time::Duration;

use code_runner::job::Status;
use code_runner::job::grading::Verdict;
use code_runner::sandbox::SandboxEvent;
use common::{Harness, harness_per_runtime};
use serde_json::json;

use super::{PYTHON, checker_program, graded, verdicts};

/// A checker: full marks for the right sum, half for a sum off by one,
/// nothing otherwise; it reads the three files it is given.
const PARTIAL_CHECKER: &str = r#"
import sys
test_input, output, answer = (open(p).read() for p in sys.argv[1:4])
a, b = map(int, test_input.split())
got = output.strip()
if got == str(a + b) and answer.strip() == str(a + b):
    print("ok: the sum of", a, "and", b)
    sys.exit(0)
if got == str(a + b + 1):
    print("0.5 off by one")
    sys.exit(7)
print("expected", a + b, "got", repr(got))
sys.exit(1)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_program_judges_with_partial_scores_and_a_crashing_checker_is_a_checker_error() {
    for (runtime, harness) in harness_per_runtime(
        "a_checker_program_judges_with_partial_scores_and_a_crashing_checker_is_a_checker_error",
    )
    .await
    {
        let spec = graded(
            "python",
            "main.py",
            PYTHON,
            json!({"check": checker_program(PARTIAL_CHECKER), "tests": [
                {"stdin": "1 2", "expected_stdout": "3", "points": 2},
                {"stdin": "7 1", "expected_stdout": "8", "points": 4},
                {"stdin": "10 1", "expected_stdout": "11"},
            ]}),
        );
        let result = harness.run(&spec).await;
        let what = format!("under {runtime}: {result:#?}");
        assert_eq!(result.status, Status::Failed, "{what}");
        let grading = result.grading.as_ref().unwrap();
        let summary: Vec<(Verdict, f64, Option<&str>)> = grading
            .tests
            .iter()
            .map(|t| {
                (
                    t.outcome.verdict,
                    t.outcome.score,
                    t.outcome.message.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (Verdict::Accepted, 2.0, Some("ok: the sum of 1 and 2")),
                (Verdict::WrongAnswer, 2.0, Some("0.5 off by one")),
                (Verdict::RuntimeError, 0.0, Some("killed by SIGABRT")),
            ],
            "{what}"
        );
        assert_eq!((grading.score, grading.max_score), (4.0, 7.0), "{what}");

        let crashing = graded(
            "python",
            "main.py",
            PYTHON,
            json!({"check": checker_program("import os\nos.abort()\n"), "tests": [{"stdin": "1 2", "expected_stdout": "3"}]}),
        );
        let result = harness.run(&crashing).await;
        let what = format!("under {runtime}: {result:#?}");
        assert_eq!(result.status, Status::Error, "{what}");
        let test = &result.grading.as_ref().unwrap().tests[0].outcome;
        assert_eq!(test.verdict, Verdict::CheckerError, "{what}");
        assert_eq!(
            result.grading.as_ref().unwrap().verdict,
            Verdict::CheckerError
        );
        assert_eq!(
            result.error.as_deref(),
            Some("the checker could not judge test 1: the checker was killed by SIGABRT"),
            "{what}"
        );
        harness.assert_clean().await;
    }
}

/// A checker that spends 300 ms of CPU on every check, then accepts.
const SPINNING_CHECKER: &str = r#"
import time
start = time.process_time()
while time.process_time() - start < 0.3:
    pass
print("ok")
"#;

/// A C++ checker whose compile takes seconds: 24 constant evaluations of a
/// million steps each (its values wrap at 1024, so the compiler's memory
/// stays small).
const SLOW_COMPILING_CHECKER: &str = r#"
constexpr int f(int k) {
    int s = k;
    for (int i = 0; i < 1000; i++)
        for (int j = 0; j < 1000; j++) s = (s + (i ^ j)) & 1023;
    return s;
}
constexpr int v[] = {f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7), f(8), f(9), f(10), f(11),
    f(12), f(13), f(14), f(15), f(16), f(17), f(18), f(19), f(20), f(21), f(22), f(23)};
int main() { return v[0] & 1 ? 0 : 1; }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkers_cpu_and_wall_time_are_in_the_result() {
    use code_runner::job::grading::CheckerUsage;
    for (runtime, harness) in
        harness_per_runtime("a_checkers_cpu_and_wall_time_are_in_the_result").await
    {
        // Two tests reach the checker; the third crashes first (SIGABRT)
        // and is judged without it.
        let spec = graded(
            "python",
            "main.py",
            PYTHON,
            json!({"check": checker_program(SPINNING_CHECKER), "tests": [
                {"stdin": "1 2"}, {"stdin": "3 4"}, {"stdin": "10 1"},
            ]}),
        );
        let result = harness.run(&spec).await;
        let what = format!("under {runtime}: {result:#?}");
        assert_eq!(
            verdicts(&result),
            [
                (Verdict::Accepted, None),
                (Verdict::Accepted, None),
                (Verdict::RuntimeError, None)
            ],
            "{what}"
        );
        let Some(CheckerUsage {
            cpu_ms,
            wall_ms,
            checks,
            compile_cached: false,
        }) = result.grading.as_ref().unwrap().checker
        else {
            panic!("no checker usage {what}");
        };
        assert_eq!(checks, 2, "{what}");
        // 300 ms of CPU a check at least, and a check's wall time is no less.
        assert!(cpu_ms >= 600, "checker cpu_ms {cpu_ms} {what}");
        assert!(wall_ms >= 600, "checker wall_ms {wall_ms} {what}");
        // The result's JSON says it too (the ledger sums it from there).
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(
            json["checker"],
            json!({"cpu_ms": cpu_ms, "wall_ms": wall_ms, "checks": 2, "compile_cached": false}),
            "{what}"
        );
        harness.assert_clean().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_still_compiling_when_the_job_ends_is_removed_with_it() {
    use code_runner::job::grading::CheckerUsage;
    for (runtime, harness) in
        harness_per_runtime("a_checker_still_compiling_when_the_job_ends_is_removed_with_it").await
    {
        // The program fails every test before the checker is asked, seconds
        // before the checker's compile could end.
        let check = json!({"mode": "program", "language": "cpp",
            "files": [{"name": "main.cpp", "content": SLOW_COMPILING_CHECKER}]});
        let spec = graded(
            "python",
            "main.py",
            "import sys\nsys.exit(1)\n",
            json!({"check": check, "tests": [{"stdin": "1 2", "expected_stdout": "3"}]}),
        );
        let result = harness.run(&spec).await;
        let what = format!("under {runtime}: {result:#?}");
        assert_eq!(result.status, Status::Failed, "{what}");
        assert_eq!(verdicts(&result), [(Verdict::RuntimeError, None)], "{what}");
        // Nothing of the checker reported: its compile was cut short.
        assert_eq!(
            result.grading.as_ref().unwrap().checker,
            Some(CheckerUsage::default()),
            "{what}"
        );
        // Its sandbox goes with the job (once its start, under way when
        // the job ended, is over), not when the compile would end (8 s and
        // more after that start).
        let left = common::until(
            Duration::from_secs(5),
            || harness.leftovers(),
            |left: &Vec<String>| left.is_empty(),
        )
        .await;
        assert!(
            left.is_empty(),
            "the checker's sandbox outlived the job: {left:?} {what}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_stops_the_grading_the_test_running_is_killed_and_the_rest_are_skipped() {
    use code_runner::protocol::SignalKind;
    use code_runner::sandbox::{JobInput, JobIo};
    let harness = Harness::new().await;
    let spec = graded(
        "python",
        "main.py",
        "import time\nif input() == 'slow':\n    time.sleep(30)\nprint('ok')\n",
        json!({"tests": [
            {"stdin": "quick\n", "expected_stdout": "ok"},
            {"stdin": "slow\n", "expected_stdout": "ok"},
            {"stdin": "quick\n", "expected_stdout": "ok"},
        ]}),
    );
    let (events_tx, mut events_rx) = tokio::sync::mpsc::channel(16);
    let (input_tx, input_rx) = tokio::sync::mpsc::channel(4);
    let io = JobIo {
        events: Some(events_tx),
        input: Some(input_rx),
        ..Default::default()
    };
    let killer = async move {
        while let Some(event) = events_rx.recv().await {
            if matches!(event, SandboxEvent::TestStart { index: 1, .. }) {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                input_tx
                    .send(JobInput::Signal(SignalKind::Kill))
                    .await
                    .unwrap();
            }
        }
    };
    let started = std::time::Instant::now();
    let (result, ()) = tokio::join!(harness.run_io(&spec, io), killer);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the kill did not end the grading"
    );
    assert_eq!(result.status, Status::Failed, "{result:#?}");
    let tests = &result.grading.as_ref().unwrap().tests;
    let summary: Vec<(Verdict, Option<&str>)> = tests
        .iter()
        .map(|t| (t.outcome.verdict, t.outcome.message.as_deref()))
        .collect();
    assert_eq!(
        summary,
        [
            (Verdict::Accepted, None),
            (
                Verdict::RuntimeError,
                Some("killed on request (a kill signal)")
            ),
            (
                Verdict::Skipped,
                Some("not run: the job was killed (a kill signal)")
            ),
        ],
        "{result:#?}"
    );
    harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_or_a_cancel_does_not_wait_for_a_checker_judging_a_test() {
    use code_runner::protocol::SignalKind;
    use code_runner::sandbox::{JobInput, JobIo};
    let harness = Harness::new().await;
    for stop in ["kill", "cancel"] {
        // The checker never answers in time; both tests' programs end at
        // once (the supervisor runs the second while the first is judged).
        let spec = graded(
            "python",
            "main.py",
            "print(3)\n",
            json!({"check": checker_program("import time\ntime.sleep(60)\n"), "tests": [
                {"stdin": "1 2", "expected_stdout": "3"},
                {"stdin": "1 2", "expected_stdout": "3"},
            ]}),
        );
        let (events_tx, mut events_rx) = tokio::sync::mpsc::channel(16);
        let (input_tx, input_rx) = tokio::sync::mpsc::channel(4);
        let cancel = tokio_util::sync::CancellationToken::new();
        let io = JobIo {
            events: Some(events_tx),
            input: Some(input_rx),
            cancel: cancel.clone(),
            ..Default::default()
        };
        // Stopped a second after the first test started: its run has ended
        // and the checker is judging it.
        let stopper = async move {
            while let Some(event) = events_rx.recv().await {
                if matches!(event, SandboxEvent::TestStart { index: 0, .. }) {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    match stop {
                        "kill" => input_tx
                            .send(JobInput::Signal(SignalKind::Kill))
                            .await
                            .unwrap(),
                        _ => cancel.cancel(),
                    }
                }
            }
        };
        let started = std::time::Instant::now();
        let (result, ()) = tokio::join!(harness.run_io(&spec, io), stopper);
        let what = format!("{stop}: {result:#?}");
        // The checker's own wall limit (10 s) would end the check later.
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "the {stop} waited for the checker: {what}"
        );
        let (status, message) = match stop {
            "kill" => (
                Status::Failed,
                "not judged: the job was killed (a kill signal)",
            ),
            _ => (Status::Cancelled, "not judged: the job was cancelled"),
        };
        assert_eq!(result.status, status, "{what}");
        let tests = &result.grading.as_ref().unwrap().tests;
        let summary: Vec<(Verdict, Option<&str>, Option<i32>)> = tests
            .iter()
            .map(|t| {
                (
                    t.outcome.verdict,
                    t.outcome.message.as_deref(),
                    t.outcome.exit_code,
                )
            })
            .collect();
        // Both ran (exit code 0); neither was judged.
        assert_eq!(
            summary,
            [
                (Verdict::Skipped, Some(message), Some(0)),
                (Verdict::Skipped, Some(message), Some(0)),
            ],
            "{what}"
        );
        harness.assert_clean().await;
    }
}
