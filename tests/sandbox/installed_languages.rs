//! Only installed languages are offered: a worker offers the catalog's
//! languages whose images its Docker has and advertises them with its
//! heartbeat; an API-only process shows what the live workers advertise;
//! `doctor` notes the languages without an image instead of failing; a
//! worker's `/readyz` checks the images of what it offers.
//! And multi-file projects keep their directories, through the API and
//! through the CLI.

use crate::common;

use std::time::Duration;

use common::daemon::{DaemonBuilder, KEY_A, Role, run_stdout};
use common::redis_server::RedisServer;
use common::{CliHarness, catalog_with_cobol, code_runner};
use serde_json::{Value, json};

fn ids(languages: &Value) -> Vec<String> {
    languages["languages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn an_api_process_shows_what_the_live_workers_offer() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog_with_cobol(dir.path());
    let api = DaemonBuilder::new(Role::Api, &redis)
        .env("CODE_RUNNER_LANGUAGES_FILE", catalog.display())
        .start()
        .await;
    // No worker has said anything yet: the whole catalog.
    let before = ids(&api.get("/v1/languages", None).await.body);
    assert!(before.contains(&"cobol".to_string()), "{before:?}");

    let worker = DaemonBuilder::new(Role::Worker, &redis)
        .env("CODE_RUNNER_LANGUAGES_FILE", catalog.display())
        .start()
        .await;
    let after = common::wait_for(
        "the worker's languages",
        Duration::from_secs(20),
        async || {
            let now = ids(&api.get("/v1/languages", None).await.body);
            (!now.contains(&"cobol".to_string())).then_some(now)
        },
    )
    .await;
    assert!(after.contains(&"python".to_string()), "{after:?}");
    // Piston and Judge0 list the same languages.
    let runtimes = api.get("/api/v2/runtimes", None).await.body;
    assert_eq!(
        runtimes.as_array().unwrap().len(),
        after.len(),
        "{runtimes:#}"
    );
    // And a job for an installed language runs.
    let answer = api
        .submit_wait(&json!({"language": "python", "files": [{"name": "main.py", "content": "print('ran')"}]}))
        .await;
    assert_eq!(run_stdout(&answer.body), "ran\n", "{:#?}", answer);
    drop(worker);
}

/// `code-runner/bash` under a name of this test's own, untagged when dropped
/// (the image itself stays).
struct TemporaryTag(String);

impl TemporaryTag {
    fn of(image: &str) -> Self {
        let tag = format!("code-runner-test/readyz-{}:latest", uuid::Uuid::new_v4());
        let status = std::process::Command::new("docker")
            .args(["tag", image, &tag])
            .status()
            .unwrap();
        assert!(status.success(), "docker tag {image} {tag}");
        Self(tag)
    }

    fn remove(&self) {
        let output = std::process::Command::new("docker")
            .args(["rmi", &self.0])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "docker rmi {}: {}",
            self.0,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for TemporaryTag {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rmi", &self.0])
            .output();
    }
}

/// The failing checks of a `/readyz` answer, by name.
fn failing_checks(body: &Value) -> Vec<String> {
    body["failing"]
        .as_array()
        .unwrap_or_else(|| panic!("no failing list in {body:#}"))
        .iter()
        .map(|f| f["check"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_worker_is_ready_while_its_images_are_there_and_a_reaper_needs_none() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let tag = TemporaryTag::of("code-runner/bash:latest");
    let catalog = catalog_with_cobol(dir.path());
    let mut text = std::fs::read_to_string(&catalog).unwrap();
    text.push_str(&format!(
        "\n[[language]]\nid = \"tagged\"\nname = \"Tagged bash\"\nversion = \"5\"\n\
         image = \"{}\"\nsource_file = \"main.sh\"\nrun = [\"bash\", \"main.sh\"]\n",
        tag.0
    ));
    std::fs::write(&catalog, text).unwrap();

    // A worker alone checks Docker and the images of what it offers (not
    // cobol's, which it does not offer).
    let worker = DaemonBuilder::new(Role::Worker, &redis)
        .env("CODE_RUNNER_LANGUAGES_FILE", catalog.display())
        .start()
        .await;
    let ready = worker.get("/readyz", None).await;
    assert_eq!(ready.status, reqwest::StatusCode::OK, "{ready:#?}");
    assert_eq!(failing_checks(&ready.body), Vec::<String>::new());
    tag.remove();
    let unready = worker.get("/readyz", None).await;
    assert_eq!(
        unready.status,
        reqwest::StatusCode::SERVICE_UNAVAILABLE,
        "{unready:#?}"
    );
    assert_eq!(unready.body["ready"], false);
    assert_eq!(failing_checks(&unready.body), [format!("image {}", tag.0)]);

    // A reaper alone runs no job: Docker is all it needs.
    let reaper = DaemonBuilder::new(Role::Reaper, &redis)
        .env("CODE_RUNNER_LANGUAGES_FILE", catalog.display())
        .start()
        .await;
    let ready = reaper.get("/readyz", None).await;
    assert_eq!(ready.status, reqwest::StatusCode::OK, "{ready:#?}");
    assert_eq!(failing_checks(&ready.body), Vec::<String>::new());
    drop((worker, reaper));
}

#[tokio::test]
async fn doctor_notes_languages_without_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog_with_cobol(dir.path());
    let output = code_runner()
        .arg("doctor")
        .env("CODE_RUNNER_LANGUAGES_FILE", &catalog)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let note = stdout
        .lines()
        .find(|l| l.starts_with("note:") && l.contains("not installed"))
        .unwrap_or_else(|| panic!("no note in {stdout}"));
    assert!(note.contains("cobol"), "{note}");
    // (Images built with another supervisor are problems of their own; a
    // language without an image is not.)
    assert!(
        !stdout
            .lines()
            .any(|l| l.starts_with("problem:") && (l.contains("cobol") || l.contains("missing"))),
        "{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("ok: ")
            && l.contains("languages installed")
            && l.contains("python")),
        "{stdout}"
    );
}

#[tokio::test]
async fn projects_keep_their_directories_through_the_api() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let cases = [
        (
            "java",
            json!([
                {"name": "com/acme/app/Main.java", "content": "package com.acme.app;\nimport com.acme.util.Greeter;\npublic class Main {\n  public static void main(String[] a) { System.out.println(Greeter.greet(\"java\")); }\n}\n"},
                {"name": "com/acme/util/Greeter.java", "content": "package com.acme.util;\npublic class Greeter {\n  public static String greet(String who) { return \"hello from \" + who; }\n}\n"}
            ]),
            "hello from java\n",
        ),
        (
            "python",
            json!([
                {"name": "main.py", "content": "from pkg.sub.words import word\nprint(word())"},
                {"name": "pkg/__init__.py", "content": ""},
                {"name": "pkg/sub/__init__.py", "content": ""},
                {"name": "pkg/sub/words.py", "content": "def word():\n    return 'hello from python'\n"}
            ]),
            "hello from python\n",
        ),
        (
            "c",
            json!([
                {"name": "main.c", "content": "#include <stdio.h>\n#include \"greet.h\"\nint main(void) { puts(greet()); return 0; }\n"},
                {"name": "include/greet.h", "content": "const char *greet(void);\n"},
                {"name": "src/greet.c", "content": "#include \"greet.h\"\nconst char *greet(void) { return \"hello from c\"; }\n"}
            ]),
            "hello from c\n",
        ),
    ];
    for (language, files, expected) in cases {
        let answer = daemon
            .submit_as(
                Some(KEY_A),
                &json!({"language": language, "files": files}),
                true,
            )
            .await;
        assert_eq!(
            answer.body["status"], "succeeded",
            "{language}: {:#}",
            answer.body
        );
        assert_eq!(run_stdout(&answer.body), expected, "{language}");
    }
}

#[tokio::test]
async fn the_cli_keeps_relative_paths() {
    let harness = CliHarness::new().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("lib")).unwrap();
    std::fs::write(
        dir.path().join("main.py"),
        "import os\nfrom lib.util import word\nprint(word(), sorted(os.listdir('lib')))\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("lib/util.py"),
        "def word():\n    return 'nested'\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("lib/__init__.py"), "").unwrap();
    let mut command = harness.command();
    command.current_dir(dir.path()).args([
        "sandbox",
        "run",
        "main.py",
        "lib/util.py",
        "./lib/__init__.py",
    ]);
    let output = command.output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "nested ['__init__.py', 'util.py']\n",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(0));
    harness.assert_clean().await;
}
