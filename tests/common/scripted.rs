//! A scripted sandbox engine: runs a job's program as a script of steps in
//! this process, with no dockerd. The tests of the worker, the reaper, the
//! API and the store run the product's code against it
//! ([`SandboxEngine`] is the seam); what a real sandbox does is tested
//! against the Docker engine elsewhere.
//!
//! # The program
//!
//! The job's first file is the script, one step per line (blank lines and
//! lines starting with `#` are skipped). Text arguments take the escapes
//! `\n`, `\t`, `\\` and `\xNN`; inside a `repeat` block `{i}` is the
//! iteration, from 0.
//!
//! | step | what it does |
//! |---|---|
//! | `print TEXT` / `write TEXT` | TEXT and a newline / TEXT alone to stdout |
//! | `eprint TEXT` / `ewrite TEXT` | the same to stderr |
//! | `flood N` | N bytes of `y` to stdout, in chunks of 4 KiB |
//! | `sleep MS` | waits MS milliseconds |
//! | `readline [upper] [PREFIX]` | reads a line of stdin (says `input_wanted` when none is buffered) and prints PREFIX and the line (upper-cased with `upper`); at EOF, ends with exit 1 and `EOFError` on stderr |
//! | `read` | reads a line of stdin as `readline` does, and prints nothing |
//! | `echo` | copies stdin to stdout until it is closed |
//! | `ignore SIGINT` | a client's interrupt no longer ends the program |
//! | `trap SIGINT TEXT` | a client's interrupt prints TEXT and a newline to stdout instead of ending the program |
//! | `repeat N` … `end`, `forever` … `end` | a block N times, or until the program is ended |
//! | `exit CODE` | ends with CODE (the script's end is exit 0) |
//! | `die SIGNAME` | ends by that signal (e.g. `SIGSEGV`) |
//! | `oom` / `cpu-limit` | ends as the memory limit / the CPU limit would end it |
//! | `usage CPU_MS MEMORY_BYTES` | the figures the stage reports (default 1 ms, 1 MiB) |
//! | `crash` | the sandbox dies without reporting (a platform error) |
//! | `stuck` | never ends, whatever comes, until the job's future is dropped |
//! | `compile-error TEXT` | a compiled language's compile stage fails with TEXT on stderr |
//!
//! A line the engine does not know fails the run stage at once (exit 2,
//! `scripted: line N: …` on stderr), so a mistyped script never passes
//! for a program.
//!
//! # What the engine does as a sandbox would
//!
//! Each stage runs under its wall limit (`wall_timeout`, SIGKILL), its idle
//! limit (`idle_timeout`), its output limit (`output_limit`, `truncated`)
//! and the job's stored deadline; a cancel kills it (`cancelled`), a
//! client's kill too (`killed`), an interrupt ends it by SIGINT. Events go to
//! [`JobIo::events`] as the Docker engine sends them. Every run is a
//! sandbox of the [`ScriptedHost`] (labelled as Docker's containers are:
//! job, worker, created, deadline) until its [`Cleanup`] removes it; a
//! dropped run removes it too, unless the engine [`ScriptedEngine::crash`]ed
//! (a killed worker process leaves its containers behind).
//! [`ScriptedHost::running`] counts the runs whose program runs now (a
//! sandbox holding a job, as against one waiting to be removed).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use code_runner::job::deadline::{Budget, now_ms};
use code_runner::job::{
    Encoding, FileSpec, JobResult, JobSpec, Output, PreparedJob, StageResult, StartKind, Status,
    Timings,
};
use code_runner::protocol::{Reason, SignalKind, StageSpec};
use code_runner::sandbox::{
    Cleanup, JobInput, JobIo, RunOutcome, SandboxContainer, SandboxEngine, SandboxError,
    SandboxEvent, Teardown, WarmSandbox, container_name,
};
use tokio::sync::mpsc;

/// A job of one python file whose content is `script` (the language only
/// names an image the catalog has: the script is what runs).
pub fn job(script: &str) -> JobSpec {
    JobSpec {
        language: "python".to_string(),
        files: vec![FileSpec {
            name: "main.py".to_string(),
            content: script.to_string(),
            encoding: Encoding::Utf8,
        }],
        ..Default::default()
    }
}

