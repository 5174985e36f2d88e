//! Shared harness for the integration tests: a real dockerd, real images.
//!
//! Every test gets its own worker id, so the containers it creates carry a
//! label only it uses; [`Harness`] removes whatever is left of them when it is
//! dropped (also when the test fails), and [`Harness::assert_clean`] fails the
//! test if anything was left behind by the engine.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use bollard::query_parameters::ListContainersOptions;
use code_runner::config::SandboxSettings;
use code_runner::job::limits::LimitsRequest;
use code_runner::job::{Encoding, FileSpec, JobResult, JobSpec, PreparedJob, prepare};
use code_runner::languages::LanguageCatalog;
use code_runner::job::limits::LimitPolicy;
use code_runner::sandbox::{JobIo, LABEL_WORKER, SandboxEngine, force_remove};

pub struct Harness {
    pub engine: SandboxEngine,
    pub catalog: LanguageCatalog,
    pub policy: LimitPolicy,
    pub worker_id: String,
}

/// Settings as the CLI would have them with no flags and no environment.
pub fn default_settings(runtime: Option<&str>) -> SandboxSettings {
    SandboxSettings {
        runtime: Some(runtime.unwrap_or("runc").to_string()),
        seccomp_profile: None,
        languages_file: None,
        sandbox_cpus: 1.0,
        default_limits: None,
        max_limits: None,
        compile_default_limits: None,
        compile_max_limits: None,
    }
}

impl Harness {
    pub async fn new() -> Self {
        Self::with_runtime(None).await
    }

    pub async fn with_runtime(runtime: Option<&str>) -> Self {
        let worker_id = format!("test-{}", uuid::Uuid::new_v4());
        let setup = default_settings(runtime)
            .build(&worker_id)
            .expect("default settings are valid");
        let engine = SandboxEngine::connect(setup.sandbox)
            .await
            .expect("dockerd must be running for the integration tests (scripts/test starts it)");
        Self {
            engine,
            catalog: setup.catalog,
            policy: setup.policy,
            worker_id,
        }
    }

    pub fn prepare(&self, spec: &JobSpec) -> PreparedJob {
        prepare(spec, &self.catalog, &self.policy).expect("the test job is valid")
    }

    /// Runs a job to its end.
    pub async fn run(&self, spec: &JobSpec) -> JobResult {
        let job = self.prepare(spec);
        let job_id = uuid::Uuid::new_v4().to_string();
        self.engine.run(&job_id, &job, JobIo::default()).await
    }

    /// Ids of the containers this test's engine created that still exist.
    pub async fn leftovers(&self) -> Vec<String> {
        let filters = std::collections::HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_WORKER}={}", self.worker_id)],
        )]);
        let options = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        self.engine
            .docker()
            .list_containers(Some(options))
            .await
            .expect("docker lists containers")
            .into_iter()
            .filter_map(|c| c.id)
            .collect()
    }

    /// Waits (up to 10 s) until no container of this test exists; fails the
    /// test with their ids otherwise.
    pub async fn assert_clean(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.leftovers().await;
            if left.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                panic!("containers left behind: {left:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Runs also when the test failed: remove what the test left, from a
        // thread of its own because the test's runtime may be gone.
        let worker_id = self.worker_id.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async move {
                let docker = bollard::Docker::connect_with_defaults().ok()?;
                let filters = std::collections::HashMap::from([(
                    "label".to_string(),
                    vec![format!("{LABEL_WORKER}={worker_id}")],
                )]);
                let options = ListContainersOptions {
                    all: true,
                    filters: Some(filters),
                    ..Default::default()
                };
                for container in docker.list_containers(Some(options)).await.ok()? {
                    if let Some(id) = container.id {
                        let _ = force_remove(&docker, &id).await;
                    }
                }
                Some(())
            })
        })
        .join();
    }
}

/// A job of one UTF-8 file.
pub fn job(language: &str, name: &str, source: &str) -> JobSpec {
    JobSpec {
        language: language.to_string(),
        files: vec![FileSpec {
            name: name.to_string(),
            content: source.to_string(),
            encoding: Encoding::Utf8,
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
    let run = result.run.as_ref().unwrap_or_else(|| panic!("no run stage: {result:#?}"));
    String::from_utf8_lossy(run.stdout.as_bytes()).into_owned()
}

/// Stderr of the run stage as text.
pub fn stderr(result: &JobResult) -> String {
    let run = result.run.as_ref().unwrap_or_else(|| panic!("no run stage: {result:#?}"));
    String::from_utf8_lossy(run.stderr.as_bytes()).into_owned()
}

/// Whether runsc tests are enabled (scripts/test sets this when runsc is
/// registered with dockerd; CI always has it).
pub fn runsc_enabled() -> bool {
    std::env::var("CODE_RUNNER_TEST_RUNSC").is_ok_and(|v| v == "1")
}
