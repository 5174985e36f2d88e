//! A graded job's tests on the host side of the session: which `run`
//! frames go to the supervisor and when, what each test's stage end means
//! (its verdict, through the built-in comparison or the checker), and the
//! job's grading at the end.
//!
//! Without `stop_on_failure` every test's frame is sent with the bundle
//! (the supervisor runs them back to back); with it, the next one only
//! after the previous was accepted.
//!
//! A check by the checker is raced against the job's cancel and a client's
//! kill ([`Interrupt`]), so neither waits for a checker. When the sandbox
//! dies during a test (gVisor's whole sandbox dies of a test over the memory
//! limit), that test is `memory_limit` and `run.rs` starts a new sandbox for
//! the rest, at most `MAX_RESTARTS` (3) times; their compiles are counted
//! in the grading's `restarts`.

use super::checker::{CheckAnswer, Checker};
use super::config::GvisorLimits;
use crate::job::grading::compare::preview;
use crate::job::grading::verdict::{MESSAGE_CHARS, run_failure};
use crate::job::grading::{Grading, PreparedCheck, PreparedTests, Restarts, TestResult, Verdict};
use crate::job::result::signal_name;
use crate::job::{PreparedJob, StageResult};
use crate::protocol::{HostMessage, Reason, RunSpec, StageLimits, StageSpec};

const NOT_JUDGED_KILLED: &str = "not judged: the job was killed (a kill signal)";

/// What stopped the job while the checker judged a test (see
/// [`Grader::finish`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Interrupt {
    /// A client cancelled the job.
    Cancelled,
    /// A client's kill signal came.
    Killed,
}

impl Interrupt {
    /// The message of the test it left unjudged.
    fn not_judged(self) -> &'static str {
        match self {
            Interrupt::Cancelled => "not judged: the job was cancelled",
            Interrupt::Killed => NOT_JUDGED_KILLED,
        }
    }
}

/// The stage name of test `index`.
pub(super) fn stage_name(index: usize) -> String {
    format!("test:{index}")
}

/// The test a stage name is, if it is one.
pub(super) fn test_index(stage: &str) -> Option<usize> {
    stage.strip_prefix("test:")?.parse().ok()
}

pub(super) struct Grader {
    tests: PreparedTests,
    stage: StageSpec,
    /// gVisor's per-stage additions (nproc, CPU quota), as for every stage.
    gvisor: Option<GvisorLimits>,
    /// The next test whose frame has not been sent.
    next_to_send: usize,
    results: Vec<TestResult>,
    checker: Option<Checker>,
    /// Why the tests not run were skipped (set when the grading stopped).
    stopped: Option<String>,
    /// When each test started (its `stage_start` came), in order.
    starts: Vec<std::time::Instant>,
    /// A client's kill stopped the grading.
    killed: bool,
    /// The sandboxes the tests went on in after one died, and their compiles.
    restarts: Option<Restarts>,
    /// Bytes the tests' output files hold so far (the job's outputs room).
    outputs_held: u64,
}

impl Grader {
    /// The grader of `job`, if it has tests; `checker` is its checker's
    /// sandbox, already starting, when the check is a program.
    pub(super) fn new(
        job: &PreparedJob,
        gvisor: Option<GvisorLimits>,
        checker: Option<Checker>,
    ) -> Option<Self> {
        let tests = job.tests.clone()?;
        let stage = job.run_stage.clone()?;
        Some(Self {
            tests,
            stage,
            gvisor,
            next_to_send: 0,
            results: Vec::new(),
            checker,
            stopped: None,
            starts: Vec::new(),
            killed: false,
            restarts: None,
            outputs_held: 0,
        })
    }

    /// The tests went on in a new sandbox (the last one died in a test),
    /// which compiled the program again as `compile` says.
    pub(super) fn restarted(&mut self, compile: Option<&StageResult>) {
        let restarts = self.restarts.get_or_insert_with(Restarts::default);
        restarts.count += 1;
        if let Some(compile) = compile {
            restarts.cpu_ms += compile.cpu_ms;
            restarts.wall_ms += compile.wall_ms;
        }
    }

    /// The checker program, when the check is one.
    pub(super) fn checker_job(job: &PreparedJob) -> Option<&PreparedJob> {
        match &job.tests.as_ref()?.check {
            PreparedCheck::Program(checker) => Some(checker),
            PreparedCheck::Builtin(_) => None,
        }
    }

