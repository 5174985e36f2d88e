//! `deploy-fly/provision-pool` against a fake `flyctl` on PATH
//! (`tests/fly/fake-flyctl`): the fake records every call and answers, in
//! order, from a scenario each test writes with JSON built from the recorded
//! flyctl shapes in `tests/fly/` (see its README for where each comes from).
//! Each test asserts the exact sequence of flyctl calls, the exit code and
//! what the command printed, on success and when a call fails midway.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

const APP: &str = "code-runner-workers";
const AS: &str = "code-runner-autoscaler";
const TEMPLATE: &str = "3d8d9e1fe41568";
const TEMPLATE_VOL: &str = "vol_4y5p8n2m0q9r6s1t";
const GOLDEN_VOL: &str = "vol_g0ld3nv0lum3aaaa";
const AUTOSCALER: &str = "e2865013a90d68";

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

// --- bake ---------------------------------------------------------------------

const BAKE: &str = "3287e4f9a01e58";

/// The calls of a bake up to the bake Machine stopping with `exit_code`.
fn bake_until_stopped(s: &mut Scenario, exit_code: i64) {
    let template = machine(TEMPLATE, "stopped", TEMPLATE_VOL);
    s.ok(&format!("machine list -a {APP} --json"), list(std::slice::from_ref(&template)))
        .ok(
            &format!("machine list -a {AS} --json"),
            list(&[autoscaler("started", json!({}))]),
        )
        .ok(
            &format!("machine stop {AUTOSCALER} -a {AS}"),
            format!("Sending kill signal to machine {AUTOSCALER}...\n{AUTOSCALER} has been successfully stopped\n"),
        )
        .ok(
            &format!("volumes list -a {APP} --json"),
            list(&[volume(TEMPLATE_VOL, "cr_data", Some(TEMPLATE))]),
        )
        .ok(
            &format!("volumes create cr_golden -a {APP} -r ams -s 20 --snapshot-retention 60 --require-unique-zone=false -y --json"),
            serde_json::to_string_pretty(&volume(GOLDEN_VOL, "cr_golden", None)).unwrap(),
        )
        .ok(
            &format!("machine clone {TEMPLATE} -a {APP} --region ams --attach-volume {GOLDEN_VOL}:/data --override-cmd bake --name cr-bake --detach"),
            format!("Cloning Machine {TEMPLATE} into region ams\nAttaching existing volume {GOLDEN_VOL}\nProvisioning a new Machine with image registry.fly.io/code-runner-workers:v1...\n  Machine {BAKE} has been created...\n"),
        )
        .ok(
            &format!("machine list -a {APP} --json"),
            list(&[template.clone(), bake_machine(BAKE, "started", None)]),
        )
        .ok(
            &format!("machine list -a {APP} --json"),
            list(&[template.clone(), bake_machine(BAKE, "started", None)]),
        )
        .ok(
            &format!("machine list -a {APP} --json"),
            list(&[template, bake_machine(BAKE, "stopped", Some(exit_code))]),
        );
}

