//! What a stage's end means: the reason of a stage the supervisor did not
//! kill itself, and the report of a stage that never started.

use nix::libc;

use code_runner_protocol::{Reason, StageReport, StageSpec};

/// Report of a stage that was not started.
pub(crate) fn not_started(spec: &StageSpec, reason: Reason) -> StageReport {
    StageReport {
        stage: spec.name.clone(),
        exit_code: None,
        signal: None,
        reason,
        wall_ms: 0,
        cpu_ms: 0,
        memory_peak_bytes: 0,
        output_truncated: false,
        pids_limit_reached: None,
    }
}

/// What decides the reason of a stage the supervisor did not kill.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub cpu_ms: u64,
    pub cpu_limit_ms: u64,
    /// The memory cgroup's `oom_kill` counter went up during the stage.
    pub oom_killed: bool,
    /// Its failure counter (v1 `failcnt`, v2 `max`) went up.
    pub limit_hit: bool,
}

/// The reason of a stage the supervisor did not kill itself (so a SIGKILL
/// here came from the kernel: OOM killer or RLIMIT_CPU's hard limit, or from
/// the job itself).
pub(crate) fn classify(facts: Facts) -> Reason {
    let unsent_sigkill = facts.signal == Some(libc::SIGKILL);
    if facts.signal == Some(libc::SIGXCPU) {
        // RLIMIT_CPU's soft limit.
        Reason::CpuTimeout
    } else if facts.oom_killed && facts.exit_code != Some(0) {
        // The kernel OOM-killed the stage or one of its processes.
        Reason::MemoryLimit
    } else if unsent_sigkill && facts.limit_hit {
        Reason::MemoryLimit
    } else if unsent_sigkill && facts.cpu_ms >= facts.cpu_limit_ms {
        // RLIMIT_CPU's hard limit.
        Reason::CpuTimeout
    } else {
        Reason::Exited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            exit_code: None,
            signal: Some(libc::SIGKILL),
            cpu_ms: 10,
            cpu_limit_ms: 1000,
            oom_killed: false,
            limit_hit: false,
        }
    }

    #[test]
    fn unexplained_sigkill_is_exited() {
        assert_eq!(classify(facts()), Reason::Exited);
    }

    #[test]
    fn oom_evidence_means_memory_limit() {
        assert_eq!(
            classify(Facts {
                oom_killed: true,
                ..facts()
            }),
            Reason::MemoryLimit
        );
        assert_eq!(
            classify(Facts {
                limit_hit: true,
                ..facts()
            }),
            Reason::MemoryLimit
        );
        // A stage that survived the OOM kill of a child and exited 0 succeeded.
        assert_eq!(
            classify(Facts {
                exit_code: Some(0),
                signal: None,
                oom_killed: true,
                ..facts()
            }),
            Reason::Exited
        );
    }

    #[test]
    fn rlimit_cpu_deaths_are_cpu_timeouts() {
        assert_eq!(
            classify(Facts {
                signal: Some(libc::SIGXCPU),
                ..facts()
            }),
            Reason::CpuTimeout
        );
        assert_eq!(
            classify(Facts {
                cpu_ms: 3000,
                ..facts()
            }),
            Reason::CpuTimeout
        );
    }
}
