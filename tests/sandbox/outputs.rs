//! Output files from a real sandbox (the image's supervisor): a glob with
//! several matches, binary bytes exact, a missing path, a link and a
//! directory never read, files written by a run that timed out, and a
//! graded job's answer written to a file by each test.

use code_runner::job::Status;
use code_runner::job::outputs::OutputEntry;
use serde_json::json;

use crate::common::Harness;

fn spec(source: &str, extra: serde_json::Value) -> code_runner::job::JobSpec {
    let mut value =
        json!({"language": "python", "files": [{"name": "main.py", "content": source}]});
    for (key, item) in extra.as_object().unwrap() {
        value[key] = item.clone();
    }
    serde_json::from_value(value).expect("a valid job spec")
}

fn shape(entries: &[OutputEntry]) -> Vec<(Option<&str>, Option<&str>, Option<&str>)> {
    entries
        .iter()
        .map(|e| (e.name.as_deref(), e.pattern.as_deref(), e.error.as_deref()))
        .collect()
}

const WRITER: &str = r#"
import os
os.makedirs("out/sub", exist_ok=True)
open("out/a.bin", "wb").write(bytes(range(256)))
open("out/b.bin", "wb").write(b"\x00\xff" * 40000)
open("out/sub/c.bin", "wb").write(b"deep")
os.symlink("/etc/passwd", "out/link.bin")
os.makedirs("out/dir.bin")
open("result.csv", "w").write("x,y\n1,2\n")
"#;

#[tokio::test]
async fn a_run_sends_back_its_files_and_answers_what_it_cannot() {
    sends_back_its_files(Harness::new().await).await;
}

/// Under gVisor the supervisor walks its kernel's file system the same way.
#[tokio::test]
async fn a_run_sends_back_its_files_under_gvisor() {
    let Some(harness) =
        crate::common::runsc_harness("a_run_sends_back_its_files_under_gvisor").await
    else {
        return;
    };
    sends_back_its_files(harness).await;
}

async fn sends_back_its_files(harness: Harness) {
    let result = harness
        .run(&spec(
            WRITER,
            json!({"outputs": ["out/*.bin", "result.csv", "missing.txt", "out/dir.bin"]}),
        ))
        .await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    let outputs = &result.outputs;
    assert_eq!(
        shape(outputs),
        [
            (
                Some("out/link.bin"),
                Some("out/*.bin"),
                Some("not_regular_file")
            ),
            (Some("out/a.bin"), None, None),
            (Some("out/b.bin"), None, None),
            (Some("result.csv"), None, None),
            (None, Some("missing.txt"), Some("not_found")),
            (
                Some("out/dir.bin"),
                Some("out/dir.bin"),
                Some("not_regular_file")
            ),
        ],
        "{outputs:#?}"
    );
    assert_eq!(outputs[1].content, Some((0..=255u8).collect::<Vec<_>>()));
    let b = [0u8, 0xff].repeat(40000);
    assert_eq!(outputs[2].size, Some(80_000));
    assert_eq!(
        outputs[2].content.as_deref(),
        Some(b.as_slice()),
        "chunked bytes exact"
    );
    assert_eq!(
        outputs[2].sha256,
        Some(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&b)))
    );
    assert_eq!(outputs[3].content.as_deref(), Some(&b"x,y\n1,2\n"[..]));
}

#[tokio::test]
async fn a_run_that_timed_out_still_sends_what_it_wrote() {
    let harness = Harness::new().await;
    let source = "import time\nopen('partial.txt', 'w').write('so far')\ntime.sleep(60)\n";
    let result = harness
        .run(&spec(
            source,
            json!({"outputs": ["partial.txt"], "limits": {"wall_ms": 1000}}),
        ))
        .await;
    assert_eq!(result.status, Status::TimedOut, "{result:#?}");
    assert_eq!(result.outputs[0].content.as_deref(), Some(&b"so far"[..]));
}

#[tokio::test]
async fn each_test_of_a_graded_job_sends_its_own_answer_file() {
    let harness = Harness::new().await;
    let source = "a, b = map(int, input().split())\nopen('answer.txt', 'w').write(str(a + b))\nprint(a + b)\n";
    let result = harness
        .run(&spec(
            source,
            json!({
                "outputs": ["answer.txt"],
                "tests": [
                    {"stdin": "1 2", "expected_stdout": "3"},
                    {"stdin": "20 22", "expected_stdout": "42"},
                ],
            }),
        ))
        .await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert!(
        result.outputs.is_empty(),
        "a graded job's files are on its tests"
    );
    let tests = &result.grading.as_ref().unwrap().tests;
    let answers: Vec<_> = tests
        .iter()
        .map(|t| {
            t.outputs
                .iter()
                .map(|e| e.content.clone())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        answers,
        [vec![Some(b"3".to_vec())], vec![Some(b"42".to_vec())]],
        "each test's own file, none left by the one before"
    );
}
