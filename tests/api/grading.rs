//! Grading through the API: a graded job the API refuses names the field.
//! (The scripted engine runs no graded jobs: a graded job's verdicts, its
//! `test` events and the checker's cache are tested on real sandboxes in
//! the `daemon` binary's `grading_api`.)

use serde_json::{Value, json};

use crate::common::daemon::Role;
use crate::common::in_process::InProcessBuilder;
use crate::common::redis_server::RedisServer;

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
async fn a_graded_job_the_api_refuses_names_the_field() {
    let redis = RedisServer::start();
    let daemon = InProcessBuilder::new(Role::Serve, &redis).start().await;

    // Refusals name the field.
    for (extra, field) in [
        (json!({"tests": []}), "tests"),
        (json!({"tests": [{}], "interactive": true}), "tests"),
        (
            json!({"tests": [{"limits": {"cpu_ms": 999_999_999}}]}),
            "tests[0].limits.cpu_ms",
        ),
        (json!({"tests": [{}], "check": "fuzzy"}), "check.mode"),
        (json!({"tests": [{"stdin": 3}]}), "body"),
    ] {
        let answer = daemon.submit(&sum_job(extra.clone())).await;
        assert_eq!(answer.status, 400, "{extra}: {answer:#?}");
        let (code, message) = answer.error();
        if field != "body" {
            assert_eq!(code, "invalid_job", "{extra}: {answer:#?}");
            assert_eq!(answer.body["error"]["field"], field, "{extra}: {answer:#?}");
        } else {
            // A test field of the wrong type: the body does not parse.
            assert_eq!(code, "invalid_json", "{extra}: {answer:#?}");
            assert!(message.contains("string"), "{message}");
        }
    }
}
