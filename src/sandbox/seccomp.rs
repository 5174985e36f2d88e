//! The sandbox seccomp profile (`seccomp/profile.json`): loaded once at start,
//! validated, and passed inline to Docker with every container.
//!
//! A profile is refused at start unless it denies by default, allows none of
//! [`MUST_DENY`] (ptrace but the supervisor's own requests, mount, unshare,
//! setns, keyctl, bpf, userfaultfd, perf_event_open, io_uring) by any rule,
//! answers `clone3` with ENOSYS, and keeps closed the three [`Door`]s the
//! shipped profile closes (socket families beyond unix/inet, the compat
//! ABIs, `modify_ldt`) unless `CODE_RUNNER_SECCOMP_ALLOW` names the door.

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

/// The `ptrace` requests the profile may allow, each by a rule that pins
/// argument 0 to it: the supervisor (PID 1) traces a watched stage (see
/// `crates/init/src/watch.rs`) with PTRACE_TRACEME (made by the stage's
/// process before its filter is on), PTRACE_CONT, PTRACE_SETOPTIONS,
/// PTRACE_GETEVENTMSG and PTRACE_GETSIGINFO. None reaches into a process
/// that did not ask to be traced, and every job process runs under the
/// supervisor's stage filter, which refuses `ptrace` altogether.
pub const SUPERVISOR_PTRACE_REQUESTS: &[u64] = &[0, 7, 0x4200, 0x4201, 0x4202];

/// Address families `socket()` may create: AF_UNIX, AF_INET, AF_INET6.
pub const SOCKET_FAMILIES: &[u64] = &[1, 2, 10];
/// Address families `socketpair()` may create: AF_UNIX.
pub const SOCKETPAIR_FAMILIES: &[u64] = &[1];
/// Sub-architectures whose system calls reach the kernel's compat entry
/// points from an x86-64 (or arm64) process.
const COMPAT_ARCHES: &[&str] = &["SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_ARM"];

/// A kernel door the shipped profile closes and an operator's profile may
/// re-open only when the operator names it in `CODE_RUNNER_SECCOMP_ALLOW`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Door {
    /// `socket()`/`socketpair()` beyond AF_UNIX, AF_INET, AF_INET6 (netlink,
    /// packet, vsock, alg, …: each family is kernel code of its own).
    SocketFamilies,
    /// The 32-bit x86, x32 (and arm) compat system call ABIs.
    CompatAbi,
    /// `modify_ldt`: 16-bit segments, a long record of kernel bugs.
    ModifyLdt,
}

impl Door {
    pub const ALL: [Door; 3] = [Door::SocketFamilies, Door::CompatAbi, Door::ModifyLdt];

