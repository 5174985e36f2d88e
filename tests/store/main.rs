//! The job store against a real redis-server (one per test), with no
//! engine at all: every step of a job's life checked against the
//! transition table (`transitions`), fair turns across keys and users
//! (`fair_turns`), claims, releases and starts as a worker makes them
//! (`claims`), and the pool of Redis connections (`pool`).
//!
//! Each test starts its own redis-server on a free loopback port and kills
//! it when it ends (also when it fails).

#[path = "../common/mod.rs"]
mod common;

mod claims;
mod fair_turns;
mod pool;
mod transitions;
