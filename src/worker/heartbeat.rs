//! The worker's heartbeat (`worker:<wid>:hb`, with an expiry of
//! `heartbeat_ttl`): refreshed every `heartbeat_interval` with the worker's
//! load, so autoscalers and the reaper see it alive; retried quickly after
//! a Redis failure. Its value is a [`Heartbeat`], the type its readers
//! parse it with: slots, and with a warm pool its figures per language and
//! whether it waits for memory. The languages the worker has images of are
//! advertised with it (`worker:<wid>:languages`), for the API's catalog.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Shared;
use super::backoff::{Backoff, INITIAL, sleep_unless_cancelled};
use crate::sandbox::WarmStatus;
use crate::store::{Heartbeat, WarmFigures};

/// The heartbeat's value: what an operator, an autoscaler or the capacity
/// API reads about this worker. `warm` (with a warm pool) has, per
/// language, the sandboxes `ready` and the `target`; `warm_memory_held`
/// (with a warm pool) says whether it starts none for want of memory.
pub(super) fn heartbeat_value(
    slots_used: usize,
    slots_max: usize,
    started_ms: u64,
    warm: Option<&WarmStatus>,
) -> String {
    Heartbeat {
        slots_used: Some(slots_used as u64),
        slots_max: Some(slots_max as u64),
        version: Some(env!("CARGO_PKG_VERSION").to_string()),
        started_ms: Some(started_ms),
        warm: warm.map(|warm| {
            warm.languages
                .iter()
                .map(|(language, figures)| {
                    let figures = WarmFigures {
                        ready: figures.ready as u64,
                        target: figures.target as u64,
                    };
                    (language.clone(), figures)
                })
                .collect()
        }),
        warm_memory_held: warm.map(|warm| warm.memory_held),
    }
    .to_json()
}

impl Shared {
    /// Writes the heartbeat once.
    pub(super) async fn beat(&self) -> Result<(), crate::store::StoreError> {
        let warm = self
            .pool
            .as_ref()
            .map(|pool| pool.status().borrow().clone());
        let value = heartbeat_value(
            self.slots_used(),
            self.config.max_sandboxes,
            self.started_ms,
            warm.as_ref(),
        );
        self.store
            .workers()
            .heartbeat(&self.config.id, &value, self.config.heartbeat_ttl)
            .await?;
        self.store
            .workers()
            .advertise_languages(
                &self.config.id,
                &self.catalog.ids(),
                self.config.heartbeat_ttl,
            )
            .await
    }

    /// After a Redis failure, before anything else goes to Redis: writes
    /// the heartbeat, retrying with backoff (capped at the heartbeat
    /// interval) until it is written, so a worker that comes back from an
    /// outage is seen alive before it claims or writes anything. `false`
    /// when `stop` was cancelled first.
    pub(super) async fn reannounce(&self, stop: &CancellationToken) -> bool {
        let mut backoff = Backoff::new(INITIAL, self.config.heartbeat_interval);
        loop {
            match self.beat().await {
                Ok(()) => return true,
                Err(error) => {
                    tracing::debug!(worker.id = %self.config.id, %error, "could not re-announce the worker yet");
                }
            }
            if !sleep_unless_cancelled(backoff.next_delay(), stop).await {
                return false;
            }
        }
    }

    /// Refreshes the heartbeat until `stop`; the first refresh is due after
    /// `first_delay`. A failure is retried sooner than the interval (with
    /// backoff capped at the interval) so a blip does not let it expire.
    pub(super) async fn heartbeat_loop(&self, stop: CancellationToken, first_delay: Duration) {
        let interval = self.config.heartbeat_interval;
        let mut backoff = Backoff::new(INITIAL, interval);
        let mut failing = false;
        let mut delay = first_delay;
        while sleep_unless_cancelled(delay, &stop).await {
            delay = match self.beat().await {
                Ok(()) => {
                    if failing {
                        tracing::info!(worker.id = %self.config.id, "the heartbeat is written again");
                    }
                    failing = false;
                    backoff.reset();
                    interval
                }
                Err(error) => {
                    failing = true;
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        worker.id = %self.config.id,
                        %error,
                        retry_ms = delay.as_millis() as u64,
                        "could not write the heartbeat; retrying"
                    );
                    delay
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_names_the_load_and_the_version() {
        let value: serde_json::Value =
            serde_json::from_str(&heartbeat_value(2, 4, 1_700_000_000_000, None)).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "slots_used": 2,
                "slots_max": 4,
                "version": env!("CARGO_PKG_VERSION"),
                "started_ms": 1_700_000_000_000u64,
            })
        );
        let mut warm = WarmStatus::default();
        warm.languages.insert(
            "python".into(),
            crate::sandbox::pool::LanguageStatus {
                target: 4,
                ready: 3,
                creating: 1,
            },
        );
        let value: serde_json::Value =
            serde_json::from_str(&heartbeat_value(0, 4, 1, Some(&warm))).unwrap();
        assert_eq!(
            value["warm"],
            serde_json::json!({"python": {"ready": 3, "target": 4}})
        );
        assert_eq!(value["warm_memory_held"], false);
        warm.memory_held = true;
        let value: serde_json::Value =
            serde_json::from_str(&heartbeat_value(0, 4, 1, Some(&warm))).unwrap();
        assert_eq!(value["warm_memory_held"], true);
    }
}