/// [`job`] as the JSON body a client submits.
pub fn json(script: &str) -> serde_json::Value {
    serde_json::json!({
        "language": "python",
        "files": [{"name": "main.py", "content": script}],
    })
}

/// The host every engine of a test shares: its sandboxes, as Docker's
/// containers on one machine are shared by the workers on it.
#[derive(Debug)]
pub struct ScriptedHost {
    id: String,
    sandboxes: Mutex<BTreeMap<String, SandboxContainer>>,
    down: AtomicBool,
    missing_images: Mutex<Vec<String>>,
    runs: AtomicU64,
    running: AtomicU64,
}

impl ScriptedHost {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            id: format!("scripted-{}", uuid::Uuid::new_v4().simple()),
            sandboxes: Mutex::default(),
            down: AtomicBool::new(false),
            missing_images: Mutex::default(),
            runs: AtomicU64::new(0),
            running: AtomicU64::new(0),
        })
    }

    /// An engine of this host for the worker `worker_id`.
    pub fn engine(self: &Arc<Self>, worker_id: &str) -> ScriptedEngine {
        ScriptedEngine {
            host: Arc::clone(self),
            worker_id: worker_id.to_string(),
            budget: Budget::default(),
            answered_ms: Arc::new(AtomicU64::new(now_ms())),
            crashed: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The sandboxes that exist now.
    pub fn sandboxes(&self) -> Vec<SandboxContainer> {
        self.lock().values().cloned().collect()
    }

    /// The sandboxes of `worker`.
    pub fn sandboxes_of(&self, worker: &str) -> Vec<SandboxContainer> {
        self.lock()
            .values()
            .filter(|c| c.worker == worker)
            .cloned()
            .collect()
    }

    /// Leaves a sandbox on the host, as a process that died would have.
    pub fn plant(&self, container: SandboxContainer) {
        self.lock().insert(container.id.clone(), container);
    }

    /// A sandbox of `worker` for `job` with the given deadline, as a dead
    /// worker's would be; returns its id.
    pub fn plant_for(&self, worker: &str, job: Option<&str>, deadline_ms: Option<u64>) -> String {
        let id = container_name(job.unwrap_or("hand-made"));
        self.plant(SandboxContainer {
            id: id.clone(),
            job: job.map(str::to_string),
            worker: worker.to_string(),
            created_ms: now_ms(),
            deadline_ms,
            uid: None,
            warm: false,
            removing: false,
        });
        id
    }

    /// While down, every call of the host's engines fails, as Docker's do
    /// when dockerd is stopped.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// Images the host does not have (the readiness check names them).
    pub fn set_missing_images(&self, images: &[&str]) {
        *self
            .missing_images
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            images.iter().map(|i| i.to_string()).collect();
    }

    /// How many runs the host's engines started.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }

    /// How many runs are running their stages now: started, and not yet
    /// ended (their sandboxes may stay a moment longer, until removed).
    pub fn running(&self) -> u64 {
        self.running.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SandboxContainer>> {
        self.sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn remove(&self, id: &str) -> bool {
        self.lock().remove(id).is_some()
    }

    fn down_error(&self, what: &str) -> SandboxError {
        SandboxError::Engine {
            what: what.to_string(),
            message: format!("the scripted host {} is down", self.id),
        }
    }
}

/// One worker's engine on a [`ScriptedHost`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ScriptedEngine {
    host: Arc<ScriptedHost>,
    worker_id: String,
    budget: Budget,
    answered_ms: Arc<AtomicU64>,
    crashed: Arc<AtomicBool>,
}

impl ScriptedEngine {
    pub fn host(&self) -> &Arc<ScriptedHost> {
        &self.host
    }

    /// The same engine with another budget (start timeout and grace).
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// From now on, runs that end or are dropped leave their sandboxes on
    /// the host, as a worker process killed with SIGKILL does.
    pub fn crash(&self) {
        self.crashed.store(true, Ordering::SeqCst);
    }

    fn answered(&self) {
        self.answered_ms.store(now_ms(), Ordering::Relaxed);
    }
}

#[async_trait]
impl SandboxEngine for ScriptedEngine {
    fn host_id(&self) -> &str {
        &self.host.id
    }

    fn budget(&self) -> Budget {
        self.budget
    }

    fn answered_within(&self, within: Duration) -> bool {
        let last = self.answered_ms.load(Ordering::Relaxed);
        now_ms().saturating_sub(last) <= within.as_millis() as u64
    }

    fn note_unanswered(&self) {
        self.answered_ms.store(0, Ordering::Relaxed);
    }

    async fn readiness(&self, images: &[String], _timeout: Duration) -> Vec<(String, String)> {
        if self.host.is_down() {
            self.note_unanswered();
            return vec![(
                "docker".to_string(),
                format!("the scripted host {} is down", self.host.id),
            )];
        }
        self.answered();
        let missing = self
            .host
            .missing_images
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        images
            .iter()
            .filter(|image| missing.contains(image))
            .map(|image| (format!("image {image}"), format!("no such image: {image}")))
            .collect()
    }

    async fn list_sandboxes(&self) -> Result<Vec<SandboxContainer>, SandboxError> {
        if self.host.is_down() {
            return Err(self.host.down_error("could not list its sandboxes"));
        }
        self.answered();
        Ok(self.host.sandboxes())
    }

    async fn remove_sandbox(&self, id: &str) -> Result<(), SandboxError> {
        if self.host.is_down() {
            return Err(self.host.down_error(&format!("could not remove {id}")));
        }
        self.host.remove(id);
        Ok(())
    }

    async fn run_job(
        &self,
        job_id: &str,
        job: &PreparedJob,
        io: JobIo,
        warm: Option<WarmSandbox>,
    ) -> RunOutcome {
        assert!(warm.is_none(), "the scripted engine keeps no warm pool");
        let started = Instant::now();
        let name = container_name(job_id);
        if self.host.is_down() {
            self.note_unanswered();
            let error = format!(
                "the sandbox did not start: the scripted host {} is down",
                self.host.id
            );
            return RunOutcome {
                result: ended(job, Status::Error, None, None, started, 0).with_error(error),
                cleanup: Cleanup::nothing(),
                container: name,
            };
        }
        self.answered();
        self.host.runs.fetch_add(1, Ordering::SeqCst);
        let _running = RunningGuard::new(&self.host.running);
        let walls = Duration::from_millis(job.stages_wall_ms());
        let deadline_ms = io
            .deadline_ms
            .unwrap_or_else(|| self.budget.deadline_ms(now_ms(), walls));
        self.host.plant(SandboxContainer {
            id: name.clone(),
            job: Some(job_id.to_string()),
            worker: self.worker_id.clone(),
            created_ms: now_ms(),
            deadline_ms: Some(deadline_ms),
            uid: None,
            warm: false,
            removing: false,
        });
        let teardown = ScriptedTeardown {
            host: Arc::clone(&self.host),
            id: name.clone(),
            crashed: Arc::clone(&self.crashed),
            removed: false,
        };
        let container_start_ms = (started.elapsed().as_millis() as u64).max(1);
        let mut run = Run::new(job, io, deadline_ms);
        run.emit(SandboxEvent::Ready).await;
        let (status, compile, run_stage, error) = run.stages().await;
        let mut result = ended(job, status, compile, run_stage, started, container_start_ms);
        result.error = error;
        RunOutcome {
            result,
            cleanup: Cleanup::new(teardown),
            container: name,
        }
    }
}

/// The job's result from its stages, as the Docker engine builds it.
fn ended(
    job: &PreparedJob,
    status: Status,
    compile: Option<StageResult>,
    run: Option<StageResult>,
    started: Instant,
    container_start_ms: u64,
) -> JobResult {
    JobResult {
        status,
        language: job.language.id.clone(),
        version: job.language.version.clone(),
        timings: Timings {
            container_start_ms,
            compile_ms: compile.as_ref().map(|s| s.wall_ms),
            run_ms: run.as_ref().map(|s| s.wall_ms),
            total_ms: started.elapsed().as_millis() as u64,
        },
        compile,
        run,
        error: None,
        reason: None,
        start: Some(StartKind::Cold),
        grading: None,
        egress: None,
    }
}

/// Counts a run in [`ScriptedHost::running`] while it lives.
struct RunningGuard<'a>(&'a AtomicU64);

impl<'a> RunningGuard<'a> {
    fn new(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A run's sandbox on the host until it is removed.
struct ScriptedTeardown {
    host: Arc<ScriptedHost>,
    id: String,
    crashed: Arc<AtomicBool>,
    removed: bool,
}

#[async_trait]
impl Teardown for ScriptedTeardown {
    fn is_idle(&self) -> bool {
        false
    }

    fn stop_lingering(&mut self) {}

    async fn exited_within(&mut self, _within: Duration) -> bool {
        true
    }

    async fn remove(mut self: Box<Self>) -> bool {
        if self.host.is_down() {
            return false;
        }
        self.removed = true;
        if !self.crashed.load(Ordering::SeqCst) {
            self.host.remove(&self.id);
        }
        true
    }
}

impl Drop for ScriptedTeardown {
    fn drop(&mut self) {
        if !self.removed && !self.crashed.load(Ordering::SeqCst) {
            self.host.remove(&self.id);
        }
    }
}

// ---------------------------------------------------------------------------
// the script
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Out { text: Vec<u8>, stderr: bool },
    Flood(u64),
    Sleep(Duration),
    ReadLine { upper: bool, prefix: Vec<u8> },
    Read,
    Echo,
    IgnoreInterrupt,
    TrapInterrupt(Vec<u8>),
    Repeat { times: Option<u64>, body: Vec<Step> },
    Exit(i32),
    Die(String),
    Oom,
    CpuLimit,
    Usage { cpu_ms: u64, memory: u64 },
    Crash,
    Stuck,
    CompileError(Vec<u8>),
}

/// A script that could not be read: the line and why.
#[derive(Debug)]
struct ScriptError(usize, String);

fn parse(source: &str) -> Result<Vec<Step>, ScriptError> {
    let lines: Vec<(usize, &str)> = source
        .lines()
        .enumerate()
        .map(|(n, line)| (n + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .collect();
    let mut at = 0;
    let steps = parse_block(&lines, &mut at, false)?;
    Ok(steps)
}

fn parse_block(
    lines: &[(usize, &str)],
    at: &mut usize,
    nested: bool,
) -> Result<Vec<Step>, ScriptError> {
    let mut steps = Vec::new();
    while *at < lines.len() {
        let (number, line) = lines[*at];
        *at += 1;
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let error = |message: &str| ScriptError(number, format!("{message}: {line:?}"));
        let number_arg = || {
            rest.trim()
                .parse::<u64>()
                .map_err(|_| error("needs a number"))
        };
        let step = match word {
            "end" if nested => return Ok(steps),
            "print" | "eprint" => {
                let mut text = unescape(rest);
                text.push(b'\n');
                Step::Out {
                    text,
                    stderr: word == "eprint",
                }
            }
            "write" | "ewrite" => Step::Out {
                text: unescape(rest),
                stderr: word == "ewrite",
            },
            "flood" => Step::Flood(number_arg()?),
            "sleep" => Step::Sleep(Duration::from_millis(number_arg()?)),
            "readline" => {
                let (upper, prefix) = match rest.strip_prefix("upper") {
                    Some(after) => (true, after.strip_prefix(' ').unwrap_or(after)),
                    None => (false, rest),
                };
                Step::ReadLine {
                    upper,
                    prefix: unescape(prefix),
                }
            }
            "read" => Step::Read,
            "echo" => Step::Echo,
            "ignore" if rest == "SIGINT" => Step::IgnoreInterrupt,
            "trap" if rest.starts_with("SIGINT ") => {
                let mut text = unescape(&rest["SIGINT ".len()..]);
                text.push(b'\n');
                Step::TrapInterrupt(text)
            }
            "repeat" => Step::Repeat {
                times: Some(number_arg()?),
                body: parse_block(lines, at, true)?,
            },
            "forever" => Step::Repeat {
                times: None,
                body: parse_block(lines, at, true)?,
            },
            "exit" => Step::Exit(rest.trim().parse().map_err(|_| error("needs a code"))?),
            "die" if rest.starts_with("SIG") => Step::Die(rest.to_string()),
            "oom" => Step::Oom,
            "cpu-limit" => Step::CpuLimit,
            "usage" => {
                let mut figures = rest.split_whitespace().map(str::parse::<u64>);
                match (figures.next(), figures.next()) {
                    (Some(Ok(cpu_ms)), Some(Ok(memory))) => Step::Usage { cpu_ms, memory },
                    _ => return Err(error("needs CPU_MS MEMORY_BYTES")),
                }
            }
            "crash" => Step::Crash,
            "stuck" => Step::Stuck,
            "compile-error" => Step::CompileError(unescape(rest)),
            _ => return Err(error("unknown step")),
        };
        steps.push(step);
    }
    if nested {
        return Err(ScriptError(
            lines.last().map_or(0, |l| l.0),
            "a block has no `end`".to_string(),
        ));
    }
    Ok(steps)
}

fn unescape(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buffer = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut buffer).as_bytes());
            continue;
        }
        match chars.next() {
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('\\') => out.push(b'\\'),
            Some('x') => {
                let hex: String = chars.by_ref().take(2).collect();
                out.push(u8::from_str_radix(&hex, 16).unwrap_or(b'?'));
            }
            Some(other) => {
                out.push(b'\\');
                let mut buffer = [0; 4];
                out.extend_from_slice(other.encode_utf8(&mut buffer).as_bytes());
            }
            None => out.push(b'\\'),
        }
    }
    out
}

