//! `code-runner bench`: a load generator a user points at their own server
//! (or, with `--engine`, at the sandbox engine alone) to measure submit →
//! first output, submit → result, jobs/s, the warm/cold split and, with
//! `--interactive`, the stdin → stdout round trip.
//!
//! - [`load`]: the lanes that submit and follow the jobs, one path each for
//!   the WebSocket, `?wait=true` and the engine; reuses the `run` command's
//!   HTTP client and WebSocket follower.
//! - [`fairness`](mod@fairness): `--scenario fairness`, one key's backlog against another
//!   key's job and a second user's.
//! - [`grading`](mod@grading): `--scenario grading`, one job with many tests against as
//!   many separate jobs.
//! - [`jobe`](mod@jobe): `--scenario jobe`, CodeRunner's bursts on the Jobe API.
//! - [`exam`](mod@exam): `--exam N`, N students answering questions at once, each
//!   typing when its program says `input_wanted`.
//! - [`echo`]: the interactive round trip, as pure state.
//! - [`stats`]: nearest-rank percentiles.
//! - [`report`]: the progress line, the text report and `--json`.
//! - [`programs`]: the built-in hello world and echo program per language.
//!
//! `bench` measures only through what a user has, the public HTTP API or
//! `SandboxEngine::run`, and names no Redis key; the warm/cold split is read
//! from each result's `start`.
//!
//! Exit codes: 0 when every job succeeded (and every line came back), 1 when
//! the run completed but some did not (the report says which and why), 130
//! after Ctrl-C (the report covers the jobs that ran), 64 for bad flags, a
//! refused key or a job the API rejects, 69 when Docker (`--engine`) cannot
//! be reached.

mod class;
mod echo;
mod exam;
mod fairness;
mod grading;
mod jobe;
mod load;
mod programs;
mod report;
mod stats;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;

use crate::client::{ApiTarget, ClientError, language_for, read_source};
use crate::config::SandboxSettings;
use crate::exit;
use crate::job::{Encoding, FileSpec, JobSpec, prepare};
use crate::languages::LanguageCatalog;
use crate::sandbox::DockerEngine;
use load::{Plan, Target};
use report::{Progress, Report, Setup};

/// Exit code of a run in which some job did not succeed.
const SOME_JOBS_DID_NOT_SUCCEED: u8 = 1;
/// Longest a single request may take (a `?wait=true` lasts as long as its job).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// How submit → result is measured through the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Via {
    /// `POST /v1/jobs`, then the job's WebSocket: the first `stdout` event is
    /// the first output, the `exit` event the result.
    Ws,
    /// One `POST /v1/jobs?wait=true`: its answer is the result (no
    /// first-output figure).
    Wait,
}

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::Ws => "ws",
            Via::Wait => "wait",
        }
    }
}

