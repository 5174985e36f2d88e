//! Append events: the running attempt's stage and output events go into
//! the job's events stream (`append_events.lua`). No status changes.

use super::Jobs;
use super::script::{StepScript, script_inputs};
use crate::job::events::JobEvent;
use crate::job::lifecycle::Step;
use crate::store::StoreError;

script_inputs! {
    struct AppendInputs {
        keys { job, events }
        args { worker: String, attempt: u32 }
    }
}

pub(super) fn script() -> StepScript<AppendInputs> {
    StepScript::new(Step::AppendEvents, include_str!("append_events.lua"))
}

impl Jobs {
    /// Appends a running attempt's events (in order) for `worker`'s
    /// `attempt`; `None` when the job is not running that attempt any more
    /// (nothing was appended). Output is stored raw; output past the
    /// per-job cap of events is left out of the stream (the result keeps
    /// it). Returns the last `seq` appended (0 if none).
    pub async fn append_events(
        &self,
        id: &str,
        worker: &str,
        attempt: u32,
        events: &[JobEvent],
    ) -> Result<Option<u64>, StoreError> {
        if events.is_empty() {
            return Ok(Some(0));
        }
        let keys = &self.redis.keys;
        let inputs = AppendInputs {
            job: keys.job(id),
            events: keys.events(id),
            worker: worker.to_string(),
            attempt,
        };
        let args = EventArgs::of(events);
        let rest: Vec<&[u8]> = args.slices().collect();
        let mut conn = self.redis.conn().await?;
        let reply = self
            .scripts
            .append_events
            .run(&mut conn, &inputs, &rest)
            .await?;
        match reply.outcome() {
            "ended" => Ok(None),
            "ok" => Ok(Some(reply.number(0)?)),
            _ => Err(reply.unexpected()),
        }
    }
}

/// Events as the scripts take them (`append_batch` in lib.lua): a kind
/// (`event`, `stdout`, `stderr`) and its payload (an event's JSON, raw
/// output bytes) for each.
pub(super) struct EventArgs(Vec<(&'static [u8], Vec<u8>)>);

impl EventArgs {
    pub(super) fn of(events: &[JobEvent]) -> Self {
        Self(
            events
                .iter()
                .map(|event| match event {
                    JobEvent::Stdout { .. } => {
                        (&b"stdout"[..], event.output_bytes().unwrap_or_default())
                    }
                    JobEvent::Stderr { .. } => {
                        (&b"stderr"[..], event.output_bytes().unwrap_or_default())
                    }
                    _ => (&b"event"[..], event.to_json().into_bytes()),
                })
                .collect(),
        )
    }

    /// The arguments in order: kind, payload, kind, payload…
    pub(super) fn slices(&self) -> impl Iterator<Item = &[u8]> {
        self.0
            .iter()
            .flat_map(|(kind, payload)| [*kind, payload.as_slice()])
    }
}
