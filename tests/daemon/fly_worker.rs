//! The Fly worker image (`deploy-fly/`), run as the local stand-in for a Fly
//! Machine: a docker-in-docker container with every capability but
//! SYS_RESOURCE, confinement off and the host's cgroups mounted (see
//! shared ENVIRONMENT notes), a named volume at `/data` as the Machine's volume,
//! and host networking so the worker inside reaches this test's redis-server
//! and exposes its `/readyz` on loopback. The inner dockerd runs the
//! sandboxes; the API runs on the host, as a client would use it.
//!
//! Slow (it builds the worker image: ~1 min with a warm Docker cache), so it
//! runs when `CODE_RUNNER_TEST_FLY_WORKER=1` (scripts/test sets it). The test
//! image carries only the python runner image (`--languages python`) to keep
//! CI short; the entrypoint treats one image or seven alike.
//!
//! Every container and volume it creates carries the label
//! `code-runner.test-fly=<uuid>` and is removed when the test ends, also when
//! it fails.

use crate::common;

use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::daemon::{self, Daemon, DaemonBuilder, Role};
use common::redis_server::{RedisServer, free_port};
use reqwest::StatusCode;

const ENABLE: &str = "CODE_RUNNER_TEST_FLY_WORKER";
const IMAGE: &str = "code-runner/worker-fly:test";
const LABEL: &str = "code-runner.test-fly";
/// Every capability but SYS_RESOURCE (outside this VM's bounding set, which
/// is why `--privileged` fails here).
const CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
];
/// Longest a boot may take before the test fails (the first one loads images).
const BOOT: Duration = Duration::from_secs(300);
/// Longest a drain may take (the job sleeps 4 s; the drain timeout is 30 s).
const DRAIN: Duration = Duration::from_secs(120);

fn enabled() -> bool {
    let on = std::env::var(ENABLE).is_ok_and(|v| v == "1");
    if !on {
        eprintln!("skipped: set {ENABLE}=1 to build and boot the Fly worker image");
    }
    on
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the docker client runs")
}

