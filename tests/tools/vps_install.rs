//! VPS packaging: `scripts/install --root DIR` stages exactly what a real
//! install writes (binary, systemd unit, environment file, Redis settings),
//! and each piece is checked with the real tool that will read it:
//! `systemd-analyze verify` for the unit (systemd cannot run as PID 1 on this
//! VM), redis-server for the Redis configuration, `code-runner api` for the
//! environment file and its generated key. The compose file and the
//! Kubernetes example are parsed and their values checked.

use crate::common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{ChildGuard, DaemonBuilder, Role};
use common::redis_server::{RedisServer, free_port};
use reqwest::StatusCode;
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `scripts/install --root root --binary <this build's code-runner>`,
/// with the host's Debian redis.conf staged first (installed with
/// redis-server).
fn stage(root: &Path) -> std::process::Output {
    let conf = root.join("etc/redis/redis.conf");
    if !conf.exists() {
        std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
        std::fs::copy("/etc/redis/redis.conf", &conf)
            .expect("/etc/redis/redis.conf (apt-get install redis-server)");
    }
    let output = Command::new(repo().join("scripts/install"))
        .arg("--root")
        .arg(root)
        .args(["--binary", env!("CARGO_BIN_EXE_code-runner")])
        .stdin(Stdio::null())
        .output()
        .expect("scripts/install runs");
    assert!(
        output.status.success(),
        "scripts/install --root failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn env_file(root: &Path) -> HashMap<String, String> {
    std::fs::read_to_string(root.join("etc/code-runner/code-runner.env"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn is_hex64(text: &str) -> bool {
    text.len() == 64 && text.chars().all(|c| c.is_ascii_hexdigit())
}

/// The settings of a unit file: `Key` → its values (a key may repeat).
fn unit_settings(text: &str) -> HashMap<String, Vec<String>> {
    let mut settings: HashMap<String, Vec<String>> = HashMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=')
            && !line.starts_with('#')
        {
            settings
                .entry(k.trim().to_string())
                .or_default()
                .push(v.trim().to_string());
        }
    }
    settings
}

#[test]
fn install_writes_a_private_environment_file_with_a_generated_key_and_keeps_it_on_upgrade() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    stage(a.path());
    stage(b.path());
    let file = a.path().join("etc/code-runner/code-runner.env");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the environment file holds the API key");

    let env = env_file(a.path());
    let key = env["CODE_RUNNER_API_KEYS"]
        .strip_prefix("admin:")
        .expect("one key named admin");
    assert!(is_hex64(key), "a 256-bit key: {key}");
    assert!(is_hex64(&env["CODE_RUNNER_TOKEN_SECRET"]));
    assert_ne!(key, env["CODE_RUNNER_TOKEN_SECRET"]);
    // Another install generates another key.
    assert_ne!(
        env_file(b.path())["CODE_RUNNER_API_KEYS"],
        env["CODE_RUNNER_API_KEYS"]
    );
    // Running it again (the upgrade) keeps the file as it is.
    let before = std::fs::read(&file).unwrap();
    let again = stage(a.path());
    assert_eq!(std::fs::read(&file).unwrap(), before);
    let said = String::from_utf8_lossy(&again.stdout);
    assert!(
        said.contains("code-runner.env exists: kept as it is"),
        "{said}"
    );
    // It says how to upgrade and uninstall.
    assert!(
        said.contains("  upgrade:   git pull && sudo scripts/install"),
        "{said}"
    );
    assert!(
        said.contains("  uninstall: sudo systemctl disable --now code-runner"),
        "{said}"
    );

    let binary = a.path().join("usr/local/bin/code-runner");
    let mode = std::fs::metadata(&binary).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);
}

#[tokio::test]
async fn the_generated_environment_file_configures_a_working_daemon() {
    let root = tempfile::tempdir().unwrap();
    stage(root.path());
    let env = env_file(root.path());
    let key = env["CODE_RUNNER_API_KEYS"]
        .strip_prefix("admin:")
        .unwrap()
        .to_string();
    let redis = RedisServer::start();
    // Every setting of the file, but this test's Redis and a free port.
    let mut builder = DaemonBuilder::new(Role::Api, &redis);
    for (name, value) in &env {
        if name != "CODE_RUNNER_REDIS_URL" && name != "CODE_RUNNER_LISTEN" {
            builder = builder.env(name, value);
        }
    }
    let api = builder.start().await;
    let missing = format!("/v1/jobs/{}", uuid::Uuid::new_v4());
    let answer = api.get(&missing, Some(&key)).await;
    assert_eq!(
        answer.status,
        StatusCode::NOT_FOUND,
        "the key is accepted: {answer:#?}"
    );
    let answer = api.get(&missing, Some("not-the-key-0123456789")).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
}

#[test]
fn the_unit_passes_systemd_analyze_verify_and_carries_the_service_contract() {
    let root = tempfile::tempdir().unwrap();
    stage(root.path());
    // verify resolves the units the service needs (docker.service,
    // redis-server.service, the targets) inside the root: give it the host's.
    let units = root.path().join("lib/systemd");
    std::fs::create_dir_all(&units).unwrap();
    let copied = Command::new("cp")
        .args(["-a", "/lib/systemd/system"])
        .arg(&units)
        .status()
        .unwrap();
    assert!(copied.success());
    for needed in ["docker.service", "redis-server.service"] {
        assert!(
            units.join("system").join(needed).exists(),
            "{needed} is installed (docker.io, redis-server)"
        );
    }
    let verify = |unit: &str| {
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", root.path().display()))
            .arg(unit)
            .output()
            .expect("systemd-analyze runs (apt-get install systemd)")
    };
    let output = verify("/etc/systemd/system/code-runner.service");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && said.is_empty(),
        "systemd-analyze verify: {said}"
    );

    // The check is real: a broken copy is reported.
    let broken = root
        .path()
        .join("etc/systemd/system/code-runner-broken.service");
    let text = std::fs::read_to_string(root.path().join("etc/systemd/system/code-runner.service"))
        .unwrap();
    std::fs::write(&broken, text.replace("KillMode=mixed", "KillMode=mixd")).unwrap();
    let output = verify("/etc/systemd/system/code-runner-broken.service");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("Failed to parse kill mode"),
        "{output:?}"
    );

    let unit = unit_settings(&text);
    let one = |key: &str| unit.get(key).map(|v| v.join(" ")).unwrap_or_default();
    assert_eq!(one("Type"), "notify");
    assert_eq!(one("Restart"), "on-failure");
    assert_eq!(one("KillSignal"), "SIGTERM");
    assert_eq!(one("KillMode"), "mixed");
    assert_eq!(one("Requires"), "docker.service");
    assert!(one("After").split(' ').any(|u| u == "docker.service"));
    assert_eq!(one("EnvironmentFile"), "/etc/code-runner/code-runner.env");
    assert_eq!(one("ExecStart"), "/usr/local/bin/code-runner serve");
    assert_eq!(one("SupplementaryGroups"), "docker");
    let stop_ms: u64 = one("TimeoutStopSec")
        .strip_suffix('s')
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1000;
    let drain_ms: u64 = env_file(root.path())["CODE_RUNNER_DRAIN_TIMEOUT_MS"]
        .parse()
        .unwrap();
    assert!(
        stop_ms > drain_ms,
        "TimeoutStopSec {stop_ms} ms > drain {drain_ms} ms"
    );
}

