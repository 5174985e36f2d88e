//! The libraries of the runtimes (`libraries` in
//! `runner-images/languages.toml`, installed by `scripts/build-images`):
//! a real `code-runner serve` lists them in `/v1/languages`, and a job
//! (no network) imports each one and finds its pinned version. Piston's
//! runtimes keep their shape.

use crate::common;

use code_runner::languages::{LanguageCatalog, Library, LibrarySource};
use common::daemon::{DaemonBuilder, Role, job, run_stdout};
use common::redis_server::RedisServer;
use serde_json::{Value, json};

/// A program in `language` that imports `library` and prints `<name>
/// <version>` (the version as its package metadata says), with its file
/// name.
fn importer(language: &str, library: &Library) -> (&'static str, String) {
    let module = library.import.as_deref().unwrap_or(&library.name);
    match (language, library.source) {
        ("python", LibrarySource::Pypi) => (
            "main.py",
            format!(
                "import importlib.metadata\nimport {module}\nprint({name:?}, importlib.metadata.version({name:?}))\n",
                name = library.name
            ),
        ),
        ("javascript", LibrarySource::Npm) => (
            "main.js",
            format!(
                "require({module:?});\nconsole.log({name:?}, require({name:?} + '/package.json').version);\n",
                name = library.name
            ),
        ),
        _ => panic!(
            "no importer for a {} library of {language}: add one to tests/sandbox/libraries.rs",
            library.source.as_str()
        ),
    }
}

#[tokio::test]
async fn every_listed_library_is_in_its_image_at_its_pinned_version() {
    let catalog = LanguageCatalog::embedded().unwrap();
    let with_libraries: Vec<_> = catalog
        .all()
        .iter()
        .filter(|l| !l.libraries.is_empty())
        .collect();
    // The libraries every install has: numpy in python, lodash in javascript.
    let listed: Vec<(&str, &str)> = with_libraries
        .iter()
        .flat_map(|l| {
            l.libraries
                .iter()
                .map(|lib| (l.id.as_str(), lib.name.as_str()))
        })
        .collect();
    assert!(listed.contains(&("python", "numpy")), "{listed:?}");
    assert!(listed.contains(&("javascript", "lodash")), "{listed:?}");

    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis).start().await;
    let languages = daemon.get("/v1/languages", None).await.body;
    for language in &with_libraries {
        let view = languages["languages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["id"] == language.id.as_str())
            .unwrap_or_else(|| panic!("{} is not offered: {languages:#}", language.id));
        assert_eq!(
            view["libraries"],
            serde_json::to_value(&language.libraries).unwrap(),
            "{}",
            language.id
        );
        for library in &language.libraries {
            if library.source == LibrarySource::Debian {
                let version = std::process::Command::new("docker")
                    .args([
                        "run",
                        "--rm",
                        "--network",
                        "none",
                        "--entrypoint",
                        "dpkg-query",
                    ])
                    .arg(language.image_ref())
                    .args(["-W", "-f", "${Version}", &library.name])
                    .output()
                    .expect("docker runs");
                assert!(
                    version.status.success(),
                    "{} is not installed in {}",
                    library.name,
                    language.image
                );
                if let Some(pinned) = &library.version {
                    assert_eq!(String::from_utf8_lossy(&version.stdout), *pinned);
                }
                continue;
            }
            let (file, source) = importer(&language.id, library);
            let answer = daemon.submit_wait(&job(&language.id, file, &source)).await;
            assert_eq!(
                answer.body["status"], "succeeded",
                "{}: {:#}",
                library.name, answer.body
            );
            assert_eq!(
                run_stdout(&answer.body),
                format!(
                    "{} {}\n",
                    library.name,
                    library.version.as_deref().unwrap_or("")
                ),
                "{}",
                library.name
            );
        }
    }
    // The python one is used, not only imported: numpy computes within the
    // job's limits, in one thread (one BLAS thread, whatever the host has).
    let answer = daemon
        .submit_wait(&job(
            "python",
            "main.py",
            "import numpy as np, os\nm = np.arange(9.0).reshape(3, 3)\nprint(int((m @ m.T).trace()), len(os.listdir('/proc/self/task')))\n",
        ))
        .await;
    assert_eq!(answer.body["status"], "succeeded", "{:#}", answer.body);
    assert_eq!(run_stdout(&answer.body), "204 1\n");
    // Piston's runtimes keep Piston's fields only.
    let runtimes = daemon.get("/api/v2/runtimes", None).await.body;
    for runtime in runtimes.as_array().unwrap() {
        let mut keys: Vec<&str> = runtime
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.retain(|k| *k != "runtime");
        assert_eq!(keys, ["aliases", "language", "version"], "{runtime}");
    }
    let python: Value = runtimes
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["language"] == "python")
        .cloned()
        .unwrap();
    assert_eq!(
        python,
        json!({"language": "python", "version": "3.11.0", "aliases": ["py", "python3"]})
    );
}

/// `scripts/build-images` rebuilds only what changed: with every image
/// built (as `scripts/test` leaves them), building the two languages with
/// libraries again finds both up to date — the libraries' install step is
/// part of their inputs, and it is the same step every time.
#[test]
fn building_the_images_with_libraries_again_rebuilds_nothing() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("scripts/build-images"))
        .args(["python", "javascript"])
        .current_dir(root)
        .output()
        .expect("scripts/build-images runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for language in ["python", "javascript"] {
        assert!(
            text.contains(&format!(
                "{language}: up to date (code-runner/{language}:latest)"
            )),
            "{text}"
        );
    }
    assert!(!text.contains("building code-runner/"), "{text}");
}
