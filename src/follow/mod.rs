//! What an API process follows while it runs, for its clients: one
//! follower per followed job's events ([`feeds`]), the places of the queued
//! jobs its streams follow ([`places`]), and the recent history of the
//! dashboard's figures ([`samples`]). Long-running tasks of the process,
//! each started at its first use (the samples, with the server when the
//! dashboard is on) and ended by the server's shutdown token.
//!
//! Knows the store and the metrics, not HTTP: the handlers of
//! [`crate::api`] hold these through their state and turn what they give
//! into answers.

pub(crate) mod feeds;
pub(crate) mod places;
pub(crate) mod samples;