fn docker_ok(args: &[&str]) -> String {
    let output = docker(args);
    assert!(
        output.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Builds the test image once per test process: `deploy-fly/build-image` with
/// python only and this build's `code-runner` binary.
fn build_image() {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if *built {
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let started = Instant::now();
    let output = Command::new(format!("{root}/deploy-fly/build-image"))
        .args(["--languages", "python", "--tag", IMAGE])
        .args(["--binary", env!("CARGO_BIN_EXE_code-runner")])
        .stdin(Stdio::null())
        .output()
        .expect("deploy-fly/build-image runs");
    assert!(
        output.status.success(),
        "deploy-fly/build-image failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!(
        "worker image {IMAGE} built in {:.1} s:\n{}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&output.stdout)
    );
    *built = true;
}

/// What one test created in Docker, removed (by label) when dropped.
struct FlyStandIn {
    run: String,
    volume: String,
    redis_url: String,
    worker_id: String,
    listen: String,
}

impl FlyStandIn {
    fn new(redis: &RedisServer) -> Self {
        let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        Self {
            volume: format!("code-runner-fly-test-{run}"),
            redis_url: redis.url(),
            worker_id: format!("fly-test-{run}"),
            listen: format!("127.0.0.1:{}", free_port()),
            run,
        }
    }

    fn create_volume(&self) {
        docker_ok(&[
            "volume",
            "create",
            "--label",
            &format!("{LABEL}={}", self.run),
            &self.volume,
        ]);
    }

    /// `docker run -d` of the worker image as a Machine; `with_volume` mounts
    /// the test's volume at /data. Returns the container name.
    fn boot(&self, boot: u32, with_volume: bool) -> Machine {
        let name = format!("code-runner-fly-test-{}-{boot}", self.run);
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.clone()];
        args.extend(["--label".into(), format!("{LABEL}={}", self.run)]);
        for cap in CAPS {
            args.extend(["--cap-add".into(), (*cap).into()]);
        }
        for opt in [
            "seccomp=unconfined",
            "apparmor=unconfined",
            "systempaths=unconfined",
        ] {
            args.extend(["--security-opt".into(), opt.into()]);
        }
        args.extend(["-v".into(), "/sys/fs/cgroup:/sys/fs/cgroup:rw".into()]);
        if with_volume {
            args.extend(["-v".into(), format!("{}:/data", self.volume)]);
        }
        args.extend(["--network".into(), "host".into()]);
        for (k, v) in [
            ("CODE_RUNNER_REDIS_URL", self.redis_url.as_str()),
            ("CODE_RUNNER_WORKER_LISTEN", &self.listen),
            ("CODE_RUNNER_WORKER_ID", &self.worker_id),
            ("CODE_RUNNER_LOG", "info"),
        ] {
            args.extend(["-e".into(), format!("{k}={v}")]);
        }
        args.push(IMAGE.into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        docker_ok(&args);
        Machine {
            name,
            started,
            ready_url: format!("http://{}/readyz", self.listen),
        }
    }
}

impl Drop for FlyStandIn {
    fn drop(&mut self) {
        let filter = format!("label={LABEL}={}", self.run);
        let containers = docker(&["ps", "-aq", "--filter", &filter]);
        for id in String::from_utf8_lossy(&containers.stdout).split_whitespace() {
            if std::thread::panicking() {
                let logs = docker(&["logs", "--tail", "60", id]);
                eprintln!(
                    "--- last lines of container {id} ---\n{}{}",
                    String::from_utf8_lossy(&logs.stdout),
                    String::from_utf8_lossy(&logs.stderr)
                );
            }
            let _ = docker(&["rm", "-f", "-v", id]);
        }
        let volumes = docker(&["volume", "ls", "-q", "--filter", &filter]);
        for volume in String::from_utf8_lossy(&volumes.stdout).split_whitespace() {
            let _ = docker(&["volume", "rm", "-f", volume]);
        }
    }
}

/// One boot of the stand-in Machine.
struct Machine {
    name: String,
    started: Instant,
    ready_url: String,
}

impl Machine {
    fn logs(&self) -> String {
        let output = docker(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }

    fn running(&self) -> bool {
        docker(&["inspect", "-f", "{{.State.Running}}", &self.name]).stdout == b"true\n"
    }

    /// Polls the worker's `/readyz` until it answers 200; returns the time
    /// from `docker run` to ready. Fails with the logs if the container
    /// stops or does not get ready within [`BOOT`].
    async fn wait_ready(&self) -> Duration {
        let http = daemon::http_client();
        loop {
            if let Ok(response) = http.get(&self.ready_url).send().await
                && response.status() == StatusCode::OK
            {
                return self.started.elapsed();
            }
            assert!(
                self.running(),
                "the Machine stopped during boot:\n{}",
                self.logs()
            );
            assert!(
                self.started.elapsed() < BOOT,
                "not ready within {BOOT:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn signal(&self, signal: &str) {
        docker_ok(&["kill", "--signal", signal, &self.name]);
    }

    /// Waits for the container to end; returns its exit code.
    async fn wait_exit(&self, within: Duration) -> i64 {
        let deadline = Instant::now() + within;
        while self.running() {
            assert!(
                Instant::now() < deadline,
                "the Machine did not stop within {within:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        docker_ok(&["inspect", "-f", "{{.State.ExitCode}}", &self.name])
            .parse()
            .expect("an exit code")
    }

    fn remove(&self) {
        docker_ok(&["rm", &self.name]);
    }
}

/// A job that runs for 4 s is running when the signal comes; the worker
/// drains it to its result, the container exits 0 and dockerd was stopped.
async fn drain_on(signal: &str, machine: &Machine, api: &Daemon, worker_id: &str) {
    let answer = api.submit(&daemon::sleeper(4.0)).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:#?}");
    let id = answer.id();
    api.wait_status(&id, &["running"], Duration::from_secs(60))
        .await;
    machine.signal(signal);
    let code = machine.wait_exit(DRAIN).await;
    let logs = machine.logs();
    assert_eq!(code, 0, "exit code after SIG{signal}:\n{logs}");
    let view = api.wait_terminal(&id, Duration::from_secs(10)).await;
    assert_eq!(view["status"], "succeeded", "{view:#}\n{logs}");
    assert_eq!(daemon::run_stdout(&view), "done\n");
    assert_eq!(view["worker"], worker_id, "{view:#}");
    for line in [
        format!("entrypoint: SIG{signal} received: the worker drains"),
        "entrypoint: worker exited with status 0".to_string(),
        "entrypoint: dockerd stopped".to_string(),
    ] {
        assert!(logs.contains(&line), "no {line:?} in:\n{logs}");
    }
}

#[tokio::test]
async fn fly_worker_boots_loads_images_once_runs_jobs_and_drains_on_sigterm_and_sigint() {
    if !enabled() {
        return;
    }
    common::init_tracing();
    build_image();
    let redis = RedisServer::start();
    let api = DaemonBuilder::new(Role::Api, &redis).start().await;
    let fly = FlyStandIn::new(&redis);
    fly.create_volume();

    // Boot 1, on an empty volume: dockerd starts on it and loads the image.
    let first = fly.boot(1, true);
    let first_ready = first.wait_ready().await;
    let logs = first.logs();
    assert!(
        logs.contains("entrypoint: volume: /data (ext4"),
        "the volume is checked: {logs}"
    );
    assert!(
        logs.contains("entrypoint: image code-runner/python:latest: loaded in")
            && logs.contains("entrypoint: images: 1 loaded, 0 up to date"),
        "{logs}"
    );
    assert!(logs.contains("ok: image code-runner/python:latest is present and current"));

    // A job submitted through the API on the host runs in the Machine's dockerd.
    let answer = api
        .submit_wait(&daemon::python("print('hello from a fly machine')"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    assert_eq!(answer.body["status"], "succeeded", "{answer:#?}");
    assert_eq!(
        daemon::run_stdout(&answer.body),
        "hello from a fly machine\n"
    );
    assert_eq!(answer.body["worker"], fly.worker_id.as_str());

    drain_on("TERM", &first, &api, &fly.worker_id).await;
    first.remove();

    // Boot 2, same volume: nothing to load, ready in a few seconds.
    let second = fly.boot(2, true);
    let second_ready = second.wait_ready().await;
    let logs = second.logs();
    assert!(
        logs.contains("entrypoint: image code-runner/python:latest: up to date")
            && logs.contains("entrypoint: images: 0 loaded, 1 up to date"),
        "{logs}"
    );
    assert!(!logs.contains(": loaded in"), "{logs}");
    drain_on("INT", &second, &api, &fly.worker_id).await;

    eprintln!(
        "boot times (docker run to /readyz 200): first boot, empty volume: {:.1} s; \
         second boot, same volume: {:.1} s",
        first_ready.as_secs_f64(),
        second_ready.as_secs_f64()
    );
}

#[tokio::test]
async fn fly_worker_without_a_mounted_volume_fails_with_a_clear_message() {
    if !enabled() {
        return;
    }
    build_image();
    let redis = RedisServer::start();
    let fly = FlyStandIn::new(&redis);
    let machine = fly.boot(1, false);
    let code = machine.wait_exit(Duration::from_secs(60)).await;
    let logs = machine.logs();
    assert_eq!(code, 1, "{logs}");
    assert!(
        logs.contains("entrypoint: ERROR: no volume is mounted at /data: dockerd's image store must live on a volume"),
        "{logs}"
    );
    assert!(!logs.contains("dockerd: up"), "nothing starts: {logs}");
}