#[test]
fn the_redis_configuration_turns_on_the_append_only_file() {
    let root = tempfile::tempdir().unwrap();
    stage(root.path());
    let conf = root.path().join("etc/redis/redis.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    let active = |key: &str| -> Vec<&str> {
        text.lines()
            .filter(|l| l.split_whitespace().next() == Some(key))
            .collect()
    };
    assert_eq!(active("appendonly"), ["appendonly yes"]);
    assert_eq!(active("appendfsync"), ["appendfsync everysec"]);
    assert_eq!(active("maxmemory-policy"), ["maxmemory-policy noeviction"]);

    // redis-server itself reads the file (its paths replaced by this test's).
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let child = Command::new("redis-server")
        .arg(&conf)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--daemonize", "no", "--supervised", "no", "--logfile", ""])
        .args(["--pidfile", "", "--unixsocket", ""])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs");
    let _guard = ChildGuard(child);
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while cli(&["PING"]) != "PONG" {
        assert!(
            Instant::now() < deadline,
            "redis-server with the staged configuration did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(cli(&["CONFIG", "GET", "appendonly"]), "appendonly\nyes");
    assert_eq!(
        cli(&["CONFIG", "GET", "maxmemory-policy"]),
        "maxmemory-policy\nnoeviction"
    );
}

fn yaml(path: &str) -> Vec<Yaml> {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

#[test]
fn compose_example_runs_serve_on_the_docker_socket_next_to_redis_with_aof() {
    let doc = &yaml("deploy/compose/docker-compose.yml")[0];
    let redis = &doc["services"]["redis"];
    let command: Vec<&str> = redis["command"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        command.join(" "),
        "redis-server --appendonly yes --appendfsync everysec --maxmemory-policy noeviction"
    );
    let runner = &doc["services"]["code-runner"];
    assert_eq!(runner["command"][1].as_str(), Some("serve"));
    assert!(
        runner["volumes"]
            .as_vec()
            .unwrap()
            .iter()
            .any(|v| v.as_str() == Some("/var/run/docker.sock:/var/run/docker.sock"))
    );
    let env = &runner["environment"];
    assert_eq!(
        env["CODE_RUNNER_REDIS_URL"].as_str(),
        Some("redis://redis:6379")
    );
    assert_eq!(runner["stop_signal"].as_str(), Some("SIGTERM"));
    let grace_s: u64 = runner["stop_grace_period"]
        .as_str()
        .unwrap()
        .strip_suffix('s')
        .unwrap()
        .parse()
        .unwrap();
    let drain_ms: u64 = env["CODE_RUNNER_DRAIN_TIMEOUT_MS"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(grace_s * 1000 > drain_ms);
}

#[test]
fn kubernetes_example_scales_workers_with_keda_on_the_jobs_queue() {
    let docs = yaml("deploy/kubernetes/code-runner-worker.yaml");
    let deployment = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .unwrap();
    let scaled = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("ScaledObject"))
        .unwrap();
    assert_eq!(scaled["apiVersion"].as_str(), Some("keda.sh/v1alpha1"));
    assert_eq!(
        scaled["spec"]["scaleTargetRef"]["name"].as_str(),
        deployment["metadata"]["name"].as_str()
    );
    let trigger = &scaled["spec"]["triggers"][0];
    assert_eq!(trigger["type"].as_str(), Some("redis"));
    assert_eq!(trigger["metadata"]["listName"].as_str(), Some("jobs:queue"));

    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env: HashMap<&str, &Yaml> = container["env"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), &e["value"]))
        .collect();
    assert_eq!(
        trigger["metadata"]["listLength"].as_str(),
        env["CODE_RUNNER_WORKER_MAX_SANDBOXES"].as_str(),
        "one replica per slots' worth of waiting jobs"
    );
    let drain_ms: i64 = env["CODE_RUNNER_DRAIN_TIMEOUT_MS"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pod["terminationGracePeriodSeconds"].as_i64().unwrap() * 1000 >= drain_ms);
    assert_eq!(
        container["volumeMounts"][0]["mountPath"].as_str(),
        Some("/data")
    );
}
