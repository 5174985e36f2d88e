//! The `code-runner` binary run as a user runs it from a shell: to its
//! end, with what it printed ([`Ran`]), and stopped as Ctrl-C would stop it
//! if the test fails first ([`ChildGuard`]). Used by the CLI's tests with
//! Docker (`daemon::cli`) and without (`tools::cli`). [`CliHarness`] checks
//! that the containers the binary made on real sandboxes are gone.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use code_runner::sandbox::LABEL_WORKER;

use super::containers::{assert_none_left, docker, list_labelled, remove_labelled};
use super::{code_runner, drain, unix_ms};

/// What a finished command left.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` to its end (stdin is empty unless the command says otherwise).
pub fn run(mut command: Command) -> Ran {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the code-runner binary starts");
    finish(ChildGuard(Some(child)))
}

/// Waits (up to 60 s) for a guarded child to end, collecting its piped
/// stdout and stderr; a child still running at the deadline fails the test
/// (and the guard stops it).
pub fn finish(mut guard: ChildGuard) -> Ran {
    let stdout = drain(guard.child().stdout.take());
    let stderr = drain(guard.child().stderr.take());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = guard.child().try_wait().expect("waiting for code-runner") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "code-runner did not end within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&stderr.join().unwrap()).into_owned(),
    }
}

/// Stops a child that is still running when the test fails: SIGINT first
/// (the CLI then cancels its job and removes its container), SIGKILL if it
/// does not stop within 5 s.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("the child is guarded")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let Some(child) = self.0.as_mut() else { return };
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Tests of the `code-runner` binary run one at a time: the CLI names its own
/// worker (`cli-<uuid>`), so the only way to tell this test's containers from
/// another's is that no other CLI test runs meanwhile.
static CLI_SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Harness for tests that run the `code-runner` binary: the binary with a
/// clean environment, and a check that every container it created is gone.
pub struct CliHarness {
    /// Containers created by a CLI before this are not this test's.
    started_ms: u64,
    docker: bollard::Docker,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl CliHarness {
    pub async fn new() -> Self {
        let serial = CLI_SERIAL.lock().await;
        Self {
            started_ms: unix_ms(),
            docker: docker().await,
            _serial: serial,
        }
    }

    /// The `code-runner` binary with no `CODE_RUNNER_*` or `SANDBOX_RUNTIME`
    /// variable inherited from the environment the tests run in.
    pub fn command(&self) -> std::process::Command {
        code_runner()
    }

    /// Containers created by a `code-runner` CLI since this harness started.
    pub async fn leftovers(&self) -> Vec<String> {
        cli_containers_since(&self.docker, self.started_ms).await
    }

    /// Waits (up to 10 s) until no container created by the CLI during this
    /// test exists; fails the test with their ids otherwise.
    pub async fn assert_clean(&self) {
        assert_none_left("containers left behind by the CLI", async || {
            self.leftovers().await
        })
        .await;
    }
}

impl Drop for CliHarness {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        // The test failed, maybe with a CLI killed mid-run: remove what it left.
        let started_ms = self.started_ms;
        remove_labelled(LABEL_WORKER.to_string(), move |c| {
            created_by_cli_since(c, started_ms)
        });
    }
}

async fn cli_containers_since(docker: &bollard::Docker, since_ms: u64) -> Vec<String> {
    list_labelled(docker, LABEL_WORKER)
        .await
        .expect("docker lists containers")
        .into_iter()
        .filter(|c| created_by_cli_since(c, since_ms))
        .filter_map(|c| c.id)
        .collect()
}

/// Whether a `code-runner` CLI created the container at `since_ms` or later.
fn created_by_cli_since(container: &bollard::models::ContainerSummary, since_ms: u64) -> bool {
    let labels = container.labels.clone().unwrap_or_default();
    let by_cli = labels
        .get(LABEL_WORKER)
        .is_some_and(|w| w.starts_with("cli-"));
    let created = labels
        .get(code_runner::sandbox::LABEL_CREATED)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    by_cli && created >= since_ms
}