#[test]
fn bake_boots_a_bake_machine_snapshots_the_golden_volume_and_prints_the_snapshot_id() {
    let mut s = Scenario::new();
    bake_until_stopped(&mut s, 0);
    s.ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[]),
    )
    .ok(
        &format!("volumes snapshots create {GOLDEN_VOL} -a {APP}"),
        format!("Scheduled to snapshot volume {GOLDEN_VOL}\n"),
    )
    .ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[snapshot("", "pending", &ago(5))]),
    )
    .ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[snapshot("vs_N3wG0ld3n5nap", "created", &ago(1))]),
    )
    .ok(
        &format!("machine destroy {BAKE} -a {APP}"),
        format!("{BAKE} has been destroyed\n"),
    )
    .ok(
        &format!("machine start {AUTOSCALER} -a {AS}"),
        format!("{AUTOSCALER} has been started\n"),
    );
    let outcome = s.run_all(&["bake"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert_eq!(outcome.stdout, "vs_N3wG0ld3n5nap\n");
    assert!(outcome.stderr.contains("autoscaler paused (1 Machine(s)"));
    assert!(outcome.stderr.contains("autoscaler resumed"));
}

#[test]
fn bake_whose_machine_exits_nonzero_removes_it_resumes_the_autoscaler_and_says_where_to_look() {
    let mut s = Scenario::new();
    bake_until_stopped(&mut s, 1);
    s.ok(&format!("machine destroy --force {BAKE} -a {APP}"), "")
        .ok(&format!("machine start {AUTOSCALER} -a {AS}"), "");
    let outcome = s.run_all(&["bake"]);
    assert_failed(
        &outcome,
        "bake",
        &[
            &format!("the bake Machine {BAKE} exited with 1"),
            &format!("flyctl logs -a {APP} -i {BAKE}"),
        ],
    );
    assert_eq!(outcome.stdout, "");
}

#[test]
fn bake_failing_at_the_snapshot_with_the_autoscaler_not_restarting_says_how_to_resume_it() {
    let mut s = Scenario::new();
    bake_until_stopped(&mut s, 0);
    s.ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[]),
    )
    .fail(
        &format!("volumes snapshots create {GOLDEN_VOL} -a {APP}"),
        "Error: failed to create volume snapshot: 503 Service Unavailable",
    )
    .ok(&format!("machine destroy --force {BAKE} -a {APP}"), "")
    .fail(
        &format!("machine start {AUTOSCALER} -a {AS}"),
        "Error: could not start machine: timeout",
    );
    let outcome = s.run_all(&["bake"]);
    assert_failed(
        &outcome,
        "bake",
        &[
            &format!(
                "'volumes snapshots create {GOLDEN_VOL} -a {APP}' exited with 1: Error: failed to create volume snapshot: 503 Service Unavailable"
            ),
            &format!(
                "the autoscaler is still paused: start it with flyctl machine start {AUTOSCALER} -a {AS}"
            ),
        ],
    );
}

#[test]
fn bake_refuses_while_a_bake_machine_exists() {
    let mut s = Scenario::new();
    s.ok(
        &format!("machine list -a {APP} --json"),
        list(&[
            machine(TEMPLATE, "stopped", TEMPLATE_VOL),
            bake_machine(BAKE, "stopped", Some(1)),
        ]),
    );
    let outcome = s.run_all(&["bake"]);
    assert_failed(
        &outcome,
        "bake",
        &[
            &format!("a bake Machine exists already ({BAKE})"),
            &format!("flyctl machine destroy --force {BAKE} -a {APP}"),
        ],
    );
}

// --- grow -------------------------------------------------------------------------

const SPARE_VOL: &str = "vol_sp4r3v0lum3bbbb";
const NEW_VOL: &str = "vol_n3wv0lum3cccccc";
const M1: &str = "148e7d1c2b0a98";
const M2: &str = "9080e2a7c41d38";

fn grow_start(s: &mut Scenario) {
    s.ok(
        &format!("volumes list -a {APP} --json"),
        list(&[
            volume(TEMPLATE_VOL, "cr_data", Some(TEMPLATE)),
            volume(GOLDEN_VOL, "cr_golden", None),
            volume(SPARE_VOL, "cr_data", None),
        ]),
    )
    .ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[
            snapshot("vs_01dS5nap", "created", &ago(40 * DAY)),
            snapshot("vs_N3wG0ld3n5nap", "created", &ago(2 * DAY)),
        ]),
    )
    .ok(
        &format!("machine list -a {APP} --json"),
        list(&[machine(TEMPLATE, "stopped", TEMPLATE_VOL)]),
    )
    // The spare volume (left by an interrupted grow) is used first.
    .ok(
        &format!("machine clone {TEMPLATE} -a {APP} --region ams --attach-volume {SPARE_VOL}:/data"),
        "Machine has been successfully cloned!\n",
    )
    .ok(
        &format!("machine list -a {APP} --json"),
        list(&[machine(TEMPLATE, "stopped", TEMPLATE_VOL), machine(M1, "started", SPARE_VOL)]),
    )
    .ok(&format!("machine stop {M1} -a {APP} --wait-timeout 330s"), format!("{M1} has been successfully stopped\n"))
    .ok(
        &format!("volumes create cr_data -a {APP} -r ams -s 20 --snapshot-id vs_N3wG0ld3n5nap --require-unique-zone=false -y --json"),
        serde_json::to_string_pretty(&volume(NEW_VOL, "cr_data", None)).unwrap(),
    );
}