// ---------------------------------------------------------------------------
// running it
// ---------------------------------------------------------------------------

/// How a stage ended.
#[derive(Debug, Clone, PartialEq)]
enum End {
    Exit(i32),
    /// Ended by a signal it did not get from the host (`die`, an
    /// interrupt).
    Signal(String),
    /// Killed by the sandbox or the host, for this reason.
    Killed(Reason),
    /// The sandbox died without reporting.
    Crash,
}

/// What a stage runs: the compile (failing with this text, if it must),
/// or the program (or why its script could not be read).
enum StageBody {
    Compile(Option<Vec<u8>>),
    Program(Result<Vec<Step>, (usize, String)>),
}

/// A job's run: its channels, stdin as it came, and the stage running.
struct Run<'a> {
    job: &'a PreparedJob,
    events: Option<mpsc::Sender<SandboxEvent>>,
    input: Option<mpsc::Receiver<JobInput>>,
    cancel: tokio_util::sync::CancellationToken,
    /// The job's deadline.
    deadline: tokio::time::Instant,
    cancelled: bool,
    stdin: Vec<u8>,
    stdin_closed: bool,
    ignore_interrupt: bool,
    /// What an interrupt prints instead of ending the program (`trap`).
    on_interrupt: Option<Vec<u8>>,
    /// The stage running: its output and limits.
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    cap: u64,
    truncated: bool,
    stage_deadline: tokio::time::Instant,
    idle: Option<Duration>,
    last_activity: tokio::time::Instant,
    /// What the stage reports: CPU ms and peak memory bytes.
    usage: (u64, u64),
}