/// What a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// The jobs in lanes (--jobs, --concurrency, --via, …): submit → first
    /// output, submit → result, jobs/s.
    Load,
    /// Fair turns: key A queues a backlog (--backlog jobs of --job-ms), once
    /// alone and once while key B (--other-key) and a second user of key A
    /// submit one job each; their queue wait and the backlog's drain rate.
    Fairness,
    /// Grading: a C++ solution graded on --tests tests in one job against
    /// the same count of separate jobs, --rounds times; the time of each and
    /// the overhead per test.
    Grading,
    /// A class graded at once by one C++ checker: --jobs graded python
    /// sums of --tests tests each, sent together, --rounds times (a new
    /// checker each round); each round's time and the checker compiles.
    Class,
    /// Moodle CodeRunner's load on the Jobe API: --jobs runs at once (with
    /// --ladder, bursts doubling up to it); --language is a Jobe id.
    Jobe,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub api: ApiTarget,
    /// What to measure: `load` (the flags below) or `fairness` (key A's
    /// backlog against key B's job; takes --other-key, --backlog, --job-ms
    /// and --late-ms, and only --url, --key and --json of the rest).
    #[arg(long, value_enum, default_value_t = Scenario::Load)]
    pub scenario: Scenario,
    /// --scenario grading: how many tests the graded job has (and how many
    /// separate jobs it is measured against).
    #[arg(long, default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(2..=500))]
    pub tests: u32,
    /// --scenario jobe: bursts of 1, 2, 4, … up to --jobs.
    #[arg(long)]
    pub ladder: bool,
    /// --scenario grading: how many times each way runs.
    #[arg(long, default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// N students press Run at once, each an interactive program that asks
    /// a name and --questions questions: each student waits for the
    /// program's `input_wanted`, types after --think-ms, reads the answer.
    /// Reports first output, input prompt and answer latencies and the
    /// refusals (takes only --url, --key, --json, --questions, --think-ms).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub exam: Option<u32>,
    /// --exam: questions per student (after its name).
    #[arg(long, default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub questions: u32,
    /// --exam: how long a student thinks before typing, in ms (each time
    /// ±50 %, spread over the students).
    #[arg(long, default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub think_ms: u64,
    /// --scenario fairness: key B, a second API key of the same server.
    #[arg(long, env = "CODE_RUNNER_BENCH_OTHER_KEY", hide_env_values = true)]
    pub other_key: Option<String>,
    /// --scenario fairness: the jobs of key A's backlog (the key must be
    /// allowed that many queued jobs, its max_active).
    #[arg(long, default_value_t = 120,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub backlog: u32,
    /// --scenario fairness: how long each job runs (python time.sleep), in ms.
    #[arg(long, default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub job_ms: u64,
    /// --scenario fairness: how long after the backlog is queued key B and
    /// the second user submit, in ms.
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub late_ms: u64,
    /// Run the jobs straight through the sandbox engine in this process: no
    /// Redis, no API (the sandbox settings below apply only then).
    #[arg(long)]
    pub engine: bool,
    /// How submit → result is measured through the API: `ws` (POST /v1/jobs,
    /// then the job's WebSocket) or `wait` (one POST /v1/jobs?wait=true).
    #[arg(long, value_enum, default_value_t = Via::Ws)]
    pub via: Via,
    /// Language id or alias (default: python, or the program's extension).
    #[arg(short, long)]
    pub language: Option<String>,
    /// The program to run (default: a built-in hello world printing 42, or
    /// with --interactive an echo program).
    #[arg(long)]
    pub program: Option<PathBuf>,
    /// How many jobs to run.
    #[arg(short = 'n', long, default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub jobs: u32,
    /// How many jobs are in flight at once.
    #[arg(short, long, default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Each lane waits this long after a job before it submits the next one
    /// (people pressing Run, not a tight loop); jobs/s counts the pauses.
    #[arg(long, default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub pause_ms: u64,
    /// Interactive jobs: time the stdin → stdout round trip (over the
    /// WebSocket; with --engine, in the engine). The program must print a
    /// line when it is ready, then write back each line it reads.
    #[arg(short, long)]
    pub interactive: bool,
    /// Round trips per interactive job.
    #[arg(long, default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub round_trips: u32,
    /// Write the report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sandbox: SandboxSettings,
}

