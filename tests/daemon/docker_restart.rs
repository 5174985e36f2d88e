//! dockerd restarted during a run: the job that was running
//! settles as `error` with a message that says what happened, none of its
//! containers is left, `/readyz` follows Docker's state (a `serve`'s and a
//! `reaper`'s), and the same `serve` process runs the next job, without a
//! restart.
//!
//! This stops the machine's dockerd (the one in /var/run/docker.pid) and
//! starts it again the one way the project does (`ensure_dockerd` of
//! scripts/lib/services.sh), so it needs root. Nothing else may run while
//! dockerd is down: `.config/nextest.toml` runs this test alone (under plain
//! `cargo test`, run it alone too: `cargo test --test daemon docker_restart`).
//! Whatever happens, [`DockerdGuard`] leaves dockerd running.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::containers::{docker, processes};
use common::daemon::{self, DaemonBuilder, POLL, Role, job_containers, run_stdout};
use common::redis_server::RedisServer;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::StatusCode;
use serde_json::{Value, json};

const DOCKER_PID_FILE: &str = "/var/run/docker.pid";
/// dockerd stops its containers (10 s stop timeout) and shuts down (15 s).
const DOCKERD_STOP: Duration = Duration::from_secs(60);
/// After dockerd answers again, how long the daemon may take to notice.
const RECOVERY: Duration = Duration::from_secs(30);

