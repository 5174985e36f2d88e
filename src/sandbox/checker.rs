//! A graded job's checker program, in a sandbox of its own: the program
//! being graded never shares a container with it, its source, the tests'
//! inputs or the expected outputs. The checker's sandbox (labelled
//! `code-runner.checker`) is started beside the program's, compiles the
//! checker once, then runs it once per check with three files (`input`,
//! `output`, `answer`) written fresh for that check and removed after it
//! (the supervisor's run plan).
//!
//! A checker with a compile stage is compiled once per worker and API key:
//! the files its compile left are read back and kept in the worker's
//! [`CheckerCache`](checker_cache::CheckerCache), and the next checker of the same key starts with them
//! and no compile stage (see `checker_cache`).
//!
//! [`Checker::start`] spawns a task that owns the sandbox; [`Checker::check`]
//! sends it one check and waits for the answer; [`Checker::usage`] sums
//! what its stages reported (the job's ledger counts it). Dropping the
//! [`Checker`] ends the task as soon as its sandbox has started, even in the
//! checker's compile, and the task removes the container.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bollard::Docker;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::SandboxConfig;
use super::checker_cache::{self, CacheKey, Lookup};
use super::config::GvisorLimits;
use super::connection::{Connection, StartFailure, start};
use super::container::{ContainerGuard, SandboxClass, SandboxShape, container_name};
use super::uids::{UidRange, runs_uid};
use crate::job::deadline;
use crate::job::grading::CheckerUsage;
use crate::job::{PreparedJob, RUN_FILES_DIR, scratch_mounts};
use crate::protocol::{
    BundleFile, HostMessage, Reason, RunPlan, RunSpec, SandboxMessage, StageSpec,
};

/// Most bytes of a checker's stdout and stderr kept for its answer.
const CHECKER_OUTPUT_BYTES: u64 = 64 * 1024;

/// What the checker said about one test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckAnswer {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Reason,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

struct CheckRequest {
    input: Vec<u8>,
    output: Vec<u8>,
    answer: Vec<u8>,
    reply: oneshot::Sender<Result<CheckAnswer, String>>,
}

/// Handle to a checker's sandbox.
pub struct Checker {
    requests: mpsc::Sender<CheckRequest>,
    /// What the checker's stages reported so far.
    usage: Arc<Mutex<CheckerUsage>>,
    /// Stops the task (and so removes the sandbox) when the handle goes.
    _stop: DropGuard,
}

impl Checker {
    /// Starts the checker's sandbox for `job_id` of `tenant` (in the
    /// background).
    pub(super) fn start(
        docker: &Docker,
        config: &SandboxConfig,
        uids: &UidRange,
        job_id: &str,
        tenant: &str,
        checker: &PreparedJob,
        deadline_ms: u64,
    ) -> Self {
        let (requests, receiver) = mpsc::channel(1);
        let usage = Arc::new(Mutex::new(CheckerUsage::default()));
        let stop = CancellationToken::new();
        tokio::spawn(serve(
            docker.clone(),
            config.clone(),
            uids.clone(),
            job_id.to_string(),
            checker.clone(),
            deadline_ms,
            Task {
                requests: receiver,
                usage: usage.clone(),
                stop: stop.clone(),
                tenant: tenant.to_string(),
            },
        ));
        Self {
            requests,
            usage,
            _stop: stop.drop_guard(),
        }
    }

