//! The job's life: its statuses (see [`Status`]) and the only moves between
//! them, each made by one step of `store/job/` (one Lua script per step).
//!
//! [`MOVES`] is the one definition. The store generates from it the Lua
//! function every script changes a job's status through, which refuses a
//! move the table does not have; a test replays every script against real
//! Redis from every status and checks what happened against it; and
//! `docs/ARCHITECTURE.md` prints it ([`markdown_table`], checked by a test).

use super::Status;

/// A step of the job's life that may change its status: one script each.
/// Steps that never change a status (claim, release, append events, send
/// input) are [`Step`]s too, with no [`Move`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// An admitted job enters the queue.
    Submit,
    /// A worker takes the job whose turn it is into its processing list
    /// (no status change).
    Claim,
    /// A worker that holds the claim marks the job running on itself.
    Start,
    /// The worker records the result of its running attempt (or of an
    /// attempt the platform gave up on, within the late-result window).
    Finish,
    /// A client cancels the job.
    Cancel,
    /// A claimed job goes back to the head of the queue (no status change).
    Release,
    /// The running attempt's events are appended (no status change).
    AppendEvents,
    /// A stream client's stdin, stdin close or signal (no status change).
    SendInput,
    /// The reaper takes back or settles one job of a worker whose heartbeat
    /// expired.
    Reap,
    /// The reaper gives up on a job running on a live worker past its
    /// deadline.
    GiveUpOverdue,
    /// An ended job's keys are removed before they expire (Judge0's
    /// `DELETE /submissions/{token}`; no status change).
    Delete,
}

impl Step {
    /// Every step, in the order of the job's life.
    pub const ALL: [Step; 11] = [
        Step::Submit,
        Step::Claim,
        Step::Start,
        Step::AppendEvents,
        Step::SendInput,
        Step::Finish,
        Step::Cancel,
        Step::Release,
        Step::Reap,
        Step::GiveUpOverdue,
        Step::Delete,
    ];

    /// The step's name: its script's file (`store/job/<name>.lua`) and the
    /// key of its moves in the generated Lua table.
    pub fn name(self) -> &'static str {
        match self {
            Step::Submit => "submit",
            Step::Claim => "claim",
            Step::Start => "start",
            Step::Finish => "finish",
            Step::Cancel => "cancel",
            Step::Release => "release",
            Step::AppendEvents => "append_events",
            Step::SendInput => "send_input",
            Step::Reap => "reap",
            Step::GiveUpOverdue => "give_up_overdue",
            Step::Delete => "delete",
        }
    }

    /// The moves this step may make.
    pub fn moves(self) -> impl Iterator<Item = &'static Move> {
        MOVES.iter().filter(move |m| m.step == self)
    }

    /// Whether this step may move a job from `from` (`None`: no job yet) to
    /// `to`.
    pub fn allows(self, from: Option<Status>, to: Status) -> bool {
        self.moves().any(|m| m.from == from && m.to.contains(&to))
    }
}

/// The terminal statuses.
pub const TERMINAL: &[Status] = &[
    Status::Succeeded,
    Status::Failed,
    Status::TimedOut,
    Status::Cancelled,
    Status::Error,
];

/// What a real result of a given-up attempt may be (not `error`: a platform
/// failure never replaces a verdict).
const LATE: &[Status] = &[
    Status::Succeeded,
    Status::Failed,
    Status::TimedOut,
    Status::Cancelled,
];

/// One allowed move: `step` may take a job from `from` to any of `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub step: Step,
    /// `None`: the job does not exist yet.
    pub from: Option<Status>,
    pub to: &'static [Status],
    /// When the step makes this move.
    pub when: &'static str,
}

