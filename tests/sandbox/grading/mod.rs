//! Grading in real sandboxes (runc, and gVisor when enabled): one job,
//! one compile, one run per test with a verdict each; purpose-written
//! solutions for each verdict in C++ and Python; solutions that try to
//! read what they are judged against or to leave something for the next
//! test; checker programs, partial scores and a crashing checker; compiled
//! checkers kept between jobs.
//!
//! Here the helpers and the Python solution the modules share; the tests
//! are in [`solutions`], [`checkers`] and [`checker_cache`].

mod checker_cache;
mod checkers;
mod solutions;

use code_runner::job::grading::{TimeLimit, Verdict};
use code_runner::job::{JobResult, JobSpec};
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

fn checker_program(source: &str) -> Value {
    json!({"mode": "program", "language": "python", "files": [{"name": "check.py", "content": source}]})
}
