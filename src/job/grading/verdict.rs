//! A test's verdict, from how its run ended and then from its output; the
//! result of one test; the summary of a graded job. Judge0's status codes
//! come from [`run_failure`] and [`Check::compare`] too.

use serde::{Deserialize, Serialize};

use super::compare::{Check, Difference, preview};
use crate::job::result::{StageResult, signal_number};
use crate::protocol::Reason;

/// How much of a test's stdout and stderr its result shows, in characters.
pub const OUTPUT_PREVIEW_CHARS: usize = 256;
/// How much of a checker's message a result shows, in characters.
pub const MESSAGE_CHARS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Accepted,
    WrongAnswer,
    /// Over the wall or the CPU limit ([`TestOutcome::time_limit`] says which).
    TimeLimit,
    MemoryLimit,
    /// Exited with a code other than 0, or died of a signal.
    RuntimeError,
    OutputLimit,
    /// Not run: the compile failed, `stop_on_failure` after a failure, or
    /// the job ended first.
    Skipped,
    /// The checker program failed (crashed, timed out, answered outside its
    /// contract): the platform could not judge the test.
    CheckerError,
    /// The job's overall verdict when its compile stage failed.
    CompileError,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::WrongAnswer => "wrong_answer",
            Verdict::TimeLimit => "time_limit",
            Verdict::MemoryLimit => "memory_limit",
            Verdict::RuntimeError => "runtime_error",
            Verdict::OutputLimit => "output_limit",
            Verdict::Skipped => "skipped",
            Verdict::CheckerError => "checker_error",
            Verdict::CompileError => "compile_error",
        }
    }
}

/// Which time limit a `time_limit` verdict is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeLimit {
    Wall,
    Cpu,
}

/// Added to a failed test's message when its run was refused a process
/// start at the pids limit.
const PIDS_LIMIT_NOTE: &str = " (a process start was refused at the pids limit)";

/// How a run failed before its output counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFailure {
    pub verdict: Verdict,
    pub time_limit: Option<TimeLimit>,
    /// The signal that ended it, by number (SIGKILL for a kill).
    pub signal: Option<i32>,
    pub exit_code: Option<i32>,
    pub message: String,
}

/// The verdict a run's end gives before its output is looked at; `None`
/// when it exited 0 within its limits (its output decides). A run whose
/// CPU time is above `cpu_limit_ms` is over its time limit even when it
/// ended before the supervisor's poll caught it.
pub fn run_failure(run: &StageResult, cpu_limit_ms: u64) -> Option<RunFailure> {
    let failure = |verdict, time_limit, signal, message: String| RunFailure {
        verdict,
        time_limit,
        signal,
        exit_code: run.exit_code,
        message,
    };
    let signal = run.signal.as_deref().and_then(signal_number);
    Some(match run.reason {
        Reason::WallTimeout | Reason::IdleTimeout => failure(
            Verdict::TimeLimit,
            Some(TimeLimit::Wall),
            None,
            "time limit exceeded (wall clock)".into(),
        ),
        Reason::CpuTimeout => failure(
            Verdict::TimeLimit,
            Some(TimeLimit::Cpu),
            None,
            "time limit exceeded (CPU)".into(),
        ),
        _ if run.cpu_ms > cpu_limit_ms => failure(
            Verdict::TimeLimit,
            Some(TimeLimit::Cpu),
            None,
            "time limit exceeded (CPU)".into(),
        ),
        Reason::MemoryLimit => failure(
            Verdict::MemoryLimit,
            None,
            None,
            "memory limit exceeded".into(),
        ),
        Reason::OutputLimit => failure(
            Verdict::OutputLimit,
            None,
            None,
            "output limit exceeded".into(),
        ),
        Reason::Killed => failure(
            Verdict::RuntimeError,
            None,
            Some(9),
            "killed (SIGKILL)".into(),
        ),
        Reason::Exited => match (run.exit_code, signal) {
            (None, Some(number)) => failure(
                Verdict::RuntimeError,
                None,
                Some(number),
                format!("killed by {}", run.signal.as_deref().unwrap_or("a signal")),
            ),
            (Some(code), _) if code != 0 => failure(
                Verdict::RuntimeError,
                None,
                None,
                format!("exited with code {code}"),
            ),
            _ => return None,
        },
    })
}

/// One test's result: which test, and how it went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    pub index: usize,
    pub name: String,
    #[serde(flatten)]
    pub outcome: TestOutcome,
    /// The files the job asked back, as this test's run left them (not in
    /// the test's event: the result alone carries them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<crate::job::outputs::OutputEntry>,
}

