//! The verdicts of solutions: each one from a purpose-written solution in C++ and Python, a
//! test whose process start the pids limit refused, a compile error that
//! skips every test and stop-on-failure that skips the rest, and a solution
//! that tries to read what it is judged against or to leave something for
//! the next test.

use crate::common;

use code_runner::job::Status;
use code_runner::job::grading::{Restarts, TimeLimit, Verdict};
use code_runner::sandbox::SandboxEvent;
use common::{Harness, harness_per_runtime};
use serde_json::{Value, json};

use super::{PYTHON, checker_program, graded, verdicts};

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