impl<'a> Run<'a> {
    fn new(job: &'a PreparedJob, io: JobIo, deadline_ms: u64) -> Self {
        let now = tokio::time::Instant::now();
        let left = Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
        Self {
            job,
            events: io.events,
            input: io.input,
            cancel: io.cancel,
            deadline: now + left,
            cancelled: false,
            stdin: job.stdin.clone(),
            stdin_closed: !job.interactive,
            ignore_interrupt: false,
            on_interrupt: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
            cap: 0,
            truncated: false,
            stage_deadline: now,
            idle: None,
            last_activity: now,
            usage: (1, 1 << 20),
        }
    }

    async fn emit(&self, event: SandboxEvent) {
        if let Some(events) = &self.events {
            let _ = events.send(event).await;
        }
    }

    /// Runs the bundle's stages; the job's status, its stages and the
    /// platform's error, if any.
    async fn stages(
        &mut self,
    ) -> (
        Status,
        Option<StageResult>,
        Option<StageResult>,
        Option<String>,
    ) {
        if self.job.tests.is_some() {
            let error = "the scripted engine runs no graded jobs".to_string();
            return (Status::Error, None, None, Some(error));
        }
        let source = self
            .job
            .bundle
            .files
            .first()
            .map(|f| String::from_utf8_lossy(&f.content).into_owned())
            .unwrap_or_default();
        let script = parse(&source).map_err(|e| (e.0, e.1));
        let mut compile = None;
        let mut run = None;
        for spec in self.job.bundle.stages.clone() {
            let body = if spec.name == "compile" {
                let failure = script.as_ref().ok().and_then(|steps| {
                    steps.iter().find_map(|s| match s {
                        Step::CompileError(text) => Some(text.clone()),
                        _ => None,
                    })
                });
                StageBody::Compile(failure)
            } else {
                StageBody::Program(script.clone())
            };
            let Some(result) = self.stage(&spec, body).await else {
                let error = "the sandbox exited without reporting (exit code 137)".to_string();
                return (Status::Error, compile, run, Some(error));
            };
            let failed = result.reason != Reason::Exited || result.exit_code != Some(0);
            if spec.name == "compile" {
                compile = Some(result);
            } else {
                run = Some(result);
            }
            if failed || self.cancelled {
                break;
            }
        }
        let status = if self.cancelled {
            Status::Cancelled
        } else {
            JobResult::status_from_stages(compile.as_ref(), run.as_ref())
        };
        let error = (status == Status::Error)
            .then(|| "the sandbox ended without running the program".to_string());
        (status, compile, run, error)
    }