#[test]
fn grow_restores_volumes_from_the_newest_golden_snapshot_clones_and_stops_each_machine() {
    let mut s = Scenario::new();
    grow_start(&mut s);
    s.ok(
        &format!("machine clone {TEMPLATE} -a {APP} --region ams --attach-volume {NEW_VOL}:/data"),
        "Machine has been successfully cloned!\n",
    )
    .ok(
        &format!("machine list -a {APP} --json"),
        list(&[
            machine(TEMPLATE, "stopped", TEMPLATE_VOL),
            machine(M1, "stopped", SPARE_VOL),
            machine(M2, "started", NEW_VOL),
        ]),
    )
    .ok(
        &format!("machine stop {M2} -a {APP} --wait-timeout 330s"),
        "",
    );
    let outcome = s.run_all(&["grow", "2"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert_eq!(outcome.stdout, format!("{M1}\n{M2}\n"));
    assert!(
        outcome
            .stderr
            .contains("grew the pool by 2 Machine(s) from snapshot vs_N3wG0ld3n5nap")
    );
}

#[test]
fn grow_failing_at_a_clone_keeps_the_volume_and_says_how_to_resume() {
    let mut s = Scenario::new();
    grow_start(&mut s);
    s.fail(
        &format!("machine clone {TEMPLATE} -a {APP} --region ams --attach-volume {NEW_VOL}:/data"),
        "Error: could not reserve resource for machine: insufficient memory available to fulfill request",
    );
    let outcome = s.run_all(&["grow", "2"]);
    assert_failed(
        &outcome,
        "grow",
        &[
            "insufficient memory available",
            &format!("grew 1 of 2 ({M1})"),
            &format!(
                "at 'machine clone': volume {NEW_VOL} exists, unattached: the next grow reuses it"
            ),
            "resume with: provision-pool grow 1",
        ],
    );
    assert_eq!(outcome.stdout, "");
}

#[test]
fn grow_without_a_golden_snapshot_asks_for_a_bake() {
    let mut s = Scenario::new();
    s.ok(
        &format!("volumes list -a {APP} --json"),
        list(&[volume(TEMPLATE_VOL, "cr_data", Some(TEMPLATE))]),
    );
    let outcome = s.run_all(&["grow", "3"]);
    assert_failed(
        &outcome,
        "grow",
        &["no golden volume (cr_golden): run provision-pool bake first"],
    );
}

#[test]
fn an_answer_in_an_unexpected_shape_stops_the_command_with_a_clear_error() {
    let mut s = Scenario::new();
    s.ok(
        &format!("volumes list -a {APP} --json"),
        "{\"error\": \"not found\"}\n",
    );
    let outcome = s.run_all(&["grow", "1"]);
    assert_failed(
        &outcome,
        "grow",
        &["volumes list --json answered dict, not a list of objects"],
    );

    let mut s = Scenario::new();
    s.ok(
        &format!("machine list -a {APP} --json"),
        "Error: not logged in\n",
    );
    let outcome = s.run_all(&["status"]);
    assert_failed(
        &outcome,
        "status",
        &[&format!(
            "'machine list -a {APP} --json' did not answer JSON"
        )],
    );
}

// --- status -------------------------------------------------------------------------

fn status_scenario(snapshot_age_days: u64, prewarm: Value) -> Scenario {
    let mut s = Scenario::new();
    s.ok(
        &format!("machine list -a {APP} --json"),
        list(&[
            machine(TEMPLATE, "stopped", TEMPLATE_VOL),
            machine(M1, "started", SPARE_VOL),
            machine(M2, "stopped", NEW_VOL),
        ]),
    )
    .ok(
        &format!("volumes list -a {APP} --json"),
        list(&[
            volume(TEMPLATE_VOL, "cr_data", Some(TEMPLATE)),
            volume(SPARE_VOL, "cr_data", Some(M1)),
            volume(NEW_VOL, "cr_data", Some(M2)),
            volume("vol_l3ft0v3rdddddd", "cr_data", None),
            volume(GOLDEN_VOL, "cr_golden", None),
        ]),
    )
    .ok(
        &format!("volumes snapshots list {GOLDEN_VOL} -a {APP} --json"),
        list(&[
            snapshot("vs_01dS5nap", "created", &ago(70 * DAY)),
            snapshot(
                "vs_N3wG0ld3n5nap",
                "created",
                &ago(snapshot_age_days * DAY + 3600),
            ),
            snapshot("", "pending", &ago(10)),
        ]),
    )
    .ok(
        &format!("machine list -a {AS} --json"),
        list(&[autoscaler("started", prewarm)]),
    );
    s
}

#[test]
fn status_reports_the_pool_the_snapshot_age_and_expiry_and_the_prewarm_window() {
    let prewarm = json!({"CR_PREWARM_MACHINES": "4", "CR_PREWARM_FROM": "1893484800", "CR_PREWARM_UNTIL": "1893492000"});
    let outcome = status_scenario(10, prewarm).run_all(&["status"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    let lines: Vec<&str> = outcome.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("pool {APP}: 3 Machines (1 started, 2 stopped), 4 data volumes (1 unattached)")
    );
    assert!(
        lines[1].starts_with(&format!(
            "golden snapshot vs_N3wG0ld3n5nap of {GOLDEN_VOL}: created "
        )) && lines[1].contains("(10 days ago), kept 60 days: expires ")
            && lines[1].ends_with("(in 49 days)"),
        "{}",
        lines[1]
    );
    assert_eq!(
        lines[2],
        format!("autoscaler {AS}: 1 of 1 Machine(s) started")
    );
    assert_eq!(
        lines[3],
        format!(
            "  pre-warm on {AUTOSCALER}: 4 Machines from 2030-01-01T08:00:00Z until 2030-01-01T10:00:00Z (scheduled)"
        )
    );
    assert_eq!(lines.len(), 4, "{}", outcome.stdout);
}

#[test]
fn status_warns_when_the_golden_snapshot_is_about_to_expire() {
    let outcome = status_scenario(56, json!({})).run_all(&["status"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert!(
        outcome.stdout.contains("(56 days ago), kept 60 days"),
        "{}",
        outcome.stdout
    );
    assert!(
        outcome
            .stdout
            .contains(&format!("  pre-warm on {AUTOSCALER}: none\n"))
    );
    assert!(
        outcome
            .stdout
            .ends_with("WARNING: the golden snapshot expires in 3 days: run provision-pool bake\n"),
        "{}",
        outcome.stdout
    );
}

// --- shrink -------------------------------------------------------------------------

const M3: &str = "e7843a9b2c1d08";
const M3_VOL: &str = "vol_m3v0lum3eeeeee";

fn four_machines() -> String {
    list(&[
        machine(TEMPLATE, "stopped", TEMPLATE_VOL),
        machine(M1, "started", SPARE_VOL),
        machine(M2, "stopped", NEW_VOL),
        machine(M3, "stopped", M3_VOL),
    ])
}

#[test]
fn shrink_destroys_the_highest_id_stopped_machines_and_their_volumes() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines())
        .ok(
            &format!("machine destroy {M3} -a {APP}"),
            format!("{M3} has been destroyed\n"),
        )
        .ok(
            &format!("volumes destroy {M3_VOL} -a {APP} -y"),
            format!("Destroyed volume ID: {M3_VOL} name: cr_data\n"),
        )
        .ok(&format!("machine destroy {M2} -a {APP}"), "")
        .ok(&format!("volumes destroy {NEW_VOL} -a {APP} -y"), "");
    let outcome = s.run_all(&["shrink", "2"]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert_eq!(outcome.stdout, format!("{M3}\n{M2}\n"));
}

#[test]
fn shrink_never_touches_a_started_machine_nor_the_last_one() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines());
    let outcome = s.run_all(&["shrink", "4"]);
    assert_failed(
        &outcome,
        "shrink",
        &["the pool has 4 Machines; shrinking by 4 would leave none to clone"],
    );

    let mut s = Scenario::new();
    s.ok(
        &format!("machine list -a {APP} --json"),
        list(&[
            machine(TEMPLATE, "started", TEMPLATE_VOL),
            machine(M1, "started", SPARE_VOL),
            machine(M2, "stopped", NEW_VOL),
        ]),
    );
    let outcome = s.run_all(&["shrink", "2"]);
    assert_failed(
        &outcome,
        "shrink",
        &["only 1 of the pool's 3 Machines are stopped; a started one may run jobs"],
    );
}

#[test]
fn shrink_failing_at_a_volume_says_which_volume_is_left_and_how_to_resume() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines())
        .ok(&format!("machine destroy {M3} -a {APP}"), "")
        .fail(
            &format!("volumes destroy {M3_VOL} -a {APP} -y"),
            "Error: volume is still attached",
        );
    let outcome = s.run_all(&["shrink", "2"]);
    assert_failed(
        &outcome,
        "shrink",
        &[&format!(
            "Machine {M3} is destroyed but its volume {M3_VOL} remains: flyctl volumes destroy {M3_VOL} -a {APP} -y, then provision-pool shrink 1"
        )],
    );
}

