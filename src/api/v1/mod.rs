//! The native JSON API under `/v1`: jobs (submit, status, cancel), the run
//! history, usage, the warm capacity schedule, and the one submit path the
//! compatible APIs share.

pub(crate) mod capacity;
pub(crate) mod history;
pub(crate) mod jobs;
pub(crate) mod languages;
pub(crate) mod submit;
pub(crate) mod usage;
