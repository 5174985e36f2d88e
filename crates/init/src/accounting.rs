//! What the supervisor measures while a stage runs: the CPU time of the
//! job's processes (from `/proc`), and the memory and pids cgroups' counters
//! of limits hit.
//!
//! CPU time is read per process rather than from the cgroup's `cpuacct`
//! because the cgroup also counts the supervisor itself and, outside a
//! container, is not the job's at all. Every process of the job's uid is the
//! job's (nothing else runs as that uid), and for each one
//! `utime + stime + cutime + cstime` covers the process and the children it
//! has waited for; children reaped by the supervisor are added by the caller
//! from their `wait4` usage.
//!
//! Those figures are trusted only up to what the CPUs can physically give:
//! see [`cpu_ceiling_ms`].

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Clock ticks per second in `/proc/<pid>/stat`: Linux fixes `USER_HZ` at
/// 100 for user space on every architecture we run on.
const USER_HZ: u64 = 100;

/// Reads a small file of `/proc` or of the cgroup file system whole. These
/// report no size, so `std::fs::read_to_string` asks for it (a `statx`) and
/// then reads 32 bytes, 32, 64 and so on: ten system calls for a
/// `/proc/<pid>/status`. One buffer of 4 KiB takes any of them in one read
/// (and one more that says the end): four calls with the open and close.
/// Under gVisor every system call of the supervisor counts (about 0.1 ms
/// each on the development VM).
pub(crate) fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut bytes = vec![0; 4096];
    let mut len = 0;
    loop {
        if len == bytes.len() {
            bytes.resize(len * 2, 0);
        }
        match file.read(&mut bytes[len..]) {
            Ok(0) => break,
            Ok(read) => len += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    bytes.truncate(len);
    String::from_utf8(bytes)
        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))
}

/// The job's processes at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct UidSample {
    /// Processes of the uid that are not zombies.
    pub live: usize,
    /// CPU time of those processes and of the children they reaped.
    pub cpu_ms: u64,
}

/// Scans `/proc` for the processes whose real uid is `uid`.
pub(crate) fn sample_uid(uid: u32) -> UidSample {
    let mut sample = UidSample::default();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return sample;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let dir = Path::new("/proc").join(pid);
        // The owner of /proc/<pid> is not the uid for a non-dumpable process,
        // so read the real uid from `status`.
        let Ok(status) = read_small(&dir.join("status")) else {
            continue;
        };
        if real_uid(&status) != Some(uid) {
            continue;
        }
        let Ok(stat) = read_small(&dir.join("stat")) else {
            continue;
        };
        if let Some((state, ticks)) = parse_stat(&stat) {
            if state != 'Z' && state != 'X' {
                sample.live += 1;
            }
            sample.cpu_ms = sample.cpu_ms.saturating_add(ticks * (1000 / USER_HZ));
        }
    }
    sample
}

fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|id| id.parse().ok())
}

/// State and `utime + stime + cutime + cstime` (in ticks) from the text of
/// `/proc/<pid>/stat`. The command name may contain spaces and parentheses,
/// so fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 of proc(5) (state); utime..cstime are 14..17.
    let state = fields.first()?.chars().next()?;
    let mut ticks: u64 = 0;
    for field in fields.get(11..15)? {
        let value: i64 = field.parse().ok()?;
        ticks = ticks.saturating_add(u64::try_from(value).unwrap_or(0));
    }
    Some((state, ticks))
}

/// How much CPU the job's processes can get at once, in thousandths of a
/// CPU: the supervisor's CPU affinity, which they inherit (and which covers
/// every CPU of the container unless something pinned it), and the
/// container's CPU quota when the worker sent it (`quota_millis`, gVisor);
/// `u64::MAX` (no ceiling) if neither is known.
pub(crate) fn usable_cpu_millis(quota_millis: Option<u64>) -> u64 {
    let affinity = affinity_millis();
    match quota_millis {
        Some(quota) => affinity.min(quota.max(1)),
        None => affinity,
    }
}

/// The supervisor's CPU affinity in thousandths of a CPU (`u64::MAX` when
/// it cannot be read), read once: [`read_affinity`] reads it before the
/// bundle, off a warm sandbox's job path (under gVisor every system call
/// there costs tens of µs). It cannot change afterwards: only the
/// supervisor itself (it does not) or a process with `CAP_SYS_NICE` (no
/// process of the job has it) could change PID 1's affinity.
fn affinity_millis() -> u64 {
    use nix::sched::{CpuSet, sched_getaffinity};
    use nix::unistd::Pid;
    static AFFINITY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *AFFINITY.get_or_init(|| match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => {
            let count = (0..CpuSet::count())
                .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
                .count();
            u64::try_from(count)
                .unwrap_or(u64::MAX)
                .max(1)
                .saturating_mul(1000)
        }
        Err(_) => u64::MAX,
    })
}

/// Reads the supervisor's CPU affinity now (see [`affinity_millis`]).
pub(crate) fn read_affinity() {
    affinity_millis();
}

