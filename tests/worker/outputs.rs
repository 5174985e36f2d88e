//! A job's output files through the worker, on the scripted engine: a
//! glob with several matches, a missing path, a link, binary content that
//! round-trips exactly, the inline cap (the file past it stored, its `ref`
//! readable from the key's files), the store's refusal, and a run stage
//! that never ran.

use std::time::Duration;

use code_runner::job::outputs::OutputEntry;
use code_runner::job::{JobSpec, Status};
use code_runner::store::{NewJob, SubmitOutcome};
use sha2::{Digest, Sha256};

use crate::common::scripted;
use crate::world::{JOB_DEADLINE, World};

fn with_outputs(script: &str, outputs: &[&str]) -> JobSpec {
    JobSpec {
        outputs: outputs.iter().map(|p| p.to_string()).collect(),
        ..scripted::job(script)
    }
}

fn binary(size: u32) -> Vec<u8> {
    (0..size).map(|i| (i % 251) as u8).collect()
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The job's output entries once it ended.
async fn outputs_of(world: &World, id: &str) -> (Status, Vec<OutputEntry>) {
    let record = world.wait_terminal(id, JOB_DEADLINE).await;
    let result = record.result.expect("a result");
    (record.status, result.outputs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn globs_missing_paths_links_and_binary_content_are_each_answered() {
    let world = World::new().await;
    let script = "file out/a.png \\x00\\xff\\x01\nfile-bytes out/b.png 300\nfile out/c.txt text\nlink out/d.png\nfile result.csv x,y\\n\nprint done";
    let id = world
        .submit(&with_outputs(
            script,
            &["out/*.png", "result.csv", "missing.txt"],
        ))
        .await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));
    let (status, outputs) = outputs_of(&world, &id).await;
    assert_eq!(status, Status::Succeeded);
    let shapes: Vec<_> = outputs
        .iter()
        .map(|e| (e.name.as_deref(), e.pattern.as_deref(), e.error.as_deref()))
        .collect();
    assert_eq!(
        shapes,
        [
            (Some("out/a.png"), None, None),
            (Some("out/b.png"), None, None),
            (
                Some("out/d.png"),
                Some("out/*.png"),
                Some("not_regular_file")
            ),
            (Some("result.csv"), None, None),
            (None, Some("missing.txt"), Some("not_found")),
        ]
    );
    assert_eq!(outputs[0].content.as_deref(), Some(&[0u8, 0xff, 1][..]));
    assert_eq!(outputs[0].size, Some(3));
    assert_eq!(
        outputs[0].sha256.as_deref(),
        Some(sha(&[0, 0xff, 1]).as_str())
    );
    assert_eq!(outputs[1].content, Some(binary(300)));
    assert_eq!(outputs[1].sha256, Some(sha(&binary(300))));
    assert_eq!(outputs[3].content.as_deref(), Some(&b"x,y\n"[..]));
    // As a client reads it: base64 content, and nothing of a stored file.
    let json = serde_json::to_value(&outputs[0]).unwrap();
    assert_eq!(json["content"], "AP8B");
    assert!(json.get("ref").is_none());
    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_past_the_inline_cap_go_to_the_store_by_ref() {
    let world = World::new().await;
    let script = "file-bytes first.bin 600\nfile-bytes second.bin 700\nfile-bytes third.bin 100";
    let id = world
        .submit(&with_outputs(
            script,
            &["first.bin", "second.bin", "third.bin"],
        ))
        .await;
    let mut worker = world.start_worker_with(1, Duration::from_secs(30), |config| {
        config.outputs.inline_max_bytes = 1000;
    });
    let (status, outputs) = outputs_of(&world, &id).await;
    assert_eq!(status, Status::Succeeded);
    // The first fits inline; the second does not and is stored; the third
    // still fits in what is left.
    assert_eq!(outputs[0].content, Some(binary(600)));
    assert_eq!(outputs[1].content, None);
    assert_eq!(outputs[1].size, Some(700));
    let digest = sha(&binary(700));
    assert_eq!(outputs[1].reference.as_deref(), Some(digest.as_str()));
    assert_eq!(outputs[1].sha256.as_deref(), Some(digest.as_str()));
    assert_eq!(outputs[2].content, Some(binary(100)));
    let stored = world
        .store
        .files()
        .get("test", &digest, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(stored, Some(binary(700)), "the ref reads the file's bytes");
    let json = serde_json::to_value(&outputs[1]).unwrap();
    assert_eq!(json["ref"], digest.as_str());
    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_the_store_refuses_says_so() {
    let world = World::new().await;
    let spec = with_outputs("file-bytes big.bin 5000", &["big.bin"]);
    let id = uuid::Uuid::new_v4().to_string();
    let outcome = world
        .store
        .jobs()
        .submit(NewJob {
            id: &id,
            spec: &spec,
            api_key: "test",
            user: "",
            language: &spec.language,
            idempotency: None,
            admission: code_runner::store::Admission {
                // Room for the job itself (its reserve), not for a 5000-byte file.
                storage_budget: 8_000,
                ..crate::common::admission()
            },
        })
        .await
        .expect("submit");
    assert_eq!(outcome, SubmitOutcome::Accepted);
    let mut worker = world.start_worker_with(1, Duration::from_secs(30), |config| {
        config.outputs.inline_max_bytes = 0;
    });
    let (status, outputs) = outputs_of(&world, &id).await;
    assert_eq!(status, Status::Succeeded);
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    assert_eq!(outputs[0].name.as_deref(), Some("big.bin"));
    assert_eq!(
        outputs[0].error.as_deref(),
        Some("storage_refused"),
        "{outputs:?}"
    );
    assert_eq!(outputs[0].size, Some(5000));
    assert_eq!(outputs[0].sha256, Some(sha(&binary(5000))));
    assert_eq!(
        (outputs[0].content.as_ref(), outputs[0].reference.as_ref()),
        (None, None)
    );
    assert!(
        outputs[0].message.as_deref().unwrap().contains("budget"),
        "{outputs:?}"
    );
    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_stage_that_never_ran_answers_each_pattern() {
    let world = World::new().await;
    let spec = JobSpec {
        outputs: vec!["a.txt".into(), "out/*".into()],
        ..crate::common::job("c", "main.c", "compile-error nope")
    };
    let id = world.submit(&spec).await;
    let mut worker = world.start_worker(1, Duration::from_secs(30));
    let (status, outputs) = outputs_of(&world, &id).await;
    assert_eq!(status, Status::Failed);
    let codes: Vec<_> = outputs
        .iter()
        .map(|e| (e.pattern.as_deref().unwrap(), e.error.as_deref().unwrap()))
        .collect();
    assert_eq!(codes, [("a.txt", "not_run"), ("out/*", "not_run")]);
    worker.shut_down();
    worker.stopped(Duration::from_secs(10)).await;
}
