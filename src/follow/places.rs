//! A queued job's place in the queue, live: `{"type":"queued","position",
//! "eta_ms"}` on its streams, and `queue` in its view.
//!
//! One task per API process, started at the first use: every [`TICK`], one
//! `places.lua` call reads the places of all the queued jobs this
//! process's streams follow (never a call per job), and each job's
//! watchers get its new place when it moved ([`moved`]); a job newly
//! watched is read at once. With no job watched, a tick reads the claim
//! counter alone (one `GET`), so a new watcher's first place comes with its
//! estimated wait. The wait is estimated from the fleet's claim rate, read
//! from the claim counter (`jobs:claims`) over the last [`RATE_WINDOW`];
//! with no claim in that window there is no estimate (`eta_ms: null`):
//! nothing is being claimed, which is what a student waiting on a stopped
//! service should see.
//!
//! Why a tick and not events: a queued job's place moves when any worker
//! of the fleet claims a job, and when any API process queues or cancels
//! one ahead of it (fair turns put a new user's first job ahead of others'
//! older ones). None of that reaches this process: the followed jobs' own
//! events ([`super::feeds`]) say only when a job itself starts, and the
//! store keeps no signal of the queue's changes. The estimate moves with
//! time alone too. So the process asks, twice a second.
//!
//! What a tick costs, measured as `places.lua`'s own time in a local Redis
//! 7.0: 35 µs for one watched job; with W watched jobs of a key with U
//! users waiting, about 0.25 µs × W × U: 14 ms for an exam of 300 students
//! each following their one job, 25 ms for 100 watched among 1000 users,
//! 73 ms for 300 watched among 1000 users (at two ticks a second, 15% of
//! Redis's one thread for each API process with such streams). The cost is
//! the script's walk of the key's users for each job, not how often it
//! runs: fewer ticks would make every place later, not the walk cheaper.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::store::{self, Store, StoreError};

/// How often the followed jobs' places are read (see the module's doc for
/// why a tick, and what one costs): at most 2 updates a second per job.
pub(crate) const TICK: Duration = Duration::from_millis(500);
/// The claim rate is taken over this long.
const RATE_WINDOW: Duration = Duration::from_secs(30);
/// A rate from less than this much history is not trusted yet.
const RATE_MIN_SPAN: Duration = Duration::from_secs(2);

/// A queued job's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Place {
    /// The jobs that will be claimed before it (0: it is next).
    pub position: u64,
    /// The wait estimated from the recent claim rate; `None`: nothing was
    /// claimed lately, so there is no estimate.
    pub eta_ms: Option<u64>,
}

/// Claim counter samples, oldest first.
#[derive(Debug, Default)]
struct ClaimRate {
    samples: VecDeque<(Instant, u64)>,
}

impl ClaimRate {
    fn add(&mut self, at: Instant, claims: u64) {
        while self
            .samples
            .front()
            .is_some_and(|(then, _)| at.duration_since(*then) > RATE_WINDOW)
        {
            self.samples.pop_front();
        }
        self.samples.push_back((at, claims));
    }

    /// Claims per second over the window, when there is enough of it and
    /// something was claimed.
    fn per_second(&self) -> Option<f64> {
        let (first_at, first) = *self.samples.front()?;
        let (last_at, last) = *self.samples.back()?;
        let span = last_at.duration_since(first_at);
        if span < RATE_MIN_SPAN || last <= first {
            return None;
        }
        Some((last - first) as f64 / span.as_secs_f64())
    }

    /// `position` jobs go first, then this one's own claim.
    fn place(&self, position: u64) -> Place {
        Place {
            position,
            eta_ms: self
                .per_second()
                .map(|rate| ((position + 1) as f64 * 1000.0 / rate).ceil() as u64),
        }
    }
}

struct Inner {
    store: Store,
    /// The followed queued jobs, each with the channel its streams watch.
    watched: Mutex<HashMap<String, watch::Sender<Option<Place>>>>,
    rate: Mutex<ClaimRate>,
    /// Rung when a job is first watched: its place is read at once.
    wake: Notify,
    /// The task starts at the first use (an API state nobody asks for
    /// places reads nothing).
    started: std::sync::Once,
    shutdown: CancellationToken,
}

