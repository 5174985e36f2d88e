//! The sandbox seccomp profile (`seccomp/profile.json`): loaded once at start,
//! validated, and passed inline to Docker with every container.

use std::path::Path;

use serde::Deserialize;

/// The profile shipped in the repository, embedded so the binary stands alone.
pub const EMBEDDED_PROFILE: &str = include_str!("../../seccomp/profile.json");

/// Syscalls the profile must never allow, not even conditionally: each one
/// is a known way out of, or into the kernel past, a container.
pub const MUST_DENY: &[&str] = &[
    "ptrace",
    "mount",
    "umount2",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "unshare",
    "setns",
    "userfaultfd",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
];

const ENOSYS: i64 = 38;

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("cannot read seccomp profile {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("seccomp profile is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("seccomp profile is unsafe: {0}")]
    Unsafe(String),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProfileJson {
    default_action: String,
    #[serde(default)]
    syscalls: Vec<RuleJson>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuleJson {
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    name: Option<String>,
    action: String,
    #[serde(default)]
    errno_ret: Option<i64>,
}

impl RuleJson {
    fn covers(&self, syscall: &str) -> bool {
        self.names.iter().any(|n| n == syscall) || self.name.as_deref() == Some(syscall)
    }
}

/// A validated profile, kept as the JSON text Docker takes in `SecurityOpt`.
#[derive(Debug, Clone)]
pub struct SeccompProfile {
    json: String,
}

impl SeccompProfile {
    /// Loads the profile at `path`, or the embedded one.
    pub fn load(path: Option<&Path>) -> Result<Self, SeccompError> {
        match path {
            None => Self::parse(EMBEDDED_PROFILE),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| SeccompError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                Self::parse(&text)
            }
        }
    }

    /// Parses and validates a profile: deny by default, none of [`MUST_DENY`]
    /// allowed by any rule, and `clone3` answered with ENOSYS so libc falls back
    /// to `clone`.
    pub fn parse(text: &str) -> Result<Self, SeccompError> {
        let profile: ProfileJson = serde_json::from_str(text)?;
        if !profile.default_action.starts_with("SCMP_ACT_ERRNO")
            && !profile.default_action.starts_with("SCMP_ACT_KILL")
        {
            return Err(SeccompError::Unsafe(format!(
                "defaultAction is {}; it must deny (SCMP_ACT_ERRNO or SCMP_ACT_KILL)",
                profile.default_action
            )));
        }
        for syscall in MUST_DENY.iter().chain(std::iter::once(&"clone3")) {
            if let Some(rule) = profile
                .syscalls
                .iter()
                .find(|r| r.action == "SCMP_ACT_ALLOW" && r.covers(syscall))
            {
                return Err(SeccompError::Unsafe(format!(
                    "{syscall} is allowed by a rule (names {:?})",
                    rule.names
                )));
            }
        }
        let clone3_enosys = profile.syscalls.iter().any(|r| {
            r.covers("clone3") && r.action == "SCMP_ACT_ERRNO" && r.errno_ret == Some(ENOSYS)
        });
        if !clone3_enosys {
            return Err(SeccompError::Unsafe(
                "clone3 must fail with ENOSYS (errnoRet 38) so libc falls back to clone".into(),
            ));
        }
        Ok(Self {
            json: text.to_string(),
        })
    }

    /// The value for Docker's `SecurityOpt`.
    pub fn security_opt(&self) -> String {
        format!("seccomp={}", self.json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_profile_is_valid() {
        SeccompProfile::parse(EMBEDDED_PROFILE).unwrap();
    }

    #[test]
    fn allow_by_default_is_refused() {
        let error = SeccompProfile::parse(r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[]}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "seccomp profile is unsafe: defaultAction is SCMP_ACT_ALLOW; it must deny (SCMP_ACT_ERRNO or SCMP_ACT_KILL)"
        );
    }

    #[test]
    fn allowing_ptrace_is_refused() {
        let text = r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[
            {"names":["read","ptrace"],"action":"SCMP_ACT_ALLOW"},
            {"names":["clone3"],"action":"SCMP_ACT_ERRNO","errnoRet":38}]}"#;
        let error = SeccompProfile::parse(text).unwrap_err().to_string();
        assert!(error.contains("ptrace is allowed"), "{error}");
    }

    #[test]
    fn clone3_must_be_enosys() {
        let text = r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[
            {"names":["read"],"action":"SCMP_ACT_ALLOW"}]}"#;
        let error = SeccompProfile::parse(text).unwrap_err().to_string();
        assert!(error.contains("clone3 must fail with ENOSYS"), "{error}");
    }
}
