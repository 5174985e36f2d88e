//! The Fly configs in `deploy-fly/` parse as TOML and carry the values the
//! deployment depends on: the worker's drain budget, its volume, metrics and
//! readiness check; the API's public service; fly-autoscaler's query and
//! started-count expression. The autoscaler's Prometheus query is evaluated by
//! a real Prometheus engine (`promtool test rules`) on synthetic series, with
//! the variables expanded the way fly-autoscaler's `ExpandMetricQuery` does.

use std::collections::HashMap;
use std::path::Path;

use toml::Value;

fn config(app: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("deploy-fly/{app}/fly.toml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{path:?} is not TOML: {e}"))
}

fn env(config: &Value) -> HashMap<String, String> {
    config["env"]
        .as_table()
        .expect("an [env] table")
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().expect("env values are strings").into(),
            )
        })
        .collect()
}

/// The value of `key` in a `key=value,…` limit list.
fn limit(list: &str, key: &str) -> u64 {
    list.split(',')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {list:?}"))
        .parse()
        .unwrap()
}

fn port_of(listen: &str) -> i64 {
    listen.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[test]
fn worker_config_has_no_public_service_a_volume_metrics_a_check_and_a_drain_budget() {
    let worker = config("worker");
    let env = env(&worker);
    assert_eq!(worker["app"].as_str(), Some("code-runner-workers"));
    assert!(worker.get("services").is_none() && worker.get("http_service").is_none());

    // Stopped with SIGINT (Fly's default, treated like SIGTERM) and at most 300 s.
    assert_eq!(worker["kill_signal"].as_str(), Some("SIGINT"));
    let kill_timeout_ms = worker["kill_timeout"].as_integer().unwrap() as u64 * 1000;
    assert_eq!(kill_timeout_ms, 300_000);
    // kill_timeout >= drain >= the longest job (compile + run wall limits).
    let drain_ms: u64 = env["CODE_RUNNER_DRAIN_TIMEOUT_MS"].parse().unwrap();
    let longest_job_ms = limit(&env["CODE_RUNNER_MAX_LIMITS"], "wall_ms")
        + limit(&env["CODE_RUNNER_COMPILE_MAX_LIMITS"], "wall_ms");
    assert!(
        kill_timeout_ms >= drain_ms && drain_ms >= longest_job_ms,
        "kill_timeout {kill_timeout_ms} >= drain {drain_ms} >= longest job {longest_job_ms}"
    );

    let mounts = worker["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0]["destination"].as_str(), Some("/data"));
    assert_eq!(mounts[0]["snapshot_retention"].as_integer(), Some(60));

    let listen_port = port_of(&env["CODE_RUNNER_WORKER_LISTEN"]);
    assert!(env["CODE_RUNNER_WORKER_LISTEN"].starts_with("[::]:"));
    assert_eq!(worker["metrics"]["port"].as_integer(), Some(listen_port));
    assert_eq!(worker["metrics"]["path"].as_str(), Some("/metrics"));
    let check = &worker["checks"]["readyz"];
    assert_eq!(check["type"].as_str(), Some("http"));
    assert_eq!(check["path"].as_str(), Some("/readyz"));
    assert_eq!(check["port"].as_integer(), Some(listen_port));

    // Memory: every slot may hold the largest job, plus room for the daemons.
    let vm = &worker["vm"].as_array().unwrap()[0];
    let memory_mb: u64 = vm["memory"]
        .as_str()
        .unwrap()
        .strip_suffix("gb")
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024;
    let slots: u64 = env["CODE_RUNNER_WORKER_MAX_SANDBOXES"].parse().unwrap();
    let job_mb = limit(&env["CODE_RUNNER_MAX_LIMITS"], "memory_mb");
    assert!(
        slots * job_mb + 1024 <= memory_mb,
        "{slots} slots x {job_mb} MiB + 1 GiB > {memory_mb} MiB"
    );
    let cpus = vm["cpus"].as_integer().unwrap() as u64;
    assert_eq!(slots, 2 * cpus, "2 slots per CPU (docs/scaling.md)");
}

#[test]
fn api_config_serves_http_publicly_with_one_machine_always_running() {
    let api = config("api");
    let env = env(&api);
    let service = &api["http_service"];
    assert!(env["CODE_RUNNER_LISTEN"].starts_with("[::]:"));
    assert_eq!(
        service["internal_port"].as_integer(),
        Some(port_of(&env["CODE_RUNNER_LISTEN"]))
    );
    assert_eq!(service["min_machines_running"].as_integer(), Some(1));
    assert_eq!(service["force_https"].as_bool(), Some(true));
    let checks = service["checks"].as_array().unwrap();
    assert_eq!(checks[0]["path"].as_str(), Some("/readyz"));
    assert_eq!(api["processes"]["app"].as_str(), Some("code-runner api"));
    assert!(api.get("mounts").is_none());
    // The API accepts only what a worker can run within its drain budget.
    let worker_env = self::env(&config("worker"));
    for key in ["CODE_RUNNER_MAX_LIMITS", "CODE_RUNNER_COMPILE_MAX_LIMITS"] {
        assert_eq!(env[key], worker_env[key], "{key}");
    }
}

#[test]
fn redis_config_keeps_an_append_only_file_on_a_volume() {
    let redis = config("redis");
    let command = redis["processes"]["app"].as_str().unwrap();
    for flag in [
        "--appendonly yes",
        "--dir /data",
        "--maxmemory-policy noeviction",
        "--requirepass",
    ] {
        assert!(command.contains(flag), "{flag} in {command}");
    }
    assert_eq!(
        redis["mounts"].as_array().unwrap()[0]["destination"].as_str(),
        Some("/data")
    );
    assert!(redis.get("http_service").is_none() && redis.get("services").is_none());
}

#[test]
fn autoscaler_scales_the_worker_app_on_slots_and_queue_with_min_and_max() {
    let autoscaler = config("autoscaler");
    let env = env(&autoscaler);
    let worker = config("worker");
    let worker_env = self::env(&worker);
    assert_eq!(env["FAS_APP_NAME"], worker["app"].as_str().unwrap());
    assert_eq!(env["CR_API_APP"], config("api")["app"].as_str().unwrap());
    assert_eq!(env["FAS_PROMETHEUS_METRIC_NAME"], "load");
    let slots = &worker_env["CODE_RUNNER_WORKER_MAX_SANDBOXES"];
    assert_eq!(&env["CR_SLOTS_PER_MACHINE"], slots);
    assert_eq!(
        env["FAS_STARTED_MACHINE_COUNT"],
        format!("min(max(ceil(load / {slots}), 1), 20)")
    );
    for name in ["CR_PREWARM_MACHINES", "CR_PREWARM_FROM", "CR_PREWARM_UNTIL"] {
        assert_eq!(env[name], "0", "no pre-warm window by default");
    }
    let query = &env["FAS_PROMETHEUS_QUERY"];
    for part in [
        "sum(code_runner_slots_used{",
        "max(code_runner_queue_depth{",
        "or vector(0)",
    ] {
        assert!(query.contains(part), "{part} in {query}");
    }
}

/// fly-autoscaler's `ExpandMetricQuery` (Go's `os.Expand`): `$APP_NAME` is
/// the scaled app, any other `$NAME` / `${NAME}` comes from the environment.
fn expand(query: &str, env: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = query;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').expect("a closing brace");
            (&braced[..end], end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        let value = if name == "APP_NAME" {
            env["FAS_APP_NAME"].as_str()
        } else {
            env.get(name)
                .unwrap_or_else(|| panic!("${name} is not set in the autoscaler's [env]"))
                .as_str()
        };
        out.push_str(value);
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// One case: input series (Prometheus test notation), env overrides, the
/// expected value of the query at t = 120 s.
struct Case<'a> {
    name: &'a str,
    series: &'a [(&'a str, &'a str)],
    env: &'a [(&'a str, &'a str)],
    expect: u64,
}

#[test]
fn autoscaler_query_evaluates_to_load_or_the_prewarm_floor_and_is_never_empty() {
    let base = env(&config("autoscaler"));
    let slots_a = r#"code_runner_slots_used{app="code-runner-workers",instance="a"}"#;
    let slots_b = r#"code_runner_slots_used{app="code-runner-workers",instance="b"}"#;
    let queue_api = r#"code_runner_queue_depth{app="code-runner-api",instance="c"}"#;
    let queue_worker = r#"code_runner_queue_depth{app="code-runner-workers",instance="a"}"#;
    let other = r#"code_runner_slots_used{app="someone-else",instance="d"}"#;
    let busy: &[(&str, &str)] = &[
        (slots_a, "3x3"),
        (slots_b, "2x3"),
        (queue_api, "2x3"),
        (queue_worker, "2x3"),
    ];
    let window = |from: &'static str, until: &'static str| -> [(&str, &str); 3] {
        [
            ("CR_PREWARM_MACHINES", "2"),
            ("CR_PREWARM_FROM", from),
            ("CR_PREWARM_UNTIL", until),
        ]
    };
    let open = window("0", "1000");
    let later = window("200", "300");
    let over = window("0", "100");
    let cases = [
        Case {
            name: "slots in use on every worker plus the queue depth (max over reporters)",
            series: busy,
            env: &[],
            expect: 7,
        },
        Case {
            name: "no series at all: 0, not an empty result",
            series: &[],
            env: &[],
            expect: 0,
        },
        Case {
            name: "only a queue: its depth",
            series: &[(queue_api, "4x3")],
            env: &[],
            expect: 4,
        },
        Case {
            name: "another app's series are not counted",
            series: &[(other, "9x3")],
            env: &[],
            expect: 0,
        },
        Case {
            name: "pre-warm window open: the floor (2 Machines x 8 slots) above the load",
            series: busy,
            env: &open,
            expect: 16,
        },
        Case {
            name: "pre-warm window open, load above the floor: the load",
            series: &[(slots_a, "20x3")],
            env: &open,
            expect: 20,
        },
        Case {
            name: "pre-warm window not yet open: the load",
            series: busy,
            env: &later,
            expect: 7,
        },
        Case {
            name: "pre-warm window over, nothing running: 0",
            series: &[],
            env: &over,
            expect: 0,
        },
    ];

    let mut yaml = String::from("rule_files: []\ntests:\n");
    for case in &cases {
        let mut env = base.clone();
        for (k, v) in case.env {
            env.insert((*k).to_string(), (*v).to_string());
        }
        let query = expand(&env["FAS_PROMETHEUS_QUERY"], &env);
        assert!(!query.contains('$'), "unexpanded: {query}");
        yaml.push_str(&format!(
            "  # {}\n  - interval: 1m\n    input_series:\n",
            case.name
        ));
        if case.series.is_empty() {
            // promtool needs a series; an unrelated one leaves the query's empty.
            yaml.push_str("      - series: 'up{job=\"x\"}'\n        values: '1x3'\n");
        }
        for (series, values) in case.series {
            yaml.push_str(&format!(
                "      - series: '{series}'\n        values: '{values}'\n"
            ));
        }
        yaml.push_str(&format!(
            "    promql_expr_test:\n      - expr: {}\n        eval_time: 2m\n        exp_samples:\n          - labels: '{{}}'\n            value: {}\n",
            serde_json::to_string(&query).unwrap(),
            case.expect
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("autoscaler-query.yml");
    std::fs::write(&file, &yaml).unwrap();
    let output = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool runs (apt-get install prometheus)");
    assert!(
        output.status.success(),
        "promtool test rules failed:\n{}{}\n{yaml}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