    /// The name used in `CODE_RUNNER_SECCOMP_ALLOW`.
    pub fn name(self) -> &'static str {
        match self {
            Door::SocketFamilies => "socket-families",
            Door::CompatAbi => "compat-abi",
            Door::ModifyLdt => "modify_ldt",
        }
    }

    /// Parses a comma-separated list of door names.
    pub fn parse_list(text: &str) -> Result<Vec<Door>, String> {
        let mut doors = Vec::new();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let door = Door::ALL
                .into_iter()
                .find(|door| door.name() == name)
                .ok_or_else(|| {
                    format!(
                        "{name:?} is not one of {}",
                        Door::ALL.map(Door::name).join(", ")
                    )
                })?;
            if !doors.contains(&door) {
                doors.push(door);
            }
        }
        Ok(doors)
    }
}

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
    #[error(
        "seccomp profile re-opens {door}: {detail}; list {door} in CODE_RUNNER_SECCOMP_ALLOW to run it anyway"
    )]
    Reopens { door: &'static str, detail: String },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProfileJson {
    default_action: String,
    #[serde(default)]
    arch_map: Vec<ArchJson>,
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    syscalls: Vec<RuleJson>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArchJson {
    architecture: String,
    #[serde(default)]
    sub_architectures: Vec<String>,
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
    #[serde(default)]
    args: Vec<ArgJson>,
}

#[derive(Debug, Deserialize)]
struct ArgJson {
    index: u32,
    value: u64,
    #[serde(default)]
    op: String,
}

impl RuleJson {
    fn covers(&self, syscall: &str) -> bool {
        self.names.iter().any(|n| n == syscall) || self.name.as_deref() == Some(syscall)
    }

    fn allows(&self) -> bool {
        self.action == "SCMP_ACT_ALLOW"
            || self.action == "SCMP_ACT_LOG"
            || self.action.starts_with("SCMP_ACT_TRACE")
            || self.action == "SCMP_ACT_NOTIFY"
    }

    /// The rule allows one of [`SUPERVISOR_PTRACE_REQUESTS`] and nothing
    /// else: exactly one condition, argument 0 equal to that request.
    fn allows_only_supervisor_ptrace(&self) -> bool {
        self.args.len() == 1
            && self
                .pinned_argument()
                .is_some_and(|request| SUPERVISOR_PTRACE_REQUESTS.contains(&request))
    }

    /// The value (a family, a request) this rule pins the first argument
    /// to, if it does: one
    /// `SCMP_CMP_EQ` condition on argument 0 (several conditions on the same
    /// argument would be an AND, which libseccomp refuses anyway).
    fn pinned_argument(&self) -> Option<u64> {
        match self.args.as_slice() {
            [] => None,
            args => args
                .iter()
                .find(|arg| arg.index == 0 && arg.op == "SCMP_CMP_EQ")
                .map(|arg| arg.value),
        }
    }
}

/// A validated profile, kept as the JSON text Docker takes in `SecurityOpt`.
#[derive(Debug, Clone)]
pub struct SeccompProfile {
    json: String,
}

impl SeccompProfile {
    /// Loads the profile at `path`, or the embedded one, re-opening no door.
    pub fn load(path: Option<&Path>) -> Result<Self, SeccompError> {
        Self::load_allowing(path, &[])
    }

    /// Loads the profile at `path`, or the embedded one; the profile may
    /// re-open the doors in `allowed` and no other.
    pub fn load_allowing(path: Option<&Path>, allowed: &[Door]) -> Result<Self, SeccompError> {
        match path {
            None => Self::parse_allowing(EMBEDDED_PROFILE, allowed),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| SeccompError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                Self::parse_allowing(&text, allowed)
            }
        }
    }

    /// [`SeccompProfile::parse_allowing`] with no door re-opened.
    pub fn parse(text: &str) -> Result<Self, SeccompError> {
        Self::parse_allowing(text, &[])
    }

    /// Parses and validates a profile: deny by default, none of [`MUST_DENY`]
    /// allowed by any rule, `clone3` answered with ENOSYS so libc falls back
    /// to `clone`, and no [`Door`] re-opened unless it is in `allowed`.
    pub fn parse_allowing(text: &str, allowed: &[Door]) -> Result<Self, SeccompError> {
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
            if let Some(rule) = profile.syscalls.iter().find(|r| {
                r.action == "SCMP_ACT_ALLOW"
                    && r.covers(syscall)
                    && !(*syscall == "ptrace" && r.allows_only_supervisor_ptrace())
            }) {
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
        for door in Door::ALL {
            if allowed.contains(&door) {
                continue;
            }
            if let Some(detail) = reopened(&profile, door) {
                return Err(SeccompError::Reopens {
                    door: door.name(),
                    detail,
                });
            }
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

/// How `profile` re-opens `door`, if it does.
fn reopened(profile: &ProfileJson, door: Door) -> Option<String> {
    match door {
        Door::SocketFamilies => [
            ("socket", SOCKET_FAMILIES),
            ("socketpair", SOCKETPAIR_FAMILIES),
        ]
        .into_iter()
        .find_map(|(syscall, families)| {
            profile
                .syscalls
                .iter()
                .filter(|rule| rule.allows() && rule.covers(syscall))
                .find_map(|rule| match rule.pinned_argument() {
                    None => Some(format!("a rule allows {syscall}() for any address family")),
                    Some(family) if !families.contains(&family) => Some(format!(
                        "a rule allows {syscall}() for address family {family}"
                    )),
                    Some(_) => None,
                })
        }),
        Door::CompatAbi => profile
            .arch_map
            .iter()
            .flat_map(|arch| {
                arch.sub_architectures
                    .iter()
                    .map(move |sub| (arch.architecture.as_str(), sub.as_str()))
            })
            .find(|(_, sub)| COMPAT_ARCHES.contains(sub))
            .map(|(arch, sub)| format!("archMap gives {arch} the sub-architecture {sub}"))
            .or_else(|| {
                profile
                    .architectures
                    .iter()
                    .find(|arch| COMPAT_ARCHES.contains(&arch.as_str()))
                    .map(|arch| format!("architectures lists {arch}"))
            }),
        Door::ModifyLdt => profile
            .syscalls
            .iter()
            .any(|rule| rule.allows() && rule.covers("modify_ldt"))
            .then(|| "a rule allows modify_ldt".to_string()),
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
    fn ptrace_is_allowed_only_for_the_supervisors_requests() {
        let profile = |args: &str| {
            format!(
                r#"{{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[
                {{"names":["ptrace"],"action":"SCMP_ACT_ALLOW","args":{args}}},
                {{"names":["clone3"],"action":"SCMP_ACT_ERRNO","errnoRet":38}}]}}"#
            )
        };
        for request in SUPERVISOR_PTRACE_REQUESTS {
            let args = format!(r#"[{{"index":0,"value":{request},"op":"SCMP_CMP_EQ"}}]"#);
            SeccompProfile::parse(&profile(&args)).unwrap();
        }
        // PTRACE_ATTACH, PTRACE_SEIZE, PTRACE_PEEKDATA; a condition on
        // another argument; a comparison that is not equality; two conditions.
        for args in [
            r#"[{"index":0,"value":16,"op":"SCMP_CMP_EQ"}]"#,
            r#"[{"index":0,"value":16902,"op":"SCMP_CMP_EQ"}]"#,
            r#"[{"index":0,"value":2,"op":"SCMP_CMP_EQ"}]"#,
            r#"[{"index":1,"value":7,"op":"SCMP_CMP_EQ"}]"#,
            r#"[{"index":0,"value":7,"op":"SCMP_CMP_GE"}]"#,
            r#"[{"index":0,"value":7,"op":"SCMP_CMP_EQ"},{"index":1,"value":0,"op":"SCMP_CMP_EQ"}]"#,
        ] {
            let error = SeccompProfile::parse(&profile(args))
                .unwrap_err()
                .to_string();
            assert_eq!(
                error,
                r#"seccomp profile is unsafe: ptrace is allowed by a rule (names ["ptrace"])"#,
                "{args}"
            );
        }
    }

    #[test]
    fn clone3_must_be_enosys() {
        let text = r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[
            {"names":["read"],"action":"SCMP_ACT_ALLOW"}]}"#;
        let error = SeccompProfile::parse(text).unwrap_err().to_string();
        assert!(error.contains("clone3 must fail with ENOSYS"), "{error}");
    }

    /// The shipped profile with one change made to its JSON.
    fn shipped_with(change: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut profile: serde_json::Value = serde_json::from_str(EMBEDDED_PROFILE).unwrap();
        change(&mut profile);
        profile.to_string()
    }

    fn rules(profile: &mut serde_json::Value) -> &mut Vec<serde_json::Value> {
        profile["syscalls"].as_array_mut().unwrap()
    }

    #[test]
    fn socket_for_any_family_is_refused_unless_allowed() {
        let text = shipped_with(|p| {
            rules(p).push(serde_json::json!({"names": ["socket"], "action": "SCMP_ACT_ALLOW"}))
        });
        let error = SeccompProfile::parse(&text).unwrap_err().to_string();
        assert_eq!(
            error,
            "seccomp profile re-opens socket-families: a rule allows socket() for any address family; list socket-families in CODE_RUNNER_SECCOMP_ALLOW to run it anyway"
        );
        SeccompProfile::parse_allowing(&text, &[Door::SocketFamilies]).unwrap();
        assert!(SeccompProfile::parse_allowing(&text, &[Door::ModifyLdt]).is_err());
    }

    #[test]
    fn socket_for_netlink_is_refused() {
        let text = shipped_with(|p| {
            rules(p).push(
                serde_json::json!({"names": ["socketpair", "socket"], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 16, "op": "SCMP_CMP_EQ"}]}),
            )
        });
        let error = SeccompProfile::parse(&text).unwrap_err().to_string();
        assert!(
            error.contains("a rule allows socket() for address family 16"),
            "{error}"
        );
        // A range is not a family.
        let text = shipped_with(|p| {
            rules(p).push(
                serde_json::json!({"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 3, "op": "SCMP_CMP_GE"}]}),
            )
        });
        let error = SeccompProfile::parse(&text).unwrap_err().to_string();
        assert!(error.contains("for any address family"), "{error}");
    }

    #[test]
    fn compat_sub_architectures_are_refused_unless_allowed() {
        let text = shipped_with(|p| {
            p["archMap"][0]["subArchitectures"] =
                serde_json::json!(["SCMP_ARCH_X86", "SCMP_ARCH_X32"]);
        });
        let error = SeccompProfile::parse(&text).unwrap_err().to_string();
        assert!(
            error.contains(
                "re-opens compat-abi: archMap gives SCMP_ARCH_X86_64 the sub-architecture SCMP_ARCH_X86"
            ),
            "{error}"
        );
        SeccompProfile::parse_allowing(&text, &[Door::CompatAbi]).unwrap();
        let text = shipped_with(|p| p["architectures"] = serde_json::json!(["SCMP_ARCH_X32"]));
        let error = SeccompProfile::parse(&text).unwrap_err().to_string();
        assert!(
            error.contains("architectures lists SCMP_ARCH_X32"),
            "{error}"
        );
    }

    #[test]
    fn modify_ldt_is_refused_unless_allowed() {
        let text = shipped_with(|p| {
            rules(p).push(
                serde_json::json!({"names": ["modify_ldt"], "action": "SCMP_ACT_ALLOW",
                "includes": {"arches": ["amd64"]}}),
            )
        });
        let error = SeccompProfile::parse(&text).unwrap_err().to_string();
        assert!(
            error.contains("re-opens modify_ldt: a rule allows modify_ldt"),
            "{error}"
        );
        SeccompProfile::parse_allowing(&text, &[Door::ModifyLdt]).unwrap();
    }

    #[test]
    fn dockers_default_profile_reopens_every_door() {
        // The profile this one started from (seccomp/README.md): the three
        // doors, undone.
        let text = shipped_with(|p| {
            p["archMap"][0]["subArchitectures"] =
                serde_json::json!(["SCMP_ARCH_X86", "SCMP_ARCH_X32"]);
            rules(p).push(serde_json::json!({"names": ["socket", "socketpair", "modify_ldt"], "action": "SCMP_ACT_ALLOW"}));
        });
        SeccompProfile::parse_allowing(&text, &Door::ALL).unwrap();
        for door in Door::ALL {
            let others: Vec<Door> = Door::ALL.into_iter().filter(|d| *d != door).collect();
            let error = SeccompProfile::parse_allowing(&text, &others)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(&format!("re-opens {}:", door.name())),
                "{error}"
            );
        }
    }

    #[test]
    fn door_lists_parse() {
        assert_eq!(
            Door::parse_list("modify_ldt, compat-abi,,modify_ldt").unwrap(),
            [Door::ModifyLdt, Door::CompatAbi]
        );
        assert_eq!(Door::parse_list("").unwrap(), []);
        assert_eq!(
            Door::parse_list("ptrace").unwrap_err(),
            "\"ptrace\" is not one of socket-families, compat-abi, modify_ldt"
        );
    }

    #[test]
    fn shipped_profile_closes_every_door() {
        let profile: ProfileJson = serde_json::from_str(EMBEDDED_PROFILE).unwrap();
        for door in Door::ALL {
            assert_eq!(reopened(&profile, door), None, "{door:?}");
        }
        let socket_families: Vec<u64> = profile
            .syscalls
            .iter()
            .filter(|rule| rule.allows() && rule.covers("socket"))
            .filter_map(RuleJson::pinned_argument)
            .collect();
        assert_eq!(socket_families, SOCKET_FAMILIES);
    }
}
