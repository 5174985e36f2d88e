//! A stream's watch of its queued job's place: on while the job is queued,
//! off from its start (or end), on again when a `status` `queued` event
//! puts it back in the queue; and the next thing a stream sends, of the
//! job's events and its places, in the order a client should see them.

use tokio::sync::watch;

use crate::api::ApiState;
use crate::follow::feeds::{Step, Subscription};
use crate::follow::places::{Place, Places};
use crate::job::Status;
use crate::job::events::StoredEvent;
use crate::store::JobRecord;

/// The `queued` event of a place (no `seq`: it is not stored).
pub(super) fn queued_event(place: Place) -> String {
    serde_json::json!({"type": "queued", "position": place.position, "eta_ms": place.eta_ms})
        .to_string()
}

/// A queued job's place, as its streams watch it.
type PlaceWatch = watch::Receiver<Option<Place>>;

/// A stream's watch of its job's place: on while the job is queued, off
/// from its start (or end), on again when it goes back to the queue for
/// another attempt.
pub(super) struct QueuePlace {
    places: Places,
    id: String,
    watch: Option<PlaceWatch>,
}

impl QueuePlace {
    /// Watching from the start when the stream opens on a queued job.
    pub(super) fn of(state: &ApiState, record: &JobRecord) -> Self {
        let places = state.places.clone();
        let watch = (record.status == Status::Queued).then(|| places.watch(&record.id));
        Self {
            places,
            id: record.id.clone(),
            watch,
        }
    }

    /// Follows the job in or out of the queue by the last of `events`
    /// that moves it.
    fn note(&mut self, events: &[StoredEvent]) {
        let queued = events.iter().rev().find_map(|event| {
            if leaves_the_queue(event) {
                Some(false)
            } else {
                event.is_queued().then_some(true)
            }
        });
        match queued {
            Some(false) => self.watch = None,
            Some(true) if self.watch.is_none() => self.watch = Some(self.places.watch(&self.id)),
            _ => {}
        }
    }

    /// The new place; `None` when the job is not queued any more.
    async fn changed(&mut self) -> Option<Place> {
        let Some(watch) = &mut self.watch else {
            return std::future::pending().await;
        };
        match watch.changed().await {
            Ok(()) => *watch.borrow_and_update(),
            Err(_) => None,
        }
    }
}

/// What a stream sends next.
pub(super) enum Next {
    Step(Step),
    /// The queued job's place changed (never between its start and a
    /// return to the queue).
    Place(Place),
}

/// The next of the job's events, or of its places while it is queued. The
/// stored events a stream replays all come before any place (a client
/// sees the job's `status` `queued` before where it is in the queue), and
/// the events come first when both are ready; once the job has started (or
/// ended), its place is no longer watched, so no place follows its start
/// until the job is queued again.
pub(super) async fn next_of(subscription: &mut Subscription, place: &mut QueuePlace) -> Next {
    if let Some(step) = subscription.catch_up().await {
        if let Step::Events(events) = &step {
            place.note(events);
        }
        return Next::Step(step);
    }
    loop {
        tokio::select! {
            biased;
            step = subscription.next() => {
                if let Step::Events(events) = &step {
                    place.note(events);
                }
                return Next::Step(step);
            }
            changed = place.changed() => match changed {
                Some(now) => return Next::Place(now),
                None => place.watch = None,
            },
        }
    }
}

fn leaves_the_queue(event: &StoredEvent) -> bool {
    event.is_exit() || event.is_start()
}