// --- prewarm ------------------------------------------------------------------------

#[test]
fn prewarm_sets_the_window_on_the_autoscaler_machine() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines())
        .ok(&format!("machine list -a {AS} --json"), list(&[autoscaler("started", json!({}))]))
        .ok(
            &format!("machine update {AUTOSCALER} -a {AS} --env CR_PREWARM_MACHINES=3 --env CR_PREWARM_FROM=1893484800 --env CR_PREWARM_UNTIL=1893492000 --yes"),
            "Updating machine e2865013a90d68\n",
        );
    let outcome = s.run_all(&[
        "prewarm",
        "3",
        "--at",
        "2030-01-01T09:00:00+01:00",
        "--until",
        "2030-01-01T11:00:00+01:00",
    ]);
    assert_eq!(outcome.code, Some(0), "stderr:\n{}", outcome.stderr);
    assert!(
        outcome
            .stderr
            .contains("keeps at least 3 worker Machines started")
    );
    assert!(outcome.stderr.contains("CODE_RUNNER_WARM"));
}

#[test]
fn prewarm_refuses_more_machines_than_the_pool_has_and_times_without_a_zone() {
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines());
    let outcome = s.run_all(&[
        "prewarm",
        "6",
        "--at",
        "2030-01-01T09:00:00Z",
        "--until",
        "2030-01-01T11:00:00Z",
    ]);
    assert_failed(
        &outcome,
        "prewarm",
        &[
            "the pool has 4 Machines, fewer than 6",
            "run provision-pool grow 2 first",
        ],
    );

    // The autoscaler's own maximum (deploy-fly/autoscaler/fly.toml) caps it too.
    let mut s = Scenario::new();
    s.ok(&format!("machine list -a {APP} --json"), four_machines())
        .ok(
            &format!("machine list -a {AS} --json"),
            list(&[autoscaler(
                "started",
                json!({"FAS_STARTED_MACHINE_COUNT": "min(max(ceil(load / 8), 1), 2)"}),
            )]),
        );
    let outcome = s.run_all(&[
        "prewarm",
        "3",
        "--at",
        "2030-01-01T09:00:00Z",
        "--until",
        "2030-01-01T11:00:00Z",
    ]);
    assert_failed(
        &outcome,
        "prewarm",
        &[&format!(
            "the autoscaler starts at most 2 Machines (FAS_STARTED_MACHINE_COUNT on {AUTOSCALER}), fewer than 3"
        )],
    );

    let s = Scenario::new();
    let outcome = s.run_all(&[
        "prewarm",
        "2",
        "--at",
        "2030-01-01T09:00:00",
        "--until",
        "2030-01-01T11:00:00Z",
    ]);
    assert_failed(
        &outcome,
        "prewarm",
        &["--at '2030-01-01T09:00:00' has no time zone"],
    );

    let s = Scenario::new();
    let outcome = s.run_all(&[
        "prewarm",
        "2",
        "--at",
        "2030-01-01T11:00:00Z",
        "--until",
        "2030-01-01T09:00:00Z",
    ]);
    assert_failed(&outcome, "prewarm", &["--until must be after --at"]);
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
