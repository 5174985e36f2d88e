//! `bench --scenario grading`: one C++ solution graded on
//! `--tests` tests in one job, against the same tests as that many separate
//! jobs of the same solution, all submitted at once, in the same run; each
//! way `--rounds` times, alternately.
//!
//! - graded: one `POST /v1/jobs?wait=true` with the tests; its time is the
//!   request's;
//! - separate: the same count of `?wait=true` jobs sent together; their
//!   time runs until the last one answered;
//! - the overhead per test: from one test's end to the next one's start, as
//!   the worker saw them (`started_ms` + `wall_ms` of one test to the next
//!   one's `started_ms`), over every pair of consecutive tests.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::report::{self, Host};
use super::stats::Summary;
use crate::client::{Api, ClientError};

/// The solution: reads two numbers, prints their sum.
const SOLUTION: &str = r#"#include <cstdio>
int main() {
    long a, b;
    if (scanf("%ld %ld", &a, &b) != 2) return 2;
    printf("%ld\n", a + b);
    return 0;
}
"#;

#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) tests: u32,
    pub(super) rounds: u32,
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    scenario: &'static str,
    language: &'static str,
    tests: u32,
    rounds: u32,
    graded_ms: Option<Summary>,
    separate_ms: Option<Summary>,
    /// Graded p50 over separate p50.
    ratio: Option<f64>,
    overhead_per_test_ms: Option<Summary>,
    /// What did not go as it should (a test not accepted, a job failed).
    problems: Vec<String>,
    host: Host,
}

impl Report {
    pub(super) fn succeeded(&self) -> bool {
        self.problems.is_empty()
    }

    pub(super) fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let line = Summary::line;
        let _ = writeln!(
            out,
            "grading: a C++ sum graded on {} tests, {} rounds",
            self.tests, self.rounds
        );
        let _ = writeln!(
            out,
            "graded      one job with {} tests: {}",
            self.tests,
            line(&self.graded_ms)
        );
        let _ = writeln!(
            out,
            "separate    {} jobs at once:        {}",
            self.tests,
            line(&self.separate_ms)
        );
        match self.ratio {
            Some(ratio) => {
                let _ = writeln!(out, "ratio       graded / separate (p50): {ratio:.3}");
            }
            None => {
                let _ = writeln!(out, "ratio       unknown");
            }
        }
        let _ = writeln!(
            out,
            "per test    end → next start: {}",
            line(&self.overhead_per_test_ms)
        );
        for problem in &self.problems {
            let _ = writeln!(out, "problem     {problem}");
        }
        let _ = writeln!(out, "host        {}", self.host.describe());
        out
    }
}

fn job(tests: Option<u32>, stdin: &str) -> Value {
    let mut job = json!({"language": "cpp", "files": [{"name": "main.cpp", "content": SOLUTION}]});
    match tests {
        Some(count) => {
            job["tests"] = (0..count)
                .map(|i| json!({"stdin": format!("{i} {i}\n"), "expected_stdout": format!("{}\n", 2 * i)}))
                .collect();
        }
        None => job["stdin"] = Value::String(stdin.to_string()),
    }
    job
}

/// Submits `body` with `?wait=true`; the job's view.
pub(super) async fn wait(api: &Api, body: &Value) -> Result<Value, ClientError> {
    let body = serde_json::to_vec(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    Ok(api.submit(&body, None, true, |_| {}).await?.answer)
}

/// The gaps between consecutive tests of a graded job's view.
fn gaps(view: &Value) -> Vec<Duration> {
    let Some(tests) = view["result"]["tests"].as_array() else {
        return Vec::new();
    };
    tests
        .windows(2)
        .filter_map(|pair| {
            let end = pair[0]["started_ms"].as_u64()? + pair[0]["wall_ms"].as_u64()?;
            let next = pair[1]["started_ms"].as_u64()?;
            Some(Duration::from_millis(next.saturating_sub(end)))
        })
        .collect()
}

pub(super) async fn run(api: &Api, plan: Plan) -> Result<Report, ClientError> {
    let load_before = report::load_average();
    let (mut graded, mut separate, mut overhead, mut problems) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        let started = Instant::now();
        let view = wait(api, &job(Some(plan.tests), "")).await?;
        graded.push(started.elapsed());
        if view["result"]["verdict"] != "accepted" {
            problems.push(format!(
                "round {round}: the graded job's verdict was {}",
                view["result"]["verdict"]
            ));
        }
        overhead.extend(gaps(&view));

        let started = Instant::now();
        let answers = futures_util::future::join_all(
            (0..plan.tests)
                .map(|i| async move { wait(api, &job(None, &format!("{i} {i}\n"))).await }),
        )
        .await;
        separate.push(started.elapsed());
        for (i, answer) in answers.into_iter().enumerate() {
            let view = answer?;
            let expected = format!("{}\n", 2 * i);
            if view["status"] != "succeeded" || view["result"]["run"]["stdout"] != expected.as_str()
            {
                problems.push(format!(
                    "round {round}: separate job {i} ended {}",
                    view["status"]
                ));
            }
        }
    }
    let graded_ms = Summary::of(graded);
    let separate_ms = Summary::of(separate);
    let ratio = match (&graded_ms, &separate_ms) {
        (Some(g), Some(s)) if s.p50 > 0.0 => Some((g.p50 / s.p50 * 1000.0).round() / 1000.0),
        _ => None,
    };
    Ok(Report {
        scenario: "grading",
        language: "cpp",
        tests: plan.tests,
        rounds: plan.rounds,
        graded_ms,
        separate_ms,
        ratio,
        overhead_per_test_ms: Summary::of(overhead),
        problems,
        host: Host::after(load_before),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gaps_run_from_one_tests_end_to_the_next_ones_start() {
        let view = json!({"result": {"tests": [
            {"started_ms": 0, "wall_ms": 3},
            {"started_ms": 5, "wall_ms": 2},
            {"started_ms": 9, "wall_ms": 1},
            {"wall_ms": 0},
        ]}});
        assert_eq!(
            gaps(&view),
            [Duration::from_millis(2), Duration::from_millis(2)]
        );
        let graded = job(Some(3), "");
        assert_eq!(
            graded["tests"][2],
            json!({"stdin": "2 2\n", "expected_stdout": "4\n"})
        );
        assert_eq!(job(None, "1 1\n")["stdin"], "1 1\n");
    }
}