impl BenchArgs {
    /// The first flag given that only the load scenario takes (the others
    /// run programs of their own, through the API).
    fn load_only_flag(&self) -> Option<&'static str> {
        [
            (self.engine, "--engine"),
            (self.interactive, "--interactive"),
            (self.via == Via::Wait, "--via wait"),
            (self.program.is_some(), "--program"),
            (self.language.is_some(), "--language"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    eprintln!("code-runner: {message}");
    code
}

/// The job every run of the benchmark submits, and how to name its program.
fn job_spec(args: &BenchArgs, catalog: &LanguageCatalog) -> Result<(JobSpec, String), String> {
    let (language, file, program) = match &args.program {
        Some(path) => {
            let file = read_source(path)?;
            let language = language_for(catalog, args.language.as_deref(), &file.name)?;
            (language, file, path.display().to_string())
        }
        None => {
            let asked = args.language.as_deref().unwrap_or("python");
            let language = catalog.find(asked).ok_or_else(|| {
                format!(
                    "unknown language {asked:?} (known: {})",
                    catalog.ids().join(", ")
                )
            })?;
            let source = programs::built_in(&language.id, args.interactive).ok_or_else(|| {
                format!(
                    "there is no built-in program for {} (there is for {}); pass --program FILE",
                    language.id,
                    programs::languages().join(", ")
                )
            })?;
            let file = FileSpec {
                name: language.source_file.clone(),
                content: source.to_string(),
                encoding: Encoding::Utf8,
                reference: None,
            };
            let what = if args.interactive {
                "built-in echo"
            } else {
                "built-in hello world"
            };
            (language.id.clone(), file, what.to_string())
        }
    };
    let spec = JobSpec {
        language,
        files: vec![file],
        interactive: args.interactive,
        ..Default::default()
    };
    Ok((spec, program))
}

pub async fn run(args: BenchArgs) -> u8 {
    if let Some(students) = args.exam {
        return exam(&args, students).await;
    }
    if args.scenario == Scenario::Fairness {
        return fairness(&args).await;
    }
    if args.scenario == Scenario::Grading {
        return grading(&args).await;
    }
    if args.scenario == Scenario::Class {
        return class(&args).await;
    }
    if args.scenario == Scenario::Jobe {
        return jobe::bench(&args).await;
    }
    if args.engine && args.via == Via::Wait {
        return fail(
            exit::USAGE,
            "--via wait measures through the API; it does not go with --engine",
        );
    }
    if args.interactive && args.via == Via::Wait {
        return fail(
            exit::USAGE,
            "--interactive sends stdin over the WebSocket; it needs --via ws",
        );
    }
    let plan = Plan {
        jobs: args.jobs,
        concurrency: args.concurrency,
        round_trips: args.interactive.then_some(args.round_trips),
        pause: std::time::Duration::from_millis(args.pause_ms),
    };
    if args.engine {
        on_engine(&args, plan).await
    } else {
        through_api(&args, plan).await
    }
}

/// Prints a scenario's report: as JSON with `--json`, else its text.
fn print_report<T: serde::Serialize>(
    json: bool,
    report: &T,
    text: impl FnOnce() -> String,
) -> Result<(), u8> {
    if json {
        match serde_json::to_string_pretty(report) {
            Ok(text) => println!("{text}"),
            Err(error) => return Err(fail(exit::PLATFORM_ERROR, error)),
        }
    } else {
        print!("{}", text());
    }
    Ok(())
}

/// The report of a scenario other than `load`.
trait ScenarioReport: serde::Serialize {
    fn text(&self) -> String;
    /// Every job of the scenario went as it should.
    fn succeeded(&self) -> bool;
}

impl ScenarioReport for exam::Report {
    fn text(&self) -> String {
        exam::Report::text(self)
    }
    fn succeeded(&self) -> bool {
        exam::Report::succeeded(self)
    }
}

impl ScenarioReport for class::Report {
    fn text(&self) -> String {
        class::Report::text(self)
    }
    fn succeeded(&self) -> bool {
        class::Report::succeeded(self)
    }
}

impl ScenarioReport for grading::Report {
    fn text(&self) -> String {
        grading::Report::text(self)
    }
    fn succeeded(&self) -> bool {
        grading::Report::succeeded(self)
    }
}

impl ScenarioReport for fairness::FairnessReport {
    fn text(&self) -> String {
        fairness::FairnessReport::text(self)
    }
    fn succeeded(&self) -> bool {
        self.all_succeeded()
    }
}

/// Why a scenario stopped without a report, and the exit code for it.
trait ScenarioError: std::fmt::Display {
    fn exit_code(&self) -> u8;
}

impl ScenarioError for ClientError {
    fn exit_code(&self) -> u8 {
        ClientError::exit_code(self)
    }
}

impl ScenarioError for fairness::Stopped {
    fn exit_code(&self) -> u8 {
        fairness::Stopped::exit_code(self)
    }
}

/// Prints a scenario's report (or its error) and says how it went: 0, or
/// exit 1 with `failed` when some job did not go as it should.
fn conclude<R: ScenarioReport>(json: bool, ran: Result<R, impl ScenarioError>, failed: &str) -> u8 {
    let report = match ran {
        Ok(report) => report,
        Err(error) => return fail(error.exit_code(), error),
    };
    if let Err(code) = print_report(json, &report, || report.text()) {
        return code;
    }
    if report.succeeded() {
        0
    } else {
        fail(SOME_JOBS_DID_NOT_SUCCEED, failed)
    }
}

/// `--exam N`: through the API, then the report.
async fn exam(args: &BenchArgs, students: u32) -> u8 {
    let scenario = (args.scenario != Scenario::Load).then_some("--scenario");
    if let Some(flag) = args.load_only_flag().or(scenario) {
        return fail(
            exit::USAGE,
            format!(
                "{flag} does not go with --exam (its students run a built-in python program over the WebSocket)"
            ),
        );
    }
    let api = match args.api.api(REQUEST_TIMEOUT) {
        Ok(api) => api,
        Err(error) => return fail(error.exit_code(), error),
    };
    let plan = exam::Plan {
        students,
        questions: args.questions,
        think: Duration::from_millis(args.think_ms),
    };
    conclude(
        args.json,
        exam::run(&api, plan).await,
        "some students of the exam did not go through (see the report)",
    )
}

/// `--scenario grading`: through the API, then the report.
async fn grading(args: &BenchArgs) -> u8 {
    if args.engine {
        return fail(
            exit::USAGE,
            "--scenario grading measures through the API; it does not go with --engine",
        );
    }
    let api = match args.api.api(REQUEST_TIMEOUT) {
        Ok(api) => api,
        Err(error) => return fail(error.exit_code(), error),
    };
    let plan = grading::Plan {
        tests: args.tests,
        rounds: args.rounds,
    };
    conclude(
        args.json,
        grading::run(&api, plan).await,
        "some jobs of the grading scenario did not succeed (see the report)",
    )
}

/// `--scenario class`: through the API, then the report.
async fn class(args: &BenchArgs) -> u8 {
    if let Some(flag) = args.load_only_flag() {
        return fail(
            exit::USAGE,
            format!("{flag} does not go with --scenario class (its jobs are graded python sums)"),
        );
    }
    let api = match args.api.api(REQUEST_TIMEOUT) {
        Ok(api) => api,
        Err(error) => return fail(error.exit_code(), error),
    };
    let plan = class::Plan {
        jobs: args.jobs,
        tests: args.tests,
        rounds: args.rounds,
    };
    conclude(
        args.json,
        class::run(&api, plan).await,
        "some jobs of the class scenario were not judged as they should be (see the report)",
    )
}

/// `--scenario fairness`: both phases through the API, then the report.
async fn fairness(args: &BenchArgs) -> u8 {
    if let Some(flag) = args.load_only_flag() {
        return fail(
            exit::USAGE,
            format!("{flag} does not go with --scenario fairness (its jobs are python sleeps)"),
        );
    }
    let Some(other_key) = args.other_key.clone().filter(|k| !k.is_empty()) else {
        return fail(
            exit::USAGE,
            "--scenario fairness needs --other-key: a second API key of the server (key B)",
        );
    };
    if args.api.api_key.as_deref() == Some(other_key.as_str()) {
        return fail(
            exit::USAGE,
            "--other-key is the key of --key; the fair turns are between two keys",
        );
    }
    let other = ApiTarget {
        url: args.api.url.clone(),
        api_key: Some(other_key),
    };
    let (a, b) = match (args.api.api(REQUEST_TIMEOUT), other.api(REQUEST_TIMEOUT)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(error), _) | (_, Err(error)) => return fail(error.exit_code(), error),
    };
    let plan = fairness::Plan {
        backlog: args.backlog,
        job_ms: args.job_ms,
        late: Duration::from_millis(args.late_ms),
    };
    let stop = CancellationToken::new();
    let on_ctrl_c = {
        let stop = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.cancel();
            }
        })
    };
    let ran = fairness::run(&a, &b, plan, &stop).await;
    on_ctrl_c.abort();
    conclude(
        args.json,
        ran,
        "some jobs of the fairness scenario did not succeed (see the report)",
    )
}

