//! What the integration test binaries share (each declares it with
//! `#[path = "../common/mod.rs"] mod common;`).
//!
//! Here: [`Harness`], the sandbox engine on the real dockerd and the runner
//! images. Every test gets its own worker id, so the containers it creates
//! carry a label only it uses; [`Harness`] removes whatever is left of them
//! when it is dropped (also when the test fails), and
//! [`Harness::assert_clean`] fails the test if anything was left behind by
//! the engine. [`CliHarness`] does the same for the `code-runner` binary's
//! own containers; the job and result helpers ([`job`], [`stdout`], …) and
//! the pollers ([`wait_for`], [`until`]) serve every binary.
//!
//! Beside it:
//!
//! | module | what |
//! |---|---|
//! | [`scripted`] | a scripted sandbox engine: no dockerd |
//! | [`in_process`] | a whole `code-runner` process inside the test, on the scripted engine |
//! | [`worker_world`] | a worker run in the test, on either engine, and its Redis |
//! | [`client`] | the API client of both kinds of process |
//! | [`logs`] | what a process run in the test logs (its tracing, captured) |
//! | [`daemon`] | the real binary as a child process (needs Docker for its sandboxes) |
//! | [`paths`] | [`on_every_start_path!`](paths::on_every_start_path): a test on each start path of a job |
//! | [`programs`] | programs in every language |
//! | [`containers`] | Docker for the harnesses: labelled containers and their removal |
//! | [`redis_server`], [`redis_tls`], [`proxy`] | a redis-server of one test, one that speaks only TLS, a proxy that cuts it off |
//! | [`cli`] | the binary run as from a shell, to its end; [`CliHarness`] |
//! | [`certs`], [`compat`], [`up_keys`] | a test CA; the Piston and Judge0 clients; `scripts/up`'s keys |
//!
//! Nothing here is a test: a `#[test]` in this folder would run once in
//! every binary.
#![allow(dead_code)]

pub mod certs;
pub mod cli;
pub mod client;
pub mod compat;
pub mod containers;
pub mod daemon;
pub mod in_process;
pub mod logs;
pub mod paths;
pub mod programs;
pub mod proxy;
#[path = "redis.rs"]
pub mod redis_server;
pub mod redis_tls;
pub mod s3;
pub mod scripted;
pub mod up_keys;
pub mod worker_world;

use std::time::{Duration, Instant};

#[allow(unused_imports)] // a test binary without CLI tests
pub use cli::CliHarness;
use code_runner::config::SandboxSettings;
use code_runner::job::StartKind;
use code_runner::job::limits::LimitPolicy;
use code_runner::job::limits::LimitsRequest;
use code_runner::job::{
    Encoding, FileSpec, JobResult, JobSpec, PreparedJob, prepare, runs_on, warm_runtime,
};
use code_runner::languages::LanguageCatalog;
use code_runner::sandbox::pool::PoolSettings;
use code_runner::sandbox::{
    DockerEngine, JobIo, LABEL_WORKER, SandboxClass, SandboxEngine as _, WarmPool, WarmSpec,
};
use containers::{assert_none_left, containers_labelled, remove_labelled, sweep_later};

pub struct Harness {
    pub engine: DockerEngine,
    pub catalog: LanguageCatalog,
    pub policy: LimitPolicy,
    pub worker_id: String,
    /// How [`Harness::run`] starts a job's sandbox: `Cold` (a container
    /// made for it) or `Warm` (one a warm pool started before the job, of
    /// the job's own class).
    pub start: StartKind,
}

/// Settings as the CLI would have them with no flags and no environment.
pub fn default_settings(runtime: Option<&str>) -> SandboxSettings {
    SandboxSettings {
        runtime: Some(runtime.unwrap_or("runc").to_string()),
        seccomp_profile: None,
        seccomp_allow: None,
        languages_file: None,
        sandbox_cpus: 1.0,
        default_limits: None,
        max_limits: None,
        compile_default_limits: None,
        compile_max_limits: None,
        sandbox_uid_base: code_runner::sandbox::DEFAULT_UID_BASE,
        uid_lock_dir: code_runner::sandbox::DEFAULT_LOCK_DIR.into(),
        egress_dir: code_runner::sandbox::DEFAULT_EGRESS_DIR.into(),
        egress_runtime: None,
        egress_max_mb: 64,
        egress_max_connections: 256,
        test_egress_hosts: None,
        checker_cache_mb: code_runner::sandbox::DEFAULT_CHECKER_CACHE_MB,
    }
}

