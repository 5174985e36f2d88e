//! Every language: hello world, a byte-exact stdin echo, and for compiled
//! languages a compile error reported as the compile stage's result.

use crate::common;
use crate::jobs::base64;

use code_runner::job::Status;
use code_runner::protocol::Reason;
use common::programs::{ECHO, HELLO};
use common::{Harness, job, stdout};

#[tokio::test]
async fn hello_world_in_every_language() {
    let harness = Harness::new().await;
    for (language, file, source) in HELLO {
        let result = harness.run(&job(language, file, source)).await;
        assert_eq!(result.status, Status::Succeeded, "{language}: {result:#?}");
        assert_eq!(stdout(&result), format!("hello from {language}\n"));
        let run = result.run.as_ref().unwrap();
        assert_eq!(run.exit_code, Some(0));
        assert_eq!(run.reason, Reason::Exited);
        assert_eq!(result.language, *language);
        let compiled = harness.catalog.find(language).unwrap().compile.is_some();
        assert_eq!(result.compile.is_some(), compiled, "{language}");
    }
    harness.assert_clean().await;
}

#[tokio::test]
async fn stdin_is_echoed_byte_exact_in_every_language() {
    let harness = Harness::new().await;
    // Text with a newline in the middle, no final newline, and UTF-8.
    let input = "first line\nsecond ünïcode line, no newline at the end";
    for (language, file, source) in ECHO {
        let mut spec = job(language, file, source);
        spec.stdin = input.to_string();
        let result = harness.run(&spec).await;
        assert_eq!(result.status, Status::Succeeded, "{language}: {result:#?}");
        assert_eq!(stdout(&result), input, "{language}");
    }
    harness.assert_clean().await;
}

#[tokio::test]
async fn binary_stdin_and_output_survive() {
    let harness = Harness::new().await;
    let mut spec = job("bash", "main.sh", "cat");
    let bytes: Vec<u8> = (0..=255u8).chain([0, 0xff, 0xc3]).collect();
    spec.stdin = base64(&bytes);
    spec.stdin_encoding = code_runner::job::Encoding::Base64;
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(
        result.run.as_ref().unwrap().stdout.as_bytes(),
        bytes.as_slice()
    );
    // Not UTF-8: the JSON result carries it as base64 with a flag.
    let json = serde_json::to_value(&result).unwrap();
    assert_eq!(json["run"]["stdout_encoding"], "base64");
    assert_eq!(json["run"]["stdout"], base64(&bytes));
    harness.assert_clean().await;
}

#[tokio::test]
async fn stdout_and_stderr_are_kept_apart() {
    let harness = Harness::new().await;
    let result = harness
        .run(&job(
            "python",
            "main.py",
            "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)",
        ))
        .await;
    assert_eq!(result.status, Status::Failed);
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.stdout.as_bytes(), b"out\n");
    assert_eq!(run.stderr.as_bytes(), b"err\n");
    assert_eq!(run.exit_code, Some(3));
    assert_eq!(run.reason, Reason::Exited);
    harness.assert_clean().await;
}

#[tokio::test]
async fn compile_errors_are_the_compile_stage_result_and_the_run_never_starts() {
    let harness = Harness::new().await;
    for (language, file, source, message) in [
        // gcc quotes with ‘’ under LANG=C.UTF-8.
        (
            "c",
            "main.c",
            "int main(void){ return nope; }",
            "nope’ undeclared",
        ),
        (
            "cpp",
            "main.cpp",
            "int main(){ return nope; }",
            "nope’ was not declared",
        ),
        (
            "go",
            "main.go",
            "package main\nfunc main(){ nope() }",
            "undefined: nope",
        ),
    ] {
        let result = harness.run(&job(language, file, source)).await;
        assert_eq!(result.status, Status::Failed, "{language}: {result:#?}");
        assert!(result.run.is_none(), "{language}: the run stage started");
        let compile = result.compile.as_ref().expect("a compile result");
        assert_eq!(compile.reason, Reason::Exited);
        assert_ne!(compile.exit_code, Some(0));
        let diagnostics = format!(
            "{}{}",
            String::from_utf8_lossy(compile.stdout.as_bytes()),
            String::from_utf8_lossy(compile.stderr.as_bytes())
        );
        assert!(
            diagnostics.contains(message),
            "{language}: {diagnostics:?} lacks {message:?}"
        );
    }
    harness.assert_clean().await;
}

#[tokio::test]
async fn args_and_env_reach_the_program() {
    let harness = Harness::new().await;
    let mut spec = job("bash", "main.sh", "echo \"$#:$1:$2:$GREETING\"");
    spec.args = vec!["a b".into(), "-c".into()];
    spec.env.insert("GREETING".into(), "hi".into());
    let result = harness.run(&spec).await;
    assert_eq!(stdout(&result), "2:a b:-c:hi\n");
    harness.assert_clean().await;
}

#[tokio::test]
async fn several_files_in_directories_are_written() {
    let harness = Harness::new().await;
    let mut spec = job(
        "python",
        "main.py",
        "from pkg.helper import word\nprint(word())",
    );
    spec.files.push(code_runner::job::FileSpec {
        name: "pkg/helper.py".into(),
        content: "def word():\n    return 'nested'\n".into(),
        encoding: code_runner::job::Encoding::Utf8,
        reference: None,
    });
    spec.files.push(code_runner::job::FileSpec {
        name: "pkg/__init__.py".into(),
        content: String::new(),
        encoding: code_runner::job::Encoding::Utf8,
        reference: None,
    });
    let result = harness.run(&spec).await;
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    assert_eq!(stdout(&result), "nested\n");
    harness.assert_clean().await;
}
