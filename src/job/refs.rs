//! Files a job names by reference (`{"name": "data/big.in", "ref":
//! "<sha256>"}`, a test's `stdin_ref` and `expected_stdout_ref`) instead of
//! carrying: stored once by the job's key
//! (`PUT /v1/files/{sha256}`), checked by the API before the job is
//! queued, and read by the worker when the job starts, so that their bytes
//! travel through neither the request nor the job's record.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{Encoding, InvalidJob, JobSpec};

/// Whether `text` is a SHA-256 in hex (either case), as refs are named.
pub fn is_digest(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The digests `spec`'s files name (in lower case), each once, in the
/// order first named;
/// a refusal names the file whose ref is not a digest, or that has both a
/// ref and content.
pub fn references(spec: &JobSpec) -> Result<Vec<String>, InvalidJob> {
    let mut digests: Vec<String> = Vec::new();
    let mut add = |field: String, digest: &str| {
        if !is_digest(digest) {
            return Err(InvalidJob::new(
                field,
                format!("{digest:?} is not a SHA-256 (64 hex digits)"),
            ));
        }
        let digest = digest.to_ascii_lowercase();
        if !digests.contains(&digest) {
            digests.push(digest);
        }
        Ok(())
    };
    for (index, file) in spec.files.iter().enumerate() {
        let Some(digest) = &file.reference else {
            continue;
        };
        add(format!("files[{index}].ref"), digest)?;
        if !file.content.is_empty() {
            return Err(InvalidJob::new(
                format!("files[{index}]"),
                "a file has content or a ref, not both",
            ));
        }
    }
    for (index, test) in spec.tests.iter().flatten().enumerate() {
        if let Some(digest) = &test.stdin_ref {
            add(format!("tests[{index}].stdin_ref"), digest)?;
            if !test.stdin.is_empty() {
                return Err(InvalidJob::new(
                    format!("tests[{index}]"),
                    "a test has stdin or stdin_ref, not both",
                ));
            }
        }
        if let Some(digest) = &test.expected_stdout_ref {
            add(format!("tests[{index}].expected_stdout_ref"), digest)?;
            if test.expected_stdout.is_some() {
                return Err(InvalidJob::new(
                    format!("tests[{index}]"),
                    "a test has expected_stdout or expected_stdout_ref, not both",
                ));
            }
        }
    }
    Ok(digests)
}

/// The bytes `spec` names by reference that count as its files (`files`)
/// and as its tests' input and expected output (`tests`), given each
/// digest's size.
pub fn referenced_bytes(spec: &JobSpec, size: impl Fn(&str) -> u64) -> (u64, u64) {
    let size = |digest: &Option<String>| {
        digest
            .as_deref()
            .map_or(0, |d| size(&d.to_ascii_lowercase()))
    };
    let files = spec.files.iter().map(|f| size(&f.reference)).sum();
    let tests = spec
        .tests
        .iter()
        .flatten()
        .map(|t| size(&t.stdin_ref) + size(&t.expected_stdout_ref))
        .sum();
    (files, tests)
}

/// `spec` with each file named by reference given its bytes from
/// `contents` (by lower-case digest); `Err` names the first digest `contents` lacks.
pub fn with_contents(
    spec: &JobSpec,
    contents: &HashMap<String, Vec<u8>>,
) -> Result<JobSpec, String> {
    let bytes_of = |digest: String| {
        let digest = digest.to_ascii_lowercase();
        contents
            .get(&digest)
            .map(|bytes| STANDARD.encode(bytes))
            .ok_or(digest)
    };
    let mut spec = spec.clone();
    for file in &mut spec.files {
        if let Some(digest) = file.reference.take() {
            file.content = bytes_of(digest)?;
            file.encoding = Encoding::Base64;
        }
    }
    for test in spec.tests.iter_mut().flatten() {
        if let Some(digest) = test.stdin_ref.take() {
            test.stdin = bytes_of(digest)?;
            test.stdin_encoding = Encoding::Base64;
        }
        if let Some(digest) = test.expected_stdout_ref.take() {
            test.expected_stdout = Some(bytes_of(digest)?);
            test.expected_stdout_encoding = Encoding::Base64;
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::FileSpec;

    fn file(name: &str, content: &str, reference: Option<&str>) -> FileSpec {
        FileSpec {
            name: name.into(),
            content: content.into(),
            encoding: Encoding::Utf8,
            reference: reference.map(str::to_string),
        }
    }

    #[test]
    fn refs_are_digests_named_once_and_replaced_by_their_bytes() {
        let a = "a".repeat(64);
        let b = "0123456789abcdef".repeat(4);
        let spec = JobSpec {
            language: "python".into(),
            files: vec![
                file("main.py", "print(1)", None),
                file("x.in", "", Some(&a)),
                file("y.in", "", Some(&b)),
                file("z.in", "", Some(&a)),
            ],
            ..JobSpec::default()
        };
        assert_eq!(references(&spec).unwrap(), vec![a.clone(), b.clone()]);
        let contents = HashMap::from([(a.clone(), vec![0xff, 0]), (b.clone(), b"hi".to_vec())]);
        let resolved = with_contents(&spec, &contents).unwrap();
        assert_eq!(resolved.files[0], spec.files[0]);
        assert_eq!(
            resolved.files[1],
            FileSpec {
                name: "x.in".into(),
                content: "/wA=".into(),
                encoding: Encoding::Base64,
                reference: None,
            }
        );
        assert_eq!(resolved.files[2].content, "aGk=");
        assert_eq!(with_contents(&spec, &HashMap::from([(a, vec![])])), Err(b));
    }

    #[test]
    fn tests_name_their_stdin_and_expected_output_by_ref() {
        use crate::job::grading::TestSpec;
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let spec = JobSpec {
            language: "python".into(),
            files: vec![file("main.py", "print(1)", None)],
            tests: Some(vec![
                TestSpec {
                    stdin_ref: Some(a.to_uppercase()),
                    expected_stdout_ref: Some(b.clone()),
                    ..TestSpec::default()
                },
                TestSpec {
                    stdin: "x".into(),
                    expected_stdout: Some("y".into()),
                    ..TestSpec::default()
                },
            ]),
            ..JobSpec::default()
        };
        assert_eq!(references(&spec).unwrap(), vec![a.clone(), b.clone()]);
        assert_eq!(
            referenced_bytes(&spec, |d| if d == a { 3 } else { 5 }),
            (0, 8)
        );
        let contents = HashMap::from([(a.clone(), b"in".to_vec()), (b.clone(), b"out".to_vec())]);
        let resolved = with_contents(&spec, &contents).unwrap();
        let tests = resolved.tests.unwrap();
        assert_eq!(
            (tests[0].stdin.as_str(), tests[0].stdin_encoding),
            ("aW4=", Encoding::Base64)
        );
        assert_eq!(tests[0].expected_stdout.as_deref(), Some("b3V0"));
        assert_eq!(tests[0].expected_stdout_encoding, Encoding::Base64);
        assert_eq!(
            (
                tests[0].stdin_ref.as_ref(),
                tests[0].expected_stdout_ref.as_ref()
            ),
            (None, None)
        );
        assert_eq!(tests[1], spec.tests.as_ref().unwrap()[1]);

        let mut both = spec.clone();
        both.tests.as_mut().unwrap()[1].stdin_ref = Some(a.clone());
        let error = references(&both).unwrap_err();
        assert_eq!(
            (error.field.as_str(), error.message.as_str()),
            ("tests[1]", "a test has stdin or stdin_ref, not both")
        );
        let mut both = spec.clone();
        both.tests.as_mut().unwrap()[1].expected_stdout_ref = Some(a.clone());
        assert_eq!(
            references(&both).unwrap_err().message,
            "a test has expected_stdout or expected_stdout_ref, not both"
        );
        let mut bad = spec;
        bad.tests.as_mut().unwrap()[0].expected_stdout_ref = Some("xyz".into());
        assert_eq!(
            references(&bad).unwrap_err().field,
            "tests[0].expected_stdout_ref"
        );
    }

    #[test]
    fn a_bad_ref_or_one_beside_content_is_refused_naming_the_file() {
        let spec = |files| JobSpec {
            language: "python".into(),
            files,
            ..JobSpec::default()
        };
        let error = references(&spec(vec![
            file("main.py", "", None),
            file("d", "", Some("ABC")),
        ]))
        .unwrap_err();
        assert_eq!(
            (error.field.as_str(), error.message.as_str()),
            ("files[1].ref", "\"ABC\" is not a SHA-256 (64 hex digits)")
        );
        // Either case names the same file.
        let upper = "A".repeat(64);
        assert_eq!(
            references(&spec(vec![file("d", "", Some(&upper))])).unwrap(),
            vec!["a".repeat(64)]
        );
        let error = references(&spec(vec![file("d", "x", Some(&"a".repeat(64)))])).unwrap_err();
        assert_eq!(
            (error.field.as_str(), error.message.as_str()),
            ("files[0]", "a file has content or a ref, not both")
        );
    }
}
