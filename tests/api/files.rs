//! Files by digest (`/v1/files/{sha256}`) against a whole `code-runner
//! serve` in the test: put (201, then 200), the digest checked, read back
//! byte for byte, another key's 404, delete, the size limit and the key's
//! storage budget (shared with its jobs) with the refusal naming each, and
//! a file unused for its keep time gone with its bytes given back; jobs
//! that name stored files by `ref` (run on their bytes, refused before
//! queueing when one is missing, an error naming it when one went before
//! the job started).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::client::{ApiClient, KEY_A, KEY_B};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;

async fn serve(redis: &RedisServer, settings: &[(&str, &str)]) -> InProcess {
    let mut builder = InProcessBuilder::new(Role::Serve, redis)
        .env("CODE_RUNNER_API_KEYS", format!("a:{KEY_A},b:{KEY_B}"));
    for (name, value) in settings {
        builder = builder.env(name, value);
    }
    builder.start().await
}

pub(crate) fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `method /v1/files/{digest}` as `key` with `body`: the status, the
/// headers and the body's bytes.
pub(crate) async fn call(
    daemon: &ApiClient,
    method: Method,
    digest: &str,
    key: &str,
    body: Option<Vec<u8>>,
) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
    let mut request = daemon
        .http
        .request(method, format!("{}/v1/files/{digest}", daemon.url))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    (status, headers, response.bytes().await.unwrap().to_vec())
}