/// The catalog's file (`runner-images/languages.toml`) plus `cobol`, a
/// language whose image (`code-runner/does-not-exist`) no Docker has,
/// written as `languages.toml` into `dir`; its path (for
/// `CODE_RUNNER_LANGUAGES_FILE`).
pub fn catalog_with_cobol(dir: &std::path::Path) -> std::path::PathBuf {
    let mut text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("runner-images/languages.toml"),
    )
    .unwrap();
    text.push_str(
        "\n[[language]]\nid = \"cobol\"\nname = \"COBOL\"\nversion = \"3.1\"\n\
         image = \"code-runner/does-not-exist\"\nsource_file = \"main.cob\"\nrun = [\"cobc\"]\n",
    );
    let path = dir.join("languages.toml");
    std::fs::write(&path, text).unwrap();
    path
}

impl Harness {
    pub async fn new() -> Self {
        Self::with_runtime(None).await
    }

    pub async fn with_runtime(runtime: Option<&str>) -> Self {
        Self::with_settings(default_settings(runtime)).await
    }

    /// What a reaper needs, with this test's engine and catalog.
    pub fn reaper_handles(
        &self,
        store: code_runner::store::Store,
        metrics: code_runner::metrics::Metrics,
    ) -> code_runner::reaper::ReaperHandles {
        code_runner::reaper::ReaperHandles {
            store,
            engine: std::sync::Arc::new(self.engine.clone()),
            catalog: self.catalog.clone(),
            metrics,
            longest_wall: self.policy.longest_wall(),
        }
    }

    /// What a worker needs, with this test's engine and catalog.
    pub fn services(
        &self,
        store: code_runner::store::Store,
        metrics: code_runner::metrics::Metrics,
    ) -> code_runner::worker::Services {
        code_runner::worker::Services {
            store,
            engine: std::sync::Arc::new(self.engine.clone()),
            catalog: self.catalog.clone(),
            policy: self.policy.clone(),
            metrics,
            carried: None,
        }
    }

    pub fn prepare(&self, spec: &JobSpec) -> PreparedJob {
        prepare(spec, &self.catalog, &self.policy).expect("the test job is valid")
    }

    /// Runs a job to its end, on the harness's start path.
    pub async fn run(&self, spec: &JobSpec) -> JobResult {
        self.run_io(spec, JobIo::default()).await
    }

    /// Runs a job with `io` to its end, on the harness's start path: in
    /// warm mode through a warm pool holding one sandbox of the job's spec,
    /// ready before the job is given to it (and the result must say `warm`);
    /// in warm-runtime mode the same with the language's runtime started
    /// ahead (the result must say `warm_runtime` when the job runs on it:
    /// its language has one and its first stage fits, see `runs_on`).
    pub async fn run_io(&self, spec: &JobSpec, io: JobIo) -> JobResult {
        let job = self.prepare(spec);
        let job_id = uuid::Uuid::new_v4().to_string();
        if self.start == StartKind::Cold {
            return self.engine.run(&job_id, &job, io).await;
        }
        let pool = self.warm_pool(&job, 1).await;
        let warm = pool.claim(&job).await.expect("a ready warm sandbox");
        let outcome = self.engine.run_job(&job_id, &job, io, Some(warm)).await;
        pool.shutdown(Duration::from_secs(30)).await;
        outcome.cleanup.remove().await;
        let expected = match self.warm_spec(&job).runtime {
            Some(prestart) if job.tests.is_none() && runs_on(&prestart, &job.bundle) => {
                StartKind::WarmRuntime
            }
            _ => StartKind::Warm,
        };
        assert_eq!(
            outcome.result.start,
            Some(expected),
            "{:#?}",
            outcome.result
        );
        outcome.result
    }

    /// The spec a warm pool needs to serve `job` (on this harness's path:
    /// with the language's runtime started ahead in warm-runtime mode).
    pub fn warm_spec(&self, job: &PreparedJob) -> WarmSpec {
        WarmSpec {
            language: job.language.id.clone(),
            image: job.language.image_ref(),
            class: SandboxClass::of(&job.limits),
            runtime: if self.start == StartKind::WarmRuntime {
                warm_runtime(&job.language, 0)
            } else {
                None
            },
        }
    }