/// The most CPU time the job can really have used `elapsed` after its stage
/// started, with `cpu_millis` thousandths of a CPU: figures above it are
/// not CPU time.
///
/// gVisor (runsc) needs this. Its kernel charges a task CPU time for as long
/// as the task is marked running in the sentry, whether or not a host CPU
/// runs it: time spent waiting for the container's CPU quota or contending
/// for sentry locks (fork, exit, wait) counts as `stime`. Each process of a
/// fork bomb then shows ~100-300 ms of `stime` while sleeping, and the sum
/// grows at 10-15 s per second of wall time in a 1-CPU container (gVisor's own
/// `getrusage(RUSAGE_CHILDREN)` shows the same), which ended bombs as
/// `cpu_timeout` well before their wall limit. Under runc the figures are
/// real and stay under the ceiling; a real busy loop (and the CPU of
/// grandchildren and orphans) still counts in full under both runtimes.
pub(crate) fn cpu_ceiling_ms(elapsed: Duration, cpu_millis: u64) -> u64 {
    if cpu_millis == u64::MAX {
        return u64::MAX;
    }
    let elapsed = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    u64::try_from(u128::from(elapsed) * u128::from(cpu_millis) / 1000).unwrap_or(u64::MAX)
}

/// The cgroup counters that show a limit being hit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LimitCounters {
    /// `oom_kill` (cgroup v1 `memory.oom_control`, v2 `memory.events`).
    pub oom_kill: Option<u64>,
    /// Times usage hit the limit: v1 `memory.failcnt`, v2 `max` in
    /// `memory.events`.
    pub failcnt: Option<u64>,
    /// Process starts refused at the pids limit: `max` in `pids.events`
    /// (v1 and v2).
    pub pids_max: Option<u64>,
}

impl LimitCounters {
    /// Whether `later` shows an OOM kill since `self`.
    pub(crate) fn oom_killed_since(&self, later: &LimitCounters) -> bool {
        grew(self.oom_kill, later.oom_kill) == Some(true)
    }

    /// Whether `later` shows the memory limit being hit since `self`.
    pub(crate) fn limit_hit_since(&self, later: &LimitCounters) -> bool {
        grew(self.failcnt, later.failcnt) == Some(true)
    }

    /// Whether `later` shows a process start refused at the pids limit
    /// since `self`; `None` without a pids cgroup to read (gVisor).
    pub(crate) fn pids_refused_since(&self, later: &LimitCounters) -> Option<bool> {
        grew(self.pids_max, later.pids_max)
    }
}

/// Whether a counter went up; `None` when either reading is missing.
fn grew(before: Option<u64>, after: Option<u64>) -> Option<bool> {
    Some(after? > before?)
}

/// Where the supervisor's memory and pids cgroups keep their counters.
/// Under gVisor there are none (its kernel shows no cgroup files): the
/// memory limit is seen from the sandbox's exit, and refused process
/// starts are not known (gVisor's kernel enforces `RLIMIT_NPROC` and counts
/// no refusals; sampling the processes, tried, sees a fork bomb anywhere
/// between a few and the limit).
#[derive(Debug, Clone, Default)]
pub(crate) struct CgroupProbe {
    /// v1 `memory.oom_control` or v2 `memory.events`.
    events: Option<PathBuf>,
    /// v1 `memory.failcnt`; `None` on v2 (the `max` line of `events`).
    failcnt: Option<PathBuf>,
    /// v1 or v2 `pids.events`.
    pids_events: Option<PathBuf>,
}

impl CgroupProbe {
    /// Finds the files of the supervisor's own cgroups. In a container the
    /// cgroup is usually mounted at the root of `/sys/fs/cgroup`, while
    /// `/proc/self/cgroup` names its path on the host; outside one, the
    /// path from `/proc/self/cgroup` is right. Both are tried, own path first.
    pub(crate) fn discover() -> Self {
        let own = read_small(Path::new("/proc/self/cgroup")).unwrap_or_default();
        let dirs = |controller: &str| own_cgroup_dirs(&own, controller);
        let mut probe = Self::default();
        for dir in dirs("memory") {
            let v1 = dir.join("memory.oom_control");
            let v2 = dir.join("memory.events");
            if v1.is_file() {
                let failcnt = dir.join("memory.failcnt");
                probe.events = Some(v1);
                probe.failcnt = failcnt.is_file().then_some(failcnt);
                break;
            }
            if v2.is_file() {
                probe.events = Some(v2);
                break;
            }
        }
        probe.pids_events = dirs("pids")
            .into_iter()
            .map(|dir| dir.join("pids.events"))
            .find(|events| events.is_file());
        probe
    }

    pub(crate) fn read(&self) -> LimitCounters {
        let events = self
            .events
            .as_ref()
            .and_then(|path| read_small(path).ok())
            .unwrap_or_default();
        let failcnt = match &self.failcnt {
            Some(path) => read_small(path)
                .ok()
                .and_then(|text| text.trim().parse().ok()),
            None => keyed_counter(&events, "max"),
        };
        let pids_max = self
            .pids_events
            .as_ref()
            .and_then(|path| read_small(path).ok())
            .and_then(|text| keyed_counter(&text, "max"));
        LimitCounters {
            oom_kill: keyed_counter(&events, "oom_kill"),
            failcnt,
            pids_max,
        }
    }
}

