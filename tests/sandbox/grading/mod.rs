//! Grading in real sandboxes (runc, and gVisor when enabled): one job,
//! one compile, one run per test with a verdict each; purpose-written
//! solutions for each verdict in C++ and Python; solutions that try to
//! read what they are judged against or to leave something for the next
//! test; checker programs, partial scores and a crashing checker.

use crate::common;

use std::time::Duration;

use code_runner::job::grading::{Restarts, TimeLimit, Verdict};
use code_runner::job::{JobResult, JobSpec, Status};
use code_runner::sandbox::SandboxEngine as _;
use code_runner::sandbox::SandboxEvent;
use common::{Harness, harness_per_runtime};
use serde_json::{Value, json};

/// A job of one file with `extra` fields (tests, check, limits…).
fn graded(language: &str, name: &str, source: &str, extra: Value) -> JobSpec {
    let mut value = json!({"language": language, "files": [{"name": name, "content": source}]});
    for (key, item) in extra.as_object().unwrap() {
        value[key] = item.clone();
    }
    serde_json::from_value(value).expect("a valid job spec")
}

fn verdicts(result: &JobResult) -> Vec<(Verdict, Option<TimeLimit>)> {
    let grading = result
        .grading
        .as_ref()
        .unwrap_or_else(|| panic!("no grading in {result:#?}"));
    grading
        .tests
        .iter()
        .map(|t| (t.outcome.verdict, t.outcome.time_limit))
        .collect()
}

/// Reads `a b`; prints a+b, except on purpose: 7 a wrong sum, 8 a CPU
/// loop, 9 memory, 10 a crash, 11 a flood, 12 a sleep.
const CPP: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <unistd.h>
int main() {
    long a, b;
    if (scanf("%ld %ld", &a, &b) != 2) return 2;
    if (a == 7) { printf("%ld\n", a + b + 1); return 0; }
    if (a == 8) { volatile unsigned long x = 0; for (;;) x++; }
    if (a == 9) { std::vector<char> v(400u << 20, 1); printf("%d\n", v[12345]); return 0; }
    if (a == 10) { abort(); }
    if (a == 11) { for (;;) fputs("flood flood flood flood\n", stdout); }
    if (a == 12) { sleep(30); }
    printf("%ld\n", a + b);
    return 0;
}
"#;

const PYTHON: &str = r#"
import os, sys, time
a, b = map(int, sys.stdin.read().split())
if a == 7:
    print(a + b + 1)
elif a == 8:
    while True:
        pass