    /// A warm pool of this harness's engine holding `count` ready sandboxes
    /// for `job`'s spec; waits (up to 60 s) until they are ready.
    pub async fn warm_pool(&self, job: &PreparedJob, count: usize) -> WarmPool {
        let pool = WarmPool::start(&self.engine, pool_settings(count.max(1)));
        pool.set_targets(vec![(self.warm_spec(job), count)]);
        let mut status = pool.status();
        let language = job.language.id.clone();
        let ready =
            status.wait_for(|s| s.languages.get(&language).is_some_and(|l| l.ready >= count));
        tokio::time::timeout(Duration::from_secs(60), ready)
            .await
            .expect("the warm pool is ready within 60 s")
            .expect("the pool is alive");
        pool
    }

    /// Ids of the containers this test's engine created that still exist.
    pub async fn leftovers(&self) -> Vec<String> {
        let label = format!("{LABEL_WORKER}={}", self.worker_id);
        containers_labelled(self.engine.docker(), &label).await
    }

    /// Waits (up to 10 s) until no container of this test exists; fails the
    /// test with their ids otherwise.
    pub async fn assert_clean(&self) {
        assert_none_left("containers left behind", async || self.leftovers().await).await;
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Runs also when the test failed: remove what the test left.
        let label = format!("{LABEL_WORKER}={}", self.worker_id);
        remove_labelled(label.clone(), |_| true);
        // A job the test left starting may still be creating its container.
        sweep_later(&label);
    }
}

/// A job of one UTF-8 file.
/// A test pool's settings: at most `max` members living 10 minutes, two
/// starts at once, the served refill hold, no slot bound and no memory
/// reserve (change what a test needs with `..pool_settings(max)`).
pub fn pool_settings(max: usize) -> PoolSettings {
    PoolSettings {
        max,
        lifetime: Duration::from_secs(600),
        longest_job: Duration::from_secs(600),
        parallel_starts: 2,
        refill_hold: code_runner::worker::REFILL_HOLD,
        slots: None,
        memory_reserve: 0,
    }
}

/// What the store's submit checks a test's job against: a queue of 1000,
/// one attempt, no output or storage limit to speak of, the API's default
/// wall limit (10 s), weight 1, no per-user limit and no quotas.
pub fn admission() -> code_runner::store::Admission {
    code_runner::store::Admission {
        max_queue_depth: 1000,
        key_limit: None,
        max_attempts: 1,
        output_limit_bytes: 0,
        storage_budget: 1 << 40,
        wall_budget_ms: 10_000,
        weight: 1,
        user_limit: None,
        user_rate_per_minute: None,
        quotas: code_runner::store::Quotas::default(),
    }
}

pub fn job(language: &str, name: &str, source: &str) -> JobSpec {
    JobSpec {
        language: language.to_string(),
        files: vec![FileSpec {
            name: name.to_string(),
            content: source.to_string(),
            encoding: Encoding::Utf8,
            reference: None,
        }],
        ..Default::default()
    }
}

/// A job of one file with some limits set.
pub fn job_with_limits(language: &str, name: &str, source: &str, limits: LimitsRequest) -> JobSpec {
    JobSpec {
        limits,
        ..job(language, name, source)
    }
}

/// Stdout of the run stage as text.
pub fn stdout(result: &JobResult) -> String {
    let run = result
        .run
        .as_ref()
        .unwrap_or_else(|| panic!("no run stage: {result:#?}"));
    String::from_utf8_lossy(run.stdout.as_bytes()).into_owned()
}

/// Stderr of the run stage as text.
pub fn stderr(result: &JobResult) -> String {
    let run = result
        .run
        .as_ref()
        .unwrap_or_else(|| panic!("no run stage: {result:#?}"));
    String::from_utf8_lossy(run.stderr.as_bytes()).into_owned()
}

/// Whether runsc tests are enabled (scripts/test sets this when runsc is
/// registered with dockerd; CI always has it).
pub fn runsc_enabled() -> bool {
    std::env::var("CODE_RUNNER_TEST_RUNSC").is_ok_and(|v| v == "1")
}