/// How a test went (also the figures of its `test` end event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestOutcome {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<TimeLimit>,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub wall_ms: u64,
    pub cpu_ms: u64,
    pub memory_peak_bytes: u64,
    /// A process or thread start of the run was refused at the pids limit
    /// (see [`StageResult::pids_limit_reached`]; absent where not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit_reached: Option<bool>,
    /// When the test started, in ms after the job's first test started (as
    /// the worker saw it): with `wall_ms`, a timeline of the tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// What the test is worth, and what it scored (all of it when
    /// accepted, a checker's share of it, else 0).
    pub points: f64,
    pub score: f64,
    /// For a wrong answer under a built-in check: where it first differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difference: Option<Difference>,
    /// Why, in words: the checker's message, or what ended the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The start of the program's stdout and stderr (lossy UTF-8).
    pub stdout: String,
    pub stderr: String,
}

impl TestResult {
    /// A test that ran, with no verdict yet (the caller sets it).
    pub fn of_run(index: usize, name: &str, points: f64, run: &StageResult) -> Self {
        Self {
            index,
            name: name.to_string(),
            outcome: TestOutcome {
                verdict: Verdict::Accepted,
                time_limit: None,
                exit_code: run.exit_code,
                signal: run.signal.clone(),
                wall_ms: run.wall_ms,
                cpu_ms: run.cpu_ms,
                memory_peak_bytes: run.memory_peak_bytes,
                pids_limit_reached: run.pids_limit_reached,
                started_ms: None,
                points,
                score: 0.0,
                difference: None,
                message: None,
                stdout: preview(run.stdout.as_bytes(), OUTPUT_PREVIEW_CHARS),
                stderr: preview(run.stderr.as_bytes(), OUTPUT_PREVIEW_CHARS),
            },
            outputs: Vec::new(),
        }
    }

    /// A test that did not run.
    pub fn skipped(index: usize, name: &str, points: f64, why: &str) -> Self {
        Self {
            index,
            name: name.to_string(),
            outcome: TestOutcome {
                verdict: Verdict::Skipped,
                time_limit: None,
                exit_code: None,
                signal: None,
                wall_ms: 0,
                cpu_ms: 0,
                memory_peak_bytes: 0,
                pids_limit_reached: None,
                started_ms: None,
                points,

                score: 0.0,
                difference: None,
                message: Some(why.to_string()),
                stdout: String::new(),
                stderr: String::new(),
            },
            outputs: Vec::new(),
        }
    }

    /// Judged by a run's end and a built-in check: the whole verdict.
    pub fn judged(
        index: usize,
        name: &str,
        points: f64,
        run: &StageResult,
        cpu_limit_ms: u64,
        expected: Option<&[u8]>,
        check: Check,
    ) -> Self {
        let mut result = Self::of_run(index, name, points, run);
        if let Some(failure) = run_failure(run, cpu_limit_ms) {
            result.fail(failure);
            return result;
        }
        match expected.and_then(|expected| check.compare(expected, run.stdout.as_bytes())) {
            Some(difference) => {
                result.outcome.verdict = Verdict::WrongAnswer;
                result.outcome.difference = Some(difference);
            }
            None => result.accept(1.0, None),
        }
        result
    }

    /// Sets a failed run's verdict. Its message says too when the run was
    /// refused a process start at the pids limit (a fork bomb ends by a
    /// time limit, a program whose fork failed by its own error).
    pub fn fail(&mut self, failure: RunFailure) {
        self.outcome.verdict = failure.verdict;
        self.outcome.time_limit = failure.time_limit;
        let mut message = failure.message;
        if self.outcome.pids_limit_reached == Some(true) {
            message.push_str(PIDS_LIMIT_NOTE);
        }
        self.outcome.message = Some(message);
        self.outcome.score = 0.0;
    }

    /// Accepted with `share` (0–1) of the points.
    pub fn accept(&mut self, share: f64, message: Option<String>) {
        self.outcome.verdict = Verdict::Accepted;
        self.outcome.score = self.outcome.points * share;
        self.outcome.message = message;
    }

    /// Not accepted, as `verdict`, with a message.
    pub fn reject(&mut self, verdict: Verdict, message: Option<String>) {
        self.outcome.verdict = verdict;
        self.outcome.score = 0.0;
        self.outcome.message = message;
    }

    pub fn verdict(&self) -> Verdict {
        self.outcome.verdict
    }

    pub fn passed(&self) -> bool {
        self.outcome.verdict == Verdict::Accepted
    }
}

/// A graded job's tests and their summary (`result.tests`, `passed`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grading {
    pub tests: Vec<TestResult>,
    pub passed: usize,
    pub total: usize,
    pub score: f64,
    pub max_score: f64,
    /// `accepted` when every test was; `compile_error`; `checker_error`
    /// when the checker failed on any test; else the verdict of the first
    /// test that was not accepted.
    pub verdict: Verdict,
    /// What the checker program used (`result.checker`), when the check is
    /// one; counted with the job's own stages in the usage ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checker: Option<CheckerUsage>,
    /// The new sandboxes the tests ran in after one died in a test
    /// (`result.restarts`, gVisor only), and what compiling the program
    /// again in them used; counted with the job's own stages in the usage
    /// ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<Restarts>,
}