    /// Runs one stage; its result, or `None` when the sandbox crashed.
    async fn stage(&mut self, spec: &StageSpec, body: StageBody) -> Option<StageResult> {
        let started = Instant::now();
        let now = tokio::time::Instant::now();
        self.stdout.clear();
        self.stderr.clear();
        self.truncated = false;
        self.cap = spec.limits.output_bytes;
        self.stage_deadline = (now + Duration::from_millis(spec.limits.wall_ms)).min(self.deadline);
        self.idle = spec.limits.idle_ms.map(Duration::from_millis);
        self.last_activity = now;
        self.usage = (1, 1 << 20);
        self.emit(SandboxEvent::StageStart {
            stage: spec.name.clone(),
        })
        .await;
        let end = match body {
            StageBody::Compile(None) => End::Exit(0),
            StageBody::Compile(Some(mut text)) => {
                text.push(b'\n');
                self.out(text, true).await.unwrap_or(End::Exit(1))
            }
            StageBody::Program(Err((line, message))) => {
                let text = format!("scripted: line {line}: {message}\n").into_bytes();
                self.out(text, true).await.unwrap_or(End::Exit(2))
            }
            StageBody::Program(Ok(steps)) => self.steps(&steps, None).await.unwrap_or(End::Exit(0)),
        };
        let (exit_code, signal, reason) = match end {
            End::Crash => return None,
            End::Exit(code) => (Some(code), None, Reason::Exited),
            End::Signal(signal) => (None, Some(signal), Reason::Exited),
            End::Killed(reason) => (None, Some("SIGKILL".to_string()), reason),
        };
        let result = StageResult {
            stdout: Output(std::mem::take(&mut self.stdout)),
            stderr: Output(std::mem::take(&mut self.stderr)),
            truncated: self.truncated,
            exit_code,
            signal,
            reason,
            wall_ms: started.elapsed().as_millis() as u64,
            cpu_ms: self.usage.0,
            memory_peak_bytes: self.usage.1,
            pids_limit_reached: Some(false),
        };
        self.emit(SandboxEvent::StageEnd {
            stage: spec.name.clone(),
            result: Box::new(result.clone()),
        })
        .await;
        Some(result)
    }

