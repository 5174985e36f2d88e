//! Files back from a job (`outputs`): the patterns a job asks for, their
//! checks, and the entries its result lists (docs/api.md, "Output files").
//!
//! The supervisor matches the patterns below the run stage's working
//! directory once the stage ended (each test's run, for a graded job) and
//! sends each file; the session bounds what it takes (at most
//! [`MAX_FILES`] files and [`MAX_BYTES`] bytes per stage or test, and
//! [`MAX_BYTES`] for the whole job), and the worker then keeps each file
//! inline up to the job's inline cap, or stores it as the key's file and
//! gives its `ref` (`worker/outputs.rs`). Whatever is not returned is an
//! entry with an `error` code and a `message`, never left out.

use serde::{Deserialize, Serialize};

use super::InvalidJob;
use crate::protocol::OutputRequest;

/// Most patterns a job may give.
pub const MAX_PATTERNS: usize = 32;
/// Longest pattern, in bytes.
pub const MAX_PATTERN_BYTES: usize = 255;
/// Most files one stage or test sends back.
pub const MAX_FILES: u32 = 100;
/// Most bytes one stage or test sends back, and one job holds.
pub const MAX_BYTES: u64 = 64 << 20;

/// How the patterns match (the supervisor's own options): `*` and `?`
/// never cross `/`, `**` does; hidden files match like others.
const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// Whether `pattern` is a glob rather than one path.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

/// Whether glob `pattern` matches the relative path `name` as the
/// supervisor matches it.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    glob::Pattern::new(pattern).is_ok_and(|p| p.matches_with(name, MATCH))
}

/// Checks a job's `outputs`; the refusal names the entry.
pub fn check(patterns: &[String]) -> Result<(), InvalidJob> {
    if patterns.len() > MAX_PATTERNS {
        return Err(InvalidJob::new(
            "outputs",
            format!(
                "{} patterns is more than the {MAX_PATTERNS} a job may give",
                patterns.len()
            ),
        ));
    }
    for (index, pattern) in patterns.iter().enumerate() {
        check_one(pattern)
            .map_err(|message| InvalidJob::new(format!("outputs[{index}]"), message))?;
    }
    Ok(())
}

fn check_one(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("the pattern is empty".into());
    }
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!(
            "the pattern has {} bytes, more than {MAX_PATTERN_BYTES}",
            pattern.len()
        ));
    }
    if pattern.starts_with('/') {
        return Err(format!(
            "{pattern:?} is absolute; a pattern is relative to the working directory"
        ));
    }
    if let Some(bad) = pattern.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{pattern:?} contains the control character {bad:?}"
        ));
    }
    if pattern.contains('\\') {
        return Err(format!("{pattern:?} contains a backslash"));
    }
    for part in pattern.split('/') {
        match part {
            ".." => return Err(format!("{pattern:?} contains \"..\"")),
            "." | "" => return Err(format!("{pattern:?} has an empty or \".\" part")),
            _ => {}
        }
    }
    if is_glob(pattern) {
        glob::Pattern::new(pattern)
            .map_err(|error| format!("{pattern:?} is not a valid glob: {error}"))?;
    }
    Ok(())
}

/// What the supervisor is asked for the stage or test that has `patterns`.
pub fn request(patterns: &[String]) -> Option<OutputRequest> {
    (!patterns.is_empty()).then(|| OutputRequest {
        patterns: patterns.to_vec(),
        max_files: MAX_FILES,
        max_bytes: MAX_BYTES,
    })
}

/// One entry of a result's `outputs`: a file inline (`content`, base64),
/// a file in the file store (`ref`, its SHA-256), or what was not
/// returned (`error`, `message`, with the `name` of the file or the
/// `pattern` that found nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_base64"
    )]
    pub content: Option<Vec<u8>>,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl OutputEntry {
    /// A file returned inline.
    pub fn inline(name: String, content: Vec<u8>) -> Self {
        use sha2::{Digest, Sha256};
        Self {
            name: Some(name),
            size: Some(content.len() as u64),
            sha256: Some(hex::encode(Sha256::digest(&content))),
            content: Some(content),
            ..Self::default()
        }
    }

    /// What was not returned, for `pattern` (and the file `name` when one
    /// is meant).
    pub fn failed(
        pattern: Option<String>,
        name: Option<String>,
        error: &str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            name,
            pattern,
            error: Some(error.to_string()),
            message: Some(message.into()),
            ..Self::default()
        }
    }

    /// The same file, not returned after all (its size and digest kept).
    pub fn refused(self, error: &str, message: impl Into<String>) -> Self {
        Self {
            content: None,
            reference: None,
            error: Some(error.to_string()),
            message: Some(message.into()),
            ..self
        }
    }

    /// Each pattern answered `error` (a stage that never collected them).
    pub fn for_each(patterns: &[String], error: &str, message: &str) -> Vec<Self> {
        patterns
            .iter()
            .map(|p| Self::failed(Some(p.clone()), None, error, message))
            .collect()
    }
}

/// Serde helper: `Option<Vec<u8>>` as an optional base64 string.
mod optional_base64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        bytes: &Option<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(bytes) => serializer.serialize_str(&STANDARD.encode(bytes)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?;
        text.map(|text| STANDARD.decode(text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(patterns: &[&str]) -> InvalidJob {
        let patterns: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
        check(&patterns).unwrap_err()
    }

    #[test]
    fn bad_patterns_are_named() {
        let error = refused(&["ok.txt", "../etc/passwd"]);
        assert_eq!(error.field, "outputs[1]");
        assert!(error.message.contains("\"..\""), "{}", error.message);
        assert_eq!(refused(&["/etc/passwd"]).field, "outputs[0]");
        assert!(refused(&[""]).message.contains("empty"));
        assert!(refused(&["a\nb"]).message.contains("control"));
        assert!(
            refused(&["out/[a.png"])
                .message
                .contains("not a valid glob")
        );
        assert!(refused(&[&"a".repeat(256)]).message.contains("256 bytes"));
        let many: Vec<String> = (0..33).map(|i| format!("f{i}")).collect();
        assert_eq!(check(&many).unwrap_err().field, "outputs");
        assert!(check(&["out/*.png".into(), "result.csv".into(), "**/*.txt".into()]).is_ok());
    }

    #[test]
    fn entries_have_the_documented_shapes() {
        let inline = OutputEntry::inline("a.bin".into(), vec![0, 255]);
        // sha256 of the bytes 00 ff.
        let json = serde_json::to_value(&inline).unwrap();
        assert_eq!(json["name"], "a.bin");
        assert_eq!(json["size"], 2);
        assert_eq!(json["content"], "AP8=");
        assert_eq!(
            json["sha256"],
            "06eb7d6a69ee19e5fbdf749018d3d2abfa04bcbd1365db312eb86dc7169389b8"
        );
        assert!(json.get("ref").is_none() && json.get("error").is_none());
        let back: OutputEntry =
            serde_json::from_value(serde_json::to_value(&inline).unwrap()).unwrap();
        assert_eq!(back, inline);
        let missing = OutputEntry::failed(Some("x.txt".into()), None, "not_found", "gone");
        assert_eq!(
            serde_json::to_value(&missing).unwrap(),
            serde_json::json!({"pattern": "x.txt", "error": "not_found", "message": "gone"})
        );
        assert!(glob_matches("out/*.png", "out/a.png"));
        assert!(!glob_matches("out/*.png", "out/sub/a.png"));
        assert!(glob_matches("**/*.png", "out/sub/a.png"));
    }
}