pub(crate) fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_is_put_once_read_back_whole_and_deleted_by_its_key_only() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[]).await;
    // Every byte value, so nothing on the way may treat it as text.
    let content: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let digest = sha256(&content);

    let (status, _, body) = call(&daemon, Method::PUT, &digest, KEY_A, Some(content.clone())).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(json_of(&body), json!({"sha256": digest, "size": 70_000}));
    let (status, _, body) = call(&daemon, Method::PUT, &digest, KEY_A, Some(content.clone())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body), json!({"sha256": digest, "size": 70_000}));
    // The digest in capitals names the same file.
    let (status, _, _) = call(
        &daemon,
        Method::PUT,
        &digest.to_uppercase(),
        KEY_A,
        Some(content.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    let (status, headers, body) = call(&daemon, Method::GET, &digest, KEY_A, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(body, content);
    let (status, headers, body) = call(&daemon, Method::HEAD, &digest, KEY_A, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-length"], "70000");
    assert!(body.is_empty());

    // Another key sees nothing, cannot delete it, and keeps a copy of its own.
    for method in [Method::GET, Method::HEAD, Method::DELETE] {
        let (status, _, body) = call(&daemon, method.clone(), &digest, KEY_B, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}");
        if method != Method::HEAD {
            assert_eq!(json_of(&body)["error"]["code"], "not_found", "{method}");
        }
    }
    let (status, _, _) = call(&daemon, Method::PUT, &digest, KEY_B, Some(content.clone())).await;
    assert_eq!(status, StatusCode::CREATED);

    let (status, _, body) = call(&daemon, Method::DELETE, &digest, KEY_A, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(body.is_empty());
    for method in [Method::GET, Method::HEAD, Method::DELETE] {
        let (status, _, _) = call(&daemon, method.clone(), &digest, KEY_A, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}");
    }
    let (status, _, body) = call(&daemon, Method::GET, &digest, KEY_B, None).await;
    assert_eq!((status, body), (StatusCode::OK, content));

    // An empty file is a file.
    let empty = sha256(b"");
    let (status, _, _) = call(&daemon, Method::PUT, &empty, KEY_A, Some(Vec::new())).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, headers, _) = call(&daemon, Method::HEAD, &empty, KEY_A, None).await;
    assert_eq!(
        (status, &headers["content-length"]),
        (StatusCode::OK, &"0".parse().unwrap())
    );

    // Without a key: 401.
    let response = daemon
        .http
        .get(format!("{}/v1/files/{digest}", daemon.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_digest_or_a_name_that_is_none_is_a_400_naming_it() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[]).await;
    let claimed = sha256(b"what the client meant");
    let (status, _, body) = call(
        &daemon,
        Method::PUT,
        &claimed,
        KEY_A,
        Some(b"what it sent".to_vec()),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error = &json_of(&body)["error"];
    assert_eq!(error["code"], "invalid_request");
    assert_eq!(error["field"], "sha256");
    assert_eq!(
        error["message"],
        format!(
            "the body's SHA-256 is {}, not {claimed} as the path says: the file was not kept",
            sha256(b"what it sent")
        )
    );
    let (status, _, _) = call(&daemon, Method::GET, &claimed, KEY_A, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    for bad in ["abc", &"g".repeat(64), &"a".repeat(65)] {
        let (status, _, body) = call(&daemon, Method::PUT, bad, KEY_A, Some(b"x".to_vec())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        let error = &json_of(&body)["error"];
        assert_eq!(error["field"], "sha256", "{bad}");
        assert_eq!(
            error["message"],
            format!("{bad:?} is not a SHA-256: the path names a file by 64 hex digits")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_over_its_limit_or_the_keys_budget_is_refused_naming_the_limit() {
    let redis = RedisServer::start();
    let daemon = serve(
        &redis,
        &[
            ("CODE_RUNNER_FILE_MAX_MB", "1"),
            ("CODE_RUNNER_KEY_MAX_STORED_MB", "2"),
        ],
    )
    .await;
    let too_big = vec![7u8; (1 << 20) + 1];
    let (status, _, body) = call(
        &daemon,
        Method::PUT,
        &sha256(&too_big),
        KEY_A,
        Some(too_big),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let error = &json_of(&body)["error"];
    assert_eq!(error["code"], "too_large");
    assert_eq!(
        error["message"],
        "the file has more than 1048576 bytes, the most a file may have (CODE_RUNNER_FILE_MAX_MB)"
    );

    // Two files of 1 MiB fill the budget of 2 MiB; a third byte is over.
    let first = vec![1u8; 1 << 20];
    let second = vec![2u8; (1 << 20) - 10];
    for file in [&first, &second] {
        let (status, _, _) = call(
            &daemon,
            Method::PUT,
            &sha256(file),
            KEY_A,
            Some(file.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let third = vec![3u8; 11];
    let (status, headers, body) = call(
        &daemon,
        Method::PUT,
        &sha256(&third),
        KEY_A,
        Some(third.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "30");
    let error = &json_of(&body)["error"];
    assert_eq!(error["code"], "key_storage");
    assert_eq!(error["reason"], "key_storage");
    let held = 2 * (1 << 20) - 10;
    assert_eq!(
        error["message"],
        format!(
            "this api key's jobs and files hold {held} bytes and this file has 11, over the key's budget of 2097152 bytes (CODE_RUNNER_KEY_MAX_STORED_MB); delete files (DELETE /v1/files/{{sha256}}), or wait for unused ones to expire (CODE_RUNNER_FILE_KEEP_SECS) and finished jobs too"
        )
    );
    assert_eq!(
        error["limit"],
        json!({"setting": "CODE_RUNNER_KEY_MAX_STORED_MB", "unit": "bytes the api key's jobs and files hold (with this file's)", "value": 2_097_152, "counted": held + 11})
    );
    // The files count against the key's jobs too: a job no longer fits.
    let response = daemon
        .http
        .post(format!("{}/v1/jobs", daemon.url))
        .bearer_auth(KEY_A)
        .json(&json!({"language": "python", "files": [{"name": "main.py", "content": "print 1"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "key_storage", "{body}");
    // Another key has its own budget.
    let (status, _, _) = call(
        &daemon,
        Method::PUT,
        &sha256(&third),
        KEY_B,
        Some(third.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // Deleting a file gives its bytes back.
    let (status, _, _) = call(&daemon, Method::DELETE, &sha256(&first), KEY_A, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = call(&daemon, Method::PUT, &sha256(&third), KEY_A, Some(third)).await;
    assert_eq!(status, StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_unused_for_its_keep_time_goes_and_gives_its_bytes_back() {
    let redis = RedisServer::start();
    let daemon = serve(
        &redis,
        &[
            ("CODE_RUNNER_FILE_KEEP_SECS", "2"),
            ("CODE_RUNNER_KEY_MAX_STORED_MB", "1"),
        ],
    )
    .await;
    let kept = vec![5u8; 600_000];
    let used = vec![6u8; 300_000];
    for file in [&kept, &used] {
        let (status, _, _) = call(
            &daemon,
            Method::PUT,
            &sha256(file),
            KEY_A,
            Some(file.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    // `used` is read every half second: each read renews its time.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (status, _, _) = call(&daemon, Method::HEAD, &sha256(&used), KEY_A, None).await;
        assert_eq!(status, StatusCode::OK);
    }
    // `kept`, unused for 3 s, is gone, and so are its bytes from the
    // budget: 600 000 more fit again beside `used`.
    let (status, _, _) = call(&daemon, Method::GET, &sha256(&kept), KEY_A, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let other = vec![8u8; 600_000];
    let (status, _, body) = call(&daemon, Method::PUT, &sha256(&other), KEY_A, Some(other)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (status, _, body) = call(&daemon, Method::GET, &sha256(&used), KEY_A, None).await;
    assert_eq!((status, body), (StatusCode::OK, used));
}

/// Puts `content` as key `a`'s file; its digest.
async fn stored(daemon: &ApiClient, content: &[u8]) -> String {
    let digest = sha256(content);
    let (status, _, body) = call(daemon, Method::PUT, &digest, KEY_A, Some(content.to_vec())).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    digest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_names_stored_files_by_ref_and_runs_on_their_bytes() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[]).await;
    // The scripted engine runs the job's first file: stored, not sent.
    let program = stored(&daemon, b"print from the store\nprint twice\n").await;
    let data = stored(&daemon, &[0u8, 159, 146, 150]).await;
    let job = json!({"language": "python", "files": [
        {"name": "main.py", "ref": program},
        {"name": "data/in.bin", "ref": data},
        {"name": "copy.bin", "ref": data.to_uppercase()},
    ]});
    let answer = daemon.submit_wait(&job).await;
    assert_eq!(answer.status, StatusCode::OK, "{:#}", answer.body);
    assert_eq!(answer.body["status"], "succeeded", "{:#}", answer.body);
    assert_eq!(
        answer.body["result"]["run"]["stdout"],
        "from the store\ntwice\n"
    );
    // The job's record keeps the refs, not the bytes.
    let id = answer.body["id"].as_str().unwrap();
    let spec: String = redis.cli(&["HGET", &format!("job:{id}"), "spec"]);
    assert!(
        spec.contains(&program) && !spec.contains("from the store"),
        "{spec}"
    );

    // Every file named by a ref that is not stored is listed, before
    // anything is queued; another key's file is not this key's.
    let (status, _, _) = call(
        &daemon,
        Method::PUT,
        &sha256(b"b's"),
        KEY_B,
        Some(b"b's".to_vec()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let absent = sha256(b"never stored");
    let job = json!({"language": "python", "files": [
        {"name": "main.py", "ref": program},
        {"name": "a.in", "ref": absent},
        {"name": "b.in", "ref": sha256(b"b's")},
    ]});
    let answer = daemon.submit(&job).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{:#}", answer.body);
    assert_eq!(answer.body["error"]["code"], "invalid_job");
    assert_eq!(answer.body["error"]["field"], "files");
    assert_eq!(
        answer.body["error"]["message"],
        format!(
            "2 of the files named by ref are not stored for this key: {absent}, {} (PUT /v1/files/{{sha256}} first)",
            sha256(b"b's")
        )
    );
    // A ref that is no digest, or one beside content, names its file.
    for (file, field, message) in [
        (
            json!({"name": "a.in", "ref": "abc"}),
            "files[1].ref",
            "\"abc\" is not a SHA-256 (64 hex digits)",
        ),
        (
            json!({"name": "a.in", "ref": data, "content": "x"}),
            "files[1]",
            "a file has content or a ref, not both",
        ),
    ] {
        let job =
            json!({"language": "python", "files": [{"name": "main.py", "ref": program}, file]});
        let answer = daemon.submit(&job).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{:#}", answer.body);
        assert_eq!(answer.body["error"]["field"], field);
        assert_eq!(answer.body["error"]["message"], message);
    }
    // Stored files count in the job's limits.files_bytes: the program (33
    // bytes) and the big one twice.
    let big = stored(&daemon, &vec![b'#'; 600_000]).await;
    let job = json!({"language": "python", "files": [
        {"name": "main.py", "ref": program},
        {"name": "a.in", "ref": big},
        {"name": "b.in", "ref": big},
    ]});
    let answer = daemon.submit(&job).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{:#}", answer.body);
    assert_eq!(
        answer.body["error"]["message"],
        "files total more than 1048576 bytes (limits.files_bytes): 1200033 of them stored files'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_file_deleted_before_its_job_starts_is_the_jobs_error_naming_it() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[("CODE_RUNNER_WORKER_MAX_SANDBOXES", "1")]).await;
    // One slot, held by a job that sleeps: the next one waits its turn.
    let first = daemon
        .submit(&json!({"language": "python", "files": [{"name": "main.py", "content": "sleep 1500\nprint slept"}]}))
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{:#}", first.body);
    let program = stored(&daemon, b"print never\n").await;
    let second = daemon
        .submit(&json!({"language": "python", "files": [{"name": "main.py", "ref": program}]}))
        .await;
    assert_eq!(second.status, StatusCode::ACCEPTED, "{:#}", second.body);
    let (status, _, _) = call(&daemon, Method::DELETE, &program, KEY_A, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let id = second.body["id"].as_str().unwrap();
    let view = daemon.wait_terminal(id, Duration::from_secs(30)).await;
    assert_eq!(view["status"], "error", "{view:#}");
    assert_eq!(
        view["result"]["error"],
        format!(
            "the stored file {program} the job names is gone (deleted, or unused for its keep time) since the job was taken; put it again and resubmit"
        )
    );
    let first = daemon
        .wait_terminal(first.body["id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(first["result"]["run"]["stdout"], "slept\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tests_stored_input_must_exist_and_fit_the_stdin_limit() {
    let redis = RedisServer::start();
    let daemon = serve(&redis, &[]).await;
    let absent = sha256(b"no such input");
    let job = |tests: Value| json!({"language": "python", "files": [{"name": "main.py", "content": "print 1"}], "tests": tests});
    let answer = daemon
        .submit(&job(
            json!([{"stdin_ref": absent, "expected_stdout": "1\n"}]),
        ))
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{:#}", answer.body);
    assert_eq!(
        answer.body["error"]["message"],
        format!(
            "1 of the files named by ref is not stored for this key: {absent} (PUT /v1/files/{{sha256}} first)"
        )
    );
    // 5 MiB of input twice passes the server's 8 MiB for tests.
    let big = stored(&daemon, &vec![b'7'; 5 << 20]).await;
    let answer = daemon
        .submit(&job(
            json!([{"stdin_ref": big}, {"stdin_ref": big, "expected_stdout": "1\n"}]),
        ))
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{:#}", answer.body);
    assert_eq!(answer.body["error"]["field"], "tests");
    assert_eq!(
        answer.body["error"]["message"],
        "the tests' stdin and expected output come to more than the limit of 8388608 bytes: 10485760 of them stored files'"
    );
    let answer = daemon
        .submit(&job(json!([{"stdin_ref": big, "stdin": "x"}])))
        .await;
    assert_eq!(
        answer.body["error"]["field"], "tests[0]",
        "{:#}",
        answer.body
    );
}