/// The directories where `controller`'s files of the supervisor's own
/// cgroup may be, most likely first: cgroup v1's hierarchy of that
/// controller (by the path `/proc/self/cgroup` gives, then its root), then
/// the v2 unified hierarchy (the same two).
fn own_cgroup_dirs(proc_self_cgroup: &str, controller: &str) -> Vec<PathBuf> {
    let v1_root = Path::new("/sys/fs/cgroup").join(controller);
    let v2_root = Path::new("/sys/fs/cgroup");
    let mut v1 = Vec::new();
    let mut v2 = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let relative = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == controller) {
            v1.push(v1_root.join(relative));
        } else if id == "0" && controllers.is_empty() {
            v2.push(v2_root.join(relative));
        }
    }
    v1.push(v1_root);
    v2.push(v2_root.to_path_buf());
    v1.into_iter().chain(v2).collect()
}

/// The value of a `key N` line.
fn keyed_counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some(key))
            .then(|| parts.next().and_then(|n| n.parse().ok()))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_command_name_parses() {
        let stat = "4242 (a) b (c)) R 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    7 3 20 10 20 0 1 0 12345 1000 100 18446744073709551615";
        assert_eq!(parse_stat(stat), Some(('R', 40)));
        assert_eq!(parse_stat("1 (x) Z 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn real_uid_is_the_first_uid_field() {
        let status = "Name:\tsh\nUid:\t4000001\t4000001\t4000001\t4000001\nGid:\t7\t7\t7\t7\n";
        assert_eq!(real_uid(status), Some(4_000_001));
        assert_eq!(real_uid("Name:\tsh\n"), None);
    }

    #[test]
    fn own_cgroup_dirs_come_from_proc_self_cgroup_then_the_roots() {
        let v1 = "8:pids:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n";
        let dirs = |controller| {
            own_cgroup_dirs(v1, controller)
                .into_iter()
                .map(|dir| dir.display().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            dirs("pids"),
            [
                "/sys/fs/cgroup/pids/docker/abc",
                "/sys/fs/cgroup/pids",
                "/sys/fs/cgroup/docker/abc",
                "/sys/fs/cgroup",
            ]
        );
        assert_eq!(dirs("memory")[0], "/sys/fs/cgroup/memory/docker/abc");
        assert_eq!(
            own_cgroup_dirs("0::/\n", "pids")
                .into_iter()
                .map(|dir| dir.display().to_string())
                .collect::<Vec<_>>(),
            ["/sys/fs/cgroup/pids", "/sys/fs/cgroup/", "/sys/fs/cgroup"]
        );
    }

    #[test]
    fn a_counter_that_grew_shows_its_limit_hit() {
        let before = LimitCounters {
            oom_kill: Some(0),
            failcnt: Some(2),
            pids_max: Some(0),
        };
        let after = LimitCounters {
            pids_max: Some(3),
            ..before
        };
        assert_eq!(before.pids_refused_since(&after), Some(true));
        assert_eq!(after.pids_refused_since(&after), Some(false));
        assert!(!before.limit_hit_since(&after));
        assert!(!before.oom_killed_since(&after));
        // Unknown (no such file, as under gVisor): not a hit, and not known.
        let unknown = LimitCounters::default();
        assert!(!unknown.oom_killed_since(&after));
        assert_eq!(unknown.pids_refused_since(&after), None);
        assert_eq!(before.pids_refused_since(&unknown), None);
    }

    #[test]
    fn keyed_counters_are_found() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed_counter(v1, "oom_kill"), Some(3));
        assert_eq!(keyed_counter(v1, "oom_kill_disable"), Some(0));
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\n";
        assert_eq!(keyed_counter(v2, "max"), Some(12));
        assert_eq!(keyed_counter(v2, "missing"), None);
    }

    #[test]
    fn cpu_ceiling_is_wall_time_times_cpus() {
        assert_eq!(cpu_ceiling_ms(Duration::from_millis(1500), 2000), 3000);
        assert_eq!(cpu_ceiling_ms(Duration::from_millis(1500), 500), 750);
        assert_eq!(cpu_ceiling_ms(Duration::from_secs(1), u64::MAX), u64::MAX);
        assert!(usable_cpu_millis(None) >= 1000);
    }

    #[test]
    fn the_quota_caps_the_usable_cpus() {
        let host = usable_cpu_millis(None);
        assert_eq!(usable_cpu_millis(Some(500)), 500.min(host));
        assert_eq!(usable_cpu_millis(Some(u64::MAX / 2)), host);
        assert_eq!(usable_cpu_millis(Some(0)), 1);
    }

    #[test]
    fn own_process_is_sampled() {
        let sample = sample_uid(nix::unistd::getuid().as_raw());
        assert!(sample.live >= 1);
    }
}