    /// What the checker's compile stage and its checks reported so far.
    pub fn usage(&self) -> CheckerUsage {
        *self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the checker on one test; `Err` says why it could not.
    pub async fn check(
        &self,
        input: &[u8],
        output: &[u8],
        answer: &[u8],
    ) -> Result<CheckAnswer, String> {
        let (reply, answered) = oneshot::channel();
        let request = CheckRequest {
            input: input.to_vec(),
            output: output.to_vec(),
            answer: answer.to_vec(),
            reply,
        };
        self.requests
            .send(request)
            .await
            .map_err(|_| "the checker's sandbox is gone".to_string())?;
        answered
            .await
            .map_err(|_| "the checker's sandbox ended without answering".to_string())?
    }
}

/// What the checker task holds besides its sandbox's settings.
struct Task {
    requests: mpsc::Receiver<CheckRequest>,
    usage: Arc<Mutex<CheckerUsage>>,
    /// Cancelled when the [`Checker`] handle is dropped.
    stop: CancellationToken,
    /// The job's API key (`""`: none), which scopes the compiled checkers
    /// kept.
    tenant: String,
}

/// The checker task: start, compile, then one run per request, until the
/// requests end or the handle is dropped.
async fn serve(
    docker: Docker,
    config: SandboxConfig,
    uids: UidRange,
    job_id: String,
    checker: PreparedJob,
    deadline_ms: u64,
    task: Task,
) {
    let Task {
        mut requests,
        usage,
        stop,
        tenant,
    } = task;
    let name = format!("{}-checker", container_name(&job_id));
    let lease = match uids.lease() {
        Ok(lease) => lease,
        Err(error) => {
            return refuse_all(&mut requests, format!("no uid for the checker: {error}")).await;
        }
    };
    let uid = lease.uid();
    let guard = ContainerGuard::new(docker.clone(), name, Some(lease));
    let shape = SandboxShape {
        image: checker.language.image_ref(),
        language: checker.language.id.clone(),
        class: SandboxClass::of(&checker.limits),
        uid,
        job_id: Some(job_id.clone()),
        created_ms: deadline::now_ms(),
        deadline_ms,
        checker: true,
        egress_dir: None,
    };
    // Its start is never cut short: a container whose creation is under
    // way when it is removed would be created after the removal, and left.
    // Once started, the job's end (its grader dropped the handle) stops it
    // at once: nobody waits for an answer, and a compile still running is
    // cut short.
    let outcome = match start(&docker, &config, &guard, &shape).await {
        Ok(mut connection) => {
            // The image the container runs, by id: a checker compiled
            // with another build of the language's image is not reused.
            // Only asked when a compile could be kept.
            let image =
                if checker.language.compile.is_some() && config.checker_cache.limit_bytes() > 0 {
                    image_id(&docker, guard.name()).await
                } else {
                    None
                };
            let session = session(
                &mut connection,
                &config,
                Checked {
                    checker: &checker,
                    tenant: &tenant,
                    image: image.as_deref(),
                    uid,
                    deadline_ms,
                },
                &mut requests,
                &usage,
            );
            tokio::select! {
                () = stop.cancelled() => Ok(()),
                outcome = session => outcome,
            }
        }
        Err(StartFailure(message)) => {
            Err(format!("the checker's sandbox did not start: {message}"))
        }
    };
    if let Err(message) = outcome {
        tracing::info!(job.id = %job_id, %message, "the checker failed");
        refuse_all(&mut requests, message).await;
    }
    guard.remove().await;
}

async fn refuse_all(requests: &mut mpsc::Receiver<CheckRequest>, message: String) {
    while let Some(request) = requests.recv().await {
        let _ = request.reply.send(Err(message.clone()));
    }
}

fn deadline_instant(deadline_ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::now() + deadline::until(deadline_ms)
}

/// Adds a stage's report to the checker's usage (`check`: one of the
/// checks, not the compile).
fn note(usage: &Mutex<CheckerUsage>, report: &crate::protocol::StageReport, check: bool) {
    let mut usage = usage.lock().unwrap_or_else(|e| e.into_inner());
    usage.cpu_ms += report.cpu_ms;
    usage.wall_ms += report.wall_ms;
    usage.checks += u32::from(check);
}

/// The checker a session serves, and for whom.
struct Checked<'a> {
    checker: &'a PreparedJob,
    tenant: &'a str,
    /// The id of the image its container runs; `None` (not known): no
    /// compiled checker is taken or kept.
    image: Option<&'a str>,
    uid: u32,
    deadline_ms: u64,
}

