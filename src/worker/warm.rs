//! The worker's side of warm capacity: how many ready sandboxes of each
//! language it keeps, from its own floors (`CODE_RUNNER_WARM`) and its share
//! of the fleet-wide schedule (`/v1/capacity`), re-read every heartbeat
//! interval; and the pool's figures turned into metrics.
//!
//! A language with an active schedule entry takes the worker's share of it
//! instead of the worker's own floor ("used when no schedule says
//! otherwise"). The share: the active entries' total for the language split
//! among the live workers, the remainder going one each to the first
//! workers in a rotation that starts at a different worker per language, so
//! `floor = 3` over two workers is 2 + 1 and no worker takes every
//! remainder. The pool cuts the sum at `CODE_RUNNER_WARM_MAX`.

use std::collections::BTreeMap;

use tokio_util::sync::CancellationToken;

use super::Shared;
use super::backoff::sleep_unless_cancelled;
use crate::job::{default_limits, warm_runtime};
use crate::sandbox::{SandboxClass, WarmPool, WarmSpec};
use crate::store::{CapacityEntry, now_ms};

/// This worker's target per language: `floors`, replaced for a language by
/// its share of the schedule's active entries. `live` is the sorted ids of
/// the live workers (this one included, even if its heartbeat has not been
/// seen yet).
pub fn targets(
    floors: &BTreeMap<String, usize>,
    schedule: &[CapacityEntry],
    live: &[String],
    me: &str,
    now_ms: u64,
) -> BTreeMap<String, usize> {
    let mut workers: Vec<&str> = live.iter().map(String::as_str).collect();
    if !workers.contains(&me) {
        workers.push(me);
    }
    workers.sort_unstable();
    workers.dedup();
    let n = workers.len();
    let index = workers.iter().position(|w| *w == me).unwrap_or(0);

    let mut scheduled: BTreeMap<&str, u64> = BTreeMap::new();
    for entry in schedule.iter().filter(|e| e.active_at(now_ms)) {
        *scheduled.entry(entry.language.as_str()).or_default() += entry.warm;
    }
    let mut targets = floors.clone();
    for (language, floor) in scheduled {
        let floor = usize::try_from(floor).unwrap_or(usize::MAX);
        // Where this language's rotation starts: a stable function of its name.
        let start = language
            .bytes()
            .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize))
            % n;
        let position = (index + n - start) % n;
        let share = floor / n + usize::from(position < floor % n);
        targets.insert(language.to_string(), share);
    }
    targets.retain(|_, count| *count > 0);
    targets
}

/// Whether `language`'s warm sandboxes hold a started runtime at `now_ms`:
/// what an active schedule entry for it asks (one asking for runtimes
/// wins), else the worker's own setting.
pub fn runtime_wanted(
    language: &str,
    schedule: &[CapacityEntry],
    default: bool,
    now_ms: u64,
) -> bool {
    let asked: Vec<bool> = schedule
        .iter()
        .filter(|e| e.language == language && e.active_at(now_ms))
        .filter_map(|e| e.warm_runtime)
        .collect();
    if asked.is_empty() {
        default
    } else {
        asked.contains(&true)
    }
}

impl Shared {
    /// The pool's spec for a language: the language's default limits, and
    /// its runtime started ahead when `runtime` and it has one.
    fn warm_spec(&self, language: &str, runtime: bool) -> Option<WarmSpec> {
        let language = self.catalog.find(language)?;
        Some(WarmSpec {
            language: language.id.clone(),
            image: language.image_ref(),
            class: SandboxClass::of(&default_limits(language, &self.policy)),
            runtime: runtime.then(|| warm_runtime(language, 0)).flatten(),
        })
    }

    /// Sets the pool's targets once, from the schedule and the fleet as
    /// Redis has them now (the floors alone when Redis does not answer).
    pub(super) async fn retarget(&self, pool: &WarmPool) {
        let me = self.config.id.as_str();
        let fleet = async {
            let schedule = self.store.capacity().schedule().await?;
            let live = self.store.overview().live_workers().await?;
            Ok::<_, crate::store::StoreError>((schedule, live))
        };
        let (schedule, live) = match fleet.await {
            Ok((schedule, live)) => (schedule, live.into_iter().map(|w| w.id).collect()),
            Err(error) => {
                tracing::debug!(worker.id = %me, %error, "cannot read the capacity schedule; keeping the floors");
                (Vec::new(), vec![me.to_string()])
            }
        };
        let wanted = targets(&self.config.warm_floors, &schedule, &live, me, now_ms());
        for language in self.catalog.all() {
            self.metrics
                .warm_target
                .with_label_values(&[&language.id])
                .set(wanted.get(&language.id).copied().unwrap_or(0) as i64);
        }
        let now = now_ms();
        let specs = wanted
            .into_iter()
            .filter_map(|(language, count)| {
                let runtime = runtime_wanted(&language, &schedule, self.config.warm_runtimes, now);
                Some((self.warm_spec(&language, runtime)?, count))
            })
            .collect();
        pool.set_targets(specs);
    }

