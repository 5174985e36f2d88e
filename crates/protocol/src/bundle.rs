//! What the host sends to run a job: the [`Bundle`] (files, stages, and
//! what follows them: the [`RunPlan`], the [`EgressRelay`]), each
//! [`StageSpec`] with its [`StageLimits`], and a [`RunSpec`] for each run of
//! a plan. These are the JSON payloads of the `bundle` and `run` frames; the
//! frames themselves are in [`crate::messages`].

use serde::{Deserialize, Serialize};

/// Everything the supervisor needs to run a job: the files to write into the
/// workspace and the stages to run, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bundle {
    /// Directory the files are written under (a tmpfs in the container).
    pub workspace: String,
    /// Unprivileged uid and gid the files are written as and the stages run as.
    pub uid: u32,
    pub gid: u32,
    pub files: Vec<BundleFile>,
    pub stages: Vec<StageSpec>,
    /// Runs to accept after the stages (a graded job's tests, a checker's
    /// checks): when set and every stage succeeded, the supervisor runs one
    /// stage per `run` frame until `runs_end`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<RunPlan>,
    /// Outbound network by allowlist: when set, the supervisor relays the
    /// sandbox's loopback port to the job's egress proxy before any stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressRelay>,
    /// After `done`, how long the supervisor stays (idle, every process of
    /// the job gone) until the host closes its stream, in ms; 0: it exits at
    /// once. The host then decides when the container's exit, and the
    /// teardown Docker does for it, happens: not beside the jobs running.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub linger_ms: u64,
    /// Before it lingers, the supervisor empties these directories (absent
    /// ones skipped) as the bundle's uid, so that a lingering container
    /// holds none of the job's files; when it cannot, it does not linger.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub linger_wipe: Vec<String>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// The sandbox's half of a job's egress (kind `bundle`): the sandbox has no
/// network, only loopback. Before the first stage the supervisor listens on
/// `127.0.0.1:listen_port` and relays every connection, byte for byte in
/// both directions, to a new connection to the Unix socket `socket` (the
/// job's egress proxy in the worker, mounted into this one sandbox). It
/// looks at none of the bytes: the proxy decides what may pass. At most
/// `max_concurrent` connections are relayed at once; further ones wait in
/// the listen backlog. The programs find the relay in `HTTP_PROXY` and
/// `HTTPS_PROXY`, which the host puts into the stages' environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRelay {
    pub listen_port: u16,
    pub socket: String,
    pub max_concurrent: u32,
}

/// How the supervisor runs the `run` frames that follow the stages.
///
/// The runs execute as a uid of their own, not the bundle's: everything the
/// bundle and its stages left (the files, the compiled program) belongs to
/// the bundle's uid and is read-only to them. Before the first run, the
/// supervisor takes away write access for others from what the stages left
/// (and makes every directory others may write in sticky). After each run
/// every process of the runs' uid is dead, and every entry a run added to a
/// directory it could write in is removed, so the next run sees exactly
/// what the first one saw. The runs cannot create System V IPC objects,
/// POSIX message queues or keys (a seccomp filter answers `EPERM`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunPlan {
    pub uid: u32,
    pub gid: u32,
    /// The writable mounts whose trees are kept as the first run found them
    /// (e.g. the workspace, `/tmp`, `/dev/shm`); absent paths are skipped.
    pub scratch: Vec<String>,
    /// Where a run's `files` are written (created fresh for each run as the
    /// runs' uid, inside one of `scratch`, so removed after it).
    pub files_dir: String,
}