/// Speaks with the checker's supervisor until the requests end, answering
/// them and adding every stage's report to `usage`.
async fn session(
    connection: &mut Connection,
    config: &SandboxConfig,
    checked: Checked<'_>,
    requests: &mut mpsc::Receiver<CheckRequest>,
    usage: &Mutex<CheckerUsage>,
) -> Result<(), String> {
    let Checked {
        checker,
        tenant,
        image,
        uid,
        deadline_ms,
    } = checked;
    let deadline = deadline_instant(deadline_ms);
    let failed = |StartFailure(message)| message;
    let mut bundle = checker.bundle.clone();
    // The compiled checker from the cache, or a compile here to keep (the
    // wait for another checker's compile of the same key overlaps this
    // sandbox's start).
    // Known only for a checker with a compile stage (its bundle's first).
    let lead = match image {
        Some(image) => {
            let key = CacheKey::new(
                tenant,
                &checker.language.id,
                &checker.language.version,
                image,
                &bundle.stages[0],
                &bundle.files,
            );
            match compiled(&config.checker_cache, key, deadline).await? {
                Lookup::Hit(files) => {
                    bundle.files = files.to_vec();
                    bundle.stages.remove(0);
                    usage
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .compile_cached = true;
                    None
                }
                Lookup::Lead(lead) => Some(lead),
                Lookup::Off | Lookup::Wait(_) => None,
            }
        }
        None => None,
    };
    connection
        .await_ready(config.budget.start_timeout)
        .await
        .map_err(failed)?;
    let run = bundle.stages.pop().ok_or("the checker has no run stage")?;
    bundle.uid = uid;
    bundle.gid = uid;
    bundle.runs = Some(RunPlan {
        uid: runs_uid(uid),
        gid: runs_uid(uid),
        scratch: scratch_mounts(),
        files_dir: RUN_FILES_DIR.to_string(),
    });
    let gvisor = config.gvisor_limits(checker.limits.pids);
    for stage in &mut bundle.stages {
        GvisorLimits::apply(gvisor, &mut stage.limits);
    }
    let has_compile = !bundle.stages.is_empty();
    send(&connection.frames, HostMessage::Bundle(Box::new(bundle))).await?;
    if has_compile {
        let (report, _, stderr) = read_stage(connection, deadline, CHECKER_OUTPUT_BYTES).await?;
        note(usage, &report, false);
        if report.reason != Reason::Exited || report.exit_code != Some(0) {
            return Err(format!(
                "the checker did not compile ({}): {}",
                report.reason.as_str(),
                crate::job::grading::compare::preview(&stderr, 400)
            ));
        }
    }
    if let Some(lead) = lead {
        let mut pack = pack_stage(&run, &checker.bundle.workspace);
        GvisorLimits::apply(gvisor, &mut pack.limits);
        match read_back(connection, pack, deadline).await? {
            Ok(files) => lead.keep(files),
            Err(why) => tracing::info!(%why, "the compiled checker is not kept"),
        }
    }
    // Every check runs the same command, with the three files appended.
    let files = ["input", "output", "answer"];
    let mut check = StageSpec {
        name: "check".into(),
        argv: run
            .argv
            .iter()
            .cloned()
            .chain(files.iter().map(|f| format!("{RUN_FILES_DIR}/{f}")))
            .collect(),
        stdin: true,
        watch_input: false,
        limits: crate::protocol::StageLimits {
            output_bytes: CHECKER_OUTPUT_BYTES,
            ..run.limits
        },
        ..run
    };
    GvisorLimits::apply(gvisor, &mut check.limits);
    while let Some(request) = requests.recv().await {
        let stage = check.clone();
        let contents = [request.input, request.output, request.answer];
        let run_spec = RunSpec {
            stage,
            input: Vec::new(),
            files: files
                .iter()
                .zip(contents)
                .map(|(name, content)| BundleFile {
                    path: name.to_string(),
                    content,
                    executable: false,
                })
                .collect(),
        };
        let started = Instant::now();
        send(&connection.frames, HostMessage::Run(Box::new(run_spec))).await?;
        match read_stage(connection, deadline, CHECKER_OUTPUT_BYTES).await {
            Ok((report, stdout, stderr)) => {
                note(usage, &report, true);
                tracing::debug!(
                    took_ms = started.elapsed().as_millis() as u64,
                    "checked one test"
                );
                let _ = request.reply.send(Ok(CheckAnswer {
                    exit_code: report.exit_code,
                    signal: report.signal,
                    reason: report.reason,
                    stdout,
                    stderr,
                }));
            }
            Err(message) => {
                let _ = request.reply.send(Err(message.clone()));
                return Err(message);
            }
        }
    }
    let _ = connection.frames.send(HostMessage::RunsEnd.encode()).await;
    Ok(())
}

async fn send(frames: &mpsc::Sender<Vec<u8>>, message: HostMessage) -> Result<(), String> {
    frames
        .send(message.encode())
        .await
        .map_err(|_| "the checker's sandbox is gone".to_string())
}