elif a == 9:
    block = bytearray(400 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    print(len(block))
elif a == 10:
    os.abort()
elif a == 11:
    while True:
        sys.stdout.write("flood flood flood flood\n")
elif a == 12:
    time.sleep(30)
else:
    print(a + b)
"#;

fn verdict_tests() -> Value {
    let test = |name: &str, a: i64, b: i64| json!({"name": name, "stdin": format!("{a} {b}\n"), "expected_stdout": format!("{}\n", a + b)});
    // 300 ms of CPU within the job's 3 s of wall time: a CPU limit even
    // when the full suite leaves the job a tenth of a CPU (the job's 1 s
    // of CPU in 3 s was once a wall timeout).
    let mut slow = test("slow", 8, 1);
    slow["limits"] = json!({"cpu_ms": 300});
    json!([
        test("sum", 1, 2),
        test("wrong", 7, 1),
        slow,
        test("memory", 9, 1),
        test("crash", 10, 1),
        test("flood", 11, 1),
        test("sleepy", 12, 1),
        test("sum again", 20, 22),
    ])
}

async fn each_verdict(harness: &Harness, runtime: &str, language: &str, file: &str, source: &str) {
    let spec = graded(
        language,
        file,
        source,
        json!({
            "limits": {"memory_mb": 128, "wall_ms": 3000, "cpu_ms": 1000, "output_bytes": 65536},
            "tests": verdict_tests(),
        }),
    );
    let (result, events) = harness.run_collecting(&spec).await;
    let what = format!("{language} under {runtime}: {result:#?}");
    assert_eq!(result.status, Status::Failed, "{what}");
    assert_eq!(
        verdicts(&result),
        [
            (Verdict::Accepted, None),
            (Verdict::WrongAnswer, None),
            (Verdict::TimeLimit, Some(TimeLimit::Cpu)),
            (Verdict::MemoryLimit, None),
            (Verdict::RuntimeError, None),
            (Verdict::OutputLimit, None),
            (Verdict::TimeLimit, Some(TimeLimit::Wall)),
            (Verdict::Accepted, None),
        ],
        "{what}"
    );
    let grading = result.grading.as_ref().unwrap();
    assert_eq!((grading.passed, grading.total), (2, 8), "{what}");
    // Under gVisor the memory test takes the sandbox with it: the rest run
    // in one new sandbox, which compiles the program again, and what that
    // compile used is in the result (the ledger counts it).
    match (runtime, result.compile.as_ref(), grading.restarts) {
        ("runc", _, restarts) => assert_eq!(restarts, None, "{what}"),
        (_, None, restarts) => assert_eq!(
            restarts,
            Some(Restarts {
                count: 1,
                cpu_ms: 0,
                wall_ms: 0
            }),
            "{what}"
        ),
        (_, Some(compile), Some(restarts)) => {
            assert_eq!(restarts.count, 1, "{what}");
            // Compiling the same program again costs about the same.
            assert!(
                restarts.cpu_ms >= compile.cpu_ms / 3 && restarts.cpu_ms > 50,
                "{what}"
            );
            assert!(restarts.wall_ms >= restarts.cpu_ms / 2, "{what}");
        }
        (_, Some(_), None) => panic!("no restarts after a sandbox died: {what}"),
    }
    assert_eq!((grading.score, grading.max_score), (2.0, 8.0), "{what}");
    assert_eq!(grading.verdict, Verdict::WrongAnswer, "{what}");
    assert!(result.run.is_none(), "{what}");
    let wrong = &grading.tests[1].outcome;
    let difference = wrong
        .difference
        .as_ref()
        .expect("a wrong answer says where");
    assert_eq!(
        (
            difference.line,
            difference.expected.as_deref(),
            difference.got.as_deref()
        ),
        (1, Some("8"), Some("9")),
        "{what}"
    );
    assert_eq!(wrong.stdout, "9\n");
    let crash = &grading.tests[4].outcome;
    assert_eq!(crash.signal.as_deref(), Some("SIGABRT"), "{what}");
    assert!(
        grading.tests[5].outcome.stdout.starts_with("flood flood"),
        "{what}"
    );
    // Live: a start and an end per test, in order, the end with its verdict.
    let ticks: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            SandboxEvent::TestStart { index, .. } => Some(format!("start {index}")),
            SandboxEvent::TestEnd(test) => Some(format!(
                "end {} {}",
                test.index,
                test.outcome.verdict.as_str()
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        ticks,
        [
            "start 0",
            "end 0 accepted",
            "start 1",
            "end 1 wrong_answer",
            "start 2",
            "end 2 time_limit",
            "start 3",
            "end 3 memory_limit",
            "start 4",
            "end 4 runtime_error",
            "start 5",
            "end 5 output_limit",
            "start 6",
            "end 6 time_limit",
            "start 7",
            "end 7 accepted",
        ],
        "{what}"
    );
    // The tests' output is in their results, not in the job's stream.
    assert!(
        !events.iter().any(|e| matches!(e, SandboxEvent::Stdout(_))),
        "{what}"
    );
    harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_verdict_from_a_purpose_written_solution_in_cpp_and_python() {
    for (runtime, harness) in
        harness_per_runtime("each_verdict_from_a_purpose_written_solution_in_cpp_and_python").await
    {
        each_verdict(&harness, runtime, "cpp", "main.cpp", CPP).await;
        each_verdict(&harness, runtime, "python", "main.py", PYTHON).await;
    }
}

/// A test whose run was refused a process start at the pids limit says so
/// (under runc, where the pids cgroup counts refusals; under gVisor it is
/// not known), in its figures and its message; the next test, which forks
/// nothing, says it was not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_refused_a_process_start_at_the_pids_limit_says_so() {
    let source = "import os, sys, time\n\
                  if input() == 'fork':\n    \
                      for _ in range(64):\n        \
                          if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n\
                  print('no fork')\n";
    for (runtime, harness) in
        harness_per_runtime("a_test_refused_a_process_start_at_the_pids_limit_says_so").await
    {
        let spec = graded(
            "python",
            "main.py",
            source,
            json!({
                "limits": {"pids": 16, "wall_ms": 3000},
                "tests": [
                    {"name": "forks", "stdin": "fork\n"},
                    {"name": "calm", "stdin": "calm\n", "expected_stdout": "no fork\n"},
                ],
            }),
        );
        let result = harness.run(&spec).await;
        let what = format!("{runtime}: {result:#?}");
        let grading = result.grading.as_ref().expect("graded");
        let (forks, calm) = (&grading.tests[0].outcome, &grading.tests[1].outcome);
        // os.fork raises BlockingIOError at the limit: exit code 1.
        assert_eq!(
            (forks.verdict, forks.exit_code),
            (Verdict::RuntimeError, Some(1)),
            "{what}"
        );
        assert!(forks.stderr.contains("BlockingIOError"), "{what}");
        assert_eq!(calm.verdict, Verdict::Accepted, "{what}");
        if runtime == "runc" {
            assert_eq!(forks.pids_limit_reached, Some(true), "{what}");
            assert_eq!(
                forks.message.as_deref(),
                Some("exited with code 1 (a process start was refused at the pids limit)"),
                "{what}"
            );
            assert_eq!(calm.pids_limit_reached, Some(false), "{what}");
        } else {
            assert_eq!(forks.pids_limit_reached, None, "{what}");
            assert_eq!(
                forks.message.as_deref(),
                Some("exited with code 1"),
                "{what}"
            );
            assert_eq!(calm.pids_limit_reached, None, "{what}");
        }
        harness.assert_clean().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_error_skips_every_test_and_stop_on_failure_skips_the_rest() {
    let harness = Harness::new().await;
    let broken = graded(
        "cpp",
        "main.cpp",
        "int main( {",
        json!({"tests": [{"stdin": "1 2"}, {"stdin": "3 4"}]}),
    );
    let result = harness.run(&broken).await;
    assert_eq!(result.status, Status::Failed, "{result:#?}");
    let grading = result.grading.as_ref().unwrap();
    assert_eq!(grading.verdict, Verdict::CompileError);
    assert!(
        grading
            .tests
            .iter()
            .all(|t| t.outcome.verdict == Verdict::Skipped
                && t.outcome.message.as_deref() == Some("not run: the compile stage failed")),
        "{result:#?}"
    );
    assert_ne!(result.compile.as_ref().unwrap().exit_code, Some(0));

    let stopping = graded(
        "python",
        "main.py",
        PYTHON,
        json!({"stop_on_failure": true, "tests": [
            {"stdin": "1 1", "expected_stdout": "2"},
            {"name": "bad", "stdin": "7 1", "expected_stdout": "8"},
            {"stdin": "2 2", "expected_stdout": "4"},
        ]}),
    );
    let result = harness.run(&stopping).await;
    assert_eq!(
        verdicts(&result),
        [
            (Verdict::Accepted, None),
            (Verdict::WrongAnswer, None),
            (Verdict::Skipped, None)
        ],
        "{result:#?}"
    );
    assert_eq!(
        result.grading.as_ref().unwrap().tests[2]
            .outcome
            .message
            .as_deref(),
        Some("not run: test bad was not accepted (stop_on_failure)")
    );
    harness.assert_clean().await;
}

/// Looks everywhere it can for what it is judged against and for the other
/// tests' inputs, and leaves a process and files behind; the next test
/// reports what it finds of them.
const SNOOP: &str = r##"
import os, subprocess, sys
data = sys.stdin.read().strip()
# Spelt in two parts, so that this source itself is not a find.
secrets = [b"EXPECTED" + b"-SECRET", b"OTHER" + b"-INPUT", b"CHECKER" + b"-SOURCE"]
marker = "#" + " tampered"
def readable_files():
    paths = [f"/proc/{p}/{f}" for p in os.listdir("/proc") if p.isdigit() for f in ("cmdline", "environ")]
    for root in ["/workspace", "/tmp", "/dev/shm", "/dev/mqueue", "/run", "/var/tmp", "/home", "/root"]:
        for d, dirs, files in os.walk(root):
            paths += [os.path.join(d, f) for f in files]
    for path in paths:
        try:
            with open(path, "rb") as h:
                yield path, h.read(1 << 20)
        except Exception:
            pass
found = sorted({p for p, content in readable_files() for secret in secrets if secret in content})
if data == "first":
    open("/tmp/state", "w").write("left")
    open("/dev/shm/state", "w").write("left")
    try:
        open("/workspace/state", "w").write("left")
    except OSError:
        pass
    try:
        open("/workspace/main.py", "a").write(marker)
    except OSError as e:
        print("cannot change main.py:", e.errno)
    subprocess.Popen(["sleep", "30"], start_new_session=True)
    print("left things", found)
else:
    left = [p for p in ["/tmp/state", "/dev/shm/state", "/workspace/state"] if os.path.exists(p)]
    others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid() and int(p) != 1 and int(p) != os.getppid()]
    changed = marker in open("/workspace/main.py").read()
    print("found", found, "left", left, "others", others, "changed", changed)
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_solution_can_neither_see_what_it_is_judged_against_nor_leave_anything_for_the_next_test()
{
    for (runtime, harness) in harness_per_runtime(
        "a_solution_can_neither_see_what_it_is_judged_against_nor_leave_anything_for_the_next_test",
    )
    .await
    {
        for check in [
            json!("exact"),
            checker_program("import sys\n# CHECKER-SOURCE\nsys.exit(1)\n"),
        ] {
            let spec = graded(
                "python",
                "main.py",
                SNOOP,
                json!({"check": check, "tests": [
                    {"stdin": "first", "expected_stdout": "EXPECTED-SECRET one"},
                    {"stdin": "second OTHER-INPUT", "expected_stdout": "EXPECTED-SECRET two"},
                ]}),
            );
            let result = harness.run(&spec).await;
            let what = format!("under {runtime}: {result:#?}");
            let grading = result.grading.as_ref().unwrap();
            let first = &grading.tests[0].outcome;
            assert_eq!(first.verdict, Verdict::WrongAnswer, "{what}");
            assert_eq!(
                first.stdout, "cannot change main.py: 13\nleft things []\n",
                "{what}"
            );
            let second = &grading.tests[1].outcome;
            assert_eq!(second.verdict, Verdict::WrongAnswer, "{what}");
            assert_eq!(
                second.stdout, "found [] left [] others [] changed False\n",
                "{what}"
            );
            harness.assert_clean().await;
        }
    }
}

fn checker_program(source: &str) -> Value {
    json!({"mode": "program", "language": "python", "files": [{"name": "check.py", "content": source}]})
}

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

/// A C++ checker: accepts when the program's number is the answer's.
const CPP_CHECKER: &str = r#"
#include <cstdio>
#include <fstream>
int main(int argc, char** argv) {
    std::ifstream out(argv[2]), ans(argv[3]);
    long long got, want;
    if (!(out >> got)) { std::puts("no number"); return 1; }
    ans >> want;
    if (got == want) { std::puts("ok"); return 0; }
    std::printf("expected %lld, got %lld\n", want, got);
    return 1;
}
"#;

fn cpp_checker(source: &str) -> Value {
    json!({"mode": "program", "language": "cpp", "files": [{"name": "check.cpp", "content": source}]})
}

/// A python sum judged by `checker`: test 1 right, test 2 wrong.
fn judged_by(checker: &str) -> JobSpec {
    graded(
        "python",
        "main.py",
        PYTHON,
        json!({"check": cpp_checker(checker), "tests": [
            {"stdin": "1 2", "expected_stdout": "3"},
            {"stdin": "3 4", "expected_stdout": "8"},
        ]}),
    )
}

/// Runs `spec` as a job of API key `tenant` on the harness's engine.
async fn run_as(harness: &Harness, tenant: &str, spec: &JobSpec) -> JobResult {
    let mut job = harness.prepare(spec);
    job.tenant = Some(tenant.to_string());
    let id = uuid::Uuid::new_v4().to_string();
    harness.engine.run(&id, &job, Default::default()).await
}

/// The verdicts and messages of a [`judged_by`] job, and its checker's
/// figures.
fn judged(result: &JobResult, what: &str) -> code_runner::job::grading::CheckerUsage {
    assert_eq!(
        verdicts(result),
        [(Verdict::Accepted, None), (Verdict::WrongAnswer, None)],
        "{what}: {result:#?}"
    );
    let grading = result.grading.as_ref().unwrap();
    let messages: Vec<_> = grading
        .tests
        .iter()
        .map(|t| t.outcome.message.as_deref())
        .collect();
    assert_eq!(
        messages,
        [Some("ok"), Some("expected 8, got 7")],
        "{what}: {result:#?}"
    );
    let usage = grading
        .checker
        .unwrap_or_else(|| panic!("no checker usage {what}"));
    assert_eq!(usage.checks, 2, "{what}: {result:#?}");
    usage
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compiled_checker_is_kept_for_the_next_job_of_the_same_key_only() {
    for (runtime, harness) in
        harness_per_runtime("a_compiled_checker_is_kept_for_the_next_job_of_the_same_key_only")
            .await
    {
        let cache = &harness.engine.config().checker_cache;
        let first = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
        let compiled = judged(&first, &format!("{runtime}: first"));
        assert!(!compiled.compile_cached, "{runtime}: {first:#?}");
        let (entries, bytes) = cache.usage();
        assert_eq!(entries, 1, "{runtime}");
        // The binary and its source (a C++ binary is kilobytes at least).
        assert!(bytes > 4096, "{runtime}: {bytes} bytes kept");

        // The same key and checker: no compile, the same judgements.
        let second = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
        let cached = judged(&second, &format!("{runtime}: second"));
        assert!(cached.compile_cached, "{runtime}: {second:#?}");
        // Its figures are the two checks' alone, the compile's CPU is not in
        // them (g++ spends hundreds of ms on <fstream>).
        assert!(
            cached.cpu_ms < compiled.cpu_ms,
            "{runtime}: cached {cached:?} against compiled {compiled:?}"
        );
        let json = serde_json::to_value(&second).unwrap();
        assert_eq!(json["checker"]["compile_cached"], true, "{runtime}");

        // Another key compiles its own, and so does another checker.
        let other_key = run_as(&harness, "key-b", &judged_by(CPP_CHECKER)).await;
        assert!(!judged(&other_key, &format!("{runtime}: key-b")).compile_cached);
        let changed = format!("// another checker\n{CPP_CHECKER}");
        let other_source = run_as(&harness, "key-a", &judged_by(&changed)).await;
        assert!(!judged(&other_source, &format!("{runtime}: changed")).compile_cached);
        assert_eq!(cache.usage().0, 3, "{runtime}");
        harness.assert_clean().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_arriving_together_compile_their_checker_once() {
    for (runtime, harness) in
        harness_per_runtime("jobs_arriving_together_compile_their_checker_once").await
    {
        let spec = judged_by(CPP_CHECKER);
        let (a, b, c) = tokio::join!(
            run_as(&harness, "key-a", &spec),
            run_as(&harness, "key-a", &spec),
            run_as(&harness, "key-a", &spec),
        );
        let cached: Vec<bool> = [&a, &b, &c]
            .iter()
            .map(|result| judged(result, runtime).compile_cached)
            .collect();
        assert_eq!(
            cached.iter().filter(|cached| !**cached).count(),
            1,
            "{runtime}: one compile, two waited for it: {cached:?}"
        );
        harness.assert_clean().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_that_does_not_compile_is_not_kept() {
    let harness = Harness::new().await;
    let broken = "int main() { return undefined_name; }\n";
    for attempt in ["first", "second"] {
        let result = run_as(&harness, "key-a", &judged_by(broken)).await;
        let grading = result.grading.as_ref().unwrap();
        assert_eq!(
            grading.tests[0].outcome.verdict,
            Verdict::CheckerError,
            "{attempt}: {result:#?}"
        );
        let error = result.error.as_deref().unwrap_or_default();
        assert!(
            error.contains("the checker did not compile (exited)")
                && error.contains("undefined_name"),
            "{attempt}: {error}"
        );
        // Its compile ran (and reported) both times.
        let usage = grading.checker.unwrap();
        assert!(
            !usage.compile_cached && usage.cpu_ms > 0,
            "{attempt}: {usage:?}"
        );
    }
    assert_eq!(harness.engine.config().checker_cache.usage(), (0, 0));
    harness.assert_clean().await;
}

/// A tag of the C++ image made for one test, removed when it ends (also
/// when it fails), with every image built under it.
struct TestTag(String);

impl TestTag {
    fn new() -> Self {
        let tag = format!("code-runner/cpp:checker-cache-{}", uuid::Uuid::new_v4());
        docker_cli(&["tag", "code-runner/cpp:latest", &tag], None);
        Self(tag)
    }

    /// Points the tag at a new image: the C++ image with one label more.
    fn rebuild(&self) {
        let dockerfile = format!("FROM code-runner/cpp:latest\nLABEL rebuilt={}\n", self.0);
        docker_cli(&["build", "--quiet", "-t", &self.0, "-"], Some(&dockerfile));
    }

    fn id(&self) -> String {
        docker_cli(&["image", "inspect", "--format", "{{.Id}}", &self.0], None)
    }
}

impl Drop for TestTag {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rmi", &self.0])
            .output();
    }
}

/// Runs the docker CLI (with `stdin`), panicking unless it succeeds; its
/// stdout, trimmed.
fn docker_cli(args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the docker CLI runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "docker {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_compiled_with_another_build_of_the_image_compiles_again() {
    let tag = TestTag::new();
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("languages.toml");
    let languages = code_runner::languages::EMBEDDED_CATALOG.replace(
        "image = \"code-runner/cpp\"\n",
        &format!("image = \"{}\"\n", tag.0),
    );
    assert_ne!(languages, code_runner::languages::EMBEDDED_CATALOG);
    std::fs::write(&catalog, languages).unwrap();
    let mut settings = common::default_settings(None);
    settings.languages_file = Some(catalog);
    let harness = Harness::with_settings(settings).await;

    let first = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
    assert!(!judged(&first, "first").compile_cached);
    let again = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
    assert!(judged(&again, "again").compile_cached);

    // The same tag, another image: the kept checker is not taken.
    let before = tag.id();
    tag.rebuild();
    assert_ne!(tag.id(), before);
    let rebuilt = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
    assert!(!judged(&rebuilt, "rebuilt").compile_cached);
    let after = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
    assert!(judged(&after, "after").compile_cached);
    assert_eq!(harness.engine.config().checker_cache.usage().0, 2);
    harness.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cache_off_every_job_compiles_its_checker() {
    let mut settings = common::default_settings(None);
    settings.checker_cache_mb = 0;
    let harness = Harness::with_settings(settings).await;
    for attempt in ["first", "second"] {
        let result = run_as(&harness, "key-a", &judged_by(CPP_CHECKER)).await;
        let usage = judged(&result, attempt);
        assert!(!usage.compile_cached, "{attempt}: {usage:?}");
    }
    assert_eq!(harness.engine.config().checker_cache.usage(), (0, 0));
    harness.assert_clean().await;
}
