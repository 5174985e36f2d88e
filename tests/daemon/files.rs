//! Stored files in a real sandbox: a job names a file its key stored
//! (`PUT /v1/files/{sha256}`) by `ref`, and the program reads its bytes from
//! the workspace as it would a file sent with the job — binary, in a
//! directory, twice under two names — and a graded job takes its tests'
//! input and expected output from stored files; on the real binary, Redis
//! and dockerd.

use crate::common;

use common::containers::docker;
use common::daemon::{DaemonBuilder, KEY_A, Role};
use common::redis_server::RedisServer;
use reqwest::StatusCode;
use serde_json::json;
use sha2::{Digest, Sha256};

/// Puts `content` as key `a`'s file; its digest.
async fn put(daemon: &common::daemon::Daemon, content: &[u8]) -> String {
    let digest = hex::encode(Sha256::digest(content));
    let response = daemon
        .http
        .put(format!("{}/v1/files/{digest}", daemon.url))
        .bearer_auth(KEY_A)
        .body(content.to_vec())
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{response:?}");
    digest
}

#[tokio::test]
async fn a_graded_jobs_tests_read_their_input_and_expected_output_from_stored_files() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let docker = docker().await;
    let input = put(&daemon, b"21\n").await;
    let answer = put(&daemon, b"42\n").await;
    let job = json!({
        "language": "python",
        "files": [{"name": "main.py", "content": "print(int(input()) * 2)"}],
        "tests": [
            {"name": "stored", "stdin_ref": input, "expected_stdout_ref": answer},
            {"name": "mixed", "stdin_ref": input, "expected_stdout": "41\n"},
            {"name": "inline", "stdin": "1\n", "expected_stdout_ref": answer},
        ],
    });
    let answer = daemon.submit_wait(&job).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    let result = &answer.body["result"];
    let verdicts: Vec<(&str, &str)> = (0..3)
        .map(|i| {
            (
                result["tests"][i]["verdict"].as_str().unwrap(),
                result["tests"][i]["stdout"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            ("accepted", "42\n"),
            ("wrong_answer", "42\n"),
            ("wrong_answer", "2\n")
        ],
        "{result:#}"
    );
    daemon.assert_no_containers(&docker).await;
}

#[tokio::test]
async fn a_program_reads_the_stored_files_its_job_names() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let docker = docker().await;
    // Every byte value, 300 KiB: more than fits in one frame of the bundle.
    let data: Vec<u8> = (0..=255u8).cycle().take(300 << 10).collect();
    let digest = hex::encode(Sha256::digest(&data));
    let response = daemon
        .http
        .put(format!("{}/v1/files/{digest}", daemon.url))
        .bearer_auth(KEY_A)
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);

    let program = "import hashlib\n\
        for name in ['data/in.bin', 'again.bin']:\n    \
        b = open(name, 'rb').read()\n    \
        print(name, len(b), hashlib.sha256(b).hexdigest())\n";
    let answer = daemon
        .submit_wait(&json!({"language": "python", "files": [
            {"name": "main.py", "content": program},
            {"name": "data/in.bin", "ref": digest},
            {"name": "again.bin", "ref": digest},
        ]}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:#?}");
    assert_eq!(answer.body["status"], "succeeded", "{:#}", answer.body);
    assert_eq!(
        answer.body["result"]["run"]["stdout"],
        format!("data/in.bin 307200 {digest}\nagain.bin 307200 {digest}\n")
    );
    daemon.assert_no_containers(&docker).await;
}
