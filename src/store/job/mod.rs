//! The job's life in Redis: one file per step, each with its Lua script
//! beside it (`<step>.lua`), its inputs (one struct, one order, bound to
//! named Lua locals) and its outcome enum.
//!
//! | step | file | what it does |
//! |---|---|---|
//! | submit | [`submit`] | admits a job and queues its turn |
//! | claim | [`claim`] | `BLMOVE` of a turn, then `claim.lua` puts the job whose turn it is in its place |
//! | start | [`start`] | one more attempt; stores the deadline |
//! | append events | [`append_events`] | the running attempt's events |
//! | send input | [`send_input`] | a client's stdin or signal, within the job's budgets |
//! | finish | [`finish`] | the result, its `exit` event, the keys' expiry; or a late result |
//! | cancel | [`cancel`] | a queued job, with its turn |
//! | release | [`release`] | a claimed job back to the claim end of its user's queue |
//! | reap | [`reap`] | one job of a dead worker |
//! | give up overdue | [`give_up_overdue`] | a running job past its deadline on a live worker |
//! | delete | [`delete`] | an ended job's keys removed early |
//!
//! Which status moves each step may make is not restated here: the moves
//! are defined once, in [`crate::job::lifecycle::MOVES`] (docs/ARCHITECTURE.md
//! prints that table, and a test keeps the copy true); every script writes a status only through `set_status` (in
//! `lib.lua`), generated from that table, which refuses any other move
//! ([`StoreError::Refused`](crate::store::StoreError::Refused)). How a script is put
//! together: [`script`]. Reading a job back: [`record`]; its control
//! stream: [`control`].
//!
//! Every move to a terminal status ([`crate::job::lifecycle::TERMINAL`])
//! goes through `settle_job` in `lib.lua`: the result, the `exit` event, the
//! keys' expiry and their size against the key's storage budget
//! (`expire_job`), the usage ledger (`count_usage`) and the history
//! summary, in the one script that ends the job. A requeue (a claimed job
//! that never started goes back to the queue) keeps `queued`, so is no
//! move.
//!
//! Storage: output is stored as raw bytes, never as JSON text (a control
//! byte would take six): output events are stream entries `t
//! <stdout|stderr> d <bytes>`, and the result's output lives in four hash
//! fields beside the result's JSON. The `exit` event is stored without the
//! result (entry `x <json>`); readers put the job's one stored result into
//! it. A platform verdict (`worker_lost`, `deadline_exceeded`) carries its
//! own small result (entry `event <json>`), because a late real result may
//! replace the job's. Every job's bytes count against its API key's storage
//! budget (`apikey:<name>:stored`): a reservation at submit, the actual size
//! once it ends, released when its keys expire.

pub mod append_events;
pub mod cancel;
pub mod claim;
pub mod control;
pub mod delete;
pub mod finish;
pub mod give_up_overdue;
pub mod places;
pub mod reap;
pub mod record;
pub mod release;
pub(crate) mod script;
pub mod send_input;
pub mod start;
pub mod submit;

use std::sync::Arc;

use super::redis::Redis;
use script::StepScript;

/// Bytes counted for one stream entry besides its payload.
pub const EVENT_OVERHEAD: u64 = 64;
/// Bytes counted for a job besides its spec, events and result: the hash's
/// other fields, the status events, the keys themselves.
pub const JOB_OVERHEAD: u64 = 4096;
/// Bytes counted for one idempotency record.
pub const IDEMPOTENCY_BYTES: u64 = 256;
/// Most output events one job's stream takes; further output is left out
/// of the stream (the result keeps it).
pub const MAX_OUTPUT_EVENTS: u64 = 4096;

/// Every step's Lua body, by name (for the tests that read them).
#[cfg(test)]
pub(crate) const SCRIPT_BODIES: &[(&str, &str)] = &[
    ("submit", include_str!("submit.lua")),
    ("claim", include_str!("claim.lua")),
    ("start", include_str!("start.lua")),
    ("append_events", include_str!("append_events.lua")),
    ("send_input", include_str!("send_input.lua")),
    ("finish", include_str!("finish.lua")),
    ("cancel", include_str!("cancel.lua")),
    ("release", include_str!("release.lua")),
    ("reap", include_str!("reap.lua")),
    ("give_up_overdue", include_str!("give_up_overdue.lua")),
    ("delete", include_str!("delete.lua")),
];

/// Every step's script, loaded once.
#[derive(Debug)]
struct Scripts {
    submit: StepScript<submit::SubmitInputs>,
    claim: StepScript<claim::ClaimInputs>,
    start: StepScript<start::StartInputs>,
    append_events: StepScript<append_events::AppendInputs>,
    send_input: StepScript<send_input::SendInputs>,
    finish: StepScript<finish::FinishInputs>,
    cancel: StepScript<cancel::CancelInputs>,
    release: StepScript<release::ReleaseInputs>,
    reap: StepScript<reap::ReapInputs>,
    give_up_overdue: StepScript<give_up_overdue::OverdueInputs>,
    delete: StepScript<delete::DeleteInputs>,
    /// A read, not a step.
    places: deadpool_redis::redis::Script,
}

/// The job's life: every step and every read of a job.
#[derive(Debug, Clone)]
pub struct Jobs {
    redis: Redis,
    scripts: Arc<Scripts>,
}

impl Jobs {
    pub(super) fn new(redis: Redis) -> Self {
        let scripts = Scripts {
            submit: submit::script(),
            claim: claim::script(),
            start: start::script(),
            append_events: append_events::script(),
            send_input: send_input::script(),
            finish: finish::script(),
            cancel: cancel::script(),
            release: release::script(),
            reap: reap::script(),
            give_up_overdue: give_up_overdue::script(),
            delete: delete::script(),
            places: places::script(),
        };
        Self {
            redis,
            scripts: Arc::new(scripts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Lua library repeats the constants (a script cannot read Rust);
    /// this keeps them the same.
    #[test]
    fn the_scripts_use_the_documented_constants() {
        let library = include_str!("lib.lua");
        for (name, value) in [
            ("EVENT_OVERHEAD", EVENT_OVERHEAD),
            ("JOB_OVERHEAD", JOB_OVERHEAD),
            ("MAX_OUTPUT_EVENTS", MAX_OUTPUT_EVENTS),
            ("IDEMPOTENCY_BYTES", IDEMPOTENCY_BYTES),
        ] {
            assert!(
                library.contains(&format!("local {name} = {value}\n")),
                "lib.lua does not define {name} = {value}"
            );
        }
    }

    #[test]
    fn every_step_has_its_script() {
        use crate::job::lifecycle::Step;
        for step in Step::ALL {
            assert!(
                SCRIPT_BODIES.iter().any(|(name, _)| *name == step.name()),
                "{step:?} has no script"
            );
        }
        assert_eq!(SCRIPT_BODIES.len(), Step::ALL.len());
    }
}