    fn run_frame(&self, index: usize) -> HostMessage {
        let test = &self.tests.tests[index];
        let mut stage = StageSpec {
            name: stage_name(index),
            argv: test.argv.clone(),
            stdin: true,
            watch_input: false,
            limits: StageLimits {
                wall_ms: test.wall_ms,
                idle_ms: None,
                cpu_ms: test.cpu_ms,
                output_bytes: test.output_bytes,
                ..self.stage.limits
            },
            ..self.stage.clone()
        };
        GvisorLimits::apply(self.gvisor, &mut stage.limits);
        HostMessage::Run(Box::new(RunSpec {
            stage,
            input: test.input.clone(),
            files: Vec::new(),
        }))
    }

    /// The frames that follow the bundle: every test and the end, or the
    /// first test only with `stop_on_failure`. In a sandbox that takes
    /// over after one died, the tests not judged yet.
    pub(super) fn first_frames(&mut self) -> Vec<HostMessage> {
        let from = self.results.len();
        let total = self.tests.tests.len();
        let upto = if self.tests.stop_on_failure {
            (from + 1).min(total)
        } else {
            total
        };
        let mut frames: Vec<HostMessage> = (from..upto).map(|i| self.run_frame(i)).collect();
        self.next_to_send = upto;
        if upto == self.tests.tests.len() {
            frames.push(HostMessage::RunsEnd);
        }
        frames
    }

    /// A client's kill: the test running is killed (the supervisor ends the
    /// runs), and the tests not run yet are skipped.
    pub(super) fn kill(&mut self) {
        self.killed = true;
        self.stopped = Some("not run: the job was killed (a kill signal)".to_string());
    }

    /// Notes that test `index` started now (its `stage_start` came).
    pub(super) fn note_start(&mut self, index: usize) {
        if index == self.starts.len() {
            self.starts.push(std::time::Instant::now());
        }
    }

    /// When test `index` started, in ms after the first test.
    fn started_ms(&self, index: usize) -> Option<u64> {
        let first = self.starts.first()?;
        let at = self.starts.get(index)?;
        Some(at.duration_since(*first).as_millis() as u64)
    }

    /// What each test asks back, and the job's room left for it.
    pub(super) fn outputs_request(&self) -> Option<(crate::protocol::OutputRequest, u64)> {
        let request = self.stage.outputs.clone()?;
        Some((
            request,
            crate::job::outputs::MAX_BYTES.saturating_sub(self.outputs_held),
        ))
    }

    /// Test `index`'s output files, once its result is in.
    pub(super) fn attach_outputs(
        &mut self,
        index: usize,
        outputs: Vec<crate::job::outputs::OutputEntry>,
        held: u64,
    ) {
        self.outputs_held = self.outputs_held.saturating_add(held);
        if let Some(result) = self.results.get_mut(index) {
            result.outputs = outputs;
        }
    }

    /// Whether tests remain to be run (and the grading did not stop).
    pub(super) fn has_more(&self) -> bool {
        self.stopped.is_none() && self.results.len() < self.tests.tests.len()
    }

    /// Test `index`'s name and output limit, when it is the test expected next.
    pub(super) fn starting(&self, index: usize) -> Option<(&str, u64)> {
        (index == self.results.len() && index < self.next_to_send)
            .then(|| self.tests.tests.get(index))
            .flatten()
            .map(|t| (t.name.as_str(), t.output_bytes))
    }

