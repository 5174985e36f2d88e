//! Files a job names by reference (`{"name": "data/big.in", "ref":
//! "<sha256>"}`) instead of carrying: stored once by the job's key
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
    for (index, file) in spec.files.iter().enumerate() {
        let Some(digest) = &file.reference else {
            continue;
        };
        if !is_digest(digest) {
            return Err(InvalidJob::new(
                format!("files[{index}].ref"),
                format!("{digest:?} is not a SHA-256 (64 hex digits)"),
            ));
        }
        if !file.content.is_empty() {
            return Err(InvalidJob::new(
                format!("files[{index}]"),
                "a file has content or a ref, not both",
            ));
        }
        let digest = digest.to_ascii_lowercase();
        if !digests.contains(&digest) {
            digests.push(digest);
        }
    }
    Ok(digests)
}

/// `spec` with each file named by reference given its bytes from
/// `contents` (by lower-case digest); `Err` names the first digest `contents` lacks.
pub fn with_contents(
    spec: &JobSpec,
    contents: &HashMap<String, Vec<u8>>,
) -> Result<JobSpec, String> {
    let mut spec = spec.clone();
    for file in &mut spec.files {
        if let Some(digest) = file.reference.take() {
            let digest = digest.to_ascii_lowercase();
            let bytes = contents.get(&digest).ok_or(digest)?;
            file.content = STANDARD.encode(bytes);
            file.encoding = Encoding::Base64;
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
