//! One Redis follower per job in this API process, fanned out to every
//! connection that follows it (WebSocket, SSE, `?wait=true`).
//!
//! A single reader task holds one dedicated Redis connection and follows
//! every followed job at once (one blocking `XREAD` over all their events
//! streams, [`Events::read_feeds`](crate::store::Events::read_feeds)); what it reads goes to each job's
//! followers through a broadcast channel. A new job is added to the read by
//! ringing this process's doorbell stream, which wakes the blocked read at
//! once. So the process holds one connection for all its streams and
//! waits, however many clients follow however many jobs.
//!
//! A [`Subscription`] replays what came before it from Redis (on the pool,
//! never blocking), then takes the broadcast. `seq` numbers a job's events
//! without gaps, so a subscriber that sees a gap (it joined between two
//! reads) or fell behind (a slow client: the channel dropped its oldest
//! updates) reads the missing events from Redis again: nothing is lost,
//! and a slow client costs Redis reads, not memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;

use crate::job::events::StoredEvent;
use crate::store::{BLOCK_TIMEOUT, Store, StoreError};

/// Updates one job's channel holds for its slowest follower.
const CHANNEL_CAPACITY: usize = 256;
/// Events one replay read returns at most.
const REPLAY_BATCH: usize = 100;
/// How often followed jobs are checked for having expired.
const SWEEP_INTERVAL: Duration = Duration::from_secs(2);

/// What a job's channel carries.
#[derive(Debug, Clone)]
enum Update {
    Events(Arc<Vec<StoredEvent>>),
    /// The `exit` event was read: nothing more comes.
    Ended,
    /// The job does not exist any more (it expired).
    Gone,
    /// Redis failed; followers close and clients reconnect.
    Failed,
}

/// What following a job gave next.
pub(crate) enum Step {
    /// New events, in order; the last may be `exit`.
    Events(Vec<StoredEvent>),
    /// The job has ended and every event up to its `exit` was given.
    Ended,
    /// The job does not exist any more (it expired).
    Gone,
    /// The server is shutting down.
    Shutdown,
    Failed(StoreError),
}

struct Feed {
    sender: broadcast::Sender<Update>,
    followers: usize,
    /// The last `seq` the reader read; at first, where the follower that
    /// opened the feed starts. Any event after it, even one written while
    /// the feed was being set up (an `exit` among them), is read.
    position: u64,
}

#[derive(Default)]
struct State {
    feeds: HashMap<String, Feed>,
    reader_started: bool,
}

/// What the reader keeps between its rounds.
struct Reader {
    /// Its dedicated connection; `None` until made, and after a failure.
    conn: Option<MultiplexedConnection>,
    /// The doorbell's last entry read.
    doorbell: String,
    last_sweep: tokio::time::Instant,
}

struct Inner {
    store: Store,
    /// This process's doorbell.
    instance: String,
    state: Mutex<State>,
    changed: Notify,
    shutdown: CancellationToken,
}

/// The followers of this process's jobs. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Feeds {
    inner: Arc<Inner>,
}

