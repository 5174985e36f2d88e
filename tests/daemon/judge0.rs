//! The Judge0 CE API (`/judge0/…`) driven by the unmodified official
//! Python SDK (PyPI `judge0`, installed by `scripts/compat-clients`) against
//! a real `code-runner serve` and redis-server, running real programs: every
//! Judge0 status from a real language's behaviour, batches and polling.
//! (Judge0's shapes, errors and admission are tested without Docker in the
//! `api` binary.)

use crate::common;

use common::compat::judge0_python;
use common::daemon::{Daemon, DaemonBuilder, KEY_A, Role, metric};
use common::redis_server::RedisServer;
use serde_json::Value;

struct Judge0 {
    daemon: Daemon,
    _redis: RedisServer,
}

impl Judge0 {
    async fn start() -> Self {
        let redis = RedisServer::start();
        let daemon = DaemonBuilder::new(Role::Serve, &redis)
            .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
            .start()
            .await;
        Self {
            daemon,
            _redis: redis,
        }
    }

    fn url(&self) -> String {
        format!("{}/judge0", self.daemon.url)
    }

    /// Runs a scenario of `tests/compat/judge0_client.py` with the SDK.
    fn sdk(&self, scenario: &str) -> Value {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/judge0_client.py");
        let output = std::process::Command::new(judge0_python())
            .arg(script)
            .args([&self.url(), KEY_A, scenario])
            .output()
            .expect("the venv's python runs");
        assert!(
            output.status.success(),
            "the judge0 SDK scenario {scenario} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
    }
}

#[tokio::test]
async fn every_status_through_the_sdk() {
    let judge0 = Judge0::start().await;
    let out = judge0.sdk("statuses");
    assert!(out["languages"].as_u64().unwrap() >= 20, "{out:#}");
    assert_eq!(out["batch_size"], 20);
    let check = |name: &str, status: u64| {
        assert_eq!(out[name]["status"], status, "{name}: {:#}", out[name]);
        &out[name]
    };
    let accepted = check("accepted", 3);
    assert_eq!(accepted["stdout"], "hello\n");
    assert_eq!(accepted["exit_code"], 0);
    assert!(accepted["time"].as_f64().unwrap() >= 0.0);
    assert!(accepted["memory"].as_f64().unwrap() > 0.0);
    assert_eq!(check("wrong_answer", 4)["stdout"], "nope\n");
    let tle = check("time_limit", 5);
    // Judge0 base64-encodes `message` too when asked (the SDK leaves it so).
    assert_eq!(message(tle), "Time limit exceeded");
    let ce = check("compilation_error", 6);
    assert!(
        ce["compile_output"].as_str().unwrap().contains("nope"),
        "{ce:#}"
    );
    assert_eq!(
        (&ce["stdout"], &ce["time"], &ce["exit_code"]),
        (&Value::Null, &Value::Null, &Value::Null)
    );
    let segv = check("sigsegv", 7);
    assert_eq!(
        (segv["exit_signal"].as_i64(), message(segv).as_str()),
        (Some(11), "Caught fatal signal 11")
    );
    let xfsz = check("sigxfsz", 8);
    assert_eq!(xfsz["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(check("sigfpe", 9)["exit_signal"], 8);
    assert_eq!(check("sigabrt", 10)["exit_signal"], 6);
    let nzec = check("nzec", 11);
    assert_eq!(
        (nzec["exit_code"].as_i64(), nzec["stderr"].as_str()),
        (Some(3), Some("bye\n"))
    );
    assert_eq!(message(nzec), "Exited with error status 3");
    assert_eq!(message(check("other", 12)), "Memory limit exceeded");
    assert_eq!(check("cpp_alias", 3)["stdout"], "c++\n");
    assert_eq!(check("java", 3)["stdout"], "2 y z\n");
    assert_eq!(check("unicode", 3)["stdout"], "ünï ✓\n");

    // Ordinary jobs: metered like any other.
    let metrics = judge0.daemon.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "code_runner_jobs_total{language=\"c\",status=\"failed\"}"
        ),
        Some(4.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn batches_and_polling_through_the_sdk() {
    let judge0 = Judge0::start().await;
    let out = judge0.sdk("batch");
    let batch = out["batch"].as_array().unwrap();
    assert_eq!(batch.len(), 5);
    for (n, result) in batch.iter().enumerate() {
        assert_eq!(result["status"], 3, "{result:#}");
        assert_eq!(result["stdout"], format!("{}\n", n * n));
    }

    let out = judge0.sdk("polling");
    let statuses: Vec<u64> = out["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(statuses.last(), Some(&3), "{statuses:?}");
    assert!(
        statuses[..statuses.len() - 1]
            .iter()
            .all(|s| *s == 1 || *s == 2)
            && statuses.len() > 1,
        "In Queue or Processing before Accepted: {statuses:?}"
    );
    assert_eq!(out["final"]["stdout"], "late\n");
}

/// A base64 `message` (Ruby's encode64, newlines and all) as text.
fn message(submission: &Value) -> String {
    use base64::Engine as _;
    let text: String = submission["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {submission:#}"))
        .split_whitespace()
        .collect();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap(),
    )
    .unwrap()
}
