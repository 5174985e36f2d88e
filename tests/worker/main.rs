//! The worker, the reaper and what they do with Redis and sandboxes,
//! against a real redis-server (one per test) and the scripted engine
//! ([`common::scripted`]), with no dockerd: claims and jobs (`jobs`), a
//! job's input (`control`) and events stream (`events`), the reaper
//! (`reaper`, `reaper_sandboxes`), the removal queue (`removals`), retries of lost jobs
//! (`retries`), stranded jobs (`stranded`), Redis outages (`outage`),
//! durable Redis settings (`durability`), and the scripted engine's own
//! tests (`scripted`, `scripted_ends`), which show that it does what the
//! worker relies on as the Docker engine does.
//!
//! Every test starts its own redis-server and host of sandboxes, and
//! stops what it started when it ends (also when it fails).

#[path = "../common/mod.rs"]
mod common;

mod control;
mod durability;
mod events;
mod jobs;
mod monitor;
mod outage;
mod outputs;
mod reaper;
mod reaper_sandboxes;
mod removals;
mod retries;
mod scripted;
mod scripted_ends;
mod stranded;
mod world;
