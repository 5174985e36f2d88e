//! Running a script as a sandbox runs a program: stage by stage, under
//! the stage's limits and the job's deadline, taking the job's input and
//! sending its events as the Docker engine does.

use code_runner::job::outputs::OutputEntry;
use std::time::{Duration, Instant};

use code_runner::job::deadline::now_ms;
use code_runner::job::{JobResult, Output, PreparedJob, StageResult, Status};
use code_runner::protocol::{Reason, SignalKind, StageSpec};
use code_runner::sandbox::{JobInput, JobIo, SandboxEvent};
use tokio::sync::mpsc;

use super::script::{Step, parse, with_iteration};

/// How a stage ended.
#[derive(Debug, Clone, PartialEq)]
enum End {
    Exit(i32),
    /// Ended by a signal it did not get from the host (`die`, an
    /// interrupt).
    Signal(String),
    /// Killed by the sandbox or the host, for this reason.
    Killed(Reason),
    /// The job's stored deadline passed: the host stops the sandbox, which
    /// reports nothing more.
    Cut,
    /// The sandbox died without reporting.
    Crash,
}

/// What a client's interrupt does to the program.
#[derive(Debug, Clone, PartialEq)]
enum OnInterrupt {
    /// It ends the program by SIGINT.
    End,
    /// Nothing (`ignore SIGINT`).
    Ignore,
    /// This text goes to stderr, then it ends the program by SIGINT.
    Trap(Vec<u8>),
    /// This text goes to stdout, and the program goes on.
    Catch(Vec<u8>),
}

/// What a stage runs: the compile (failing with this text, if it must),
/// or the program (or why its script could not be read).
enum StageBody {
    Compile(Option<Vec<u8>>),
    Program(Result<Vec<Step>, (usize, String)>),
}

/// A job's run: its channels, stdin as it came, and the stage running.
pub(super) struct Run<'a> {
    job: &'a PreparedJob,
    events: Option<mpsc::Sender<SandboxEvent>>,
    input: Option<mpsc::Receiver<JobInput>>,
    cancel: tokio_util::sync::CancellationToken,
    /// The job's deadline.
    deadline: tokio::time::Instant,
    cancelled: bool,
    stdin: Vec<u8>,
    stdin_closed: bool,
    on_interrupt: OnInterrupt,
    /// The sandbox reported every stage and said `done` (it neither
    /// crashed nor was cut by the deadline).
    pub(super) done: bool,
    /// The stage running: its output and limits.
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    cap: u64,
    truncated: bool,
    /// Its wall limit's end (the sandbox's own kill).
    stage_deadline: tokio::time::Instant,
    idle: Option<Duration>,
    last_activity: tokio::time::Instant,
    /// What the stage reports: CPU ms and peak memory bytes.
    usage: (u64, u64),
    /// The files the program wrote (`None`: a symbolic link).
    workspace: std::collections::BTreeMap<String, Option<Vec<u8>>>,
    /// The run stage's output files, as the supervisor sends them.
    pub(super) outputs: Vec<code_runner::job::outputs::OutputEntry>,
}