async fn through_api(args: &BenchArgs, plan: Plan) -> u8 {
    let api = match args.api.api(REQUEST_TIMEOUT) {
        Ok(api) => api,
        Err(error) => return fail(error.exit_code(), error),
    };
    // As `run` does: the catalog built into this binary guesses the language
    // of a file; the server decides whether it offers it.
    let catalog = match LanguageCatalog::embedded() {
        Ok(catalog) => catalog,
        Err(error) => return fail(exit::PLATFORM_ERROR, error),
    };
    let (spec, program) = match job_spec(args, &catalog) {
        Ok(job) => job,
        Err(message) => return fail(exit::USAGE, message),
    };
    let body = match serde_json::to_vec(&spec) {
        Ok(body) => body,
        Err(error) => return fail(exit::PLATFORM_ERROR, error),
    };
    let setup = Setup {
        target: "api",
        via: Some(args.via.name()),
        url: Some(api.base.clone()),
        runtime: None,
        language: spec.language.clone(),
        program,
        interactive: args.interactive,
        concurrency: plan.concurrency.min(plan.jobs),
        pause_ms: args.pause_ms,
        round_trips: plan.round_trips,
        load_before: report::load_average(),
    };
    let target = Target::Api {
        api: &api,
        body: &body,
        wait: args.via == Via::Wait,
    };
    measure(&target, plan, setup, args.json).await
}

