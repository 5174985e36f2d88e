//! Grading through the API of the real binary: a graded job's result in
//! the job view and its `test` events on the job's stream, and a compiled
//! checker kept per API key, on real sandboxes. (What the API refuses of a
//! graded job is tested without Docker in the `api` binary.)

use crate::common;

use common::containers::docker;
use common::daemon::{DaemonBuilder, KEY_A, Role, curl_events, sse_events};
use common::redis_server::RedisServer;
use serde_json::{Value, json};

fn sum_job(extra: Value) -> Value {
    let mut job = json!({
        "language": "python",
        "files": [{"name": "main.py", "content": "a, b = map(int, input().split())\nprint(a + b)\n"}],
    });
    for (key, item) in extra.as_object().unwrap() {
        job[key] = item.clone();
    }
    job
}

#[tokio::test]
async fn a_graded_job_answers_with_a_verdict_per_test_and_streams_them() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;

    let job = sum_job(json!({"tests": [
        {"name": "small", "stdin": "1 2\n", "expected_stdout": "3\n", "points": 2},
        {"name": "wrong", "stdin": "2 2\n", "expected_stdout": "5\n"},
    ]}));
    let answer = daemon.submit_wait(&job).await;
    assert_eq!(answer.status, 200, "{answer:#?}");
    let view = &answer.body;
    assert_eq!(view["status"], "failed", "{view:#}");
    let result = &view["result"];
    assert_eq!(result["passed"], 1, "{view:#}");
    assert_eq!(result["total"], 2);
    assert_eq!(result["score"], 2.0);
    assert_eq!(result["max_score"], 3.0);
    assert_eq!(result["verdict"], "wrong_answer");
    assert_eq!(result["run"], Value::Null);
    assert_eq!(result["tests"][0]["verdict"], "accepted");
    assert_eq!(result["tests"][0]["stdout"], "3\n");
    assert_eq!(result["tests"][1]["verdict"], "wrong_answer");
    assert_eq!(
        result["tests"][1]["difference"],
        json!({"line": 1, "expected": "5", "got": "4"})
    );

    let id = view["id"].as_str().unwrap();
    let (text, code) =
        curl_events(&daemon, id, "", &[format!("Authorization: Bearer {KEY_A}")]).await;
    assert_eq!(code, "200", "{text}");
    let tests: Vec<(String, String, String)> = sse_events(&text)
        .into_iter()
        .filter(|(_, event, _)| event == "test")
        .map(|(_, _, data)| {
            (
                data["name"].as_str().unwrap().to_string(),
                data["state"].as_str().unwrap().to_string(),
                data["verdict"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        tests,
        [
            ("small".into(), "start".into(), "".into()),
            ("small".into(), "end".into(), "accepted".into()),
            ("wrong".into(), "start".into(), "".into()),
            ("wrong".into(), "end".into(), "wrong_answer".into()),
        ]
    );
    daemon.assert_no_containers(&docker().await).await;
}

#[tokio::test]
async fn a_compiled_checker_is_kept_per_api_key() {
    use common::daemon::KEY_B;
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let checker = "#include <fstream>\nint main(int, char** argv) {\n  std::ifstream out(argv[2]), ans(argv[3]);\n  long long got = -1, want = -2;\n  out >> got; ans >> want;\n  return got == want ? 0 : 1;\n}\n";
    let job = sum_job(json!({
        "check": {"mode": "program", "language": "cpp", "files": [{"name": "check.cpp", "content": checker}]},
        "tests": [{"stdin": "1 2\n", "expected_stdout": "3\n"}, {"stdin": "2 2\n", "expected_stdout": "5\n"}],
    }));
    // Key a compiles it, key a again takes it from the worker's cache, key
    // b compiles its own.
    for (key, cached) in [(KEY_A, false), (KEY_A, true), (KEY_B, false)] {
        let answer = daemon.submit_as(Some(key), &job, true).await;
        assert_eq!(answer.status, 200, "{answer:#?}");
        let result = &answer.body["result"];
        assert_eq!(result["verdict"], "wrong_answer", "{key}: {result:#}");
        assert_eq!(
            result["tests"][0]["verdict"], "accepted",
            "{key}: {result:#}"
        );
        assert_eq!(result["checker"]["checks"], 2, "{key}: {result:#}");
        assert_eq!(
            result["checker"]["compile_cached"], cached,
            "{key}: {result:#}"
        );
    }
    let metrics = daemon.metrics().await;
    for (name, value) in [
        ("code_runner_checker_compiles_total{cache=\"hit\"}", 1.0),
        ("code_runner_checker_compiles_total{cache=\"miss\"}", 2.0),
    ] {
        assert_eq!(
            common::daemon::metric(&metrics, name),
            Some(value),
            "{name}: {metrics}"
        );
    }
    daemon.assert_no_containers(&docker().await).await;
}