/// The id of the image container `name` runs; `None` when Docker does not
/// say.
async fn image_id(docker: &Docker, name: &str) -> Option<String> {
    match docker
        .inspect_container(
            name,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
    {
        Ok(inspected) => inspected.image.filter(|id| !id.is_empty()),
        Err(error) => {
            tracing::info!(%error, "the checker's image is not known: its compile is not kept");
            None
        }
    }
}

/// What the cache says for `key`, after waiting (until `deadline`) for
/// another checker's compile of it: never [`Lookup::Wait`].
async fn compiled(
    cache: &checker_cache::CheckerCache,
    key: CacheKey,
    deadline: tokio::time::Instant,
) -> Result<Lookup, String> {
    loop {
        match cache.lookup(key) {
            Lookup::Wait(wait) => tokio::time::timeout_at(deadline, wait.done())
                .await
                .map_err(|_| {
                    "the job's time ran out while the checker's compile was under way in another job"
                        .to_string()
                })?,
            lookup => return Ok(lookup),
        }
    }
}

/// The stage that writes the checker's workspace to stdout as a tar archive
/// once it compiled (run as one of the runs, like a check).
fn pack_stage(run: &StageSpec, workspace: &str) -> StageSpec {
    StageSpec {
        name: "pack".into(),
        argv: [
            "/bin/tar",
            "--create",
            "--file=-",
            "--numeric-owner",
            "--directory",
            workspace,
            ".",
        ]
        .map(String::from)
        .to_vec(),
        stdin: false,
        watch_input: false,
        limits: crate::protocol::StageLimits {
            // One byte over what is kept: more is not kept.
            output_bytes: checker_cache::MAX_ENTRY_BYTES + 1,
            ..run.limits
        },
        ..run.clone()
    }
}

/// Runs `pack` and reads the compiled checker's files from its archive;
/// the inner `Err` says why they cannot be kept (the checker still serves),
/// the outer one that its sandbox failed.
async fn read_back(
    connection: &mut Connection,
    pack: StageSpec,
    deadline: tokio::time::Instant,
) -> Result<Result<Vec<crate::protocol::BundleFile>, String>, String> {
    let run_spec = RunSpec {
        stage: pack,
        input: Vec::new(),
        files: Vec::new(),
    };
    send(&connection.frames, HostMessage::Run(Box::new(run_spec))).await?;
    let cap = checker_cache::MAX_ENTRY_BYTES + 1;
    let (report, archive, stderr) = read_stage(connection, deadline, cap).await?;
    if report.reason != Reason::Exited || report.exit_code != Some(0) {
        return Ok(Err(format!(
            "reading it back ended {} (exit code {:?}): {}",
            report.reason.as_str(),
            report.exit_code,
            crate::job::grading::compare::preview(&stderr, 200)
        )));
    }
    if archive.len() as u64 >= cap {
        return Ok(Err(format!("its archive is more than {} bytes", cap - 1)));
    }
    Ok(checker_cache::files_of_archive(&archive))
}

/// Reads one stage of the checker: its output (each stream up to `cap`
/// bytes) and its report.
async fn read_stage(
    connection: &mut Connection,
    deadline: tokio::time::Instant,
    cap: u64,
) -> Result<(crate::protocol::StageReport, Vec<u8>, Vec<u8>), String> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        let message = connection
            .next(deadline)
            .await
            .map_err(|StartFailure(message)| format!("the checker's sandbox failed: {message}"))?;
        match message {
            SandboxMessage::StageStart(_) | SandboxMessage::InputWanted => {}
            SandboxMessage::Stdout(data) => keep(&mut stdout, &data, cap),
            SandboxMessage::Stderr(data) => keep(&mut stderr, &data, cap),
            SandboxMessage::StageEnd(report) => return Ok((report, stdout, stderr)),
            SandboxMessage::Fatal(fatal) => {
                return Err(format!(
                    "the checker's supervisor failed: {}",
                    fatal.message
                ));
            }
            SandboxMessage::Done => return Err("the checker's sandbox ended early".into()),
            SandboxMessage::Ready(_) => return Err("the checker's sandbox said ready twice".into()),
            SandboxMessage::OutputFile(_)
            | SandboxMessage::OutputData(_)
            | SandboxMessage::OutputError(_) => {
                return Err("the checker's sandbox sent output files it was not asked for".into());
            }
        }
    }
}

fn keep(into: &mut Vec<u8>, data: &[u8], cap: u64) {
    let room = (cap as usize).saturating_sub(into.len());
    into.extend_from_slice(&data[..data.len().min(room)]);
}