    /// Judges test `index` from its run; returns its result, the frames
    /// to send next (with `stop_on_failure`) and what interrupted it. A
    /// checker program is not waited for once `stop` resolves (the job was
    /// cancelled or killed meanwhile) or after a kill: the test is then
    /// `skipped`, not judged, with its run's figures.
    pub(super) async fn finish(
        &mut self,
        index: usize,
        run: &StageResult,
        stop: impl std::future::Future<Output = Interrupt>,
    ) -> (TestResult, Vec<HostMessage>, Option<Interrupt>) {
        let mut interrupted = None;
        let test = &self.tests.tests[index];
        let result = match &self.tests.check {
            PreparedCheck::Builtin(check) => TestResult::judged(
                index,
                &test.name,
                test.points,
                run,
                test.cpu_ms,
                test.expected.as_deref(),
                *check,
            ),
            PreparedCheck::Program(_) => {
                let mut result = TestResult::of_run(index, &test.name, test.points, run);
                match run_failure(run, test.cpu_ms) {
                    Some(failure) => result.fail(failure),
                    None if self.killed => {
                        result.reject(Verdict::Skipped, Some(NOT_JUDGED_KILLED.into()));
                    }
                    None => match &self.checker {
                        Some(checker) => {
                            let check = checker.check(
                                &test.input,
                                run.stdout.as_bytes(),
                                test.expected.as_deref().unwrap_or_default(),
                            );
                            tokio::select! {
                                biased;
                                why = stop => {
                                    result.reject(Verdict::Skipped, Some(why.not_judged().into()));
                                    interrupted = Some(why);
                                }
                                answer = check => judge_by_checker(&mut result, answer),
                            }
                        }
                        None => judge_by_checker(
                            &mut result,
                            Err("the checker's sandbox was not started".into()),
                        ),
                    },
                }
                result
            }
        };
        let mut result = result;
        if self.killed && run.reason == Reason::Killed {
            result.outcome.message = Some("killed on request (a kill signal)".into());
        }
        result.outcome.started_ms = self.started_ms(index);

        self.results.push(result.clone());
        let mut frames = Vec::new();
        if self.killed {
            frames.push(HostMessage::RunsEnd);
        } else if self.tests.stop_on_failure {
            if !result.passed() {
                self.stopped = Some(format!(
                    "not run: test {} was not accepted (stop_on_failure)",
                    test.name
                ));
                frames.push(HostMessage::RunsEnd);
            } else if self.next_to_send < self.tests.tests.len() {
                frames.push(self.run_frame(self.next_to_send));
                self.next_to_send += 1;
            } else {
                frames.push(HostMessage::RunsEnd);
            }
        }
        (result, frames, interrupted)
    }

    /// The test that was running when the sandbox stopped reporting.
    pub(super) fn unreported(&mut self, index: usize, run: &StageResult) -> Option<TestResult> {
        if index == self.results.len() && index < self.tests.tests.len() {
            let test = &self.tests.tests[index];
            let mut result = TestResult::of_run(index, &test.name, test.points, run);
            if let Some(failure) = run_failure(run, test.cpu_ms) {
                result.fail(failure);
            } else {
                result.reject(
                    Verdict::RuntimeError,
                    Some("the sandbox stopped during this test".into()),
                );
            }
            if self.tests.stop_on_failure {
                self.stopped = Some(format!(
                    "not run: test {} was not accepted (stop_on_failure)",
                    test.name
                ));
            }
            result.outcome.started_ms = self.started_ms(index);
            self.results.push(result.clone());
            return Some(result);
        }
        None
    }

    /// The job's grading: every test, those not run skipped with why.
    pub(super) fn into_grading(mut self, compile_failed: bool, ended: Option<&str>) -> Grading {
        let why = if compile_failed {
            "not run: the compile stage failed".to_string()
        } else if let Some(stopped) = self.stopped.take() {
            stopped
        } else {
            format!("not run: {}", ended.unwrap_or("the job ended first"))
        };
        for index in self.results.len()..self.tests.tests.len() {
            let test = &self.tests.tests[index];
            self.results
                .push(TestResult::skipped(index, &test.name, test.points, &why));
        }
        Grading {
            checker: self.checker.as_ref().map(Checker::usage),
            restarts: self.restarts,
            ..Grading::of(self.results, compile_failed)
        }
    }
}

