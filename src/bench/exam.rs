//! `bench --exam N`: N students press Run at once. Each submits an
//! interactive Python program that asks for a name and then `--questions`
//! questions, each with `input()`; the student waits for `input_wanted`,
//! "types" after a think time (`--think-ms`, ±50 % jitter), and reads the
//! answer. Measured per student:
//!
//! - first output: submission → the first `stdout` event;
//! - input prompt: the prompt's `stdout` event → its `input_wanted`, as the
//!   student sees them (both often come in one batch of the stream);
//! - wait → event: from the moment the program asks (each prompt carries
//!   the program's `time.time_ns()`, taken just before `input()` writes the
//!   prompt and reads) to the `input_wanted` at the student: the latency of
//!   the event itself, from the read blocking (plus the prompt's write) to
//!   the screen. It needs the bench and the sandboxes on one machine (one
//!   clock); on another the figure is skewed by the clocks' difference;
//! - answer: the line typed (sent) → the program's answer on the stream;
//! - refusals (429s, by reason; each waited out and sent again) and what
//!   was lost: a student whose job did not succeed, an answer missing from
//!   the output, a wait said twice or not at all.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde::Serialize;
use tokio::sync::mpsc;

use super::report::{self, Host, StartCounts};
use super::stats::Summary;
use crate::client::stream::{EventSink, Followed, Follower, NoInterrupts, Outgoing};
use crate::client::{Api, ClientError, job_id};
use crate::job::{StartKind, Status};

#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) students: u32,
    pub(super) questions: u32,
    pub(super) think: Duration,
}

/// The program each student runs: a name, then the questions, each answer
/// printed back with the name.
fn program(questions: u32) -> String {
    format!(
        "import time\n\
         name = input(f'[{{time.time_ns()}}] name? ')\n\
         for q in range(1, {questions} + 1):\n\
         \x20   line = input(f'[{{time.time_ns()}}] q{{q}}? ')\n\
         \x20   print(f'{{name}} answered {{q}}: {{line}}')\n\
         print('done')\n"
    )
}