/// The repository root, where scripts/lib/services.sh is.
fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `docker info` answers.
fn docker_up() -> bool {
    Command::new("docker")
        .arg("info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts dockerd as the project does; returns the script's output and
/// whether it succeeded.
fn ensure_dockerd() -> (bool, String) {
    let output = Command::new("bash")
        .args(["-c", "source scripts/lib/services.sh && ensure_dockerd"])
        .current_dir(repo_root())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("bash runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Leaves dockerd running whatever the test did: when dropped (also on a
/// failure), starts it with `ensure_dockerd` if `docker info` fails.
struct DockerdGuard;

impl Drop for DockerdGuard {
    fn drop(&mut self) {
        if docker_up() {
            return;
        }
        eprintln!("dockerd is not answering; starting it again (ensure_dockerd)");
        let (ok, text) = ensure_dockerd();
        eprintln!("ensure_dockerd ok={ok}:\n{text}");
    }
}

/// The pid in /var/run/docker.pid, checked to be a running dockerd.
fn dockerd_pid() -> i32 {
    let text = std::fs::read_to_string(DOCKER_PID_FILE)
        .unwrap_or_else(|e| panic!("{DOCKER_PID_FILE}: {e}"));
    let pid: i32 = text
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{DOCKER_PID_FILE} holds {text:?}: {e}"));
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "dockerd", "pid {pid} of {DOCKER_PID_FILE}");
    pid
}

/// The process exists and is not a zombie.
fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S …`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// `GET /readyz`: status and body.
async fn readyz(daemon: &daemon::Daemon) -> (StatusCode, Value) {
    let answer = daemon.get("/readyz", None).await;
    (answer.status, answer.body)
}

/// Polls `/readyz` until it answers `status`; fails the test after `within`.
async fn wait_readyz(daemon: &daemon::Daemon, status: StatusCode, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let (now, body) = readyz(daemon).await;
        if now == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz did not answer {status} within {within:?}; last: {now} {body:#}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the job's container runs a process whose command line
/// contains `command` (the stage is running, not only the supervisor).
async fn wait_process(docker: &bollard::Docker, id: &str, command: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        for container in job_containers(docker, id).await {
            if processes(docker, &container)
                .await
                .iter()
                .any(|row| row.contains(command))
            {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "job {id}: no `{command}` running in its container within {within:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test]
async fn dockerd_restarted_during_a_run() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test stops and starts dockerd: run it as root"
    );
    let _guard = DockerdGuard;
    assert!(docker_up(), "dockerd must be running before the test");

    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let daemon_pid = daemon.pid();
    wait_readyz(&daemon, StatusCode::OK, RECOVERY).await;
    // A reaper on its own: its /readyz checks Docker too (and no image).
    let reaper = DaemonBuilder::new(Role::Reaper, &redis).start().await;
    wait_readyz(&reaper, StatusCode::OK, RECOVERY).await;

    // A job that is running in its container when dockerd goes away.
    let mut job = daemon::job("bash", "main.sh", "echo started\nsleep 30\necho never\n");
    job["limits"] = json!({"wall_ms": 60000});
    let answer = daemon.submit(&job).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
    let id = answer.id();
    daemon
        .wait_status(&id, &["running"], Duration::from_secs(30))
        .await;
    {
        let docker = docker().await;
        wait_process(&docker, &id, "sleep 30", Duration::from_secs(30)).await;
    }

    // Stop dockerd: SIGTERM to its pid, then wait until that pid is gone.
    let old_pid = dockerd_pid();
    let stopping = Instant::now();
    kill(Pid::from_raw(old_pid), Signal::SIGTERM).expect("SIGTERM to dockerd");
    while process_alive(old_pid) {
        assert!(
            stopping.elapsed() < DOCKERD_STOP,
            "dockerd (pid {old_pid}) did not exit within {DOCKERD_STOP:?} of SIGTERM"
        );
        tokio::time::sleep(POLL).await;
    }
    eprintln!(
        "dockerd pid {old_pid} exited {:?} after SIGTERM",
        stopping.elapsed()
    );

    // While it is down, /readyz says so, with the docker check failing.
    let body = wait_readyz(&daemon, StatusCode::SERVICE_UNAVAILABLE, RECOVERY).await;
    assert_eq!(body["ready"], false, "{body:#}");
    let failing = body["failing"].as_array().expect("a failing list");
    let docker_check = failing
        .iter()
        .find(|c| c["check"] == "docker")
        .unwrap_or_else(|| panic!("no failing docker check: {body:#}"));
    assert!(
        docker_check["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body:#}"
    );
    assert!(
        failing.iter().all(|c| c["check"] != "redis"),
        "redis is up: {body:#}"
    );
    eprintln!("/readyz while dockerd is down: {body}");
    let body = wait_readyz(&reaper, StatusCode::SERVICE_UNAVAILABLE, RECOVERY).await;
    let checks: Vec<&str> = body["failing"]
        .as_array()
        .expect("a failing list")
        .iter()
        .filter_map(|c| c["check"].as_str())
        .collect();
    assert_eq!(checks, ["docker"], "the reaper's /readyz: {body:#}");

    // A job submitted while Docker is down waits in the queue: the worker
    // does not claim what it could only fail.
    let answer = daemon
        .submit(&daemon::job(
            "bash",
            "main.sh",
            "echo submitted while docker was down\n",
        ))
        .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
    let waiting = answer.id();
    let window = Instant::now() + Duration::from_secs(2);
    while Instant::now() < window {
        let view = daemon.job(&waiting).await;
        assert_eq!(
            view["status"], "queued",
            "claimed while docker was down: {view:#}"
        );
        tokio::time::sleep(daemon::POLL).await;
    }

    // Start it again, the one way the project does.
    let starting = Instant::now();
    let (ok, text) = ensure_dockerd();
    assert!(ok, "ensure_dockerd failed:\n{text}");
    assert!(
        docker_up(),
        "ensure_dockerd succeeded but `docker info` fails"
    );
    let answered = Instant::now();
    let new_pid = dockerd_pid();
    assert_ne!(new_pid, old_pid, "dockerd was not restarted");
    eprintln!(
        "dockerd pid {new_pid} answered {:?} after ensure_dockerd started:\n{text}",
        starting.elapsed()
    );

    // The job that was running ends as an error that says what happened.
    let view = daemon.wait_terminal(&id, RECOVERY).await;
    eprintln!(
        "job {id} settled {:?} after SIGTERM to dockerd: {view}",
        stopping.elapsed()
    );
    assert_eq!(view["status"], "error", "{view:#}");
    assert_eq!(view["result"]["status"], "error", "{view:#}");
    let message = view["result"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no result.error: {view:#}"));
    assert_eq!(message, EXPECTED_ERROR, "{view:#}");
    // What the program wrote before it was stopped is kept.
    assert_eq!(view["result"]["run"]["stdout"], "started\n", "{view:#}");
    assert_eq!(view["result"]["run"]["reason"], "killed", "{view:#}");

    // None of its containers is left.
    let docker = docker().await;
    daemon.assert_no_containers(&docker).await;
    assert!(job_containers(&docker, &id).await.is_empty());
    eprintln!(
        "no container of job {id} left, {:?} after dockerd answered",
        answered.elapsed()
    );

    // The job that waited while Docker was down runs now.
    let view = daemon
        .wait_terminal(&waiting, Duration::from_secs(60))
        .await;
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(
        run_stdout(&view),
        "submitted while docker was down\n",
        "{view:#}"
    );
    assert_eq!(view["attempts"], 1, "{view:#}");

    // The same processes are ready again, and the serve process runs the
    // next job.
    wait_readyz(&daemon, StatusCode::OK, RECOVERY).await;
    wait_readyz(&reaper, StatusCode::OK, RECOVERY).await;
    eprintln!(
        "/readyz 200 again, {:?} after dockerd answered",
        answered.elapsed()
    );
    let answer = daemon
        .submit(&daemon::job(
            "bash",
            "main.sh",
            "echo back after the restart\n",
        ))
        .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
    let next = answer.id();
    let view = daemon.wait_terminal(&next, Duration::from_secs(60)).await;
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(run_stdout(&view), "back after the restart\n", "{view:#}");
    daemon.assert_no_containers(&docker).await;

    assert_eq!(daemon.pid(), daemon_pid);
    assert!(
        process_alive(i32::try_from(daemon_pid).unwrap()),
        "the serve process ended; log:\n{}",
        daemon.log()
    );
    // The worker's four claim loops each saw Docker go and come back; the
    // log says each once.
    let log = daemon.log();
    for line in [
        "docker does not answer; not claiming jobs until it does",
        "docker answers again; claiming jobs",
    ] {
        assert_eq!(log.matches(line).count(), 1, "{line:?} in the log:\n{log}");
    }
}

/// The result's `error` of a job whose dockerd went away mid-run.
const EXPECTED_ERROR: &str = "dockerd stopped the sandbox while stage run was running (docker is not answering: dockerd shut down or is restarting)";