impl Inner {
    fn watched(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<Option<Place>>>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in what `places.lua` read at `now` (its claim counter into the
    /// rate) and gives each job's place with its estimated wait.
    fn rated(&self, read: &store::Places, now: Instant) -> Vec<Option<Place>> {
        let mut rate = self.rate.lock().unwrap_or_else(PoisonError::into_inner);
        rate.add(now, read.claims);
        read.places
            .iter()
            .map(|place| place.map(|p| rate.place(p)))
            .collect()
    }
}

/// The places of the jobs this process's streams follow.
#[derive(Clone)]
pub(crate) struct Places {
    inner: Arc<Inner>,
}

impl Places {
    /// Its task starts at the first use and ends with `shutdown`.
    pub(crate) fn new(store: Store, shutdown: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                watched: Mutex::new(HashMap::new()),
                rate: Mutex::new(ClaimRate::default()),
                wake: Notify::new(),
                started: std::sync::Once::new(),
                shutdown,
            }),
        }
    }

    fn start(&self) {
        self.inner.started.call_once(|| {
            tokio::spawn(self.clone().run());
        });
    }

    /// Watches `id`'s place (the receiver starts at `None`: not read yet).
    pub(crate) fn watch(&self, id: &str) -> watch::Receiver<Option<Place>> {
        self.start();
        let mut watched = self.inner.watched();
        let receiver = match watched.get(id) {
            Some(sender) => {
                // Another stream follows it already: this one is told the
                // place known now too, not only the next one.
                let mut receiver = sender.subscribe();
                if receiver.borrow().is_some() {
                    receiver.mark_changed();
                }
                receiver
            }
            None => {
                let (sender, receiver) = watch::channel(None);
                watched.insert(id.to_string(), sender);
                receiver
            }
        };
        drop(watched);
        self.inner.wake.notify_one();
        receiver
    }

    /// One job's place now (for its view): one script call.
    pub(crate) async fn place_of(&self, id: &str) -> Result<Option<Place>, StoreError> {
        self.start();
        let read = self.inner.store.jobs().places(&[id.to_string()]).await?;
        Ok(self
            .inner
            .rated(&read, Instant::now())
            .first()
            .copied()
            .flatten())
    }

    async fn run(self) {
        let shutdown = self.inner.shutdown.clone();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
                () = self.inner.wake.notified() => {}
            }
            if let Err(error) = self.read().await {
                tracing::debug!(error = %error, "reading queue places failed");
            }
        }
    }

    /// Reads the places of the watched jobs (the claim counter alone when
    /// none is), sends each changed one, and forgets the jobs nobody
    /// watches or that are no longer queued.
    async fn read(&self) -> Result<(), StoreError> {
        let ids: Vec<String> = {
            let mut watched = self.inner.watched();
            watched.retain(|_, sender| sender.receiver_count() > 0);
            watched.keys().cloned().collect()
        };
        let jobs = self.inner.store.jobs();
        let now = Instant::now();
        if ids.is_empty() {
            let claims = jobs.claims().await?;
            self.inner
                .rate
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .add(now, claims);
            return Ok(());
        }
        let read = jobs.places(&ids).await?;
        let places = self.inner.rated(&read, now);
        let mut watched = self.inner.watched();
        for (id, place) in ids.iter().zip(places) {
            let Some(sender) = watched.get(id) else {
                continue;
            };
            sender.send_if_modified(|current| {
                let changed = moved(*current, place);
                if changed {
                    *current = place;
                }
                changed
            });
            if place.is_none() {
                // Started or gone: its watchers see `None` and stop.
                watched.remove(id);
            }
        }
        Ok(())
    }
}

/// Whether a watcher is told: the position changed, or the estimate came,
/// went or moved by at least a second and a fifth.
fn moved(told: Option<Place>, now: Option<Place>) -> bool {
    match (told, now) {
        (Some(told), Some(now)) if told.position == now.position => match (told.eta_ms, now.eta_ms)
        {
            (Some(a), Some(b)) => a.abs_diff(b) >= (a / 5).max(1000),
            (a, b) => a.is_some() != b.is_some(),
        },
        (told, now) => told.is_some() || now.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_comes_from_the_claims_over_the_window() {
        let start = Instant::now();
        let mut rate = ClaimRate::default();
        rate.add(start, 100);
        assert_eq!(rate.place(3).eta_ms, None, "one sample is no rate");
        rate.add(start + Duration::from_secs(1), 104);
        assert_eq!(rate.per_second(), None, "1 s of history is too little");
        rate.add(start + Duration::from_secs(4), 116);
        // 16 claims in 4 s: 4 a second; 3 ahead and its own: 1 s.
        assert_eq!(
            rate.place(3),
            Place {
                position: 3,
                eta_ms: Some(1000)
            }
        );
        // Samples older than the window drop out; no claim since: no estimate.
        rate.add(start + Duration::from_secs(40), 116);
        rate.add(start + Duration::from_secs(43), 116);
        assert_eq!(rate.place(3).eta_ms, None);
    }

    #[test]
    fn watchers_are_told_of_a_new_position_and_of_a_wait_that_moved() {
        let place = |position, eta_ms| Some(Place { position, eta_ms });
        assert!(moved(None, place(3, None)));
        assert!(moved(place(3, Some(9000)), place(2, Some(9000))));
        assert!(moved(place(3, None), place(3, Some(9000))));
        assert!(moved(place(3, Some(9000)), place(3, None)));
        assert!(!moved(place(3, Some(9000)), place(3, Some(8000))));
        assert!(moved(place(3, Some(9000)), place(3, Some(7000))));
        assert!(moved(place(3, None), None));
        assert!(!moved(None, None));
    }
}