/// The output without the prompts' time stamps (`[<ns>] `).
fn without_stamps(output: &str) -> String {
    let mut out = String::with_capacity(output.len());
    let mut rest = output;
    while let Some(start) = rest.find('[') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find("] ") {
            Some(end) if end > 0 && after[..end].bytes().all(|b| b.is_ascii_digit()) => {
                rest = &after[end + 2..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The last prompt's time stamp in `output`, as a time since the epoch.
fn last_stamp(output: &str) -> Option<Duration> {
    let start = output.rfind('[')?;
    let after = &output[start + 1..];
    let end = after.find(']')?;
    let nanos: u64 = after[..end].parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// The think time of `student` before input `turn`: `think` ± 50 %,
/// spread evenly over the students and turns (no randomness: a rerun
/// types at the same moments).
fn think_time(think: Duration, student: u32, turn: u32) -> Duration {
    let spread = (u64::from(student) * 7919 + u64::from(turn) * 104_729) % 1001;
    // 0.5 .. 1.5 of `think`.
    think.mul_f64(0.5 + spread as f64 / 1000.0)
}

/// One student's view of its job, as the stream showed it.
struct Student {
    index: u32,
    think: Duration,
    /// Where typed lines go (to the follower).
    keyboard: mpsc::Sender<Outgoing>,
    /// Lines typed so far (the name first).
    typed: u32,
    /// All stdout.
    output: String,
    first_output: Option<Instant>,
    /// When the last `stdout` event came (the prompt, at a wait).
    last_output: Option<Instant>,
    /// When the line being typed is sent; its answer is the next output.
    answer_due: Option<Instant>,
    waits: u32,
    prompt_latencies: Vec<Duration>,
    wait_latencies: Vec<Duration>,
    answer_latencies: Vec<Duration>,
}

impl Student {
    fn line(&self) -> String {
        if self.typed == 0 {
            format!("student{}\n", self.index)
        } else {
            format!("answer {} of student{}\n", self.typed, self.index)
        }
    }
}

impl EventSink for Student {
    fn stage_started(&mut self, _stage: &str) {}

    fn output(&mut self, stderr: bool, bytes: Vec<u8>) {
        if stderr {
            return;
        }
        let now = Instant::now();
        self.first_output.get_or_insert(now);
        self.last_output = Some(now);
        if let Some(due) = self.answer_due.take() {
            self.answer_latencies
                .push(now.saturating_duration_since(due));
        }
        self.output.push_str(&String::from_utf8_lossy(&bytes));
    }

    fn input_wanted(&mut self) {
        let now = Instant::now();
        self.waits += 1;
        if let Some(prompt) = self.last_output {
            self.prompt_latencies
                .push(now.saturating_duration_since(prompt));
        }
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        if let Some(asked) = last_stamp(&self.output) {
            self.wait_latencies.push(since_epoch.saturating_sub(asked));
        }
        let think = think_time(self.think, self.index, self.typed);
        let line = self.line().into_bytes();
        self.typed += 1;
        self.answer_due = Some(now + think);
        let keyboard = self.keyboard.clone();
        tokio::spawn(async move {
            tokio::time::sleep(think).await;
            // The job may have ended meanwhile: nobody waits for it then.
            let _ = keyboard.send(Outgoing::Stdin(line)).await;
        });
    }
}

/// What one student's run gave.
struct Outcome {
    first_output: Option<Duration>,
    prompt_latencies: Vec<Duration>,
    wait_latencies: Vec<Duration>,
    answer_latencies: Vec<Duration>,
    refusals: BTreeMap<String, u32>,
    waits: u32,
    /// How the job got its sandbox, and how long that took (the result's
    /// `start` and `timings.container_start_ms`), when it ended.
    start: Option<(Option<StartKind>, Duration)>,
    /// Why it did not go as it should, if it did not.
    problem: Option<String>,
}

impl Outcome {
    fn failed(problem: String, refusals: BTreeMap<String, u32>) -> Self {
        Self {
            first_output: None,
            prompt_latencies: Vec::new(),
            wait_latencies: Vec::new(),
            answer_latencies: Vec::new(),
            refusals,
            waits: 0,
            start: None,
            problem: Some(problem),
        }
    }
}

/// The transcript a student must see: every answer, then `done`.
fn expected_output(student: u32, questions: u32) -> String {
    let mut out = String::from("name? ");
    for q in 1..=questions {
        out.push_str(&format!(
            "q{q}? student{student} answered {q}: answer {q} of student{student}\n"
        ));
    }
    out.push_str("done\n");
    out
}

async fn one_student(
    api: &Api,
    body: &[u8],
    index: u32,
    plan: Plan,
) -> Result<Outcome, ClientError> {
    let mut refusals = BTreeMap::new();
    let accepted = match api
        .submit(body, None, false, |refused| {
            *refusals.entry(refused.reason.clone()).or_default() += 1;
        })
        .await
    {
        Ok(accepted) => accepted,
        Err(error @ (ClientError::Unauthorized | ClientError::Invalid(_))) => return Err(error),
        Err(error) => return Ok(Outcome::failed(error.to_string(), refusals)),
    };
    let id = match job_id(&accepted.answer) {
        Ok(id) => id,
        Err(error) => return Ok(Outcome::failed(error.to_string(), refusals)),
    };
    let (keyboard, frames) = mpsc::channel(4);
    let student = Student {
        index,
        think: plan.think,
        keyboard,
        typed: 0,
        output: String::new(),
        first_output: None,
        last_output: None,
        answer_due: None,
        waits: 0,
        prompt_latencies: Vec::new(),
        wait_latencies: Vec::new(),
        answer_latencies: Vec::new(),
    };
    let mut follower = Follower::new(&api.base, &id, &api.key, student, Some(frames));
    let followed = follower.follow(&mut NoInterrupts).await;
    let student = follower.sink;
    let expected = expected_output(index, plan.questions);
    let start = match &followed {
        Followed::Exit(result) => Some((
            result.start,
            Duration::from_millis(result.timings.container_start_ms),
        )),
        _ => None,
    };
    let problem = match followed {
        Followed::Exit(result) if result.status == Status::Succeeded => {
            let output = without_stamps(&student.output);
            if output != expected {
                Some(format!(
                    "job {id}: the output was {output:?}, not {expected:?}"
                ))
            } else if student.waits != plan.questions + 1 {
                Some(format!(
                    "job {id}: {} input_wanted events for {} waits",
                    student.waits,
                    plan.questions + 1
                ))
            } else {
                None
            }
        }
        Followed::Exit(result) => Some(format!(
            "job {id} ended {} after {} input_wanted (of {}), its output {:?}",
            result.status.as_str(),
            student.waits,
            plan.questions + 1,
            without_stamps(&student.output)
        )),
        Followed::Failed(error) => Some(format!("job {id}: {error}")),
        Followed::Fallback(why) => Some(format!("job {id}: the stream is unavailable: {why}")),
        Followed::Interrupted => Some(format!("job {id}: interrupted")),
    };
    Ok(Outcome {
        first_output: student
            .first_output
            .map(|t| t.saturating_duration_since(accepted.sent)),
        prompt_latencies: student.prompt_latencies,
        wait_latencies: student.wait_latencies,
        answer_latencies: student.answer_latencies,
        refusals,
        waits: student.waits,
        start,
        problem,
    })
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    scenario: &'static str,
    language: &'static str,
    students: u32,
    questions: u32,
    think_ms: u64,
    succeeded: u32,
    /// Students whose run did not go as it should, with why (the first 10).
    problems: Vec<String>,
    problem_count: usize,
    input_wanted_events: u64,
    input_waits: u64,
    first_output_ms: Option<Summary>,
    input_prompt_ms: Option<Summary>,
    /// The program asked (its clock) → `input_wanted` at the student.
    wait_to_event_ms: Option<Summary>,
    answer_ms: Option<Summary>,
    /// How the jobs that ended got their sandboxes.
    start: StartCounts,
    /// The result's `container_start_ms`: from the job's claim to its
    /// sandbox ready (a warm one's is the hand-over).
    sandbox_ready_ms: Option<Summary>,
    /// 429 answers by reason (each waited out and the submission sent again).
    refusals: BTreeMap<String, u32>,
    wall_s: f64,
    host: Host,
}

impl Report {
    pub(super) fn succeeded(&self) -> bool {
        self.problem_count == 0
    }

    pub(super) fn text(&self) -> String {
        use std::fmt::Write as _;
        let line = |s: &Option<Summary>| {
            s.as_ref().map_or("no samples".to_string(), |s| {
                format!(
                    "p50 {:.1} ms  p95 {:.1} ms  p99 {:.1} ms  max {:.1} ms  ({} samples)",
                    s.p50, s.p95, s.p99, s.max, s.samples
                )
            })
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "exam: {} students at once, a name and {} questions each, {} ms think time (±50 %)",
            self.students, self.questions, self.think_ms
        );
        let _ = writeln!(
            out,
            "students     {} of {} went through ({:.1} s)",
            self.succeeded, self.students, self.wall_s
        );
        let _ = writeln!(out, "first output {}", line(&self.first_output_ms));
        let _ = writeln!(out, "start        {}", self.start.describe());
        let _ = writeln!(out, "sandbox      {}", line(&self.sandbox_ready_ms));
        let _ = writeln!(out, "input prompt {}", line(&self.input_prompt_ms));
        let _ = writeln!(out, "wait → event {}", line(&self.wait_to_event_ms));
        let _ = writeln!(out, "answer       {}", line(&self.answer_ms));
        let _ = writeln!(
            out,
            "waits        {} input_wanted for {} waits",
            self.input_wanted_events, self.input_waits
        );
        if self.refusals.is_empty() {
            let _ = writeln!(out, "refusals     none");
        } else {
            let list: Vec<String> = self
                .refusals
                .iter()
                .map(|(reason, count)| format!("{reason} {count}"))
                .collect();
            let _ = writeln!(out, "refusals     {}", list.join(", "));
        }
        for problem in &self.problems {
            let _ = writeln!(out, "problem      {problem}");
        }
        if self.problem_count > self.problems.len() {
            let _ = writeln!(
                out,
                "problem      … and {} more",
                self.problem_count - self.problems.len()
            );
        }
        let _ = writeln!(out, "host         {}", self.host.describe());
        out
    }
}

pub(super) async fn run(api: &Api, plan: Plan) -> Result<Report, ClientError> {
    let load_before = report::load_average();
    let job = serde_json::json!({
        "language": "python",
        "files": [{"name": "main.py", "content": program(plan.questions)}],
        "interactive": true,
    });
    let body = serde_json::to_vec(&job).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let started = Instant::now();
    let outcomes = join_all((0..plan.students).map(|i| one_student(api, &body, i, plan))).await;
    let wall = started.elapsed();
    let (mut first, mut prompt, mut answer) = (Vec::new(), Vec::new(), Vec::new());
    let mut wait = Vec::new();
    let (mut start, mut sandbox_ready) = (StartCounts::default(), Vec::new());
    let mut refusals: BTreeMap<String, u32> = BTreeMap::new();
    let (mut problems, mut problem_count, mut succeeded, mut events) = (Vec::new(), 0, 0, 0u64);
    for outcome in outcomes {
        let outcome = outcome?;
        first.extend(outcome.first_output);
        prompt.extend(outcome.prompt_latencies);
        wait.extend(outcome.wait_latencies);
        answer.extend(outcome.answer_latencies);
        events += u64::from(outcome.waits);
        if let Some((kind, ready)) = outcome.start {
            start.add(kind);
            sandbox_ready.push(ready);
        }
        for (reason, count) in outcome.refusals {
            *refusals.entry(reason).or_default() += count;
        }
        match outcome.problem {
            None => succeeded += 1,
            Some(problem) => {
                problem_count += 1;
                if problems.len() < 10 {
                    problems.push(problem);
                }
            }
        }
    }
    Ok(Report {
        scenario: "exam",
        language: "python",
        students: plan.students,
        questions: plan.questions,
        think_ms: u64::try_from(plan.think.as_millis()).unwrap_or(u64::MAX),
        succeeded,
        problems,
        problem_count,
        input_wanted_events: events,
        input_waits: u64::from(plan.students) * u64::from(plan.questions + 1),
        first_output_ms: Summary::of(first),
        input_prompt_ms: Summary::of(prompt),
        wait_to_event_ms: Summary::of(wait),
        answer_ms: Summary::of(answer),
        start,
        sandbox_ready_ms: Summary::of(sandbox_ready),
        refusals,
        wall_s: (wall.as_secs_f64() * 10.0).round() / 10.0,
        host: Host::after(load_before),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_times_stay_within_half_and_one_and_a_half() {
        let think = Duration::from_millis(500);
        let times: Vec<Duration> = (0..300)
            .flat_map(|s| (0..4).map(move |t| think_time(think, s, t)))
            .collect();
        assert!(times.iter().all(|t| *t >= Duration::from_millis(250)));
        assert!(times.iter().all(|t| *t <= Duration::from_millis(750)));
        // Spread, not one value.
        let distinct: std::collections::BTreeSet<_> = times.iter().collect();
        assert!(distinct.len() > 100, "{}", distinct.len());
        assert_eq!(think_time(think, 3, 1), think_time(think, 3, 1));
    }

    #[test]
    fn the_expected_transcript_has_every_answer() {
        assert_eq!(
            expected_output(7, 2),
            "name? q1? student7 answered 1: answer 1 of student7\n\
             q2? student7 answered 2: answer 2 of student7\ndone\n"
        );
        assert!(program(2).contains("range(1, 2 + 1)"));
    }

    #[test]
    fn stamps_are_taken_out_and_the_last_one_is_read() {
        let output = "[1700000000000000000] name? [1700000000500000000] q1? x answered 1: [a] 2\n";
        assert_eq!(without_stamps(output), "name? q1? x answered 1: [a] 2\n");
        assert_eq!(
            last_stamp("[1] a [1700000000500000000] q1? "),
            Some(Duration::from_nanos(1_700_000_000_500_000_000))
        );
        assert_eq!(last_stamp("no stamp"), None);
    }
}