/// Every move a job's status may make, and the step that makes it. A step
/// that keeps a job's status (a requeue keeps `queued`) makes no move.
pub const MOVES: &[Move] = &[
    Move {
        step: Step::Submit,
        from: None,
        to: &[Status::Queued],
        when: "admitted",
    },
    Move {
        step: Step::Start,
        from: Some(Status::Queued),
        to: &[Status::Running],
        when: "a worker that holds the claim starts it (`attempts` + 1, its deadline stored)",
    },
    Move {
        step: Step::Cancel,
        from: Some(Status::Queued),
        to: &[Status::Cancelled],
        when: "DELETE of a queued job",
    },
    Move {
        step: Step::Reap,
        from: Some(Status::Queued),
        to: &[Status::Error],
        when: "claimed by workers lost before starting it, requeues exhausted (`jobs:dead`)",
    },
    Move {
        step: Step::Finish,
        from: Some(Status::Running),
        to: TERMINAL,
        when: "the running attempt's own result (or a late result, which cancels a retry running elsewhere)",
    },
    Move {
        step: Step::Reap,
        from: Some(Status::Running),
        to: &[Status::Queued],
        when: "its worker was lost, attempts left, its sandbox known gone: a retry (an `attempt` event)",
    },
    Move {
        step: Step::Reap,
        from: Some(Status::Running),
        to: &[Status::Cancelled, Status::Error],
        when: "its worker was lost: `cancelled` after a DELETE asked for it, else the `worker_lost` verdict",
    },
    Move {
        step: Step::GiveUpOverdue,
        from: Some(Status::Running),
        to: &[Status::Error],
        when: "running on a live worker past its deadline: the `deadline_exceeded` verdict",
    },
    Move {
        step: Step::Finish,
        from: Some(Status::Error),
        to: LATE,
        when: "a late result: the given-up attempt's real result within `LATE_RESULT_WINDOW` replaces the verdict",
    },
    Move {
        step: Step::Finish,
        from: Some(Status::Queued),
        to: LATE,
        when: "a late result replaces the retry waiting in the queue",
    },
];

impl Status {
    /// Every status.
    pub const ALL: [Status; 7] = [
        Status::Queued,
        Status::Running,
        Status::Succeeded,
        Status::Failed,
        Status::TimedOut,
        Status::Cancelled,
        Status::Error,
    ];

    /// Whether some step may move a job from this status to `to`.
    pub fn can_become(self, to: Status) -> bool {
        MOVES
            .iter()
            .any(|m| m.from == Some(self) && m.to.contains(&to))
    }
}

fn statuses(list: &[Status]) -> String {
    if list == TERMINAL {
        return "terminal".to_string();
    }
    list.iter()
        .map(|s| format!("`{}`", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The table of [`MOVES`] as `docs/ARCHITECTURE.md` prints it.
pub fn markdown_table() -> String {
    let mut table = String::from("| from | to | step | when |\n|---|---|---|---|\n");
    for m in MOVES {
        let from = m
            .from
            .map_or("—".to_string(), |s| format!("`{}`", s.as_str()));
        table.push_str(&format!(
            "| {from} | {} | {} | {} |\n",
            statuses(m.to),
            m.step.name(),
            m.when
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_statuses_are_final_but_for_a_late_result() {
        for from in Status::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in Status::ALL {
                let late = from == Status::Error && LATE.contains(&to);
                assert_eq!(from.can_become(to), late, "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn only_submit_creates_a_job_and_only_into_the_queue() {
        for step in Step::ALL {
            for to in Status::ALL {
                assert_eq!(
                    step.allows(None, to),
                    step == Step::Submit && to == Status::Queued,
                    "{step:?} -> {to:?}"
                );
            }
        }
    }

    #[test]
    fn a_running_job_never_starts_again_and_a_late_result_is_never_an_error() {
        assert!(!Status::Running.can_become(Status::Running));
        assert!(Status::Queued.can_become(Status::Running));
        assert!(Step::Start.allows(Some(Status::Queued), Status::Running));
        assert!(!Step::Start.allows(Some(Status::Running), Status::Running));
        assert!(!Step::Finish.allows(Some(Status::Error), Status::Error));
        assert!(Step::Finish.allows(Some(Status::Error), Status::Succeeded));
    }

    #[test]
    fn steps_that_keep_the_status_have_no_move() {
        for step in [
            Step::Release,
            Step::AppendEvents,
            Step::SendInput,
            Step::Delete,
        ] {
            assert_eq!(step.moves().count(), 0, "{step:?}");
        }
    }

    #[test]
    fn the_table_names_each_step_once_per_source() {
        for (i, a) in MOVES.iter().enumerate() {
            for b in &MOVES[i + 1..] {
                assert!(
                    !(a.step == b.step
                        && a.from == b.from
                        && a.to.iter().any(|s| b.to.contains(s))),
                    "{a:?} overlaps {b:?}"
                );
            }
        }
    }
}

#[cfg(test)]
mod doc_tests {
    /// docs/ARCHITECTURE.md prints the table; this keeps it the code's.
    #[test]
    fn the_architecture_doc_prints_the_table_of_the_code() {
        let doc = include_str!("../../docs/ARCHITECTURE.md");
        let begin = "<!-- job-moves: generated from src/job/lifecycle.rs -->\n";
        let end = "<!-- /job-moves -->";
        let start = doc.find(begin).expect("the doc has the job-moves marker") + begin.len();
        let stop = start + doc[start..].find(end).expect("the doc ends the table");
        let table = super::markdown_table();
        assert_eq!(
            &doc[start..stop],
            table,
            "docs/ARCHITECTURE.md's job table differs from the code; paste this:\n{table}"
        );
    }
}