    /// Re-reads the targets every heartbeat interval and mirrors the pool's
    /// figures into the metrics, until `stop`.
    pub(super) async fn warm_loop(&self, pool: WarmPool, stop: CancellationToken) {
        let mut status = pool.status();
        let metrics = self.metrics.clone();
        let mirror = async move {
            loop {
                {
                    let now = status.borrow_and_update();
                    for (language, figures) in &now.languages {
                        metrics
                            .warm_ready
                            .with_label_values(&[language])
                            .set(figures.ready as i64);
                    }
                    metrics.warm_memory_held.set(i64::from(now.memory_held));
                }
                if status.changed().await.is_err() {
                    return;
                }
            }
        };
        let retarget = async {
            loop {
                self.retarget(&pool).await;
                if !sleep_unless_cancelled(self.config.heartbeat_interval, &stop).await {
                    return;
                }
            }
        };
        tokio::select! {
            () = mirror => {}
            () = retarget => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(language: &str, warm: u64, from_ms: u64, until_ms: u64) -> CapacityEntry {
        CapacityEntry::sample(language, warm, from_ms, until_ms)
    }

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn an_active_entry_decides_whether_runtimes_are_started() {
        let with = |runtime: Option<bool>, from_ms: u64| CapacityEntry {
            warm_runtime: runtime,
            ..entry("python", 4, from_ms, 2000)
        };
        // No entry, or one that does not say: the worker's setting.
        assert!(runtime_wanted("python", &[], true, 1000));
        assert!(!runtime_wanted("python", &[with(None, 0)], false, 1000));
        // An active entry says, either way; asking for runtimes wins.
        assert!(runtime_wanted(
            "python",
            &[with(Some(true), 0)],
            false,
            1000
        ));
        assert!(!runtime_wanted(
            "python",
            &[with(Some(false), 0)],
            true,
            1000
        ));
        assert!(runtime_wanted(
            "python",
            &[with(Some(false), 0), with(Some(true), 0)],
            false,
            1000
        ));
        // Not yet active, or another language's: the setting again.
        assert!(!runtime_wanted(
            "python",
            &[with(Some(true), 1500)],
            false,
            1000
        ));
        assert!(!runtime_wanted(
            "javascript",
            &[with(Some(true), 0)],
            false,
            1000
        ));
    }

    #[test]
    fn the_floors_hold_when_no_entry_is_active() {
        let floors = BTreeMap::from([("python".to_string(), 2), ("c".to_string(), 0)]);
        let schedule = [entry("python", 40, 1_000, 2_000)];
        let t = targets(&floors, &schedule, &ids(&["a"]), "a", 500);
        assert_eq!(t, BTreeMap::from([("python".to_string(), 2)]));
        let t = targets(&floors, &schedule, &ids(&["a"]), "a", 2_000);
        assert_eq!(t["python"], 2, "until is exclusive");
    }

    #[test]
    fn an_active_entry_replaces_the_floor_and_is_split_among_live_workers() {
        let floors = BTreeMap::from([("python".to_string(), 5)]);
        let schedule = [
            entry("python", 2, 0, 10_000),
            entry("python", 1, 500, 10_000),
            entry("javascript", 4, 0, 10_000),
        ];
        let live = ids(&["w1", "w2"]);
        let one = targets(&floors, &schedule, &live, "w1", 1_000);
        let two = targets(&floors, &schedule, &live, "w2", 1_000);
        assert_eq!(one["python"] + two["python"], 3, "{one:?} {two:?}");
        assert!(one["python"].abs_diff(two["python"]) == 1);
        assert_eq!((one["javascript"], two["javascript"]), (2, 2));
        // Before the second entry starts, 2 split as 1 + 1.
        let one = targets(&floors, &schedule, &live, "w1", 100);
        let two = targets(&floors, &schedule, &live, "w2", 100);
        assert_eq!((one["python"], two["python"]), (1, 1));
    }

    #[test]
    fn shares_follow_the_fleet_and_count_this_worker() {
        let schedule = [entry("python", 10, 0, 10_000)];
        let none = BTreeMap::new();
        // Alone (its own heartbeat not seen yet): all of it.
        assert_eq!(targets(&none, &schedule, &[], "w1", 1)["python"], 10);
        let live = ids(&["w1", "w2", "w3"]);
        let shares: Vec<usize> = ["w1", "w2", "w3"]
            .iter()
            .map(|w| targets(&none, &schedule, &live, w, 1)["python"])
            .collect();
        assert_eq!(shares.iter().sum::<usize>(), 10);
        assert!(shares.iter().all(|s| (3..=4).contains(s)), "{shares:?}");
        // A floor smaller than the fleet: some workers hold none.
        let small = [entry("python", 1, 0, 10_000)];
        let held: usize = ["w1", "w2", "w3"]
            .iter()
            .map(|w| {
                targets(&none, &small, &live, w, 1)
                    .get("python")
                    .copied()
                    .unwrap_or(0)
            })
            .sum();
        assert_eq!(held, 1);
    }
}