/// A harness on runsc, or `None` (with a line saying so) when runsc tests
/// are not enabled.
pub async fn runsc_harness(test: &str) -> Option<Harness> {
    if !runsc_enabled() {
        println!("{test}: runsc tests are skipped (CODE_RUNNER_TEST_RUNSC is not 1)");
        return None;
    }
    Some(Harness::with_runtime(Some("runsc")).await)
}

/// A harness per runtime to test: runc always, runsc when enabled (with a
/// line saying so when it is not).
pub async fn harness_per_runtime(test: &str) -> Vec<(&'static str, Harness)> {
    let mut list = vec![("runc", Harness::new().await)];
    if runsc_enabled() {
        list.push(("runsc", Harness::with_runtime(Some("runsc")).await));
    } else {
        println!("{test}: runsc part skipped (CODE_RUNNER_TEST_RUNSC is not 1)");
    }
    list
}

use code_runner::sandbox::SandboxEvent;

impl Harness {
    /// A harness whose engine is built from `settings` (another language
    /// catalog, other limits). The worker id is still this test's own.
    pub async fn with_settings(settings: SandboxSettings) -> Self {
        init_tracing();
        let worker_id = format!("test-{}", uuid::Uuid::new_v4());
        containers::note_worker(&worker_id);
        let setup = settings
            .build(&worker_id)
            .expect("the test's settings are valid");
        let engine = DockerEngine::connect(setup.sandbox)
            .await
            .expect("dockerd must be running for the integration tests (scripts/test starts it)");
        Self {
            engine,
            catalog: setup.catalog,
            policy: setup.policy,
            worker_id,
            start: StartKind::Cold,
        }
    }

    /// The same harness, running jobs on the `start` path.
    pub fn on(mut self, start: StartKind) -> Self {
        self.start = start;
        self
    }

    /// Runs a job to its end and returns its result with every event it
    /// streamed, in order.
    pub async fn run_collecting(&self, spec: &JobSpec) -> (JobResult, Vec<SandboxEvent>) {
        let (events_tx, mut events_rx) = tokio::sync::mpsc::channel(16);
        let io = JobIo {
            events: Some(events_tx),
            ..Default::default()
        };
        let collect = async {
            let mut events = Vec::new();
            while let Some(event) = events_rx.recv().await {
                events.push(event);
            }
            events
        };
        // The sender lives in `io`, which the run drops when it ends, so the
        // collector sees the end of the channel right after the result.
        let (result, events) = tokio::join!(self.run_io(spec, io), collect);
        (result, events)
    }

    /// Waits (up to `within`) until a container of this test exists; returns
    /// its id.
    pub async fn wait_for_container(&self, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(id) = self.leftovers().await.into_iter().next() {
                return id;
            }
            if Instant::now() > deadline {
                panic!("no container of this test appeared within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A Python job (`main.py`).
pub fn python(source: &str) -> JobSpec {
    job("python", "main.py", source)
}

/// Run-stage stdout lines of a result, for exact comparison.
pub fn stdout_lines(result: &JobResult) -> Vec<String> {
    stdout(result).lines().map(str::to_string).collect()
}

/// Receives the next event, failing the test if none comes before `deadline`.
pub async fn next_event(
    events: &mut tokio::sync::mpsc::Receiver<SandboxEvent>,
    deadline: Instant,
) -> Option<SandboxEvent> {
    let left = deadline.saturating_duration_since(Instant::now());
    tokio::time::timeout(left, events.recv())
        .await
        .unwrap_or_else(|_| panic!("no event before the deadline"))
}

/// Unix time in milliseconds.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Waits until a UTC midnight is at least `within` away, so that a test
/// reading "today's" ledger, quotas or statistics does not see the day turn
/// halfway (the day is the server's clock's; tests cannot move it). Near
/// midnight this sleeps past it, at most `within` plus a second.
pub async fn clear_of_utc_midnight(within: Duration) {
    const DAY_MS: u64 = 86_400_000;
    let to_midnight = DAY_MS - unix_ms() % DAY_MS;
    let within_ms = within.as_millis() as u64;
    if to_midnight < within_ms {
        eprintln!("waiting {to_midnight} ms for UTC midnight to pass before a ledger-day test");
        tokio::time::sleep(Duration::from_millis(to_midnight + 1000)).await;
    }
}

/// The `code-runner` binary with no `CODE_RUNNER_*` or `SANDBOX_RUNTIME`
/// variable inherited from the environment the tests run in.
pub fn code_runner() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_code-runner"));
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.starts_with("CODE_RUNNER_") || text == "SANDBOX_RUNTIME" {
            command.env_remove(&name);
        }
    }
    command.stdin(std::process::Stdio::null());
    command
}

/// Reads a pipe to its end on a thread of its own.
pub fn drain(
    pipe: Option<impl std::io::Read + Send + 'static>,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut data = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut data);
        }
        data
    })
}