/// A graded job's sandboxes started again after one died in a test: how
/// many, and the CPU and wall time of their compile stages (the job's
/// `compile` is the first sandbox's; these are the others', summed; 0 for
/// a language with no compile stage).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restarts {
    pub count: u32,
    pub cpu_ms: u64,
    pub wall_ms: u64,
}

/// A checker program's use of its sandbox for one job: its compile stage
/// and every check that reported, summed. A check or compile cut short
/// (its sandbox failed, or the job ended first and the checker's sandbox
/// was removed) reported nothing and is not in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckerUsage {
    pub cpu_ms: u64,
    pub wall_ms: u64,
    /// The checks it answered (one per test that reached it).
    pub checks: u32,
    /// Its compiled files came from the worker's cache (a graded job of the
    /// same API key compiled the same checker): no compile stage ran.
    #[serde(default)]
    pub compile_cached: bool,
}

impl Grading {
    /// The job's status from its grading (its compile stage succeeded):
    /// `succeeded` when every test was accepted, `error` (with why, into
    /// `error`) when the checker failed, else `failed`.
    pub fn status(&self, error: &mut Option<String>) -> crate::job::Status {
        use crate::job::Status;
        if let Some(test) = self
            .tests
            .iter()
            .find(|t| t.verdict() == Verdict::CheckerError)
        {
            *error = Some(format!(
                "the checker could not judge test {}: {}",
                test.name,
                test.outcome.message.as_deref().unwrap_or("no reason given")
            ));
            return Status::Error;
        }
        if self.passed == self.total {
            Status::Succeeded
        } else {
            Status::Failed
        }
    }