    /// Runs `steps` (`i`: the iteration of the `repeat` around them);
    /// `Some` when the stage ended in them.
    fn steps<'s>(
        &'s mut self,
        steps: &'s [Step],
        i: Option<u64>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<End>> + Send + 's>> {
        Box::pin(async move {
            for step in steps {
                if let Some(end) = self.step(step, i).await {
                    return Some(end);
                }
            }
            None
        })
    }

    async fn step(&mut self, step: &Step, i: Option<u64>) -> Option<End> {
        match step {
            Step::Out { text, stderr } => self.out(with_iteration(text, i), *stderr).await,
            Step::Flood(bytes) => {
                let mut left = *bytes;
                while left > 0 {
                    let chunk = left.min(4096);
                    left -= chunk;
                    if let Some(end) = self.out(vec![b'y'; chunk as usize], false).await {
                        return Some(end);
                    }
                    if let Some(end) = self.wait(Some(tokio::time::Instant::now()), false).await {
                        return Some(end);
                    }
                }
                None
            }
            Step::Sleep(duration) => {
                let until = tokio::time::Instant::now() + *duration;
                self.wait(Some(until), false).await
            }
            Step::ReadLine { upper, prefix } => {
                let line = match self.read_line().await {
                    Ok(Some(line)) => line,
                    Ok(None) => {
                        let end = self.out(b"EOFError\n".to_vec(), true).await;
                        return Some(end.unwrap_or(End::Exit(1)));
                    }
                    Err(end) => return Some(end),
                };
                let mut text = prefix.clone();
                text.extend(if *upper {
                    line.to_ascii_uppercase()
                } else {
                    line
                });
                text.push(b'\n');
                self.out(text, false).await
            }
            Step::Read => match self.read_line().await {
                Ok(Some(_)) => None,
                Ok(None) => {
                    let end = self.out(b"EOFError\n".to_vec(), true).await;
                    Some(end.unwrap_or(End::Exit(1)))
                }
                Err(end) => Some(end),
            },
            Step::Echo => loop {
                if !self.stdin.is_empty() {
                    let data = std::mem::take(&mut self.stdin);
                    if let Some(end) = self.out(data, false).await {
                        return Some(end);
                    }
                }
                if self.stdin_closed {
                    return None;
                }
                self.emit(SandboxEvent::InputWanted).await;
                if let Some(end) = self.wait(None, true).await {
                    return Some(end);
                }
            },
            Step::IgnoreInterrupt => {
                self.ignore_interrupt = true;
                None
            }
            Step::TrapInterrupt(text) => {
                self.on_interrupt = Some(text.clone());
                None
            }
            Step::Repeat { times, body } => {
                let mut n = 0;
                while times.is_none_or(|times| n < times) {
                    if let Some(end) = self.steps(body, Some(n)).await {
                        return Some(end);
                    }
                    if let Some(end) = self.wait(Some(tokio::time::Instant::now()), false).await {
                        return Some(end);
                    }
                    n += 1;
                }
                None
            }
            Step::Exit(code) => Some(End::Exit(*code)),
            Step::Die(signal) => Some(End::Signal(signal.clone())),
            Step::Oom => Some(End::Killed(Reason::MemoryLimit)),
            Step::CpuLimit => Some(End::Killed(Reason::CpuTimeout)),
            Step::Usage { cpu_ms, memory } => {
                self.usage = (*cpu_ms, *memory);
                None
            }
            Step::Crash => Some(End::Crash),
            Step::Stuck => std::future::pending().await,
            Step::CompileError(_) => None,
        }
    }

    /// Writes `data` to the stage's stdout or stderr, up to its output
    /// limit: past it the stage is killed (`output_limit`).
    async fn out(&mut self, data: Vec<u8>, stderr: bool) -> Option<End> {
        let used = (self.stdout.len() + self.stderr.len()) as u64;
        let room = self.cap.saturating_sub(used) as usize;
        let over = data.len() > room;
        let kept = data[..data.len().min(room)].to_vec();
        self.last_activity = tokio::time::Instant::now();
        if !kept.is_empty() {
            if stderr {
                self.stderr.extend_from_slice(&kept);
                self.emit(SandboxEvent::Stderr(kept)).await;
            } else {
                self.stdout.extend_from_slice(&kept);
                self.emit(SandboxEvent::Stdout(kept)).await;
            }
        }
        if over {
            self.truncated = true;
            return Some(End::Killed(Reason::OutputLimit));
        }
        None
    }

    /// The next line of stdin without its newline; `None` at EOF with
    /// nothing left. Says `input_wanted` when it must wait.
    async fn read_line(&mut self) -> Result<Option<Vec<u8>>, End> {
        loop {
            if let Some(at) = self.stdin.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.stdin.drain(..=at).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.stdin_closed {
                if self.stdin.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(std::mem::take(&mut self.stdin)));
            }
            self.emit(SandboxEvent::InputWanted).await;
            if let Some(end) = self.wait(None, true).await {
                return Err(end);
            }
        }
    }

    /// Waits until `until` (forever with `None`), or with `for_input`
    /// until stdin moves; meanwhile takes the job's input and watches its
    /// limits. `Some` when the stage must end.
    async fn wait(&mut self, until: Option<tokio::time::Instant>, for_input: bool) -> Option<End> {
        loop {
            let idle_at = self.idle.map(|idle| self.last_activity + idle);
            let input_open = self.input.is_some();
            tokio::select! {
                () = self.cancel.cancelled(), if !self.cancelled => {
                    self.cancelled = true;
                    return Some(End::Killed(Reason::Killed));
                }
                item = recv(&mut self.input), if input_open => match item {
                    Some(JobInput::Stdin(data)) => {
                        self.stdin.extend_from_slice(&data);
                        self.last_activity = tokio::time::Instant::now();
                        if for_input {
                            return None;
                        }
                    }
                    Some(JobInput::StdinClose) => {
                        self.stdin_closed = true;
                        if for_input {
                            return None;
                        }
                    }
                    Some(JobInput::Signal(SignalKind::Kill)) => {
                        return Some(End::Killed(Reason::Killed));
                    }
                    Some(JobInput::Signal(SignalKind::Interrupt)) => {
                        if let Some(text) = self.on_interrupt.clone() {
                            if let Some(end) = self.out(text, false).await {
                                return Some(end);
                            }
                        } else if !self.ignore_interrupt {
                            return Some(End::Signal("SIGINT".to_string()));
                        }
                    }
                    None => self.input = None,
                },
                () = tokio::time::sleep_until(self.stage_deadline) => {
                    return Some(End::Killed(Reason::WallTimeout));
                }
                () = sleep_until_some(idle_at) => {
                    return Some(End::Killed(Reason::IdleTimeout));
                }
                () = sleep_until_some(until) => return None,
            }
        }
    }
}