impl Feeds {
    pub(crate) fn new(store: Store, shutdown: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                instance: uuid::Uuid::new_v4().simple().to_string(),
                state: Mutex::default(),
                changed: Notify::new(),
                shutdown,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Follows job `id` from after `after` (a `seq`).
    pub(crate) fn subscribe(&self, id: &str, after: u64) -> Subscription {
        let (receiver, new_feed, start_reader) = {
            let mut state = self.lock();
            let start_reader = !std::mem::replace(&mut state.reader_started, true);
            let new_feed = !state.feeds.contains_key(id);
            let feed = state.feeds.entry(id.to_string()).or_insert_with(|| Feed {
                sender: broadcast::channel(CHANNEL_CAPACITY).0,
                followers: 0,
                position: after,
            });
            feed.followers += 1;
            (feed.sender.subscribe(), new_feed, start_reader)
        };
        if start_reader {
            tokio::spawn(self.clone().read());
        }
        if new_feed {
            self.inner.changed.notify_one();
            let store = self.inner.store.clone();
            let instance = self.inner.instance.clone();
            tokio::spawn(async move {
                if let Err(error) = store.events().ring_doorbell(&instance).await {
                    tracing::debug!(error = %error, "cannot ring the events reader's doorbell");
                }
            });
        }
        Subscription {
            feeds: self.clone(),
            id: id.to_string(),
            receiver,
            after,
            replay: true,
            finishing: None,
        }
    }

    fn unsubscribe(&self, id: &str) {
        let mut state = self.lock();
        if let Some(feed) = state.feeds.get_mut(id) {
            feed.followers = feed.followers.saturating_sub(1);
            if feed.followers == 0 {
                state.feeds.remove(id);
            }
        }
    }

    /// The followed jobs and where the reader is in each.
    fn followed(&self) -> Vec<(String, u64)> {
        let state = self.lock();
        state
            .feeds
            .iter()
            .map(|(id, feed)| (id.clone(), feed.position))
            .collect()
    }

    fn publish(&self, id: &str, update: Update, position: Option<u64>) {
        let mut state = self.lock();
        let remove = matches!(update, Update::Ended | Update::Gone);
        if let Some(feed) = state.feeds.get_mut(id) {
            if let Some(position) = position {
                feed.position = position;
            }
            let _ = feed.sender.send(update);
        }
        if remove {
            state.feeds.remove(id);
        }
    }

    fn publish_all(&self, update: Update) {
        let mut state = self.lock();
        for feed in state.feeds.values() {
            let _ = feed.sender.send(update.clone());
        }
        state.feeds.clear();
    }

    /// The reader: one dedicated connection, one blocking read over every
    /// followed job, until shutdown.
    async fn read(self) {
        let shutdown = self.inner.shutdown.clone();
        let mut reader = Reader {
            conn: None,
            doorbell: "0-0".to_string(),
            last_sweep: tokio::time::Instant::now(),
        };
        let mut backoff = Duration::from_millis(100);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let known = self.followed();
            if known.is_empty() {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = self.inner.changed.notified() => continue,
                }
            }
            let outcome = tokio::select! {
                () = shutdown.cancelled() => return,
                outcome = self.read_round(&mut reader, &known) => outcome,
            };
            match outcome {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(error) => {
                    tracing::warn!(error = %error, "reading the followed jobs' events failed; their streams close");
                    reader.conn = None;
                    self.publish_all(Update::Failed);
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// One round of the reader: the jobs that expired are told so (every
    /// [`SWEEP_INTERVAL`]), then one blocking read of the `known` jobs'
    /// events and the doorbell, published to each job's followers.
    async fn read_round(
        &self,
        reader: &mut Reader,
        known: &[(String, u64)],
    ) -> Result<(), StoreError> {
        let store = &self.inner.store;
        if reader.last_sweep.elapsed() >= SWEEP_INTERVAL {
            reader.last_sweep = tokio::time::Instant::now();
            let ids: Vec<String> = known.iter().map(|(id, _)| id.clone()).collect();
            let positions = store.events().positions(&ids).await?;
            for (id, position) in ids.iter().zip(positions) {
                if position.is_none() {
                    self.publish(id, Update::Gone, None);
                }
            }
        }
        if reader.conn.is_none() {
            reader.conn = Some(store.dedicated().await?);
        }
        let Some(connection) = reader.conn.as_mut() else {
            return Ok(());
        };
        let read = store
            .events()
            .read_feeds(
                connection,
                &self.inner.instance,
                &reader.doorbell,
                known,
                BLOCK_TIMEOUT,
            )
            .await?;
        if let Some(rung) = read.doorbell {
            reader.doorbell = rung;
        }
        for (id, events) in read.events {
            let Some(last) = events.last().map(|e| e.seq) else {
                continue;
            };
            let ended = events.iter().any(StoredEvent::is_exit);
            self.publish(&id, Update::Events(Arc::new(events)), Some(last));
            if ended {
                self.publish(&id, Update::Ended, None);
            }
        }
        Ok(())
    }

    /// Waits until job `id` is terminal (woken by its `exit` event), at
    /// most `within` or until shutdown; `true` when it is terminal or gone.
    pub(crate) async fn await_exit(&self, id: &str, within: Duration) -> Result<bool, StoreError> {
        let deadline = tokio::time::Instant::now() + within;
        let store = &self.inner.store;
        // The status and the last event's seq in one read: the terminal
        // status and the `exit` event are written in one step.
        let Some((status, seq)) = store.jobs().status_and_position(id).await? else {
            return Ok(true);
        };
        if status.is_terminal() {
            return Ok(true);
        }
        let mut subscription = self.subscribe(id, seq);
        loop {
            let step = tokio::select! {
                step = subscription.next() => step,
                () = tokio::time::sleep_until(deadline) => return Ok(false),
            };
            match step {
                Step::Events(events) if events.iter().any(StoredEvent::is_exit) => return Ok(true),
                Step::Events(_) => {}
                Step::Ended | Step::Gone => return Ok(true),
                Step::Shutdown => return Ok(false),
                Step::Failed(error) => return Err(error),
            }
        }
    }
}

/// One follower of one job; see the module documentation.
pub(crate) struct Subscription {
    feeds: Feeds,
    id: String,
    receiver: broadcast::Receiver<Update>,
    /// The last `seq` given.
    after: u64,
    /// Read from Redis before taking the broadcast again.
    replay: bool,
    /// The channel said how it ends; given once the replay caught up.
    finishing: Option<Update>,
}

impl Subscription {
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Reads from Redis what came after `after`; `None` when caught up.
    async fn replay(&mut self) -> Result<Option<Vec<StoredEvent>>, StoreError> {
        let mut events = self
            .feeds
            .inner
            .store
            .events()
            .since(&self.id, self.after, REPLAY_BATCH)
            .await?;
        if events.is_empty() {
            return Ok(None);
        }
        if let Some(exit) = events.iter().position(StoredEvent::is_exit) {
            events.truncate(exit + 1);
            self.finishing = Some(Update::Ended);
        }
        self.after = events.last().map_or(self.after, |e| e.seq);
        Ok(Some(events))
    }

    /// Whether the subscription still reads stored events from Redis
    /// before it takes the live ones (see [`Subscription::catch_up`]).
    pub(crate) fn catching_up(&self) -> bool {
        self.replay || self.finishing.is_some()
    }

    /// Reads from Redis what the subscription has not given yet: the next
    /// batch of stored events or how the stream ends (`Some`), or `None`
    /// once caught up with a job still going (the live events are next).
    pub(crate) async fn catch_up(&mut self) -> Option<Step> {
        while self.catching_up() {
            if self.feeds.inner.shutdown.is_cancelled() {
                return Some(Step::Shutdown);
            }
            match self.replay().await {
                Err(error) => return Some(Step::Failed(error)),
                Ok(Some(events)) => return Some(Step::Events(events)),
                Ok(None) => self.replay = false,
            }
            if self.finishing.is_none() {
                // Caught up: a job that has ended (or expired) has
                // nothing more to give; one more look catches an `exit`
                // written meanwhile.
                match self
                    .feeds
                    .inner
                    .store
                    .jobs()
                    .status_and_position(&self.id)
                    .await
                {
                    Err(error) => return Some(Step::Failed(error)),
                    Ok(None) => {
                        self.finishing = Some(Update::Gone);
                        continue;
                    }
                    Ok(Some((status, _))) if status.is_terminal() => {
                        self.finishing = Some(Update::Ended);
                        continue;
                    }
                    Ok(Some(_)) => {}
                }
            }
            if let Some(update) = self.finishing.take() {
                // Ended for good: nothing more is asked of Redis.
                self.finishing = Some(update.clone());
                return Some(match update {
                    Update::Gone => Step::Gone,
                    Update::Failed => Step::Failed(StoreError::UnexpectedReply {
                        script: "events reader",
                        reply: "the events reader failed".into(),
                    }),
                    _ => Step::Ended,
                });
            }
        }
        None
    }

    /// The next step: events, or how the stream ends.
    pub(crate) async fn next(&mut self) -> Step {
        loop {
            if self.feeds.inner.shutdown.is_cancelled() {
                return Step::Shutdown;
            }
            if let Some(step) = self.catch_up().await {
                return step;
            }
            let update = tokio::select! {
                () = self.feeds.inner.shutdown.cancelled() => return Step::Shutdown,
                update = self.receiver.recv() => update,
            };
            match update {
                Ok(Update::Events(events)) => {
                    let fresh: Vec<StoredEvent> = events
                        .iter()
                        .filter(|e| e.seq > self.after)
                        .cloned()
                        .collect();
                    match fresh.first() {
                        None => continue,
                        Some(first) if first.seq > self.after + 1 => self.replay = true,
                        Some(_) => {
                            let mut fresh = fresh;
                            if let Some(exit) = fresh.iter().position(StoredEvent::is_exit) {
                                fresh.truncate(exit + 1);
                                self.finishing = Some(Update::Ended);
                            }
                            self.after = fresh.last().map_or(self.after, |e| e.seq);
                            return Step::Events(fresh);
                        }
                    }
                }
                Ok(update @ (Update::Ended | Update::Gone | Update::Failed)) => {
                    // What the reader read before it may not have reached
                    // this follower (it joined late): one more look first.
                    self.finishing = Some(update);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => self.replay = true,
                Err(broadcast::error::RecvError::Closed) => self.finishing = Some(Update::Ended),
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.feeds.unsubscribe(&self.id);
    }
}
