//! `deploy-fly/provision-pool` against a fake `flyctl` on PATH
//! (`tests/fly/fake-flyctl`): the fake records every call and answers, in
//! order, from a scenario each test writes with JSON built from the recorded
//! flyctl shapes in `tests/fly/` (see its README for where each comes from).
//! Each test asserts the exact sequence of flyctl calls, the exit code and
//! what the command printed, on success and when a call fails midway.
//!
//! Here the fake's scenario and the recorded shapes; the tests are by
//! command: [`bake`], [`grow`], [`status`], [`shrink`] and [`prewarm`].

mod bake;
mod grow;
mod prewarm;
mod shrink;
mod status;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

const APP: &str = "code-runner-workers";
const AS: &str = "code-runner-autoscaler";
const TEMPLATE: &str = "3d8d9e1fe41568";
const TEMPLATE_VOL: &str = "vol_4y5p8n2m0q9r6s1t";
const GOLDEN_VOL: &str = "vol_g0ld3nv0lum3aaaa";
const AUTOSCALER: &str = "e2865013a90d68";

// The pool's other worker Machines and their volumes.
const SPARE_VOL: &str = "vol_sp4r3v0lum3bbbb";
const NEW_VOL: &str = "vol_n3wv0lum3cccccc";
const M1: &str = "148e7d1c2b0a98";
const M2: &str = "9080e2a7c41d38";
const M3: &str = "e7843a9b2c1d08";
const M3_VOL: &str = "vol_m3v0lum3eeeeee";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> Value {
    let path = root().join("tests/fly").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A worker Machine of the pool (the recorded one, re-identified).
fn machine(id: &str, state: &str, volume: &str) -> Value {
    let mut m = fixture("machine.json");
    m["id"] = json!(id);
    m["state"] = json!(state);
    m["config"]["mounts"][0]["volume"] = json!(volume);
    m
}

/// The bake Machine: a clone with `--override-cmd bake`.
fn bake_machine(id: &str, state: &str, exit_code: Option<i64>) -> Value {
    let mut m = machine(id, state, GOLDEN_VOL);
    m["config"]["init"] = json!({"cmd": ["bake"]});
    m["config"]["mounts"][0]["name"] = json!("cr_golden");
    m["events"] = json!([{"type": "start", "status": "started", "source": "flyd", "timestamp": 1_764_500_000_000_u64}]);
    if let Some(code) = exit_code {
        // exit_code has omitempty in fly-go: a clean exit has none.
        let mut exit_event = json!({"exited_at": "2026-11-30T10:02:11.2Z"});
        if code != 0 {
            exit_event["exit_code"] = json!(code);
        }
        m["events"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({"type": "exit", "status": "stopped", "request": {"exit_event": exit_event, "restart_count": 0}, "source": "flyd", "timestamp": 1_764_500_131_000_u64}));
    }
    m
}

/// The fly-autoscaler Machine, with its environment.
fn autoscaler(state: &str, env: Value) -> Value {
    let mut m = fixture("machine.json");
    m["id"] = json!(AUTOSCALER);
    m["state"] = json!(state);
    m["config"]["env"] = env;
    m["config"]["mounts"] = json!([]);
    m["config"]["metadata"]["fly_process_group"] = json!("app");
    m["image_ref"]["repository"] = json!("flyio/fly-autoscaler");
    m
}

fn volume(id: &str, name: &str, attached: Option<&str>) -> Value {
    let mut v = fixture("volume.json");
    v["id"] = json!(id);
    v["name"] = json!(name);
    v["attached_machine_id"] = json!(attached);
    v
}

fn snapshot(id: &str, status: &str, created_at: &str) -> Value {
    let mut s = fixture("snapshot.json");
    s["id"] = json!(id);
    s["status"] = json!(status);
    s["created_at"] = json!(created_at);
    s
}

fn list(items: &[Value]) -> String {
    serde_json::to_string_pretty(&Value::Array(items.to_vec())).unwrap() + "\n"
}

/// An RFC 3339 UTC time `secs_ago` seconds before now (by `date`).
fn ago(secs_ago: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let out = Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{}", now - secs_ago),
            "+%Y-%m-%dT%H:%M:%SZ",
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

const DAY: u64 = 86_400;

struct Scenario {
    steps: Vec<Value>,
}

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    calls: Vec<Vec<String>>,
}

impl Scenario {
    fn new() -> Self {
        Self { steps: Vec::new() }
    }

    /// The next call must be `argv` (words split on spaces); it prints `stdout`.
    fn ok(&mut self, argv: &str, stdout: impl Into<String>) -> &mut Self {
        self.steps
            .push(json!({"argv": words(argv), "stdout": stdout.into(), "exit": 0}));
        self
    }

    /// The next call must be `argv`; it fails as flyctl does (message on stderr, exit 1).
    fn fail(&mut self, argv: &str, stderr: &str) -> &mut Self {
        self.steps
            .push(json!({"argv": words(argv), "stderr": format!("{stderr}\n"), "exit": 1}));
        self
    }

    fn run(&self, args: &[&str]) -> Outcome {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(root().join("tests/fly/fake-flyctl"), bin.join("flyctl"))
            .unwrap();
        let scenario = dir.path().join("scenario.json");
        std::fs::write(&scenario, serde_json::to_vec(&self.steps).unwrap()).unwrap();
        let log = dir.path().join("calls.log");
        std::fs::write(&log, "").unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let output = Command::new(root().join("deploy-fly/provision-pool"))
            .args(args)
            .env("PATH", path)
            .env("FAKE_FLYCTL_SCENARIO", &scenario)
            .env("FAKE_FLYCTL_LOG", &log)
            .env("CR_POLL_SECONDS", "0")
            .env_remove("FLYCTL")
            .env_remove("CR_FLY_WORKER_APP")
            .env_remove("CR_FLY_AUTOSCALER_APP")
            .env_remove("CR_FLY_REGION")
            .output()
            .expect("deploy-fly/provision-pool runs (python3)");
        let calls = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        Outcome {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            calls,
        }
    }

    /// Runs and asserts that the calls were exactly the scenario's steps.
    fn run_all(&self, args: &[&str]) -> Outcome {
        let outcome = self.run(args);
        let expected: Vec<Vec<String>> = self
            .steps
            .iter()
            .map(|s| serde_json::from_value(s["argv"].clone()).unwrap())
            .collect();
        assert_eq!(
            outcome.calls, expected,
            "flyctl calls differ; stderr:\n{}",
            outcome.stderr
        );
        outcome
    }
}

/// The template, M1 started and M2, M3 stopped.
fn four_machines() -> String {
    list(&[
        machine(TEMPLATE, "stopped", TEMPLATE_VOL),
        machine(M1, "started", SPARE_VOL),
        machine(M2, "stopped", NEW_VOL),
        machine(M3, "stopped", M3_VOL),
    ])
}

fn words(argv: &str) -> Vec<String> {
    argv.split(' ').map(str::to_string).collect()
}

fn assert_failed(outcome: &Outcome, command: &str, parts: &[&str]) {
    assert_eq!(outcome.code, Some(1), "stderr:\n{}", outcome.stderr);
    let line = outcome
        .stderr
        .lines()
        .find(|l| l.starts_with(&format!("provision-pool: FAILED: {command}: ")))
        .unwrap_or_else(|| panic!("no FAILED line:\n{}", outcome.stderr));
    for part in parts {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
}

#[test]
fn the_fixtures_are_in_flyctl_shapes() {
    // Guard the recorded shapes against edits: the fields provision-pool reads.
    let m = fixture("machine.json");
    for key in [
        "id",
        "state",
        "region",
        "config",
        "events",
        "checks",
        "host_status",
    ] {
        assert!(m.get(key).is_some(), "machine.json lacks {key}");
    }
    assert_eq!(m["config"]["init"], json!({}));
    assert!(
        m["config"]["mounts"][0]["volume"]
            .as_str()
            .unwrap()
            .starts_with("vol_")
    );
    let v = fixture("volume.json");
    assert!(v["id"].as_str().unwrap().starts_with("vol_"));
    assert!(v.get("attached_machine_id").is_some() && v.get("snapshot_retention").is_some());
    let s = fixture("snapshot.json");
    assert!(s["id"].as_str().unwrap().starts_with("vs_"));
    for key in ["status", "created_at", "retention_days", "volume_size"] {
        assert!(s.get(key).is_some(), "snapshot.json lacks {key}");
    }
    assert!(Path::new(&root().join("tests/fly/README.md")).is_file());
}
