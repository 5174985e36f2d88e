//! Files whose bytes live in S3-compatible object storage
//! (`CODE_RUNNER_FILE_BACKEND=s3`), against a real S3 server in the test
//! (s3s over s3s-fs, `common::s3`) and a whole `code-runner serve` on the
//! scripted engine: the API's answers are the Redis backend's, the bytes
//! are in the bucket (read from its directory) and nowhere in Redis, a
//! deleted or expired file's object goes, a job runs on bytes read from the
//! bucket, and a bucket that cannot be reached is a 503 on put and the
//! job's error naming the file at run.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::json;

use super::files::{call, json_of, sha256};
use crate::common::client::{KEY_A, KEY_B};
use crate::common::daemon::Role;
use crate::common::in_process::{InProcess, InProcessBuilder};
use crate::common::redis_server::RedisServer;
use crate::common::s3::S3Server;

async fn serve(redis: &RedisServer, s3: &S3Server, settings: &[(&str, &str)]) -> InProcess {
    let mut builder = InProcessBuilder::new(Role::Serve, redis);
    for (name, value) in s3.settings() {
        builder = builder.env(name, value);
    }
    for (name, value) in settings {
        builder = builder.env(name, value);
    }
    builder.start().await
}

/// The name of key `key`'s object of file `digest`, as the backend writes
/// it: `files/<key>/<sha256>/<32 hex digits>`.
fn is_object_of(name: &str, key: &str, digest: &str) -> bool {
    let Some(upload) = name.strip_prefix(&format!("files/{key}/{digest}/")) else {
        return false;
    };
    upload.len() == 32 && upload.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Waits (up to 10 s) until the bucket holds exactly `names`' objects.
async fn wait_for_objects(s3: &S3Server, want: usize) -> Vec<(String, Vec<u8>)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let objects = s3.objects();
        if objects.len() == want || Instant::now() > deadline {
            return objects;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_files_bytes_are_an_object_of_the_bucket_read_back_and_deleted_with_it() {
    let redis = RedisServer::start();
    let s3 = S3Server::start();
    let daemon = serve(&redis, &s3, &[]).await;
    let content: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let digest = sha256(&content);

    let (status, _, body) = call(&daemon, Method::PUT, &digest, KEY_A, Some(content.clone())).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(json_of(&body), json!({"sha256": digest, "size": 70_000}));
    let (status, _, body) = call(&daemon, Method::PUT, &digest, KEY_A, Some(content.clone())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body), json!({"sha256": digest, "size": 70_000}));
    // One object, the second put wrote none; Redis names it and holds no
    // bytes of the file.
    let objects = s3.objects();
    assert_eq!(
        objects.len(),
        1,
        "{:?}",
        objects.iter().map(|o| &o.0).collect::<Vec<_>>()
    );
    assert!(
        is_object_of(&objects[0].0, "a", &digest),
        "{}",
        objects[0].0
    );
    assert_eq!(objects[0].1, content);
    let named: String = redis.cli(&["GET", &format!("fileobj:a:{digest}")]);
    assert_eq!(format!("files/{named}"), objects[0].0);
    let bytes_key: String = redis.cli(&["EXISTS", &format!("file:a:{digest}")]);
    assert_eq!(bytes_key, "0");

    let (status, headers, body) = call(&daemon, Method::GET, &digest, KEY_A, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(body, content);
    let (status, headers, _) = call(&daemon, Method::HEAD, &digest, KEY_A, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-length"], "70000");

    // Another key sees nothing, and its own copy is an object of its own.
    for method in [Method::GET, Method::HEAD, Method::DELETE] {
        let (status, _, _) = call(&daemon, method.clone(), &digest, KEY_B, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}");
    }
    let (status, _, _) = call(&daemon, Method::PUT, &digest, KEY_B, Some(content.clone())).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(s3.objects().len(), 2);

    // A body that is not the file writes nothing that stays.
    let (status, _, body) = call(
        &daemon,
        Method::PUT,
        &sha256(b"x"),
        KEY_A,
        Some(b"y".to_vec()),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json_of(&body)["error"]["field"], "sha256");

    let (status, _, _) = call(&daemon, Method::DELETE, &digest, KEY_A, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for method in [Method::GET, Method::HEAD, Method::DELETE] {
        let (status, _, _) = call(&daemon, method.clone(), &digest, KEY_A, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}");
    }
    let objects = wait_for_objects(&s3, 1).await;
    assert_eq!(objects.len(), 1);
    assert!(
        is_object_of(&objects[0].0, "b", &digest),
        "{}",
        objects[0].0
    );
    let (status, _, body) = call(&daemon, Method::GET, &digest, KEY_B, None).await;
    assert_eq!((status, body), (StatusCode::OK, content));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_goes_up_in_parts_and_comes_back_whole() {
    let redis = RedisServer::start();
    let s3 = S3Server::start();
    let daemon = serve(&redis, &s3, &[("CODE_RUNNER_FILE_MAX_MB", "600")]).await;
    // 20 MiB and a bit: three parts of a multipart upload.
    let content: Vec<u8> = (0..(20 << 20) + 12_345u32)
        .map(|i| (i % 251) as u8)
        .collect();
    let digest = sha256(&content);
    let started = Instant::now();
    let (status, _, body) = call(&daemon, Method::PUT, &digest, KEY_A, Some(content.clone())).await;
    let put = started.elapsed();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let started = Instant::now();
    let (status, _, body) = call(&daemon, Method::GET, &digest, KEY_A, None).await;
    let get = started.elapsed();
    assert_eq!(status, StatusCode::OK);
    assert!(body == content, "the bytes read back differ");
    let objects = s3.objects();
    assert_eq!(objects.len(), 1);
    assert!(objects[0].1 == content, "the object's bytes differ");
    eprintln!("20 MiB through the S3 backend: put {put:?}, get {get:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_size_limit_and_the_keys_budget_hold_with_s3_and_write_nothing() {
    let redis = RedisServer::start();
    let s3 = S3Server::start();
    let daemon = serve(
        &redis,
        &s3,
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
    assert_eq!(
        json_of(&body)["error"]["message"],
        "the file has more than 1048576 bytes, the most a file may have (CODE_RUNNER_FILE_MAX_MB)"
    );
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
    let (status, _, body) = call(
        &daemon,
        Method::PUT,
        &sha256(&third),
        KEY_A,
        Some(third.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let error = &json_of(&body)["error"];
    assert_eq!(error["code"], "key_storage");
    assert_eq!(
        error["limit"],
        json!({"setting": "CODE_RUNNER_KEY_MAX_STORED_MB", "unit": "bytes the api key's jobs and files hold (with this file's)", "value": 2_097_152, "counted": 2 * (1 << 20) - 10 + 11})
    );
    // Refused before a byte was written: two objects, the kept files'.
    assert_eq!(wait_for_objects(&s3, 2).await.len(), 2);
    let (status, _, _) = call(&daemon, Method::DELETE, &sha256(&first), KEY_A, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = call(&daemon, Method::PUT, &sha256(&third), KEY_A, Some(third)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(wait_for_objects(&s3, 2).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_unused_for_its_keep_time_goes_with_its_object() {
    let redis = RedisServer::start();
    let s3 = S3Server::start();
    let daemon = serve(&redis, &s3, &[("CODE_RUNNER_FILE_KEEP_SECS", "1")]).await;
    let content = b"kept for a second".to_vec();
    let digest = sha256(&content);
    let (status, _, _) = call(&daemon, Method::PUT, &digest, KEY_A, Some(content)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(s3.objects().len(), 1);
    // Nobody asks for it again: the API's collection deletes its object.
    let objects = wait_for_objects(&s3, 0).await;
    assert!(
        objects.is_empty(),
        "{:?}",
        objects.iter().map(|o| &o.0).collect::<Vec<_>>()
    );
    let (status, _, _) = call(&daemon, Method::HEAD, &digest, KEY_A, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let left: String = redis.cli(&["ZCARD", "files:objects"]);
    assert_eq!(left, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_on_bytes_read_from_the_bucket() {
    let redis = RedisServer::start();
    let s3 = S3Server::start();
    let daemon = serve(&redis, &s3, &[]).await;
    let program = b"print from the bucket\n".to_vec();
    let digest = sha256(&program);
    let (status, _, _) = call(&daemon, Method::PUT, &digest, KEY_A, Some(program)).await;
    assert_eq!(status, StatusCode::CREATED);
    let job = json!({"language": "python", "files": [{"name": "main.py", "ref": digest}]});
    let answer = daemon.submit_wait(&job).await;
    assert_eq!(answer.body["status"], "succeeded", "{:#}", answer.body);
    assert_eq!(answer.body["result"]["run"]["stdout"], "from the bucket\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_out_of_reach_is_a_503_on_put_and_the_jobs_error_naming_the_file() {
    let redis = RedisServer::start();
    let mut s3 = S3Server::start();
    let daemon = serve(&redis, &s3, &[]).await;
    let program = b"print never\n".to_vec();
    let digest = sha256(&program);
    let (status, _, _) = call(&daemon, Method::PUT, &digest, KEY_A, Some(program)).await;
    assert_eq!(status, StatusCode::CREATED);
    s3.stop();

    let other = b"not kept".to_vec();
    let (status, headers, body) = call(
        &daemon,
        Method::PUT,
        &sha256(&other),
        KEY_A,
        Some(other.clone()),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(headers["retry-after"], "1");
    let error = &json_of(&body)["error"];
    assert_eq!(error["code"], "unavailable");
    assert_eq!(
        error["message"],
        "the file store's object storage is unavailable; retry later"
    );
    // Nothing names the bytes that were never written.
    let (status, _, _) = call(&daemon, Method::HEAD, &sha256(&other), KEY_A, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The file's metadata is in Redis: the job is taken, and cannot run.
    let job = json!({"language": "python", "files": [{"name": "main.py", "ref": digest}]});
    let answer = daemon.submit_wait(&job).await;
    assert_eq!(answer.body["status"], "error", "{:#}", answer.body);
    let message = answer.body["result"]["error"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "the stored file {digest} the job names cannot be read: the file store's object storage failed: cannot read files/a/{digest}/"
        )),
        "{message}"
    );
}