async fn recv(input: &mut Option<mpsc::Receiver<JobInput>>) -> Option<JobInput> {
    match input {
        Some(input) => input.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `text` with `{i}` replaced by the iteration.
fn with_iteration(text: &[u8], i: Option<u64>) -> Vec<u8> {
    let Some(i) = i else {
        return text.to_vec();
    };
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.windows(3).position(|w| w == b"{i}") {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(i.to_string().as_bytes());
        rest = &rest[at + 3..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_reads_as_its_steps() {
        let steps = parse("print a\\tb\nrepeat 2\n  write {i}\nend\n# note\nexit 3\n").unwrap();
        assert_eq!(
            steps,
            vec![
                Step::Out {
                    text: b"a\tb\n".to_vec(),
                    stderr: false
                },
                Step::Repeat {
                    times: Some(2),
                    body: vec![Step::Out {
                        text: b"{i}".to_vec(),
                        stderr: false
                    }]
                },
                Step::Exit(3),
            ]
        );
        assert_eq!(with_iteration(b"n={i}, {i}", Some(7)), b"n=7, 7");
        let error = parse("print 1\nsleep soon\n").unwrap_err();
        assert_eq!(error.0, 2);
        assert!(parse("repeat 2\nprint x\n").is_err());
        assert!(parse("print(1)").is_err());
    }

    #[test]
    fn read_and_trap_read_as_their_steps() {
        let steps = parse("read\ntrap SIGINT caught it\n").unwrap();
        assert_eq!(
            steps,
            vec![Step::Read, Step::TrapInterrupt(b"caught it\n".to_vec())]
        );
        assert!(parse("trap SIGHUP x\n").is_err());
    }
}
