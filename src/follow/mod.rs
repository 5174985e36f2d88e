//! What an API process follows in the store while it runs, for its
//! clients: one follower per followed job's events ([`feeds`]) and the
//! places of queued jobs ([`places`]).

pub(crate) mod feeds;
pub(crate) mod places;
