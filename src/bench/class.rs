//! `bench --scenario class`: a class's submissions graded at once by one
//! C++ checker program. `--jobs` graded jobs of a python sum (each with
//! `--tests` tests, one of them wrong) are sent together (`?wait=true`),
//! `--rounds` times; each round's checker differs from every earlier one's
//! (a comment), so each round starts with no compiled checker kept. A
//! round's time runs until the last job answered; the report also counts
//! the jobs whose checker compiled (`compile_cached` false) and sums the
//! checkers' CPU. Run it against a server with `CODE_RUNNER_CHECKER_CACHE_MB=0`
//! and one with its default to see what the kept checker saves.

use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};

use super::grading::wait;
use super::report::{self, Host};
use super::stats::Summary;
use crate::client::{Api, ClientError};

/// The students' program: reads two numbers, prints their sum.
const SOLUTION: &str = "a, b = map(int, input().split())\nprint(a + b)\n";

/// The checker: the program's number against the answer's.
const CHECKER: &str = r#"#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
int main(int argc, char** argv) {
    std::ifstream out(argv[2]), ans(argv[3]);
    long long got, want;
    if (!(out >> got)) { std::cout << "no number" << std::endl; return 1; }
    ans >> want;
    if (got == want) { std::cout << "ok" << std::endl; return 0; }
    std::cout << "expected " << want << ", got " << got << std::endl;
    return 1;
}
"#;

#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) jobs: u32,
    pub(super) tests: u32,
    pub(super) rounds: u32,
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    scenario: &'static str,
    jobs: u32,
    tests: u32,
    rounds: u32,
    /// Submit of the round → the last job's answer.
    round_ms: Option<Summary>,
    /// Each job's submit → answer.
    job_ms: Option<Summary>,
    /// Per round, the jobs whose checker compiled.
    compiles: Vec<u32>,
    /// The checkers' CPU (their `checker.cpu_ms`), per round.
    checker_cpu_ms: Vec<u64>,
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
            "class: {} python sums graded at once on {} tests by one C++ checker, {} rounds",
            self.jobs, self.tests, self.rounds
        );
        let _ = writeln!(out, "round       all answered: {}", line(&self.round_ms));
        let _ = writeln!(out, "job         answered:     {}", line(&self.job_ms));
        let _ = writeln!(out, "compiles    per round: {:?}", self.compiles);
        let _ = writeln!(out, "checker cpu per round (ms): {:?}", self.checker_cpu_ms);
        for problem in &self.problems {
            let _ = writeln!(out, "problem     {problem}");
        }
        let _ = writeln!(out, "host        {}", self.host.describe());
        out
    }
}

/// One student's job of round `round` (its checker's comment is the
/// round's `nonce`).
fn job(tests: u32, nonce: &str) -> Value {
    let tests: Vec<Value> = (0..tests)
        .map(|i| {
            // The last test's answer is wrong: a checker's message shows.
            let sum = if i + 1 == tests { 2 * i + 1 } else { 2 * i };
            json!({"stdin": format!("{i} {i}\n"), "expected_stdout": format!("{sum}\n")})
        })
        .collect();
    json!({
        "language": "python",
        "files": [{"name": "main.py", "content": SOLUTION}],
        "tests": tests,
        "check": {"mode": "program", "language": "cpp", "files": [
            {"name": "check.cpp", "content": format!("// {nonce}\n{CHECKER}")},
        ]},
    })
}

/// What is wrong with a job's view, if anything; else whether its checker
/// compiled and the checker's CPU.
fn judged(view: &Value, tests: u32) -> Result<(bool, u64), String> {
    let result = &view["result"];
    if view["status"] != "failed" || result["verdict"] != "wrong_answer" {
        return Err(format!(
            "ended {} with verdict {} ({})",
            view["status"], result["verdict"], view["error"]
        ));
    }
    if result["passed"] != tests - 1 {
        return Err(format!("passed {} of {tests}", result["passed"]));
    }
    let last = &result["tests"][tests as usize - 1]["message"];
    let want = format!("expected {}, got {}", 2 * (tests - 1) + 1, 2 * (tests - 1));
    if last != want.as_str() {
        return Err(format!("the last test's message was {last}"));
    }
    let checker = &result["checker"];
    let cached = checker["compile_cached"].as_bool().unwrap_or(false);
    Ok((!cached, checker["cpu_ms"].as_u64().unwrap_or(0)))
}

pub(super) async fn run(api: &Api, plan: Plan) -> Result<Report, ClientError> {
    let load_before = report::load_average();
    let run_nonce = uuid::Uuid::new_v4();
    let (mut rounds, mut jobs, mut compiles, mut cpu, mut problems) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        let body = job(plan.tests, &format!("{run_nonce} round {round}"));
        let started = Instant::now();
        let answers = futures_util::future::join_all((0..plan.jobs).map(|_| {
            let body = &body;
            async move {
                let view = wait(api, body).await;
                (view, started.elapsed())
            }
        }))
        .await;
        rounds.push(started.elapsed());
        let (mut compiled, mut spent) = (0, 0);
        for (i, (view, took)) in answers.into_iter().enumerate() {
            jobs.push(took);
            match judged(&view?, plan.tests) {
                Ok((did_compile, cpu_ms)) => {
                    compiled += u32::from(did_compile);
                    spent += cpu_ms;
                }
                Err(problem) => problems.push(format!("round {round}: job {i} {problem}")),
            }
        }
        compiles.push(compiled);
        cpu.push(spent);
    }
    Ok(Report {
        scenario: "class",
        jobs: plan.jobs,
        tests: plan.tests,
        rounds: plan.rounds,
        round_ms: Summary::of(rounds),
        job_ms: Summary::of(jobs),
        compiles,
        checker_cpu_ms: cpu,
        problems,
        host: Host::after(load_before),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_job_has_one_wrong_test_and_the_rounds_checker() {
        let body = job(3, "n r1");
        assert_eq!(
            body["tests"][1],
            json!({"stdin": "1 1\n", "expected_stdout": "2\n"})
        );
        assert_eq!(
            body["tests"][2],
            json!({"stdin": "2 2\n", "expected_stdout": "5\n"})
        );
        let source = body["check"]["files"][0]["content"].as_str().unwrap();
        assert!(source.starts_with("// n r1\n#include"), "{source}");
    }

    #[test]
    fn a_view_is_judged_by_its_verdicts_and_the_checkers_message() {
        let view = |message: &str, cached: bool| {
            json!({"status": "failed", "result": {"verdict": "wrong_answer", "passed": 1,
                "tests": [{}, {"message": message}],
                "checker": {"cpu_ms": 12, "compile_cached": cached}}})
        };
        assert_eq!(judged(&view("expected 3, got 2", true), 2), Ok((false, 12)));
        assert_eq!(judged(&view("expected 3, got 2", false), 2), Ok((true, 12)));
        assert_eq!(
            judged(&view("ok", true), 2),
            Err("the last test's message was \"ok\"".to_string())
        );
        assert!(judged(&json!({"status": "error", "result": {}}), 2).is_err());
    }
}