/// One run (kind `run`): a stage, the bytes its stdin reads before EOF, and
/// files written for it into the plan's `files_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    pub stage: StageSpec,
    #[serde(with = "base64_bytes")]
    pub input: Vec<u8>,
    #[serde(default)]
    pub files: Vec<BundleFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleFile {
    /// Relative path below the workspace; validated by the worker and checked
    /// again by the supervisor (no absolute paths, no `..`).
    pub path: String,
    #[serde(with = "base64_bytes")]
    pub content: Vec<u8>,
    #[serde(default)]
    pub executable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSpec {
    /// `compile` or `run`.
    pub name: String,
    pub argv: Vec<String>,
    /// The whole environment of the stage (nothing is inherited).
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// Whether this stage reads the forwarded stdin; otherwise its stdin is
    /// empty (`/dev/null`).
    pub stdin: bool,
    /// Say [`crate::SandboxMessage::InputWanted`] when a process of the stage waits
    /// for stdin with nothing buffered for it (interactive stages).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watch_input: bool,
    pub limits: StageLimits,
    /// Files to send back once the stage has ended (whatever ended it):
    /// see [`OutputRequest`]. Absent: none, and nothing changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<OutputRequest>,
}

/// The files a stage sends back (its `outputs`): after the stage's end and
/// the kill of every process of its uid, before its `stage_end`, the
/// supervisor matches each pattern below the stage's `cwd`, as the stage's
/// uid, and answers every pattern: each regular file it matched as an
/// `output_file` frame followed by exactly `size` bytes in `output_data`
/// frames, and what it could not send as an `output_error` (see
/// [`crate::OutputError`]); a pattern that matched nothing gets
/// `not_found`. A path without `*`, `?` or `[` names one file; a glob
/// (`glob` crate syntax, `*` not crossing `/`, `**` any depth) is matched
/// against the paths below `cwd`. Symbolic links are never followed, and
/// one that is named or matched is answered `not_regular_file`; a file
/// two patterns name is sent once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRequest {
    pub patterns: Vec<String>,
    /// Most files sent; past it, `cap_reached`.
    pub max_files: u32,
    /// Most bytes sent, all files together; a file over what is left is
    /// `cap_reached` (`too_large` when it alone is over this).
    pub max_bytes: u64,
}

impl StageSpec {
    /// Whether the supervisor watches this stage's stdin for waits: asked
    /// (`watch_input`) and there is a stdin to wait on.
    pub fn watches_input(&self) -> bool {
        self.stdin && self.watch_input
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLimits {
    /// Wall-clock limit of the stage.
    pub wall_ms: u64,
    /// For interactive stages: longest time with neither input nor output.
    pub idle_ms: Option<u64>,
    /// CPU time of the stage (user + system, all its processes).
    pub cpu_ms: u64,
    /// stdout + stderr bytes the stage may write; more kills it.
    pub output_bytes: u64,
    /// Largest file the stage may write (RLIMIT_FSIZE).
    pub fsize_bytes: u64,
    /// Open files per process (RLIMIT_NOFILE).
    pub nofile: u64,
    /// Processes of the sandbox uid (RLIMIT_NPROC). Only set under gVisor,
    /// where the sandbox has a kernel of its own: under runc the count would
    /// include every sandbox on the host, and the pids cgroup does the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nproc: Option<u64>,
    /// The container's CPU quota in thousandths of a CPU. Only set under
    /// gVisor, whose kernel shows the supervisor every host CPU and not the
    /// quota; it caps the CPU time the supervisor believes (gVisor counts
    /// time spent waiting for the quota as CPU time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota_millis: Option<u64>,
    /// Address space of each process (RLIMIT_AS), when the job asks for
    /// one: an allocation past it fails instead of the program being
    /// stopped at the memory limit (Jobe's memory limit works so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_space_bytes: Option<u64>,
}

/// Serde helper: `Vec<u8>` as a standard base64 string in JSON.
pub mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Limits for a stage of the tests, none of them optional.
    pub(crate) fn limits() -> StageLimits {
        StageLimits {
            wall_ms: 1000,
            idle_ms: None,
            cpu_ms: 1000,
            output_bytes: 1024,
            fsize_bytes: 1024,
            nofile: 64,
            nproc: None,
            cpu_quota_millis: None,
            address_space_bytes: None,
        }
    }

    #[test]
    fn stage_limits_stay_compatible_both_ways() {
        // Without the optional fields the JSON is the first version's, and
        // the first version's JSON decodes with them unset.
        let json = serde_json::to_value(limits()).unwrap();
        assert!(json.get("nproc").is_none() && json.get("cpu_quota_millis").is_none());
        let decoded: StageLimits = serde_json::from_value(json).unwrap();
        assert_eq!(decoded, limits());
        // A field a newer worker adds is ignored by this supervisor.
        let mut newer = serde_json::to_value(StageLimits {
            cpu_quota_millis: Some(1500),
            address_space_bytes: None,
            ..limits()
        })
        .unwrap();
        newer["a_later_field"] = serde_json::json!(7);
        let decoded: StageLimits = serde_json::from_value(newer).unwrap();
        assert_eq!(decoded.cpu_quota_millis, Some(1500));
    }
}