impl<'a> Run<'a> {
    pub(super) fn new(job: &'a PreparedJob, io: JobIo, deadline_ms: u64) -> Self {
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
            on_interrupt: OnInterrupt::End,
            done: false,
            stdout: Vec::new(),
            stderr: Vec::new(),
            cap: 0,
            truncated: false,
            stage_deadline: now,
            idle: None,
            last_activity: now,
            usage: (1, 1 << 20),
            workspace: Default::default(),
            outputs: Vec::new(),
        }
    }

    pub(super) async fn emit(&self, event: SandboxEvent) {
        if let Some(events) = &self.events {
            let _ = events.send(event).await;
        }
    }

    /// Runs the bundle's stages; the job's status, its stages and the
    /// platform's error, if any.
    pub(super) async fn stages(
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
            let Some((result, reported)) = self.stage(&spec, body).await else {
                let error = "the sandbox exited without reporting (exit code 137)".to_string();
                return (Status::Error, compile, run, Some(error));
            };
            let failed = result.reason != Reason::Exited || result.exit_code != Some(0);
            if spec.name == "compile" {
                compile = Some(result);
            } else {
                run = Some(result);
            }
            if !reported {
                // Cut by the deadline: the host ended the sandbox.
                return self.status_of(compile, run);
            }
            if failed || self.cancelled {
                break;
            }
        }
        self.done = true;
        self.status_of(compile, run)
    }

    /// The job's status from its stages, and the platform's error, if any.
    fn status_of(
        &self,
        compile: Option<StageResult>,
        run: Option<StageResult>,
    ) -> (
        Status,
        Option<StageResult>,
        Option<StageResult>,
        Option<String>,
    ) {
        let status = if self.cancelled {
            Status::Cancelled
        } else {
            JobResult::status_from_stages(compile.as_ref(), run.as_ref())
        };
        let error = (status == Status::Error)
            .then(|| "the sandbox ended without running the program".to_string());
        (status, compile, run, error)
    }

    /// Runs one stage; its result and whether the sandbox reported it
    /// (not when the deadline cut it), or `None` when the sandbox crashed.
    async fn stage(&mut self, spec: &StageSpec, body: StageBody) -> Option<(StageResult, bool)> {
        let started = Instant::now();
        let now = tokio::time::Instant::now();
        self.stdout.clear();
        self.stderr.clear();
        self.truncated = false;
        self.cap = spec.limits.output_bytes;
        self.stage_deadline = now + Duration::from_millis(spec.limits.wall_ms);
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
            End::Cut => {
                if let Some(request) = &spec.outputs {
                    self.outputs = OutputEntry::for_each(
                        &request.patterns,
                        "not_collected",
                        "the sandbox ended before the files were collected",
                    );
                }
                // As the Docker engine records a stage the sandbox did not
                // report: what came of its output, killed, no usage.
                let result = StageResult {
                    stdout: Output(std::mem::take(&mut self.stdout)),
                    stderr: Output(std::mem::take(&mut self.stderr)),
                    truncated: self.truncated,
                    exit_code: None,
                    signal: Some("SIGKILL".to_string()),
                    reason: Reason::WallTimeout,
                    wall_ms: started.elapsed().as_millis() as u64,
                    cpu_ms: 0,
                    memory_peak_bytes: 0,
                    pids_limit_reached: None,
                };
                return Some((result, false));
            }
            End::Exit(code) => (Some(code), None, Reason::Exited),
            End::Signal(signal) => (None, Some(signal), Reason::Exited),
            End::Killed(reason) => (None, Some("SIGKILL".to_string()), reason),
        };
        if let Some(request) = &spec.outputs {
            self.outputs = collect(&self.workspace, &request.patterns);
        }
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
        Some((result, true))
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
            Step::Cat(path) => {
                let file = self.job.bundle.files.iter().find(|f| &f.path == path);
                match file.map(|f| f.content.clone()) {
                    Some(content) => self.out(content, false).await,
                    None => {
                        let said = format!("cat: {path}: No such file or directory\n");
                        self.out(said.into_bytes(), true).await
                    }
                }
            }
            Step::Flood(bytes) => {
                let mut left = *bytes;
                while left > 0 {
                    let chunk = left.min(4096);
                    left -= chunk;
                    if let Some(end) = self.out(vec![b'y'; chunk as usize], false).await {
                        return Some(end);
                    }
                    if let Some(end) = self.checkpoint().await {
                        return Some(end);
                    }
                }
                None
            }
            Step::Sleep(duration) => {
                let until = tokio::time::Instant::now() + *duration;
                self.wait(Some(until), false).await
            }
            Step::Read => match self.read_line().await {
                Ok(Some(_)) => None,
                Ok(None) => {
                    let end = self.out(b"EOFError\n".to_vec(), true).await;
                    Some(end.unwrap_or(End::Exit(1)))
                }
                Err(end) => Some(end),
            },
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
            Step::Echo { upper } => loop {
                if !self.stdin.is_empty() {
                    let mut data = std::mem::take(&mut self.stdin);
                    if *upper {
                        data.make_ascii_uppercase();
                    }
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
                self.on_interrupt = OnInterrupt::Ignore;
                None
            }
            Step::TrapInterrupt(text) => {
                self.on_interrupt = OnInterrupt::Trap(text.clone());
                None
            }
            Step::CatchInterrupt(text) => {
                self.on_interrupt = OnInterrupt::Catch(text.clone());
                None
            }
            Step::Repeat { times, body } => {
                let mut n = 0;
                while times.is_none_or(|times| n < times) {
                    if let Some(end) = self.steps(body, Some(n)).await {
                        return Some(end);
                    }
                    if let Some(end) = self.checkpoint().await {
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
            Step::File { name, content } => {
                self.workspace.insert(name.clone(), content.clone());
                None
            }
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
            let (limit_at, limit_end) = self.limit();
            tokio::select! {
                () = self.cancel.cancelled(), if !self.cancelled => {
                    self.cancelled = true;
                    return Some(End::Killed(Reason::Killed));
                }
                item = recv(&mut self.input), if input_open => match self.take(item).await {
                    Taken::End(end) => return Some(end),
                    Taken::Moved if for_input => return None,
                    Taken::Moved | Taken::Nothing => {}
                },
                () = tokio::time::sleep_until(limit_at) => return Some(limit_end),
                () = sleep_until_some(idle_at) => {
                    return Some(End::Killed(Reason::IdleTimeout));
                }
                () = sleep_until_some(until) => return None,
            }
        }
    }

    /// Between two steps of a loop (a `repeat`, a `flood`): takes what
    /// came meanwhile and checks the limits, without waiting on a timer
    /// (a loop of many short steps runs at once). `Some` when the stage
    /// must end.
    async fn checkpoint(&mut self) -> Option<End> {
        tokio::task::yield_now().await;
        if !self.cancelled && self.cancel.is_cancelled() {
            self.cancelled = true;
            return Some(End::Killed(Reason::Killed));
        }
        while let Some(receiver) = self.input.as_mut() {
            let item = match receiver.try_recv() {
                Ok(item) => Some(item),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => break,
            };
            if let Taken::End(end) = self.take(item).await {
                return Some(end);
            }
        }
        let now = tokio::time::Instant::now();
        let (limit_at, limit_end) = self.limit();
        if now >= limit_at {
            return Some(limit_end);
        }
        if self
            .idle
            .is_some_and(|idle| now >= self.last_activity + idle)
        {
            return Some(End::Killed(Reason::IdleTimeout));
        }
        None
    }

    /// The wall limit and how it ends the stage (the sandbox's kill), or
    /// the job's deadline when it comes first (the host's cut).
    fn limit(&self) -> (tokio::time::Instant, End) {
        if self.deadline < self.stage_deadline {
            (self.deadline, End::Cut)
        } else {
            (self.stage_deadline, End::Killed(Reason::WallTimeout))
        }
    }

    /// Takes one input of the job (`None`: its channel closed).
    async fn take(&mut self, item: Option<JobInput>) -> Taken {
        match item {
            Some(JobInput::Stdin(data)) => {
                self.stdin.extend_from_slice(&data);
                self.last_activity = tokio::time::Instant::now();
                Taken::Moved
            }
            Some(JobInput::StdinClose) => {
                self.stdin_closed = true;
                self.last_activity = tokio::time::Instant::now();
                Taken::Moved
            }
            Some(JobInput::Signal(SignalKind::Kill)) => Taken::End(End::Killed(Reason::Killed)),
            Some(JobInput::Signal(SignalKind::Interrupt)) => match self.on_interrupt.clone() {
                OnInterrupt::Ignore => Taken::Nothing,
                OnInterrupt::End => Taken::End(End::Signal("SIGINT".to_string())),
                OnInterrupt::Trap(text) => {
                    let end = self.out(text, true).await;
                    Taken::End(end.unwrap_or(End::Signal("SIGINT".to_string())))
                }
                OnInterrupt::Catch(text) => match self.out(text, false).await {
                    Some(end) => Taken::End(end),
                    None => Taken::Nothing,
                },
            },
            None => {
                self.input = None;
                Taken::Nothing
            }
        }
    }
}

/// What an input did to the program.
enum Taken {
    Nothing,
    /// Stdin moved: more of it, or its close.
    Moved,
    /// The stage ends.
    End(End),
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

/// The output files of `workspace` for `patterns`, answered as the
/// supervisor answers them (no caps: the session's are tested on its own).
fn collect(
    workspace: &std::collections::BTreeMap<String, Option<Vec<u8>>>,
    patterns: &[String],
) -> Vec<OutputEntry> {
    use code_runner::job::outputs::{glob_matches, is_glob};
    let mut entries = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for pattern in patterns {
        let matched: Vec<_> = workspace
            .iter()
            .filter(|(name, _)| {
                if is_glob(pattern) {
                    glob_matches(pattern, name)
                } else {
                    *name == pattern
                }
            })
            .collect();
        if matched.is_empty() {
            entries.push(OutputEntry::failed(
                Some(pattern.clone()),
                None,
                "not_found",
                format!("{pattern:?} does not exist in the working directory"),
            ));
        }
        for (name, content) in matched {
            match content {
                None => entries.push(OutputEntry::failed(
                    Some(pattern.clone()),
                    Some(name.clone()),
                    "not_regular_file",
                    format!("{name:?} is a symbolic link (links are not followed)"),
                )),
                Some(content) if seen.insert(name.clone()) => {
                    entries.push(OutputEntry::inline(name.clone(), content.clone()));
                }
                Some(_) => {}
            }
        }
    }
    entries
}
