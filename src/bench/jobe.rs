//! `bench --scenario jobe`: Moodle CodeRunner's load on the Jobe API —
//! `--jobs` `POST /jobe/index.php/restapi/runs` sent at once (a quiz whose
//! students press Check together), or with `--ladder` bursts of 1, 2, 4, …
//! up to `--jobs`, as Jobe's own `testsubmit.py --perf` doubles them. Each
//! run is the hello world of `--language` (a Jobe id: `python3` or `c`)
//! and must come back outcome 15 with its output; what came back otherwise
//! (21 overload included) is counted per burst, never hidden.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::report::{self, Host};
use super::stats::Summary;
use super::{BenchArgs, REQUEST_TIMEOUT, ScenarioReport, conclude, fail};
use crate::client::{Api, ClientError};
use crate::exit;

/// The prefix CodeRunner builds.
const PREFIX: &str = "/jobe/index.php/restapi";
const OUTPUT: &str = "Hello world!\n";

/// The source of Jobe language `language`'s run, if the bench has one.
pub(super) fn program(language: &str) -> Option<&'static str> {
    match language {
        "python3" => Some("print(\"Hello world!\")\n"),
        "c" => Some("#include <stdio.h>\nint main() {\n    printf(\"Hello world!\\n\");\n}\n"),
        _ => None,
    }
}

#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) language: String,
    pub(super) jobs: u32,
    pub(super) ladder: bool,
}

impl Plan {
    /// The burst sizes: `jobs`, or 1, 2, 4, … then `jobs`.
    fn bursts(&self) -> Vec<u32> {
        if !self.ladder {
            return vec![self.jobs];
        }
        let mut sizes: Vec<u32> = std::iter::successors(Some(1u32), |n| n.checked_mul(2))
            .take_while(|n| *n < self.jobs)
            .collect();
        sizes.push(self.jobs);
        sizes
    }
}

#[derive(Debug, Serialize)]
pub(super) struct Burst {
    size: u32,
    /// The burst's first request sent → its last answer.
    all_answered_ms: f64,
    /// Runs answered per second of the burst.
    runs_per_sec: f64,
    /// Each request's send → answer.
    request_ms: Option<Summary>,
    /// Answers by Jobe outcome (`"15"`), or by HTTP status when not 200
    /// (`"http 429"`), or `"transport"`.
    outcomes: BTreeMap<String, u32>,
    /// Outcome 15 with another output.
    wrong_output: u32,
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    scenario: &'static str,
    language: String,
    bursts: Vec<Burst>,
    /// The largest burst whose every run came back 15 with its output.
    largest_clean_burst: Option<u32>,
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
        let _ = writeln!(
            out,
            "jobe: {} runs of {} hello world through POST {PREFIX}/runs",
            self.bursts.iter().map(|b| b.size).sum::<u32>(),
            self.language
        );
        for burst in &self.bursts {
            let _ = writeln!(
                out,
                "burst {:>4}: all answered in {:.0} ms ({:.1} runs/s), outcomes {:?}, request p99 {}",
                burst.size,
                burst.all_answered_ms,
                burst.runs_per_sec,
                burst.outcomes,
                burst
                    .request_ms
                    .as_ref()
                    .map_or("-".to_string(), |s| format!("{:.0} ms", s.p99)),
            );
            let _ = writeln!(out, "    request   {}", Summary::line(&burst.request_ms));
        }
        let _ = writeln!(
            out,
            "largest burst with every run 15: {}",
            self.largest_clean_burst
                .map_or("none".to_string(), |n| n.to_string())
        );
        for problem in &self.problems {
            let _ = writeln!(out, "problem     {problem}");
        }
        let _ = writeln!(out, "host        {}", self.host.describe());
        out
    }
}

/// What one run came back as: its outcome key and whether its output was
/// the program's.
fn judged(answer: Result<(u16, Value), String>) -> (String, bool) {
    match answer {
        Err(_) => ("transport".to_string(), false),
        Ok((200, body)) => match body["outcome"].as_u64() {
            Some(outcome) => (outcome.to_string(), body["stdout"] == OUTPUT),
            None => ("no outcome".to_string(), false),
        },
        Ok((status, _)) => (format!("http {status}"), false),
    }
}

/// One `POST runs`: its status and body.
async fn post(api: &Api, spec: &Value) -> Result<(u16, Value), String> {
    let response = api
        .http()
        .post(format!("{}{PREFIX}/runs", api.base))
        .header("X-API-KEY", &api.key)
        .json(spec)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    Ok((status, body))
}

