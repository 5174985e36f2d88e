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
//! | `cat PATH` | the bytes of the job's file PATH to stdout (`cat: PATH: No such file or directory` to stderr when it has none) |
//! | `sleep MS` | waits MS milliseconds |
//! | `readline [upper] [PREFIX]` | reads a line of stdin (says `input_wanted` when none is buffered) and prints PREFIX and the line (upper-cased with `upper`); at EOF, ends with exit 1 and `EOFError` on stderr |
//! | `echo [upper]` | copies stdin to stdout (upper-cased with `upper`) until it is closed |
//! | `ignore SIGINT` | a client's interrupt no longer ends the program |
//! | `read` | reads a line of stdin as `readline` does, and prints nothing |
//! | `catch SIGINT TEXT` | a client's interrupt writes TEXT and a newline to stdout, and the program goes on (a handler that catches it) |
//! | `trap SIGINT TEXT` | a client's interrupt writes TEXT and a newline to stderr, then ends the program by SIGINT (as Python's `KeyboardInterrupt` does) |
//! | `repeat N` … `end`, `forever` … `end` | a block N times, or until the program is ended |
//! | `exit CODE` | ends with CODE (the script's end is exit 0) |
//! | `die SIGNAME` | ends by that signal (e.g. `SIGSEGV`) |
//! | `oom` / `cpu-limit` | ends as the memory limit / the CPU limit would end it |
//! | `usage CPU_MS MEMORY_BYTES` | the figures the stage reports (default 1 ms, 1 MiB) |
//! | `crash` | the sandbox dies without reporting (a platform error) |
//! | `stuck` | never ends, whatever comes, until the job's future is dropped |
//! | `compile-error TEXT` | a compiled language's compile stage fails with TEXT on stderr |
//! | `file NAME TEXT` / `file-bytes NAME N` / `link NAME` | writes the workspace file NAME (TEXT, or N bytes `i % 251`), or a symbolic link: the run stage's `outputs` find them |
//!
//! A line the engine does not know fails the run stage at once (exit 2,
//! `scripted: line N: …` on stderr), so a mistyped script never passes
//! for a program.
//!
//! # What the engine does as a sandbox would
//!
//! Each stage runs under its wall limit (`wall_timeout`, SIGKILL), its idle
//! limit (`idle_timeout`; input, its close and output are activity), its
//! output limit (`output_limit`, `truncated`) and the job's stored
//! deadline; a cancel kills it (`cancelled`), a client's kill too
//! (`killed`), an interrupt ends it by SIGINT. Events go to
//! [`JobIo::events`] as the Docker engine sends them. Every run is a
//! sandbox of the [`ScriptedHost`] (labelled as Docker's containers are:
//! job, worker, created, deadline) until its [`Cleanup`] removes it; a
//! dropped run removes it too, unless the engine [`ScriptedEngine::crash`]ed
//! (a killed worker process leaves its containers behind).
//!
//! Where the Docker engine's session decides something of its own, the
//! scripted engine decides the same (`src/sandbox/session.rs`, `run.rs`):
//!
//! - the job's stored deadline passing in a stage is the host's cut, not
//!   the sandbox's: the stage is recorded `wall_timeout` (SIGKILL, no
//!   usage) without a `StageEnd` event, and no later stage runs;
//! - a run whose status is `error` (a crash, a host that is down) makes
//!   [`SandboxEngine::answered_within`] say no until the engine answers
//!   again (the worker asks for readiness before its next claim);
//! - a sandbox exited by itself (its program ended and nothing failed:
//!   [`Cleanup::exited_within`] says so) may wait in the worker's removal
//!   queue; one that crashed, was cut by the deadline or never started is
//!   removed at once;
//! - a removal while the host is down answers `false` and is done in the
//!   background once the host is up again (Docker's engine retries every
//!   second; this one every 100 ms).
//!
//! A run already going when the host goes down runs on (its program is not
//! the host's API). [`ScriptedHost::running`] lists the sandboxes whose
//! program runs (a crashed engine's run on until removed, as a killed
//! worker's containers do), [`ScriptedHost::starts`] counts a job's
//! sandboxes and [`ScriptedHost::overlaps`] names the jobs that ran in two
//! at once.
//!
//! Here: the host, the engine and what a run leaves; the script's parser
//! is `scripted/script.rs`, the run of its stages `scripted/run.rs`. The
//! engine's own tests are in `tests/worker` (`scripted`, `scripted_ends`).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use code_runner::job::deadline::{Budget, now_ms};
use code_runner::job::{
    Encoding, FileSpec, JobResult, JobSpec, PreparedJob, StageResult, StartKind, Status, Timings,
};
use code_runner::sandbox::{
    Cleanup, JobIo, RunOutcome, SandboxContainer, SandboxEngine, SandboxError, SandboxEvent,
    Teardown, WarmSandbox, container_name,
};

use run::Run;

mod run;
mod script;