    pub fn of(tests: Vec<TestResult>, compile_failed: bool) -> Self {
        let passed = tests.iter().filter(|t| t.passed()).count();
        let score = tests.iter().map(|t| t.outcome.score).sum();
        let max_score = tests.iter().map(|t| t.outcome.points).sum();
        let verdict = if compile_failed {
            Verdict::CompileError
        } else if tests.iter().any(|t| t.verdict() == Verdict::CheckerError) {
            Verdict::CheckerError
        } else {
            tests
                .iter()
                .map(|t| t.verdict())
                .find(|v| *v != Verdict::Accepted)
                .unwrap_or(Verdict::Accepted)
        };
        Self {
            total: tests.len(),
            tests,
            passed,
            score,
            max_score,
            verdict,
            checker: None,
            restarts: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::result::Output;

    fn run(
        reason: Reason,
        exit_code: Option<i32>,
        signal: Option<&str>,
        stdout: &str,
    ) -> StageResult {
        StageResult {
            stdout: Output(stdout.as_bytes().to_vec()),
            stderr: Output(Vec::new()),
            truncated: false,
            exit_code,
            signal: signal.map(String::from),
            reason,
            wall_ms: 12,
            cpu_ms: 10,
            memory_peak_bytes: 1 << 20,
            pids_limit_reached: None,
        }
    }

    fn verdict_of(run: &StageResult) -> (Verdict, Option<TimeLimit>) {
        let result = TestResult::judged(0, "1", 1.0, run, 1000, Some(b"42\n"), Check::Trim);
        (result.outcome.verdict, result.outcome.time_limit)
    }

    #[test]
    fn a_run_refused_a_process_start_says_so_in_its_message() {
        let judged = |pids_limit_reached, reason, exit_code, stdout| {
            let run = StageResult {
                pids_limit_reached,
                ..run(reason, exit_code, None, stdout)
            };
            TestResult::judged(0, "1", 1.0, &run, 1000, Some(b"42\n"), Check::Trim).outcome
        };
        let bomb = judged(Some(true), Reason::WallTimeout, None, "");
        assert_eq!(
            bomb.message.as_deref(),
            Some(
                "time limit exceeded (wall clock) (a process start was refused at the pids limit)"
            )
        );
        assert_eq!(bomb.pids_limit_reached, Some(true));
        let json = serde_json::to_value(&bomb).unwrap();
        assert_eq!(json["pids_limit_reached"], true);
        let failed_fork = judged(Some(true), Reason::Exited, Some(1), "");
        assert_eq!(
            failed_fork.message.as_deref(),
            Some("exited with code 1 (a process start was refused at the pids limit)")
        );
        // Not refused, or not known (gVisor): the plain message.
        for known in [Some(false), None] {
            let slow = judged(known, Reason::WallTimeout, None, "");
            assert_eq!(
                slow.message.as_deref(),
                Some("time limit exceeded (wall clock)")
            );
            let json = serde_json::to_value(&slow).unwrap();
            assert_eq!(
                json.get("pids_limit_reached").cloned(),
                known.map(Into::into)
            );
        }
        // A run that forked to its limit and still answered right passes.
        let accepted = judged(Some(true), Reason::Exited, Some(0), "42");
        assert_eq!(
            (accepted.verdict, accepted.message),
            (Verdict::Accepted, None)
        );
    }

    #[test]
    fn each_way_a_run_ends_has_its_verdict() {
        use Verdict::*;
        assert_eq!(
            verdict_of(&run(Reason::Exited, Some(0), None, "42")),
            (Accepted, None)
        );
        assert_eq!(
            verdict_of(&run(Reason::Exited, Some(0), None, "41")),
            (WrongAnswer, None)
        );
        assert_eq!(
            verdict_of(&run(Reason::Exited, Some(3), None, "42")),
            (RuntimeError, None)
        );
        assert_eq!(
            verdict_of(&run(Reason::Exited, None, Some("SIGSEGV"), "")),
            (RuntimeError, None)
        );
        assert_eq!(
            verdict_of(&run(Reason::WallTimeout, None, Some("SIGKILL"), "")),
            (TimeLimit, Some(super::TimeLimit::Wall))
        );
        assert_eq!(
            verdict_of(&run(Reason::CpuTimeout, None, Some("SIGKILL"), "")),
            (TimeLimit, Some(super::TimeLimit::Cpu))
        );
        let mut over = run(Reason::Exited, Some(0), None, "42");
        over.cpu_ms = 1001;
        assert_eq!(verdict_of(&over), (TimeLimit, Some(super::TimeLimit::Cpu)));
        assert_eq!(
            verdict_of(&run(Reason::MemoryLimit, None, Some("SIGKILL"), "")),
            (MemoryLimit, None)
        );
        assert_eq!(
            verdict_of(&run(Reason::OutputLimit, None, Some("SIGKILL"), "")),
            (OutputLimit, None)
        );
    }

    #[test]
    fn a_wrong_answer_says_where_and_scores_nothing() {
        let result = TestResult::judged(
            2,
            "big",
            5.0,
            &run(Reason::Exited, Some(0), None, "1\n2\n"),
            1000,
            Some(b"1\n3\n"),
            Check::Trim,
        );
        assert_eq!(result.verdict(), Verdict::WrongAnswer);
        assert_eq!(result.outcome.score, 0.0);
        let difference = result.outcome.difference.unwrap();
        assert_eq!(
            (
                difference.line,
                difference.expected.as_deref(),
                difference.got.as_deref()
            ),
            (2, Some("3"), Some("2"))
        );
        let accepted = TestResult::judged(
            0,
            "a",
            5.0,
            &run(Reason::Exited, Some(0), None, "42"),
            1000,
            Some(b"42"),
            Check::Exact,
        );
        assert_eq!(
            (accepted.verdict(), accepted.outcome.score),
            (Verdict::Accepted, 5.0)
        );
        // No expected output: exiting 0 within the limits is enough.
        let free = TestResult::judged(
            0,
            "a",
            1.0,
            &run(Reason::Exited, Some(0), None, "x"),
            1000,
            None,
            Check::Exact,
        );
        assert_eq!(free.verdict(), Verdict::Accepted);
    }

    #[test]
    fn the_overall_verdict_is_the_first_failure_unless_the_checker_failed() {
        let ok = |i| {
            let mut t = TestResult::skipped(i, "t", 1.0, "");
            t.accept(1.0, None);
            t
        };
        let with = |i, verdict| {
            let mut t = TestResult::skipped(i, "t", 1.0, "");
            t.reject(verdict, None);
            t
        };
        let all = Grading::of(vec![ok(0), ok(1)], false);
        assert_eq!(
            (all.verdict, all.passed, all.total, all.score, all.max_score),
            (Verdict::Accepted, 2, 2, 2.0, 2.0)
        );
        let some = Grading::of(
            vec![
                ok(0),
                with(1, Verdict::TimeLimit),
                with(2, Verdict::WrongAnswer),
            ],
            false,
        );
        assert_eq!((some.verdict, some.passed), (Verdict::TimeLimit, 1));
        let checker = Grading::of(
            vec![
                with(0, Verdict::WrongAnswer),
                with(1, Verdict::CheckerError),
            ],
            false,
        );
        assert_eq!(checker.verdict, Verdict::CheckerError);
        let compile = Grading::of(vec![with(0, Verdict::Skipped)], true);
        assert_eq!(compile.verdict, Verdict::CompileError);
    }
}