async fn burst(api: &Api, spec: &Value, size: u32) -> (Burst, Vec<String>) {
    let started = Instant::now();
    let answers = futures_util::future::join_all((0..size).map(|_| async {
        let sent = Instant::now();
        let answer = post(api, spec).await;
        (answer, sent.elapsed())
    }))
    .await;
    let all = started.elapsed();
    let mut outcomes = BTreeMap::new();
    let (mut wrong_output, mut took, mut problems) = (0, Vec::new(), Vec::new());
    for (i, (answer, elapsed)) in answers.into_iter().enumerate() {
        took.push(elapsed);
        if let Err(error) = &answer {
            problems.push(format!("burst of {size}: run {i}: {error}"));
        }
        let (outcome, right) = judged(answer);
        if outcome == "15" && !right {
            wrong_output += 1;
        }
        *outcomes.entry(outcome).or_insert(0) += 1;
    }
    let clean = outcomes.get("15") == Some(&size) && wrong_output == 0;
    if !clean {
        problems.push(format!(
            "burst of {size}: outcomes {outcomes:?}, {wrong_output} with another output"
        ));
    }
    let burst = Burst {
        size,
        all_answered_ms: ms(all),
        runs_per_sec: f64::from(size) / all.as_secs_f64().max(1e-9),
        request_ms: Summary::of(took),
        outcomes,
        wrong_output,
    };
    (burst, problems)
}

fn ms(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1000.0 * 10.0).round() / 10.0
}

/// `--scenario jobe`: the bursts through the Jobe API, then the report.
/// `--language` is a Jobe id (default `python3`).
pub(super) async fn bench(args: &BenchArgs) -> u8 {
    let load_only = [
        (args.engine, "--engine"),
        (args.interactive, "--interactive"),
        (args.program.is_some(), "--program"),
    ];
    if let Some((_, flag)) = load_only.iter().find(|(given, _)| *given) {
        return fail(
            exit::USAGE,
            format!("{flag} does not go with --scenario jobe (its runs are Jobe's hello worlds)"),
        );
    }
    let api = match args.api.api(REQUEST_TIMEOUT) {
        Ok(api) => api,
        Err(error) => return fail(error.exit_code(), error),
    };
    let plan = Plan {
        language: args.language.clone().unwrap_or_else(|| "python3".into()),
        jobs: args.jobs,
        ladder: args.ladder,
    };
    conclude(
        args.json,
        run(&api, plan).await,
        "some runs of the jobe scenario did not come back 15 with their output (see the report)",
    )
}

impl ScenarioReport for Report {
    fn text(&self) -> String {
        Report::text(self)
    }
    fn succeeded(&self) -> bool {
        Report::succeeded(self)
    }
}

pub(super) async fn run(api: &Api, plan: Plan) -> Result<Report, ClientError> {
    let source = program(&plan.language).ok_or_else(|| {
        ClientError::Setting(format!(
            "--scenario jobe has a program for python3 and c (Jobe's ids), not {:?}",
            plan.language
        ))
    })?;
    let spec = json!({"run_spec": {"language_id": plan.language, "sourcecode": source}});
    let load_before = report::load_average();
    let (mut bursts, mut problems, mut largest_clean) = (Vec::new(), Vec::new(), None);
    for size in plan.bursts() {
        let (burst, said) = burst(api, &spec, size).await;
        if said.is_empty() {
            largest_clean = Some(size);
        }
        problems.extend(said);
        bursts.push(burst);
    }
    Ok(Report {
        scenario: "jobe",
        language: plan.language,
        bursts,
        largest_clean_burst: largest_clean,
        problems,
        host: Host::after(load_before),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ladder_doubles_up_to_the_jobs() {
        let plan = |jobs, ladder| Plan {
            language: "c".into(),
            jobs,
            ladder,
        };
        assert_eq!(plan(300, false).bursts(), [300]);
        assert_eq!(
            plan(512, true).bursts(),
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
        );
        assert_eq!(plan(5, true).bursts(), [1, 2, 4, 5]);
        assert_eq!(plan(1, true).bursts(), [1]);
    }

    #[test]
    fn each_answer_is_counted_by_what_it_was() {
        let ok = json!({"outcome": 15, "stdout": OUTPUT});
        assert_eq!(judged(Ok((200, ok))), ("15".to_string(), true));
        let other = json!({"outcome": 15, "stdout": "nope"});
        assert_eq!(judged(Ok((200, other))), ("15".to_string(), false));
        let overload = json!({"outcome": 21, "stdout": ""});
        assert_eq!(judged(Ok((200, overload))), ("21".to_string(), false));
        assert_eq!(
            judged(Ok((429, Value::Null))),
            ("http 429".to_string(), false)
        );
        assert_eq!(
            judged(Err("refused".into())),
            ("transport".to_string(), false)
        );
    }
}