/// A job of one python file whose content is `script` (the language only
/// names an image the catalog has: the script is what runs).
pub fn job(script: &str) -> JobSpec {
    JobSpec {
        language: "python".to_string(),
        files: vec![FileSpec {
            name: "main.py".to_string(),
            content: script.to_string(),
            encoding: Encoding::Utf8,
            reference: None,
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
    /// What the host saw of its sandboxes beyond their list.
    record: Mutex<Record>,
}

/// The host's record: the sandboxes whose program runs, each job's
/// sandboxes, and the jobs that ran in two at once.
#[derive(Debug, Default)]
struct Record {
    running: BTreeSet<String>,
    starts: BTreeMap<String, u64>,
    overlaps: Vec<String>,
}

impl ScriptedHost {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            id: format!("scripted-{}", uuid::Uuid::new_v4().simple()),
            sandboxes: Mutex::default(),
            down: AtomicBool::new(false),
            missing_images: Mutex::default(),
            runs: AtomicU64::new(0),
            record: Mutex::default(),
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

    /// The ids of the sandboxes whose program runs now: a run under way,
    /// or one a crashed engine left (a killed worker's container runs on
    /// until it is removed). A sandbox on the host and not here has
    /// exited: it waits for its removal.
    pub fn running(&self) -> Vec<String> {
        self.record().running.iter().cloned().collect()
    }

    /// How many sandboxes were made for `job`, one per attempt.
    pub fn starts(&self, job: &str) -> u64 {
        self.record().starts.get(job).copied().unwrap_or(0)
    }

    /// The jobs that had two sandboxes running at once: a run started
    /// while a sandbox of the same job still ran (each run's sandbox has a
    /// name of its own, as Docker's do, so nothing refuses it).
    pub fn overlaps(&self) -> Vec<String> {
        self.record().overlaps.clone()
    }

    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SandboxContainer>> {
        self.sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn remove(&self, id: &str) -> bool {
        self.record().running.remove(id);
        self.lock().remove(id).is_some()
    }

    /// Removes `id` now, or once the host is up again (as the Docker
    /// engine's removal retries in the background; it gives up after five
    /// minutes, as that one does).
    fn remove_when_up(self: &Arc<Self>, id: &str) {
        if !self.is_down() {
            self.remove(id);
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (host, id) = (Arc::clone(self), id.to_string());
        runtime.spawn(async move {
            for _ in 0..3000 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if !host.is_down() {
                    host.remove(&id);
                    return;
                }
            }
        });
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
        let teardown = ScriptedTeardown {
            host: Arc::clone(&self.host),
            id: name.clone(),
            crashed: Arc::clone(&self.crashed),
            removed: false,
            exited: false,
        };
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
        let running = Running::mark(&self.host, job_id, &name, &self.crashed);
        let mut teardown = teardown;
        let container_start_ms = (started.elapsed().as_millis() as u64).max(1);
        let mut run = Run::new(job, io, deadline_ms);
        run.emit(SandboxEvent::Ready).await;
        let (status, compile, run_stage, error) = run.stages().await;
        let mut result = ended(job, status, compile, run_stage, started, container_start_ms);
        result.error = error;
        result.outputs = std::mem::take(&mut run.outputs);
        if let Some(request) = job.bundle.stages.last().and_then(|s| s.outputs.as_ref())
            && result.run.is_none()
            && status != Status::Error
        {
            // As the Docker engine: a run stage that never ran says so.
            result.outputs = code_runner::job::outputs::OutputEntry::for_each(
                &request.patterns,
                "not_run",
                "the run stage did not run (the compile failed, or the job ended before it)",
            );
        }
        if status == Status::Error {
            // As the Docker engine: a platform error may be its backend
            // going away; the next claim asks it first.
            self.note_unanswered();
        }
        teardown.exited = run.done && status != Status::Error;
        running.end();
        RunOutcome {
            result,
            cleanup: Cleanup::new(teardown),
            container: name,
        }
    }
}

/// Marks a sandbox's program running on its host until the run ends or
/// is dropped; a crashed engine's dropped run stays marked until the
/// sandbox is removed (a killed worker's container runs on).
struct Running {
    host: Arc<ScriptedHost>,
    id: String,
    crashed: Arc<AtomicBool>,
    ended: bool,
}

impl Running {
    fn mark(host: &Arc<ScriptedHost>, job_id: &str, id: &str, crashed: &Arc<AtomicBool>) -> Self {
        let running: Vec<String> = host
            .sandboxes()
            .into_iter()
            .filter(|c| c.id != id && c.job.as_deref() == Some(job_id))
            .map(|c| c.id)
            .collect();
        let mut record = host.record();
        if running.iter().any(|other| record.running.contains(other)) {
            record.overlaps.push(job_id.to_string());
        }
        record.running.insert(id.to_string());
        *record.starts.entry(job_id.to_string()).or_default() += 1;
        Self {
            host: Arc::clone(host),
            id: id.to_string(),
            crashed: Arc::clone(crashed),
            ended: false,
        }
    }

    /// The program ended (the run returns).
    fn end(mut self) {
        self.ended = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.ended || !self.crashed.load(Ordering::SeqCst) {
            self.host.record().running.remove(&self.id);
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
        outputs: Vec::new(),
    }
}

/// A run's sandbox on the host until it is removed.
struct ScriptedTeardown {
    host: Arc<ScriptedHost>,
    id: String,
    crashed: Arc<AtomicBool>,
    removed: bool,
    /// The program ended by itself and nothing failed: the sandbox has
    /// exited (the Docker engine's `stopping` attach stream).
    exited: bool,
}

#[async_trait]
impl Teardown for ScriptedTeardown {
    fn is_idle(&self) -> bool {
        false
    }

    fn stop_lingering(&mut self) {}

    async fn exited_within(&mut self, _within: Duration) -> bool {
        std::mem::take(&mut self.exited)
    }

    async fn remove(mut self: Box<Self>) -> bool {
        self.removed = true;
        if self.crashed.load(Ordering::SeqCst) {
            return true;
        }
        let up = !self.host.is_down();
        self.host.remove_when_up(&self.id);
        up
    }
}

impl Drop for ScriptedTeardown {
    fn drop(&mut self) {
        if !self.removed && !self.crashed.load(Ordering::SeqCst) {
            self.host.remove_when_up(&self.id);
        }
    }
}