/// A checker's answer as the test's verdict (docs/grading.md, "Checker
/// programs"): 0 accepted, 1 and 2 wrong answer, 7 a share of the points
/// (the first number it writes, from 0 to 1), 3 or anything else a checker
/// error. Its first line of stdout (else stderr) is the message.
fn judge_by_checker(result: &mut TestResult, answer: Result<CheckAnswer, String>) {
    let answer = match answer {
        Ok(answer) => answer,
        Err(why) => {
            result.reject(Verdict::CheckerError, Some(why));
            return;
        }
    };
    let said = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(|l| preview(l.as_bytes(), MESSAGE_CHARS))
    };
    let message = said(&answer.stdout).or_else(|| said(&answer.stderr));
    if answer.reason != Reason::Exited {
        result.reject(
            Verdict::CheckerError,
            Some(format!(
                "the checker did not finish: {}",
                answer.reason.as_str()
            )),
        );
        return;
    }
    if let Some(signal) = answer.signal {
        result.reject(
            Verdict::CheckerError,
            Some(format!("the checker was killed by {}", signal_name(signal))),
        );
        return;
    }
    match answer.exit_code {
        Some(0) => result.accept(1.0, message),
        Some(1) => result.reject(Verdict::WrongAnswer, message),
        Some(2) => result.reject(
            Verdict::WrongAnswer,
            Some(format!(
                "presentation error{}",
                message.map(|m| format!(": {m}")).unwrap_or_default()
            )),
        ),
        Some(7) => {
            let share = message.as_deref().and_then(|m| {
                m.trim_start_matches("points")
                    .split_whitespace()
                    .next()?
                    .parse::<f64>()
                    .ok()
            });
            match share {
                Some(1.0) => result.accept(1.0, message),
                Some(share) if (0.0..1.0).contains(&share) => {
                    result.reject(Verdict::WrongAnswer, message);
                    result.outcome.score = result.outcome.points * share;
                }
                _ => result.reject(
                    Verdict::CheckerError,
                    Some(format!(
                        "the checker exited 7 (partial) without a share from 0 to 1 first in its output{}",
                        message.map(|m| format!(": {m}")).unwrap_or_default()
                    )),
                ),
            }
        }
        Some(3) => result.reject(
            Verdict::CheckerError,
            Some(format!(
                "the checker failed{}",
                message.map(|m| format!(": {m}")).unwrap_or_default()
            )),
        ),
        code => result.reject(
            Verdict::CheckerError,
            Some(format!(
                "the checker exited with code {} (not 0, 1, 2, 3 or 7){}",
                code.map_or("?".to_string(), |c| c.to_string()),
                message.map(|m| format!(": {m}")).unwrap_or_default()
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran() -> TestResult {
        TestResult::of_run(0, "1", 4.0, &StageResult::exited_with(b"42\n"))
    }

    fn answer(exit_code: Option<i32>, stdout: &str) -> Result<CheckAnswer, String> {
        Ok(CheckAnswer {
            exit_code,
            signal: None,
            reason: Reason::Exited,
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
        })
    }

    fn judged(answer: Result<CheckAnswer, String>) -> (Verdict, f64, Option<String>) {
        let mut result = ran();
        judge_by_checker(&mut result, answer);
        (
            result.verdict(),
            result.outcome.score,
            result.outcome.message,
        )
    }

    #[test]
    fn a_checkers_exit_code_is_the_verdict() {
        assert_eq!(
            judged(answer(Some(0), "ok\n")),
            (Verdict::Accepted, 4.0, Some("ok".into()))
        );
        assert_eq!(
            judged(answer(Some(1), "expected 3, got 4")).0,
            Verdict::WrongAnswer
        );
        assert_eq!(
            judged(answer(Some(2), "")),
            (Verdict::WrongAnswer, 0.0, Some("presentation error".into()))
        );
        assert_eq!(
            judged(answer(Some(7), "0.25 one of four")),
            (Verdict::WrongAnswer, 1.0, Some("0.25 one of four".into()))
        );
        assert_eq!(judged(answer(Some(7), "points 1")).0, Verdict::Accepted);
        assert_eq!(judged(answer(Some(7), "1.5")).0, Verdict::CheckerError);
        assert_eq!(judged(answer(Some(7), "half")).0, Verdict::CheckerError);
        assert_eq!(
            judged(answer(Some(3), "bad answer file")).0,
            Verdict::CheckerError
        );
        assert_eq!(judged(answer(Some(139), "")).0, Verdict::CheckerError);
        let crashed = Ok(CheckAnswer {
            exit_code: None,
            signal: Some(11),
            reason: Reason::Exited,
            stdout: Vec::new(),
            stderr: Vec::new(),
        });
        assert_eq!(judged(crashed).0, Verdict::CheckerError);
        assert_eq!(
            judged(Err("gone".into())),
            (Verdict::CheckerError, 0.0, Some("gone".into()))
        );
    }

    #[test]
    fn test_stage_names_round_trip() {
        assert_eq!(test_index(&stage_name(17)), Some(17));
        assert_eq!(test_index("run"), None);
        assert_eq!(test_index("test:x"), None);
    }
}