/// Writes a source file into `dir`.
pub fn source(dir: &std::path::Path, name: &str, content: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

/// Logs of the code under test, shown for failed tests (`TEST_LOG` filters).
/// By default they include what each sandbox's supervisor said on its
/// stderr (logged at debug by the session): why a warm runtime was not
/// used, say, which a result alone does not tell.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TEST_LOG")
                .unwrap_or_else(|_| "code_runner=info,code_runner::sandbox::session=debug".into()),
        )
        .try_init();
}

/// Polls `probe` every 50 ms until it returns `Some`, failing the test with
/// `what` after `within`.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `probe` every 100 ms until its value satisfies `done`, for at most
/// `within`; returns the last value either way, for the caller to assert on
/// (so that a failure shows what was seen, not only that time ran out).
pub async fn until<T, F, Fut>(within: Duration, mut probe: F, done: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + within;
    loop {
        let value = probe().await;
        if done(&value) || Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The API's configuration for an in-process test server on `store`:
/// the embedded catalog, the default limits, no engine; a test sets what it
/// needs otherwise (`ApiConfig { max_queue_depth: 10, ..api_config(…) }`).
pub fn api_config(
    store: code_runner::store::Store,
    keys: code_runner::api::ApiKeys,
    tokens: code_runner::api::TokenSigner,
) -> code_runner::api::ApiConfig {
    code_runner::api::ApiConfig {
        store,
        catalog: LanguageCatalog::embedded().unwrap(),
        policy: LimitPolicy::default(),
        keys,
        metrics: code_runner::metrics::Metrics::new().unwrap(),
        max_queue_depth: 1000,
        max_body_bytes: 64 << 10,
        max_wait: Duration::from_secs(10),
        tokens,
        engine: None,
        draining: tokio_util::sync::CancellationToken::new(),
        carried: None,
        limits: code_runner::api::ApiLimits::default(),
    }
}

/// Asserts what every 429 and 503 body says beside its `code` and message:
/// the `reason` (the label it is counted under in
/// `code_runner_submissions_rejected_total`), the `Retry-After` seconds
/// (`retry_after`, the header's) again as `retry_after_secs`, and for a
/// limit `(setting, value, counted)`; `None`: the body names no limit.
pub fn assert_refusal_detail(
    body: &serde_json::Value,
    retry_after: u64,
    reason: &str,
    limit: Option<(&str, u64, u64)>,
) {
    let error = &body["error"];
    assert_eq!(error["reason"], reason, "{body:#}");
    assert_eq!(error["retry_after_secs"], retry_after, "{body:#}");
    match limit {
        Some((setting, value, counted)) => {
            let named = &error["limit"];
            assert_eq!(named["setting"], setting, "{body:#}");
            assert_eq!(named["value"], value, "{body:#}");
            assert_eq!(named["counted"], counted, "{body:#}");
            assert!(
                named["unit"].as_str().is_some_and(|unit| !unit.is_empty()),
                "{body:#}"
            );
        }
        None => assert!(error.get("limit").is_none(), "{body:#}"),
    }
}

/// Plays a worker through the queue's own operations: claims the next
/// queued job for `worker` and starts it (a deadline a minute away); its id.
pub async fn claim_and_start(store: &code_runner::store::Store, worker: &str) -> String {
    let mut conn = store.dedicated().await.unwrap();
    let id = store
        .jobs()
        .claim(&mut conn, worker)
        .await
        .unwrap()
        .expect("a queued job");
    match store
        .jobs()
        .start(&id, worker, "test-host", true, Duration::from_secs(60))
        .await
        .unwrap()
    {
        code_runner::store::StartOutcome::Start { .. } => id,
        other => panic!("the job did not start: {other:?}"),
    }
}