async fn on_engine(args: &BenchArgs, plan: Plan) -> u8 {
    // A CLI's worker id, as `sandbox run` has: its containers are labelled
    // with it and removed after each job.
    let worker_id = format!("cli-{}", uuid::Uuid::new_v4());
    let setup = match args.sandbox.build(&worker_id) {
        Ok(setup) => setup,
        Err(error) => return fail(exit::USAGE, error),
    };
    let (spec, program) = match job_spec(args, &setup.catalog) {
        Ok(job) => job,
        Err(message) => return fail(exit::USAGE, message),
    };
    let job = match prepare(&spec, &setup.catalog, &setup.policy) {
        Ok(job) => job,
        Err(error) => return fail(exit::USAGE, format!("invalid job: {error}")),
    };
    let runtime = setup
        .sandbox
        .runtime
        .clone()
        .unwrap_or_else(|| "runc".to_string());
    let engine = match DockerEngine::connect(setup.sandbox).await {
        Ok(engine) => engine,
        Err(error) => return fail(exit::UNAVAILABLE, error),
    };
    let report_setup = Setup {
        target: "engine",
        via: None,
        url: None,
        runtime: Some(runtime),
        language: job.language.id.clone(),
        program,
        interactive: args.interactive,
        concurrency: plan.concurrency.min(plan.jobs),
        pause_ms: args.pause_ms,
        round_trips: plan.round_trips,
        load_before: report::load_average(),
    };
    let target = Target::Engine {
        engine: &engine,
        job: &job,
    };
    measure(&target, plan, report_setup, args.json).await
}

/// Runs the plan, prints the report, and says how it went.
async fn measure(target: &Target<'_>, plan: Plan, setup: Setup, json: bool) -> u8 {
    let progress = Progress::new(plan.jobs);
    // Ctrl-C stops the run: no new job starts, the report covers the jobs
    // that ran. A second Ctrl-C ends it without a report.
    let stop = CancellationToken::new();
    let first = {
        let stop = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.cancel();
            }
        })
    };
    let second = async {
        stop.cancelled().await;
        let _ = tokio::signal::ctrl_c().await;
    };
    let run = tokio::select! {
        run = load::run(target, plan, &progress, &stop) => run,
        () = second => return fail(exit::CANCELLED, "interrupted twice; stopped without a report"),
    };
    first.abort();
    if let Some(error) = run.aborted {
        return fail(
            error.exit_code(),
            format!("{error}; stopped after {} jobs", run.samples.len()),
        );
    }
    let interrupted = stop.is_cancelled();
    let report = Report::new(
        setup,
        &run.samples,
        run.started,
        interrupted.then_some(plan.jobs),
    );
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(error) => return fail(exit::PLATFORM_ERROR, error),
        }
    } else {
        print!("{}", report.text());
    }
    if interrupted {
        return fail(
            exit::CANCELLED,
            format!(
                "interrupted after {} of {} jobs",
                report.counts.submitted, plan.jobs
            ),
        );
    }
    if report.all_succeeded() {
        return 0;
    }
    let c = &report.counts;
    let lost = report
        .round_trips
        .as_ref()
        .map_or(0, |r| r.sent.saturating_sub(r.echoed));
    fail(
        SOME_JOBS_DID_NOT_SUCCEED,
        format!(
            "{} of {} jobs did not succeed ({} failed, {} errors); {lost} lines not echoed",
            c.submitted - c.succeeded,
            c.submitted,
            c.failed,
            c.errors
        ),
    )
}
