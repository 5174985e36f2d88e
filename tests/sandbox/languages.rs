//! Every language of the catalog, one test each under runc and one under
//! runsc (when `CODE_RUNNER_TEST_RUNSC=1`): hello world, a program reading
//! stdin, a compile error for compiled languages (reported as the compile
//! stage's result, and the run never starts), and a runtime error ending with
//! the exit code (or signal) that language gives it. The cases are
//! `common::programs::LANGUAGE_CASES`; a language without one fails
//! `every_catalog_language_has_a_case`.

use crate::common;

use code_runner::job::{JobResult, Status};
use code_runner::protocol::Reason;
use common::programs::{Ending, LANGUAGE_CASES, LanguageCase};
use common::{Harness, job, runsc_enabled, stdout};

fn case(language: &str) -> &'static LanguageCase {
    LANGUAGE_CASES
        .iter()
        .find(|c| c.language == language)
        .unwrap_or_else(|| panic!("no test case for {language}"))
}

fn diagnostics(result: &JobResult) -> String {
    let compile = result.compile.as_ref().expect("a compile result");
    format!(
        "{}{}",
        String::from_utf8_lossy(compile.stdout.as_bytes()),
        String::from_utf8_lossy(compile.stderr.as_bytes())
    )
}

/// Runs the four checks of `language` on `runtime`.
async fn check(language: &str, runtime: Option<&str>) {
    let case = case(language);
    let harness = Harness::with_runtime(runtime).await;
    let on = runtime.unwrap_or("runc");
    let definition = harness
        .catalog
        .find(language)
        .unwrap_or_else(|| panic!("{language} is not in the catalog"));
    let image = definition.image_ref();
    assert!(
        harness.engine.docker().inspect_image(&image).await.is_ok(),
        "image {image} is missing: build it with scripts/build-images {language}"
    );
    let compiled = definition.compile.is_some();

    // Hello world.
    let result = harness.run(&job(language, case.file, case.hello)).await;
    assert_eq!(
        result.status,
        Status::Succeeded,
        "{language} on {on}: {result:#?}"
    );
    assert_eq!(
        stdout(&result),
        format!("hello from {language}\n"),
        "{language} on {on}"
    );
    assert_eq!(result.language, language);
    assert_eq!(result.compile.is_some(), compiled, "{language}");
    let run = result.run.as_ref().unwrap();
    assert_eq!((run.exit_code, run.reason), (Some(0), Reason::Exited));

    // Stdin.
    let (source, input, expected) = case.stdin;
    let mut spec = job(language, case.file, source);
    spec.stdin = input.to_string();
    let result = harness.run(&spec).await;
    assert_eq!(
        result.status,
        Status::Succeeded,
        "{language} stdin on {on}: {result:#?}"
    );
    assert_eq!(stdout(&result), expected, "{language} stdin on {on}");

    // A compile error: the compile stage's result, and no run stage.
    assert_eq!(
        case.compile_error.is_some(),
        compiled,
        "{language}: a compile-error case exactly when the language compiles"
    );
    if let Some((source, message)) = case.compile_error {
        let result = harness.run(&job(language, case.file, source)).await;
        assert_eq!(
            result.status,
            Status::Failed,
            "{language} on {on}: {result:#?}"
        );
        assert!(result.run.is_none(), "{language}: the run stage started");
        let compile = result.compile.as_ref().unwrap();
        assert_eq!(compile.reason, Reason::Exited, "{language}: {compile:#?}");
        assert_ne!(compile.exit_code, Some(0));
        let text = diagnostics(&result);
        assert!(
            text.contains(message),
            "{language}: {text:?} lacks {message:?}"
        );
    }

    // A runtime error.
    let (source, ending) = case.runtime_error;
    let result = harness.run(&job(language, case.file, source)).await;
    assert_eq!(
        result.status,
        Status::Failed,
        "{language} runtime error on {on}: {result:#?}"
    );
    let run = result
        .run
        .as_ref()
        .unwrap_or_else(|| panic!("{language}: no run stage: {result:#?}"));
    match ending {
        Ending::Exit(code) => {
            assert_eq!(run.reason, Reason::Exited, "{language}: {run:#?}");
            assert_eq!(run.exit_code, Some(code), "{language} on {on}: {run:#?}");
        }
        Ending::Signal(signal) => {
            assert_eq!(
                run.signal.as_deref(),
                Some(signal),
                "{language} on {on}: {run:#?}"
            );
            assert_eq!(run.exit_code, None);
        }
    }
    harness.assert_clean().await;
}

macro_rules! language_tests {
    ($($language:ident),+ $(,)?) => {
        $(
            mod $language {
                #[tokio::test]
                async fn runc() {
                    super::check(stringify!($language), None).await;
                }

                #[tokio::test]
                async fn runsc() {
                    if !super::runsc_enabled() {
                        println!("runsc tests are skipped (CODE_RUNNER_TEST_RUNSC is not 1)");
                        return;
                    }
                    super::check(stringify!($language), Some("runsc")).await;
                }
            }
        )+

        /// The languages with tests above, to compare with the catalog.
        const TESTED: &[&str] = &[$(stringify!($language)),+];
    };
}

language_tests!(
    python, javascript, c, cpp, bash, ruby, go, java, kotlin, csharp, typescript, rust, php, perl,
    lua, haskell, r, sql, pascal, fortran,
);

#[test]
fn every_catalog_language_has_a_case() {
    let catalog = code_runner::languages::LanguageCatalog::embedded().unwrap();
    let ids = catalog.ids();
    assert!(ids.len() >= 20, "{} languages: {ids:?}", ids.len());
    for id in &ids {
        assert!(
            TESTED.contains(id),
            "{id} has no tests in tests/sandbox/languages.rs"
        );
        assert!(
            LANGUAGE_CASES.iter().any(|c| c.language == *id),
            "{id} has no case in LANGUAGE_CASES"
        );
    }
    assert_eq!(
        TESTED.len(),
        ids.len(),
        "a tested language is not in the catalog"
    );
}
